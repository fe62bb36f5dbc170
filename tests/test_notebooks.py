"""The what-if notebook runs top to bottom against the current code (its cells assert too)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the [dev] extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the [dev] extra")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


BUILDERS = {"what_if.ipynb": "build_what_if.py", "calibrate.ipynb": "build_calibrate.py"}


def _builder(name: str):  # type: ignore[no-untyped-def]
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "notebooks" / BUILDERS[name]
    sys.path.insert(0, str(path.parent))  # build_calibrate imports build_what_if's executor
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_every_notebook_has_a_builder() -> None:
    assert sorted(p.name for p in NOTEBOOKS) == sorted(BUILDERS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_notebook_is_built_from_its_source(name: str) -> None:
    """The committed notebook's cells equal what its notebooks/build_*.py writes."""
    built = [c.source for c in _builder(name).build().cells]
    path = Path(__file__).resolve().parents[1] / "notebooks" / name
    committed = [c.source for c in nbformat.read(path, as_version=4).cells]
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


def test_calibrate_notebook_is_committed_with_outputs_and_fits_both_layers() -> None:
    """Opened in Jupyter, calibrate.ipynb shows its fits and errors: every code cell executed with
    outputs, inline figures, and both layers fitted from the measurement folder (an engine
    profile by ``fit_csv``, operator tables by ``fit_folder``) with their held-out errors."""
    path = Path(__file__).resolve().parents[1] / "notebooks" / "calibrate.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "run notebooks/build_calibrate.py (it executes)"
    assert all(c.get("outputs") for c in code)
    assert sum("image/png" in o.get("data", {}) for c in code for o in c.outputs) >= 2
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    src = "\n".join(c.source for c in code)
    assert "F.fit_csv(" in src and "fit_folder(OPERATOR_DIR" in src and "lomo_predictions" in src and "CR.score(" in src
    shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for c in code for o in c.outputs)
    assert "held-out MAPE %" in shown and "extrapolation" in shown and "roofline_mape" in shown


def test_what_if_notebook_shows_rejected_candidates_gantt_and_a_sweep() -> None:
    """Issue 13's list: the plan and why (candidates rejected, predicted times), the Gantt of one
    step, a small sweep over one axis."""
    path = Path(__file__).resolve().parents[1] / "notebooks" / "what_if.ipynb"
    nb = nbformat.read(path, as_version=4)
    shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                    for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "candidates priced" in shown and "x_chosen" in shown
    assert "busy intervals" in shown and "libra / best baseline:" in shown
