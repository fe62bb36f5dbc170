"""The comparison table fits an 80-column terminal by default; ``--wide`` shows every column
(issue 21, item 6: all 15 columns needed ~180 characters and at 80 every cell read ``v…``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from sim.cli import main
from sim.metrics import RunResult, StepMetrics
from sim.report import NARROW_COLUMNS, WIDE_COLUMNS, summary_table

#: Every policy of the registry with the longest strings a row can carry.
NAMES = ("verl-colocated", "verl-static-uniform", "areal-static-optimal", "libra", "libra-homogeneous", "length-predictor")


def _result(name: str, k: int, mode: str) -> RunResult:
    step = StepMetrics.__new__(StepMetrics)
    fields = {f: 0 for f in StepMetrics.__dataclass_fields__}
    fields.update(n_rollout_gpus=36, n_train_gpus=12, rollout_tps="4x9", rollout_makespan_s=12345.6, train_s=382.0, step_s=12593.9)
    for key, v in fields.items():
        object.__setattr__(step, key, v)
    res = RunResult(name, mode, [step])
    res.max_staleness = k
    res.staleness = k if "async" in mode else 0
    return res


def _render(width: int, wide: bool) -> str:
    results = [_result(n, k, "async" if k and n != "verl-colocated" else "sync+streaming") for k in (0, 1) for n in NAMES]
    console = Console(width=width, record=True)
    console.print(summary_table(results, "a long title: swe-qwen3-14b.jsonl.gz, 20 steps, 10240 trajectories, 48 x a800", 48,
                                wide=wide))
    return console.export_text()


def test_default_table_fits_80_columns_without_cutting_a_cell() -> None:
    text = _render(80, wide=False)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text
    for name in NAMES:
        assert any(line.startswith(name + " ") for line in lines), name  # whole, not folded
    header = next(line for line in lines if line.startswith("policy"))
    assert header.split() == ["policy", "K", "mode", "split", "R:T", "TP", "step", "s", "tok/s", "vs", "best"]
    assert "12,593.9" in text and "sync+stream " in text and "async K=1" in text and "--wide" in text


def test_wide_table_has_every_column() -> None:
    text = _render(220, wide=True)
    for col in WIDE_COLUMNS:
        assert col in text, col
    assert set(NARROW_COLUMNS) - {"TP", "tok/s", "vs best"} <= set(WIDE_COLUMNS)


def test_replay_prints_the_narrow_table_unless_wide(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_sim_replay_cli import _trace

    tr = _trace(tmp_path / "t.jsonl", steps=1, n=16)
    argv = ["replay", str(tr), "--gpus", "16", "--compare", "--policies", "verl-colocated,libra", "--jobs", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trained tok/s" not in out and "vs best" in out
    assert main([*argv, "--wide"]) == 0
    assert "trained tok/s" in capsys.readouterr().out
