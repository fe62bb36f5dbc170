"""The KV that trajectories park on their instance while a tool runs.

With ``tool_kv: keep`` a trajectory in a tool call keeps its KV cached (evictable, LRU) on its
instance; when an instance's trajectories hold more than its KV capacity, returning trajectories
find their KV evicted and prefill their whole context again (``sim.instance``). The rollout DP
charges that re-prefill (``RolloutDP.evicted_share``, ``kv_pressure``), and an async search also
prices, per GPU budget, the layout best for the staleness cycle's K + 1 steps in flight together.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.rollout_dp import KV_PRESSURE_FREE, BucketLayout, kv_pressure
from libra.planner.search import Planner, SearchOptions
from libra.planner.stats import compute_stats
from libra.trace.columnar import StepArrays
from tests.test_planner_workload import make_step


def test_the_evicted_share_is_zero_below_the_free_pressure_and_rises_to_one() -> None:
    rho = np.array([0.5, 1.0, KV_PRESSURE_FREE, KV_PRESSURE_FREE + 0.3, 2.0, 2.5, 6.0])
    e = kv_pressure(rho)
    assert (e[:3] == 0.0).all()
    assert (np.diff(e[2:]) > 0).all() and e[-1] > 0.99 and (e <= 1.0).all()
    # the fit's anchors (replayed shares of evicted returns, SIMULATED): 0.53-0.63 at 1.33-1.38,
    # 0.81-0.83 at 1.73 (experiments/results/kv_pressure/)
    assert 0.45 < float(kv_pressure(1.35)) < 0.65 and 0.75 < float(kv_pressure(1.73)) < 0.9


def test_resident_and_return_contexts_are_the_contexts_at_the_tool_calls() -> None:
    """One trajectory: prompt 100, turns (gen 50, tool 30), (gen 20, tool 10), (gen 40, no tool):
    contexts at the calls 150 and 200 (and 250 after the last turn); turn-averaged 200; the
    re-prefill of the two returns 350."""
    from libra.trace.columnar import StepArrays
    from libra.trace.records import Trajectory, Turn

    turns = (Turn(50, "bash", 1.0, 30, "ok"), Turn(20, "bash", 1.0, 10, "ok"), Turn(40, None, None, 0, None))
    step = StepArrays.from_trajectories(0, [Trajectory(id="t", step=0, prompt_tokens=100, turns=turns)])
    st = compute_stats([step], step.prompt_tokens)
    assert st.resident_ctx.sum() == pytest.approx((150 + 200 + 250) / 3)
    assert st.return_ctx.sum() == pytest.approx(150 + 200)
    assert st.tail_return_ctx.sum(1).max() == pytest.approx(150 + 200)


def test_the_in_flight_peak_counts_what_is_held_at_one_moment() -> None:
    """Two trajectories start together (prompt 100 each). A generates 50 tokens and ends: it holds
    150 for 1 s (``INFLIGHT_DECODE_S_PER_TOKEN`` = 0.02). B generates 50, waits 10 s on a tool that
    returns 30, generates 20: it holds 150 for 11 s, then 200 for 0.4 s. At most 300 at once, though
    the turn-averaged contexts sum to 150 + 175."""
    from libra.planner.stats import INFLIGHT_DECODE_S_PER_TOKEN, inflight_peak
    from libra.trace.records import Trajectory, Turn

    assert INFLIGHT_DECODE_S_PER_TOKEN == pytest.approx(0.02)
    a = Trajectory(id="a", step=0, prompt_tokens=100, turns=(Turn(50, None, None, 0, None),))
    b = Trajectory(id="b", step=0, prompt_tokens=100, turns=(Turn(50, "bash", 10.0, 30, "ok"), Turn(20, None, None, 0, None)))
    step = StepArrays.from_trajectories(0, [a, b])
    assert inflight_peak(step) == pytest.approx(300.0)
    st = compute_stats([step], step.prompt_tokens)
    assert st.inflight_ratio == pytest.approx(300.0 / (150.0 + 175.0))
    # a third that holds its 11 tokens through a 5 s tool wait adds them to the first second's peak
    c = Trajectory(id="c", step=0, prompt_tokens=10, turns=(Turn(1, "bash", 5.0, 0, "ok"), Turn(1, None, None, 0, None)))
    assert inflight_peak(StepArrays.from_trajectories(0, [a, b, c])) == pytest.approx(300.0 + 11.0)


def test_a_cohort_that_runs_the_whole_step_together_is_charged_its_evictions() -> None:
    """MCPMark's trajectories (17 turns, all in flight for most of the step) with Llama-3.1-70B:
    two steps' cohort (K = 1) on three TP-4 B200 instances replayed 40% of its tool returns evicted
    and 1,475 s of rollout, on four instances none and 580 s (SIMULATED; experiments/kv_pressure.py).
    The turn-averaged pressure alone (1.14 on three) charged nothing on either."""
    from libra.trace.reader import TraceReader

    step = next(iter(TraceReader("experiments/data/held_out_38/mcpmark-community-mcp-agents-64k.jsonl.gz").steps()))
    cl = ClusterSpec(42, "b200", "llama-3.1-70b")
    stats = compute_stats([step], np.tile(step.prompt_tokens, 2), tail_of=step.n)
    assert stats.inflight_ratio > 0.95  # nearly everything is held at once (SWE: about 0.64)
    dp = Planner(cl).rollout_dp(stats)
    layout = BucketLayout((4,), ())
    three, four = (float(dp.evicted_share(layout, 0, np.array([m]))[0]) for m in (3.0, 4.0))
    assert 0.25 < three < 0.6 and four < 0.05, (three, four)
    assert dp.evaluate(layout, [3])[0] > 1.5 * dp.evaluate(layout, [4])[0]


def test_a_trajectory_never_holds_two_of_its_own_contexts_at_once() -> None:
    """A turn ends where the next begins; computed apart, the two times differed in the last bit on
    half the bundled SWE trace's boundaries, and a peak counted both contexts there (Terminal-Bench's
    few long trajectories: up to 26% too high). One trajectory of 40 turns (11 generated tokens at
    ``INFLIGHT_DECODE_S_PER_TOKEN``, 0.1 s tools, 13 returned): its peak is its largest context
    (counted twice at a boundary, it was 1,350 where it is 1,047)."""
    from libra.planner.stats import inflight_peak
    from libra.trace.records import Trajectory, Turn

    turns = tuple(Turn(11, "bash", 0.1, 13, "ok") for _ in range(39)) + (Turn(11, None, None, 0, None),)
    step = StepArrays.from_trajectories(0, [Trajectory(id="t", step=0, prompt_tokens=100, turns=turns)])
    assert inflight_peak(step) == pytest.approx(100 + 39 * 24 + 11)


def _swe_like(n: int, seed: int) -> StepArrays:
    return make_step(n=n, median=12000, sigma=0.5, seed=seed)


def test_more_trajectories_than_the_kv_holds_pay_the_re_prefill_and_release_pays_it_always() -> None:
    """The same layout and counts: a step whose trajectories park more KV than the instances
    hold is predicted slower than the model without parked KV would say; "release" charges every
    return's whole context."""
    cl = ClusterSpec(16, "h100", "qwen3-32b")
    hist = [_swe_like(256, 1)]
    prompts = np.tile(hist[0].prompt_tokens, 4)  # four steps' trajectories in flight
    keep = Planner(cl).rollout_dp(compute_stats(hist, prompts))
    release = Planner(cl, options=SearchOptions(tool_kv="release")).rollout_dp(compute_stats(hist, prompts))
    layout = BucketLayout((4,), ())
    m = np.array([1.0, 2.0, 4.0])
    share = keep.evicted_share(layout, 0, m)
    assert share[0] > share[1] > 0.0  # fewer instances, more pressure
    assert (release.evicted_share(layout, 0, m) == 1.0).all()
    load_keep, _ = keep.raw_times(layout, 0, m)
    load_release, _ = release.raw_times(layout, 0, m)
    assert (load_release >= load_keep).all()
    # without the parked KV (the statistics' resident contexts emptied) the same layout is faster
    from dataclasses import replace

    blind = Planner(cl).rollout_dp(replace(keep.stats, resident_ctx=np.zeros(0), digest="blind"))
    load_blind, _ = blind.raw_times(layout, 0, m)
    assert load_keep[0] > load_blind[0] * 1.2


