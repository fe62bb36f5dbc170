"""``libra-sim validate`` and ``libra-sim stats``: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.trace import Trajectory, Turn, write_trace
from sim.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(FIXTURES / "valid_unsorted.jsonl")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK ") and "5 trajectories, 9 turns, 3 steps" in out and "workload=swe" in out


def test_validate_invalid_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(FIXTURES / "invalid_mixed.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("invalid_mixed.jsonl:3: field 'step': must be an integer >= 0 (got int -1)")
    assert "Traceback" not in err


def test_validate_lenient_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--lenient", str(FIXTURES / "invalid_mixed.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "OK " in out and "2 trajectories" in out and "skipped 5 invalid line(s)" in out
    assert "       2  field 'step': must be an integer >= 0" in out
    assert "       1  field 'id': must be unique within the trace" in out


def test_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "x.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_validate_random_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "junk.jsonl.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    assert main(["validate", str(p)]) == 2
    assert "gzip stream is truncated or corrupt" in capsys.readouterr().err


def test_stats_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(FIXTURES / "valid_unsorted.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "5 trajectories, 3 steps" in out and "ctx" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["0", "1", "3"]
    assert main(["stats", "--json", str(FIXTURES / "valid_unsorted.jsonl")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_trajectories"] == 5 and [s["step"] for s in doc["steps"]] == [0, 1, 3]
    assert doc["header"]["metadata"] == {"seed": 7}
    s3 = doc["steps"][2]
    assert s3["n_trajectories"] == 2 and s3["finish_counts"]["tool_limit"] == 1
    assert s3["context_tokens"]["max"] == 812 + 300 + 1000  # s3-p17-r3 (r2 is 812+230+410+120+95+95)
    assert s3["context_tokens"]["p50"] == (812 + 300 + 1000 + 812 + 230 + 410 + 120 + 95 + 95) / 2


def test_stats_lenient_and_strict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(FIXTURES / "invalid_mixed.jsonl")]) == 2
    capsys.readouterr()
    assert main(["stats", "--json", "--lenient", str(FIXTURES / "invalid_mixed.jsonl")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_trajectories"] == 2 and sum(doc["skipped"].values()) == 5


def test_stats_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.jsonl.gz"
    write_trace(p, [Trajectory(f"t{i}", i % 2, 3, (Turn(4, "bash", 0.5, 2, "ok"), Turn(1, None))) for i in range(10)])
    assert main(["stats", "--json", str(p)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["n_trajectories"] for s in doc["steps"]] == [5, 5]
    assert doc["steps"][1]["drift_mean_vs_first"] == 1.0
