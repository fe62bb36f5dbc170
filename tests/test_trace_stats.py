"""Per-step statistics: exact values on a hand-computed step, drift, JSON and DataFrame forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from libra.trace import StepArrays, Trajectory, Turn
from libra.trace.stats import Distribution, stats_frame, step_stats, trace_stats


def _step(step: int, scale: int = 1) -> StepArrays:
    trajs = [
        Trajectory("a", step, 10 * scale, (Turn(5, "bash", 1.0, 20, "ok"), Turn(5, "bash", 3.0, 10, "error"), Turn(10, None)), reward=1.0, finish="stop"),
        Trajectory("b", step, 20 * scale, (Turn(30, "python", None, 40, "timeout"), Turn(2, "bash", 2.0, 8)), finish="tool_limit"),
        Trajectory("c", step, 30 * scale, (Turn(8, None),), reward=0.0),
    ]
    return StepArrays.from_trajectories(step, trajs)


def test_step_stats_exact() -> None:
    s = step_stats(_step(0))
    assert (s.n_trajectories, s.n_turns, s.n_tool_calls) == (3, 6, 4)
    assert s.turns == Distribution.of(np.array([3, 2, 1]))
    assert s.turns.mean == 2.0 and s.turns.max == 3.0
    # contexts: a = 10+5+20+5+10+10 = 60, b = 20+30+40+2+8 = 100, c = 30+8 = 38
    assert s.context_tokens.mean == pytest.approx((60 + 100 + 38) / 3)
    assert s.context_tokens.p50 == 60 and s.context_tokens.max == 100
    assert s.context_tokens.p90 == pytest.approx(np.percentile([60, 100, 38], 90))
    assert s.gen_tokens_per_turn.mean == pytest.approx((5 + 5 + 10 + 30 + 2 + 8) / 6)
    assert s.total_gen_tokens == 60
    assert s.tool_mix == {"bash": 0.75, "python": 0.25}
    assert s.outcome_rates == {"ok": 0.25, "error": 0.25, "timeout": 0.25, "unknown": 0.25}
    assert s.tool_latency_p50_s == 2.0 and s.n_latency_null == 1
    assert s.tool_latency_p99_s == pytest.approx(np.percentile([1.0, 3.0, 2.0], 99))
    assert s.finish_counts == {"stop": 1, "length": 0, "tool_limit": 1, "abort": 0, "null": 1}
    assert s.mean_reward == 0.5 and s.n_reward_null == 1


def test_drift() -> None:
    stats = trace_stats([_step(0), _step(1, 2), _step(4, 4)])
    assert [s.step for s in stats] == [0, 1, 4]
    assert math.isnan(stats[0].drift_mean_vs_first) and math.isnan(stats[0].drift_p90_vs_prev)
    for s, prev in zip(stats[1:], stats):
        assert s.drift_mean_vs_prev == pytest.approx(s.context_tokens.mean / prev.context_tokens.mean)
        assert s.drift_p90_vs_first == pytest.approx(s.context_tokens.p90 / stats[0].context_tokens.p90)
    assert stats[2].drift_mean_vs_first > stats[1].drift_mean_vs_first > 1


def test_empty_step_is_nan_not_error() -> None:
    s = step_stats(StepArrays.from_trajectories(0, []))
    assert s.n_trajectories == 0 and math.isnan(s.context_tokens.mean) and s.tool_mix == {} and math.isnan(s.mean_reward)


def test_json_and_frame() -> None:
    stats = trace_stats([_step(0), _step(1, 2)])
    doc = json.loads(json.dumps([s.to_dict() for s in stats]))  # NaN became null, so this is strict JSON
    assert doc[0]["drift_mean_vs_first"] is None and doc[1]["context_tokens"]["max"] == 120  # b: 40+30+40+2+8
    df = stats_frame(stats)
    assert list(df.index) == [0, 1]
    assert df.loc[1, "context_max"] == 120 and df.loc[0, "tool:bash"] == 0.75 and df.loc[0, "finish:stop"] == 1
