"""experiments/published_runs.py: every row of the published-runs CSV is either replayed or
given a reason, and a replayed row yields finite predicted stage times."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import published_runs as pr  # noqa: E402


def test_every_row_is_replayed_or_has_a_reason() -> None:
    with open(pr.DATA / "rl_runs_published.csv", newline="") as f:
        ids = {int(r["row_id"]) for r in csv.DictReader(f)}
    assert ids == set(pr.REPLAYS) | set(pr.NOT_REPLAYED)
    assert not set(pr.REPLAYS) & set(pr.NOT_REPLAYED)
    for rid, r in pr.REPLAYS.items():
        assert r.published, rid
        assert (pr.MODELS / r.model / "config.json").exists() or "/" not in r.model


def test_a_row_replays_to_finite_stage_times() -> None:
    pred = pr.replay_row(pr.REPLAYS[15])
    assert set(pred) == {"step", "rollout", "logprob", "update"}
    assert all(math.isfinite(v) and v > 0 for v in pred.values())
    assert pred["step"] > pred["rollout"] > pred["update"] > pred["logprob"] * 0.5


def test_an_async_row_replays_at_its_own_staleness() -> None:
    """NeMo RL's 8-steps-off run must replay 8 steps off: ``verl-static-uniform`` plans verl's
    one-step-off loop unless the staleness is asked for, and the class K alone only allows it
    (the row was replayed at staleness 1: a 64 s step for a published 34.5 s, issue 17)."""
    from dataclasses import replace

    r = pr.NEMO["nemo06_qwen30b_8off"]
    assert r.max_staleness == 8
    small = replace(r, samples=256, group_size=32, steps=r.max_staleness + 2)
    res = pr.replay(small)
    assert [m.mode for m in res.steps] == ["async"] * small.steps
    assert {m.staleness for m in res.steps} == {8}
