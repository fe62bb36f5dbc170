"""``libra-sim replay --compare --jobs N``: parallel processes give the sequential results."""

from __future__ import annotations

import json
from pathlib import Path

from sim.cli import main
from test_sim_replay_cli import _trace


def _summary(tmp_path: Path, jobs: int) -> dict:
    tr = _trace(tmp_path / "t.jsonl", steps=2, n=16)
    out = tmp_path / f"r{jobs}.json"
    rc = main(["replay", str(tr), "--gpus", "16", "--compare", "--policies", "verl-colocated,verl-static-uniform,libra",
               "--jobs", str(jobs), "--json", str(out)])
    assert rc == 0
    return json.loads(out.read_text())["policies"]


def test_parallel_compare_equals_sequential(tmp_path: Path) -> None:
    seq = _summary(tmp_path, 1)
    par = _summary(tmp_path, 2)
    assert list(par) == list(seq) == ["verl-colocated", "verl-static-uniform", "libra"]
    assert par == seq
    assert all(p["completed"] == p["expected"] == 32 for p in par.values())
