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
