"""``experiments/run_all.py --smoke`` end to end (every experiment at tiny settings, < 60 s on 2
cores), then again from its caches: the page, the README block and every figure exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_run_all_smoke_builds_every_section_and_reruns_from_cache(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    docs = tmp_path / "docs" / "results.md"
    out = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "experiments" / "run_all.py"), "--smoke", "--out", str(out), "--docs", str(docs),
           "--readme", str(readme), "--jobs", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    meta = json.loads((out / "run_all.json").read_text())
    sys.path.insert(0, str(ROOT / "experiments"))
    import run_all

    assert set(meta["experiments"]) == set(run_all.EXPERIMENTS)
    page = docs.read_text()
    figs = re.findall(r"!\[([^\]]*)\]\(([^)]+\.png)\)", page)
    assert len(figs) >= 12
    for title, link in figs:
        assert "SIMULATED" in title, title
        assert (docs.parent / link).resolve().is_file(), link
    assert page.count("**SIMULATED.**") == len(run_all.EXPERIMENTS) + 1  # the page and each section
    text = readme.read_text()
    assert text.count(run_all.BEGIN) == 1 and "Libra against each baseline" in text and "Regime map (SIMULATED)" in text
    original = (ROOT / "README.md").read_text()
    if run_all.BEGIN not in original:  # the rest of the README is untouched
        a, b = text.index("## Results of the reproduction"), text.index(run_all.END) + len(run_all.END) + 2
        assert text[:a] + text[b:] == original
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    meta2 = json.loads((out / "run_all.json").read_text())
    assert all(t["cached"] for t in meta2["experiments"].values()), meta2
    assert docs.read_text().split("code key")[1:] == page.split("code key")[1:]
