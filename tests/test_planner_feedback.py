"""The planner learns from measured rollouts (``libra.planner.feedback``): measured over the load
model's hindsight prediction, per layout kind, scales later predictions."""

from __future__ import annotations

import pytest

from libra.cluster import ClusterSpec
from libra.planner.feedback import FACTOR_MAX, RolloutCalibration, StepOutcome
from libra.planner.search import Planner, SearchOptions
from libra.trace.workload import generate_steps


def test_calibration_factors_per_kind_borrowed_and_clipped() -> None:
    cal = RolloutCalibration(window=3)
    assert cal.factor(1) == cal.factor(2) == 1.0  # nothing measured: the model as is
    assert cal.record(1, 12.0, 10.0) == pytest.approx(1.2)
    assert cal.factor(1) == pytest.approx(1.2) and cal.factor(2) == pytest.approx(1.2)  # a kind never run borrows
    cal.record(2, 15.0, 10.0)
    assert cal.factor(2) == pytest.approx(1.5) and cal.factor(1) == pytest.approx(1.2)
    for _ in range(3):
        cal.record(1, 10.0, 10.0)
    assert cal.factor(1) == pytest.approx(1.0)  # a window: the 1.2 has left it
    cal.record(2, 100.0, 1.0)
    cal.record(2, 100.0, 1.0)
    assert cal.factor(2) == FACTOR_MAX  # one odd run cannot swing a plan without bound
    assert cal.record(1, float("nan"), 1.0) is None and cal.record(1, 1.0, 0.0) is None


def test_observed_rollouts_scale_the_next_prediction() -> None:
    steps = list(generate_steps("math", 3, 64, 8, 0, max_context=8192))
    cl = ClusterSpec(16, "h100", "qwen3-8b", 8, max_context=8192)
    planner = Planner(cl, options=SearchOptions())
    plan = planner.to_plan(planner.search(steps[:1], steps[1].prompt_tokens))
    hind = planner.hindsight_rollout_s(plan, steps[1])
    assert hind > 0
    # a backend measured step 1's rollout at 1.6x what the model says of that very step
    assert planner.observe(StepOutcome(1, plan, steps[1], 1.6 * hind)) == pytest.approx(1.6)
    nxt = planner.to_plan(planner.search(steps[:2], steps[2].prompt_tokens, current=plan))
    assert nxt.notes["rollout_factor"] == pytest.approx(1.6)
    assert nxt.predicted_rollout_s == pytest.approx(1.6 * nxt.notes["model_rollout_s"])
    fresh = Planner(cl, options=SearchOptions())
    same = fresh.to_plan(fresh.search(steps[:2], steps[2].prompt_tokens, current=plan))
    assert same.notes["rollout_factor"] == 1.0
    # the plan may change with the correction, but it is priced at least as slow as before
    assert nxt.predicted_step_s >= same.predicted_step_s - 1e-9
