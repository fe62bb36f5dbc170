"""The what-if notebook runs top to bottom against the current code (its cells assert too)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the [dev] extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the [dev] extra")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_notebook_is_built_from_its_source() -> None:
    """The committed notebook's cells equal what notebooks/build_what_if.py writes."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "notebooks" / "build_what_if.py"
    spec = importlib.util.spec_from_file_location("build_what_if", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    built = [c.source for c in mod.build().cells]
    committed = [c.source for c in nbformat.read(path.with_name("what_if.ipynb"), as_version=4).cells]
    assert built == committed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_committed_notebook_has_its_outputs_and_inline_figures() -> None:
    """Opened in Jupyter it shows its tables and figure without running: every code cell was
    executed and kept its outputs, and the figure is an inline PNG (``matplotlib.use("Agg")``
    had hidden it)."""
    path = Path(__file__).resolve().parents[1] / "notebooks" / "what_if.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "run notebooks/build_what_if.py (it executes)"
    assert all(c.get("outputs") for c in code[1:])  # every cell but the imports shows something
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    src = "\n".join(c.source for c in code)
    assert 'matplotlib.use("Agg")' not in src and "%matplotlib inline" in src
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "why Libra mixes TP degrees" not in text  # its plans here are homogeneous; the text must not claim otherwise
    shown = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert "above the instance's KV capacity" in shown


def test_notebook_picks_the_engine_profile_in_one_place() -> None:
    """The engine profile is a knob of the what-if analysis (issue 10): one ``ENGINE`` setting
    reaches the evaluator and every cluster the planner and the replays see."""
    path = Path(__file__).resolve().parents[1] / "notebooks" / "what_if.ipynb"
    src = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert 'ENGINE = "vllm-2024"' in src
    assert "CostEvaluator(\"a800\", \"qwen3-14b\", engine=ENGINE)" in src
    assert src.count("ClusterSpec(") == src.count("engine=ENGINE)") - 1  # every cluster, plus the evaluator
