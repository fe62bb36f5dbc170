"""The planner learns from measured rollouts (``libra.planner.feedback``): measured over the load
model's hindsight prediction, per layout kind, scales later predictions."""

from __future__ import annotations

import pytest

from libra.cluster import ClusterSpec
from libra.planner.feedback import FACTOR_MAX, RolloutCalibration, StepOutcome
from libra.planner.plan import Bucket, RolloutInstance
from libra.planner.search import Planner, SearchOptions
from libra.planner.stats import compute_stats
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


def test_a_split_that_did_not_pay_must_forecast_more_next_time() -> None:
    """After a two-bucket step, the planner compares the measured rollout with what the best one
    bucket on the same GPUs would have taken (hindsight, scaled by one bucket's measured factor);
    the forecast gain over that realized gain raises the margin later splits must clear."""
    from dataclasses import replace

    cal = RolloutCalibration(window=3)
    assert cal.split_scale() == 1.0
    assert cal.record_split(1.15, 0.95) == pytest.approx(1.15 / 0.95)
    assert cal.split_scale() == pytest.approx(1.15 / 0.95)
    cal.record_split(1.0, 2.0)
    cal.record_split(1.0, 2.0)
    assert cal.split_scale() == 1.0  # a split that paid more than forecast earns no bonus
    assert cal.record_split(float("nan"), 1.0) is None

    steps = list(generate_steps("search", 3, 256, 8, 0, max_context=16384))
    cl = ClusterSpec(32, "h100", "qwen3-14b", 8, max_context=16384)
    planner = Planner(cl, options=SearchOptions(max_staleness=1))
    plan = planner.to_plan(planner.search(steps[:1], steps[1].prompt_tokens))
    assert len(plan.buckets) == 1
    # one bucket ran once, 10% slower than the model says of that step: its measured factor
    planner.observe(StepOutcome(1, plan, steps[1], 1.1 * planner.hindsight_rollout_s(plan, steps[1])))
    assert planner.calibration.factor(1) == pytest.approx(1.1)
    # a two-bucket plan that forecast 20% over one bucket ...
    tp_lo, tp_hi = min(planner.tps), max(planner.tps)
    insts = tuple(RolloutInstance(i, tp_lo if i else tp_hi, 0 if i else 1, node=0, first_gpu=0) for i in range(3))
    split = replace(plan, buckets=(Bucket(0, tp_lo, 0, 2048), Bucket(1, tp_hi, 2048, None)), instances=insts,
                    notes={**plan.notes, "model_rollout_s": 10.0, "one_bucket_model_rollout_s": 12.0})
    one_hs = planner._hindsight_dp(split, compute_stats([steps[1]], steps[1].prompt_tokens, window=1), 1).best_one_bucket_s(split.n_rollout_gpus)
    # ... measured as slow as one bucket would have been: it realized no gain
    planner.observe(StepOutcome(1, split, steps[1], one_hs * planner.calibration.factor(1)))
    assert planner.calibration.split_scale() == pytest.approx(1.2, rel=0.05)
    nxt = planner.to_plan(planner.search(steps[:2], steps[2].prompt_tokens, current=plan))
    assert nxt.notes["split_scale"] == pytest.approx(planner.calibration.split_scale())


def test_measured_completion_order_replaces_the_length_order_in_the_streamed_price() -> None:
    """Tool waits do not finish GRPO groups in the order of their lengths: once a step was
    measured, the streamed loop's mini-batches are ready when its groups completed
    (``CompletionOrder``), not when the length order says (InterCode-SQL, 24 A800, K=0: a
    streamed split forecast at 172.7 s a step ran 226.9 s, SIMULATED)."""
    import numpy as np

    from libra.planner.feedback import CompletionOrder, group_ready_fraction
    from libra.planner.search import step_time, streaming_step_s

    steps = list(generate_steps("search", 2, 64, 8, 0, max_context=8192))
    step = steps[0]
    finals = step.total_tokens.astype(float)
    # every group's last member finishes at the very end: nothing can stream
    late = np.full(step.n, 100.0)
    assert np.allclose(group_ready_fraction(step, late), 1.0)
    by_length = streaming_step_s(50.0, 20.0, 1.0, finals, 4)
    assert by_length < step_time("sync", 50.0, 20.0, 1.0)
    assert streaming_step_s(50.0, 20.0, 1.0, finals, 4, ready_fraction=np.ones(step.n)) == pytest.approx(
        step_time("sync", 50.0, 20.0, 1.0))
    # groups complete one after the other: a group's readiness is its last member's finish
    fin = np.arange(step.n, dtype=float) + 1.0
    frac = group_ready_fraction(step, fin)
    for g in set(step.groups):
        rows = [i for i, x in enumerate(step.groups) if x == g]
        assert np.allclose(frac[rows], fin[rows].max() / fin.max())
    order = CompletionOrder(window=2)
    cl = ClusterSpec(16, "h100", "qwen3-8b", 8, max_context=8192)
    planner = Planner(cl, options=SearchOptions(max_staleness=0))
    plan = planner.to_plan(planner.search(steps[:1], steps[1].prompt_tokens))
    assert not order.record(StepOutcome(0, plan, step, 100.0))  # no finish times: nothing kept
    assert not order.record(StepOutcome(0, plan, step, 100.0, overlapped=True, finish_s=late))
    assert order.record(StepOutcome(0, plan, step, 100.0, finish_s=late)) and order.arrays() is not None
    # the planner prices its streamed loop with what it measured
    before = planner.search(steps[:1], steps[1].prompt_tokens)
    hind = planner.hindsight_rollout_s(plan, step)  # measured as predicted: the rollout factor stays 1
    planner.observe(StepOutcome(0, plan, step, hind, finish_s=late))
    after = planner.search(steps[:1], steps[1].prompt_tokens)
    assert planner.calibration.factor(1) == pytest.approx(1.0)
    streamed = [(b, a) for b, a in zip(before.candidates, after.candidates) if "sync+streaming" in b.mode_step_s]
    assert streamed
    for b, a in streamed:  # the same candidates; streaming now overlaps nothing: rollout + training + sync
        assert a.mode_step_s["sync+streaming"] > b.mode_step_s["sync+streaming"]
        assert a.mode_step_s["sync+streaming"] == pytest.approx(a.rollout_s + a.train_s + a.sync_s, rel=1e-6)