def test_an_async_plan_holds_the_kv_of_the_staleness_cycle() -> None:
    """The bundled SWE trace (steps 10-11) on 48 H100 with Qwen3-32B at K = 1, planned from the
    SWE prior as a replay's first step is: two steps' 1,024 trajectories are in flight together.
    One step's best layout, five TP-4 instances on 20 GPUs (session 16's plan), holds one step's
    parked KV but not two (replayed: 1,982 s of rollout, 63% of the returns evicted, against 938 s
    and none for three TP-8 instances, SIMULATED). The plan's instances now hold the cycle, for a
    router that lets a newer step's turns evict an older step's parked KV (``step_priority``
    False, the default price). Libra's router does not (``sim.instance``'s step priority): there
    the two layouts replay steps 10-13 pinned at 676.9 and 677.4 s a step (SIMULATED), and a
    search pricing the cohort without evictions (``step_priority=True``) need not hold it."""
    from libra.planner.rollout_dp import plan_layout
    from libra.trace.reader import TraceReader

    steps = [s for s in TraceReader("traces/swe-qwen3-14b.jsonl.gz").steps() if s.step in (10, 11)]
    cl = ClusterSpec(48, "h100", "qwen3-32b", max_context=32768, max_turns=50, workload="swe")
    planner = Planner(cl, options=SearchOptions(max_staleness=1, mini_batches=4, run_steps=4, step_priority=False))
    plan = planner.plan([], steps[0].prompt_tokens)
    assert plan.mode == "async"
    layout, counts = plan_layout(plan)
    # measured on the two steps that then ran together
    cycle = planner.rollout_dp(compute_stats([steps[0], steps[1]], np.tile(steps[1].prompt_tokens, 2)))
    shares = [float(cycle.evicted_share(layout, b, np.array([float(m)]))[0]) for b, m in enumerate(counts)]
    assert max(shares) < 0.25, (layout, counts, shares)
    assert float(cycle.evicted_share(BucketLayout((4,), ()), 0, np.array([5.0]))[0]) > 0.4  # session 16's layout


