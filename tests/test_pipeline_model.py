"""The async pipeline's timing model (``libra.planner.pipeline``) and the overlap the simulator
measures for it (``sim.engines.Engines.overlap_of``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from libra.planner.pipeline import _gate, async_drain_s, async_steady_s, pipeline_run_s, shared_rollout_s, stagger_gain_s
from sim.engines import Engines


def test_a_shared_rollout_is_linear_in_the_overlap_between_alone_and_the_cycle() -> None:
    assert shared_rollout_s(100.0, 160.0, 2, 0.0) == 100.0
    assert shared_rollout_s(100.0, 160.0, 2, 1.0) == pytest.approx(130.0)
    assert shared_rollout_s(100.0, 160.0, 2, 2.0) == pytest.approx(160.0)
    assert shared_rollout_s(100.0, 160.0, 2, 5.0) == pytest.approx(160.0)  # at most K others at once
    assert shared_rollout_s(100.0, 90.0, 1, 1.0) == 100.0  # a cycle below the rollout alone is the rollout


@pytest.mark.parametrize("rollout,chain,load,cohort,k", [
    (150.0, 20.0, 1.0, 210.0, 2), (29.9, 29.9, 15.9, 43.6, 1), (40.0, 20.0, 1.0, 60.0, 1), (100.0, 10.0, 60.0, 150.0, 1),
    (100.0, 30.0, 1.0, 180.0, 2), (100.0, 10.0, 1.0, 400.0, 3), (10.0, 50.0, 1.0, 12.0, 1), (80.0, 30.0, 70.0, 120.0, 1),
    (100.0, 30.0, 1.0, 400.0, 1), (1570.0, 962.0, 574.0, 5729.0, 1), (151.3, 76.5, 8.8, 403.2, 2),
])
def test_the_steady_period_is_bounded_by_alone_and_whole_waves_and_is_the_long_runs(rollout: float, chain: float, load: float,
                                                                                     cohort: float, k: int) -> None:
    steady = async_steady_s(rollout, chain, load, cohort, k)
    low = max(load, chain, (rollout + chain) / (k + 1))
    high = max(load, chain, (cohort + chain) / (k + 1))
    assert low * (1 - 1e-9) <= steady <= high * (1 + 1e-9)
    # the run from a standing start tends to it (0.6% off where the cycle holds no parallel gain:
    # four steps together take four times one)
    n = 2000
    assert pipeline_run_s("async", k, rollout, chain, n, cohort_s=cohort, load_s=load) / n == pytest.approx(steady, rel=0.01)


def test_where_the_overlap_feeds_itself_the_pipeline_stays_in_the_fills_waves() -> None:
    """MCPMark on 52 A800 / Qwen3-32B at 12:40 on TP 4 x 3, K = 1 (held_out_49, SIMULATED): the
    rollout alone 1,570 s, two steps together 5,729 s, the chain 962 s. Admitted a chain apart the
    steps overlap, the overlap slows them, the slower rollouts overlap more: the pipeline never
    leaves the waves the fill starts it in (a shared rollout of 4,915 s, then the second step's
    962 s of training). The staggered equilibrium the model used before priced the knife edge
    where steps admitted one rollout apart do not overlap, 1,570 s; the replay ran 5,518 s then
    897 s."""
    steady = async_steady_s(1570.0, 962.0, 574.0, 5729.0, 1)
    assert steady == pytest.approx((4915.0 + 962.0) / 2, rel=0.01)
    assert steady > 1.8 * 1570.0
    # a chain at least the rollout alone spaces the admissions past it: no overlap, the chain's pace
    assert async_steady_s(651.0, 1188.0, 473.0, 4620.0, 1) == pytest.approx(1188.0)


def test_a_new_layout_waits_out_the_rollout_in_flight_only_where_rollouts_overlap() -> None:
    """``async_drain_s``: at a step's gate the previous step's rollout still runs for a while
    when the rollouts are longer than the chain (a rollout-bound pipeline: 400 s alone, 600 s
    two together, 10 s of training), and a new layout starts only after it; none where the chain
    spaces the admissions past the rollout."""
    rollout_bound = async_drain_s(400.0, 10.0, 150.0, 600.0, 1)
    assert 0.5 * 400.0 < rollout_bound < 600.0
    assert async_drain_s(651.0, 1188.0, 473.0, 4620.0, 1) == 0.0
    assert async_drain_s(29.9, 29.9, 15.9, 43.6, 1) == 0.0
    # between: only the part of the rollout beyond one step's spacing
    assert 0.0 < async_drain_s(40.0, 20.0, 1.0, 60.0, 1) < 40.0 - 20.0
    # known: nothing in flight waits nothing; a rollout known to run waits at least the mean
    assert async_drain_s(400.0, 10.0, 150.0, 600.0, 1, in_flight=False) == 0.0
    assert async_drain_s(400.0, 10.0, 150.0, 600.0, 1, in_flight=True) >= rollout_bound


def test_a_longer_chain_spaces_the_admissions_and_shrinks_the_overlap() -> None:
    # the rollout alone 40 s, two together 60 s, K = 1: with a short chain the admissions bunch
    # and the steps share the engines (above the no-sharing floor), with a chain at least the
    # rollout the steps never overlap and the chain sets the pace
    chains = (5.0, 15.0, 25.0, 35.0, 45.0)
    periods = [async_steady_s(40.0, c, 1.0, 60.0, 1) for c in chains]
    assert periods == sorted(periods)
    assert periods[0] > (40.0 + 5.0) / 2 and periods[0] < (60.0 + 5.0) / 2
    assert periods[-1] == pytest.approx(45.0)


def _stage(start: float) -> SimpleNamespace:
    return SimpleNamespace(step=SimpleNamespace(n=4), overlapped=False, stats=SimpleNamespace(start_s=start, end_s=float("nan")))


def test_the_engines_measure_each_rollouts_time_weighted_overlap() -> None:
    eng = Engines(0, ())
    a, b, c = _stage(0.0), _stage(30.0), _stage(90.0)
    eng.attach(a)  # type: ignore[arg-type]
    eng.attach(b)  # type: ignore[arg-type]
    a.stats.end_s = 60.0
    eng.detach(a)  # type: ignore[arg-type]
    assert eng.overlap_of(a) == pytest.approx(0.5)  # b ran 30 of a's 60 s
    eng.attach(c)  # type: ignore[arg-type]
    b.stats.end_s = 110.0
    eng.detach(b)  # type: ignore[arg-type]
    # a ran 30 of b's 80 s and c 20 (c still running counts to b's end)
    assert eng.overlap_of(b) == pytest.approx(50.0 / 80.0)
    c.stats.end_s = 150.0
    eng.detach(c)  # type: ignore[arg-type]
    assert eng.overlap_of(c) == pytest.approx(20.0 / 60.0)
    assert a.overlapped and b.overlapped and c.overlapped


def test_a_staggered_fill_pays_where_the_engines_are_throughput_bound_and_costs_where_the_cohort_is_free() -> None:
    """``stagger_gain_s``: the fill's first step rolling out alone (steps 1..K joining when its
    rollout ends) ends a throughput-bound pipeline sooner (the cohort twice one step alone, as
    MINT's 1,136 trajectories a step on 768 seats: step 0 drains in 150 s alone, not 300, and
    its training starts that much sooner) and a latency-bound one later (the cohort no slower
    than one step: staggering only serializes the two rollouts)."""
    admit, end, done = _gate(1, 150.0, 156.0, 5, 0.0, 300.0, 75.0, stagger=True)
    assert admit[1] == pytest.approx(end[0]) and end[0] == pytest.approx(150.0)  # step 0 alone
    together = _gate(1, 150.0, 156.0, 5, 0.0, 300.0, 75.0)
    assert together[0][1] == 0.0 and together[1][0] > 200.0  # admitted together, step 0 drains with step 1
    assert stagger_gain_s(1, 150.0, 156.0, 5, 300.0, 75.0) > 0.05 * together[2][-1]
    # latency-bound (the cohort no slower than one step): two steps end later staggered, and a
    # longer run catches up at best (the later steps wait for the syncs either way)
    assert stagger_gain_s(1, 15.0, 12.0, 2, 15.0, 3.0) < 0.0
    assert stagger_gain_s(1, 15.0, 12.0, 5, 15.0, 3.0) <= 1e-9
    assert pipeline_run_s("async", 1, 150.0, 156.0, 5, cohort_s=300.0, load_s=75.0, stagger=True) == pytest.approx(done[-1])
    # K = 2: steps 1 and 2 both join when step 0's rollout ends
    admit2, end2, _ = _gate(2, 150.0, 156.0, 5, 0.0, 300.0, 75.0, stagger=True)
    assert admit2[1] == admit2[2] == pytest.approx(end2[0])