def test_async_steps_that_shared_their_engines_scale_the_staleness_cycle() -> None:
    """A rollout that shared its engines teaches the per-layout factors nothing, but its span over
    the model's staleness cycle fed its own trajectories (``Planner.hindsight_cycle_s``) scales the
    next searches' cycle and engine pace (``RolloutCalibration.pipelined_factor``)."""
    cal = RolloutCalibration(window=3)
    assert cal.pipelined_factor() == 1.0
    assert cal.record_pipelined(130.0, 100.0) == pytest.approx(1.3)
    assert cal.factor(1) == 1.0  # the per-layout factors are untouched
    assert cal.record_pipelined(0.0, 100.0) is None

    steps = list(generate_steps("search", 3, 128, 8, 0, max_context=8192))
    cl = ClusterSpec(32, "h100", "qwen3-8b", 8, max_context=8192)
    planner = Planner(cl, options=SearchOptions(max_staleness=1))
    plan = planner.to_plan(planner.search(steps[:1], steps[1].prompt_tokens))
    assert plan.mode == "async"
    cycle = planner.hindsight_cycle_s(plan, steps[1])
    # the cycle holds two steps' trajectories on the same engines: longer than one step alone
    assert cycle > planner.hindsight_rollout_s(plan, steps[1]) > 0
    assert planner.observe(StepOutcome(1, plan, steps[1], 1.5 * cycle, overlapped=True)) is None
    assert planner.calibration.pipelined_factor() == pytest.approx(1.5)
    assert planner.calibration.factor(1) == 1.0
    nxt = planner.to_plan(planner.search(steps[:2], steps[2].prompt_tokens, current=plan))
    fresh = Planner(cl, options=SearchOptions(max_staleness=1))
    same = fresh.to_plan(fresh.search(steps[:2], steps[2].prompt_tokens, current=plan))
    assert nxt.notes["pipelined_factor"] == pytest.approx(1.5) and same.notes["pipelined_factor"] == 1.0
    # async steps are priced slower once the pipeline measured slower than its model
    assert nxt.predicted_step_s > same.predicted_step_s


def test_an_overlapped_step_is_compared_with_the_shared_rollout_at_its_measured_overlap() -> None:
    """Session 25: the async price mixes the rollout alone and the staleness cycle by the
    overlap (``libra.planner.pipeline.shared_rollout_s``), so a step that shared the engines is
    compared with that mix at the overlap the backend measured (``StepOutcome.overlap``), and the
    factor then scales both parts. Compared with the whole cycle, a step that overlapped one
    neighbour for a third of its time measured well below 1 and shrank the mixed price twice."""
    from libra.planner.pipeline import shared_rollout_s

    steps = list(generate_steps("search", 3, 128, 8, 0, max_context=8192))
    cl = ClusterSpec(32, "h100", "qwen3-8b", 8, max_context=8192)
    planner = Planner(cl, options=SearchOptions(max_staleness=1))
    plan = planner.to_plan(planner.search(steps[:1], steps[1].prompt_tokens))
    alone, cycle = planner.hindsight_rollout_s(plan, steps[1]), planner.hindsight_cycle_s(plan, steps[1])
    assert cycle > alone > 0
    # no overlap measured: the whole cycle (what the backend cannot tell is priced as before)
    assert planner.hindsight_shared_s(StepOutcome(1, plan, steps[1], 1.0, overlapped=True)) == pytest.approx(cycle)
    # alone at overlap 0, the cycle at K others throughout, linear in between
    at = {o: planner.hindsight_shared_s(StepOutcome(1, plan, steps[1], 1.0, overlapped=True, overlap=o)) for o in (0.0, 0.33, 1.0, 2.0)}
    assert at[0.0] == pytest.approx(alone) and at[1.0] == pytest.approx(cycle) and at[2.0] == pytest.approx(cycle)
    assert at[0.33] == pytest.approx(shared_rollout_s(alone, cycle, 1, 0.33)) and alone < at[0.33] < cycle
    # a measured rollout equal to the mix teaches a factor of 1 (against the cycle: below 1)
    assert planner.observe(StepOutcome(1, plan, steps[1], at[0.33], overlapped=True, overlap=0.33)) is None
    assert planner.calibration.pipelined_factor() == pytest.approx(1.0)