def test_a_cohort_under_step_priority_presses_as_one_step_and_waits_for_the_rest() -> None:
    """Libra's routers serve the older steps first on shared engines: a newer step's turn never
    evicts an older step's parked KV, it waits for free KV (``sim.instance``). So the cycle's DP
    under step priority (``RolloutDP.step_priority``, ``steps`` = K + 1) charges each step's
    returns the eviction one step alone has, and the cycle takes at least the rollout alone once
    per wave its parked KV needs (``RolloutDP.waves``, ``Planner._cohort_s``), where the plain
    DP (the baselines' engines, which evict LRU across steps) presses the whole cycle's KV.

    MCPMark's first step: on three TP-4 instances of Llama-3.1-70B on B200 the plain cycle
    re-prefills 43% of the returns (1,644 s of load against 473 s alone); under step priority
    none (675 s) and 1.27 waves. On three TP-4 instances of Qwen3-32B on A100 one step alone
    already evicts 31%, the cycle under step priority the same, and its KV needs both waves; its
    cycle is priced at twice the rollout alone. Replayed on 46 A100 (held_out_53, K = 1) the
    evicting price put two steps sharing two TP-8 engines at 4,671 s where they ran 1,419 s
    (SIMULATED)."""
    from libra.trace.reader import TraceReader

    step = next(iter(TraceReader("experiments/data/held_out_38/mcpmark-community-mcp-agents-64k.jsonl.gz").steps()))
    planner = Planner(ClusterSpec(42, "b200", "llama-3.1-70b"))
    assert not planner.options.step_priority  # the baselines' engines; ``LibraPolicy`` sets it
    stats = compute_stats([step], np.tile(step.prompt_tokens, 2), tail_of=step.n)
    plain, ranked = planner.rollout_dp(stats), planner.rollout_dp(stats, step_priority=True, steps=2)
    assert plain is not ranked and planner.rollout_dp(stats, step_priority=True, steps=2) is ranked  # memoized apart
    assert planner.rollout_dp(stats, step_priority=True) is not ranked
    alone = planner.rollout_dp(compute_stats([step], step.prompt_tokens))
    layout, m = BucketLayout((4,), ()), np.array([3.0])
    assert float(plain.evicted_share(layout, 0, m)[0]) > 0.25
    assert float(ranked.evicted_share(layout, 0, m)[0]) == pytest.approx(float(alone.evicted_share(layout, 0, m)[0]))
    load_plain, _ = plain.raw_times(layout, 0, m)
    load_ranked, _ = ranked.raw_times(layout, 0, m)
    alone_load, _ = alone.raw_times(layout, 0, m)
    assert float(load_ranked[0]) < 0.6 * float(load_plain[0])
    assert float(load_ranked[0]) > 1.2 * float(alone_load[0])  # two steps' work still shares the engines
    assert 1.1 < ranked.waves(layout, [3]) < 2.0 and plain.waves(layout, [3]) == 1.0
    assert ranked.evicts(layout, [3])  # the cycle does not fit together: offered the cycle's layout (K >= 2)
    assert ranked.waves(layout, [12]) == 1.0  # twelve instances hold both steps

    a100 = Planner(ClusterSpec(46, "a100", "qwen3-32b"), options=SearchOptions(tps=(4,), max_buckets=1, step_priority=True))
    one = a100.rollout_dp(compute_stats([step], step.prompt_tokens))
    cycle = a100.rollout_dp(stats, step_priority=True, steps=2)
    ro = one.best(12)
    assert ro is not None and ro.layout == layout and list(ro.counts) == [3]
    assert float(one.evicted_share(layout, 0, m)[0]) > 0.25
    assert float(cycle.evicted_share(layout, 0, m)[0]) == pytest.approx(float(one.evicted_share(layout, 0, m)[0]))
    assert cycle.waves(layout, [3]) == 2.0  # at most the K + 1 steps: then they run one after another
    assert Planner._cohort_s(cycle, ro) == pytest.approx(max(cycle.scenario_makespan(layout, [3], 0.0), 2.0 * ro.makespan_s))
    assert Planner._cohort_s(cycle, ro) >= 2.0 * ro.makespan_s
