"""Issue 17: asynchronous continuous generation (``sim.engines``) and the planner's price of it.

Real asynchronous RL systems (AReaL, NeMo RL async GRPO, verl fully_async) keep their engines
generating: while step j's long tail still decodes, freed slots take step j+1's prompts, within the
staleness bound. The simulator used to run each step's rollout as a batch whose tail gated the next
one (NeMo RL Qwen3-30B-A3B, 8 steps off: +146% over the published step). Now a step whose plan
keeps the previous step's instances runs on the same engines, its prompts admitted once the
previous step's trajectories are all seated and the staleness gate is open; the planner prices
exactly that loop (``libra.planner.search.step_time``)."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan

from libra.cluster import ClusterSpec
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from sim.loop import SimConfig, Simulator

CLUSTER = ClusterSpec(16, "fake", "fake")


def _long_tail_step(step: int, n: int = 40, seed: int = 0) -> StepArrays:
    """``n`` one-turn trajectories of 20-200 tokens, and one of 4,000 (the tail)."""
    rng = np.random.default_rng([seed, step])
    gen = [int(g) for g in rng.integers(20, 200, n - 1)] + [4000]
    trajs = [Trajectory(id=f"s{step}-t{i}", step=step, prompt_tokens=100, turns=(Turn(g, None),), group=f"g{i // 4}",
                        reward=0.5, finish="stop") for i, g in enumerate(gen)]
    return StepArrays.from_trajectories(step, trajs)


def _run(steps, plan, **cfg):  # type: ignore[no-untyped-def]
    sim = Simulator(steps, FixedPolicy(plan), CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, **cfg))
    return sim, sim.run()


@pytest.mark.parametrize("k", [1, 2])
def test_next_rollout_fills_the_tail_and_every_trajectory_completes_once(k: int) -> None:
    """Async K >= 1, a long-tail step: step j+1's trajectories start on the engines before step
    j's last one finishes; every trajectory completes exactly once with its tokens; each step's
    metrics are its own; the rollout GPUs are booked once for the shared engines and released."""
    steps = [_long_tail_step(s) for s in range(4)]
    sim, res = _run(steps, simple_plan(2, 2), mode="async", max_staleness=k)
    for s, m in zip(steps, res.steps):
        assert m.completed == m.n_traj == s.n
        assert m.gen_tokens == int(s.total_gen_tokens.sum())
        assert m.rollout_makespan_s > 0
    ends = [m.rollout_start_s + m.rollout_makespan_s for m in res.steps]
    assert any(b.rollout_start_s < end for b, end in zip(res.steps[1:], ends))  # overlapped with the tail
    assert res.steps[1].rollout_start_s < ends[0]
    assert all(o is None for o in sim.ledger.owner)  # everything released, nothing leaked
    # one booking per rollout instance (shared by every step) and one per training
    assert sim.ledger.bookings == 2 + len(steps)
    assert all(e is sim._engines_of[0] for e in sim._engines_of)


def test_long_tail_async_is_faster_than_the_batch_per_step_loop() -> None:
    """The tail's free slots do the next step's work: the async run beats sync by more than the
    training overlap alone (training here is short next to the tail)."""
    steps = [_long_tail_step(s) for s in range(6)]
    _, sync = _run(steps, simple_plan(2, 2), mode="sync")
    _, asyn = _run(steps, simple_plan(2, 2), mode="async", max_staleness=2)
    roll = sum(m.rollout_makespan_s for m in sync.steps)
    assert asyn.wall_s < roll  # below even back-to-back batch rollouts


def test_a_changed_plan_waits_for_the_tail_as_before() -> None:
    """A plan that moves instances cannot share the engines: its rollout starts after the
    previous one ended (the batch-per-step loop), and the old engines' GPUs are released first."""

    class Moving(FixedPolicy):
        def plan(self, cluster, history, prompt_tokens):  # type: ignore[no-untyped-def]
            self.histories.append(len(history))
            return simple_plan(n_inst=2) if len(self.histories) % 2 else simple_plan(n_inst=3)

    steps = [_long_tail_step(s) for s in range(3)]
    sim = Simulator(steps, Moving(simple_plan()), CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, mode="async", max_staleness=1))
    res = sim.run()
    for a, b in zip(res.steps, res.steps[1:]):
        assert b.rollout_start_s >= a.rollout_start_s + a.rollout_makespan_s - 1e-9
    assert res.completed == res.expected
    assert all(o is None for o in sim.ledger.owner)


def _sync_runs() -> list[float]:
    """Sync and sync + streaming replays (fake costs, noise on): their numbers before continuous
    generation existed, to the last bit (pinned in ``test_sync_and_streaming_are_unchanged``)."""
    steps = [make_step(s, 40, seed=1, trailing_tool_every=7) for s in range(3)]
    out = []
    for streaming in (None, True):
        for kv in ("keep", "release"):
            sim = Simulator(steps, FixedPolicy(simple_plan(3, 2)), CLUSTER, fake_costs(kv_tokens=3000),
                            SimConfig(mode="sync", streaming=streaming, kv_mode=kv))
            res = sim.run()
            out += [res.wall_s] + [m.rollout_makespan_s for m in res.steps] + [m.step_s for m in res.steps]
    return out


def test_sync_and_streaming_are_unchanged() -> None:
    """On-policy loops never share engines (one stage per step, its own instances) and give the
    same numbers as before continuous generation (values from commit ccccda8), to 1e-12: not bit
    for bit, because NumPy's reductions may differ in the last bit between CPUs (one value of 28
    differed by one ulp on session 11's machine, at ccccda8's descendants before and after its
    changes alike)."""
    assert _sync_runs() == pytest.approx(PINNED_SYNC, rel=1e-12, abs=0.0)
    steps = [make_step(s, 20, seed=2) for s in range(2)]
    sim, _ = _run(steps, simple_plan(), mode="sync")
    assert sim._engines_of == [None, None]


PINNED_SYNC: list[float] = [
    49.8084746479526, 13.518280985547465, 15.29403674099786, 15.13260743444885, 15.444519866563255,
    17.259272459376078, 17.104682322013268, 48.44149596761176, 12.065869914804749, 15.657208841807616,
    14.854867724040968, 13.992108795820538, 17.622444560185833, 16.826942611605386, 46.444306872381986,
    13.518280985547465, 15.294036740997857, 15.132607434448861, 14.3856476080209, 16.079035642674526,
    15.97962362168656, 45.26306894535162, 12.065869914804749, 15.657208841807618, 14.854867724040968,
    13.118977290588665, 16.44220774348429, 15.701883911278667
]


@pytest.mark.parametrize("k", [1, 2])
def test_planner_async_price_matches_the_simulated_steady_state(k: int) -> None:
    """Noise off, a long-tailed workload (lognormal lengths, sigma 1): the planner's async step for
    its plan is within 10% of the simulator's steady state (whole staleness cycles averaged) of
    that plan. The batch-per-step price, max(rollout, train + sync), was +56% (K=1) and +94% (K=2)
    off here."""
    from cost_models import CostEvaluator
    from libra.planner.search import Planner, SearchOptions
    from sim.costs import SimCosts

    def step(s: int, seed: int) -> StepArrays:
        rng = np.random.default_rng([seed, s])
        gen = np.clip(rng.lognormal(np.log(600) - 0.5, 1.0, 256), 16, 6000).astype(int)
        trajs = [Trajectory(id=f"s{s}-t{i}", step=s, prompt_tokens=200, turns=(Turn(int(g), None),), group=f"g{i // 8}",
                            reward=0.5, finish="stop") for i, g in enumerate(gen)]
        return StepArrays.from_trajectories(s, trajs)

    ev = CostEvaluator("h100", "qwen3-8b")
    cl = ClusterSpec(16, "h100", "qwen3-8b", max_context=6400)
    hist = [step(s, 1) for s in range(2)]
    plan = Planner(cl, ev, SearchOptions(mode="async", max_staleness=k, colocated=False, max_buckets=1)).plan(hist, hist[-1].prompt_tokens)
    n = 3 * (k + 1) + 2
    steps = [step(s, 2) for s in range(n)]
    res = Simulator(steps, FixedPolicy(plan), cl, SimCosts(ev), SimConfig(noise_sigma=0.0, max_staleness=k, mode="async")).run()
    per = 2 * (k + 1)
    sim_s = (res.steps[-1].step_end_s - res.steps[-1 - per].step_end_s) / per
    pred = float(plan.notes["loop_step_s"]["async"])  # type: ignore[index]
    assert pred == pytest.approx(sim_s, rel=0.10)
    old = max(plan.predicted_rollout_s, plan.predicted_train_s + float(plan.notes["sync_s"]))  # type: ignore[arg-type]
    assert abs(old / sim_s - 1) > 0.3  # the batch-per-step price was far off


@pytest.mark.parametrize("k", [1, 2])
def test_per_step_generation_is_libra_runs_loop(k: int) -> None:
    """``SimConfig.continuous`` False (``--async-generation per-step``, how libra-run's async loop
    runs and is replayed): each step's rollout starts only after the previous one's tail, no
    engines are shared, and the planner prices that loop (``SearchOptions.continuous``) with the
    rollout makespan, not the engines' throughput."""
    from cost_models import CostEvaluator
    from libra.planner.search import Planner, SearchOptions

    steps = [_long_tail_step(s) for s in range(4)]
    sim, res = _run(steps, simple_plan(2, 2), mode="async", max_staleness=k, continuous=False)
    ends = [m.rollout_start_s + m.rollout_makespan_s for m in res.steps]
    assert all(b.rollout_start_s >= end - 1e-9 for b, end in zip(res.steps[1:], ends))
    assert all(e is None for e in sim._engines_of)
    assert all(m.completed == m.n_traj for m in res.steps)
    _, cont = _run(steps, simple_plan(2, 2), mode="async", max_staleness=k)
    assert cont.wall_s < res.wall_s  # the shared engines fill the tail

    cl = ClusterSpec(16, "a800", "qwen3-8b")
    ev = CostEvaluator(gpu="a800", model="qwen3-8b")
    hist = [make_step(s, 64, seed=3) for s in range(2)]
    per_step = Planner(cl, ev, SearchOptions(mode="async", max_staleness=k, continuous=False)).search(hist, hist[-1].prompt_tokens)
    c = per_step.best
    assert c.mode_step_s["async"] == pytest.approx(max(c.rollout_s, c.train_s + c.sync_s))


def test_a_sync_step_after_async_ones_waits_only_for_their_sync_and_the_cycle_tail_is_one_steps() -> None:
    """A sync step right after async ones starts its rollout when the last async step has synced
    (``sim.loop``'s gate), the moment an async step would have waited for that training too: its
    step time, from that step's end, is its own rollout, training and sync, with no wait for the
    in-force training beyond it. So leaving async costs the planner its transition only; the
    wait it had charged too (``leave_async_s``, added after held_out_3) counted the in-force training twice,
    and kept WebChoreArena on 40 A800 / Qwen3-32B (K=1, 7,360 s of training a step on 24 GPUs) on
    its async split where a time-shared plan ran 5,615 s a step (held_out_55, 0.618x, SIMULATED).
    The staleness cycle's statistics take one step's expected longest trajectory as their tail
    (``tail_of``), as every other loop's price does, not a quantile beyond what the window
    resolves."""
    from dataclasses import replace as _replace

    from libra.planner.stats import compute_stats

    asy = _replace(simple_plan(2, 2), mode="async", max_staleness=1)
    syn = _replace(asy, mode="sync", max_staleness=0)

    class AsyncThenSync(FixedPolicy):
        def plan(self, cluster: object, history: object, prompt_tokens: object) -> object:
            self.histories.append(1)
            return asy if len(self.histories) <= 3 else syn

    steps = [make_step(s, 32, seed=4) for s in range(5)]
    res = Simulator(steps, AsyncThenSync(asy), ClusterSpec(16, "fake", "fake"), fake_costs(),
                    SimConfig(noise_sigma=0.0, max_staleness=1)).run()
    m2, m3, m4 = res.steps[2], res.steps[3], res.steps[4]
    assert [m.mode for m in res.steps] == ["async"] * 3 + ["sync"] * 2
    assert m3.rollout_start_s == pytest.approx(m2.step_end_s)  # it waited for step 2's sync, no more
    for m in (m3, m4):
        assert m.step_s == pytest.approx(m.rollout_makespan_s + m.train_s + m.sync_s + m.transition_s, rel=1e-9)
    hist = [_long_tail_step(s, n=40, seed=s) for s in range(3)]
    prompts = hist[-1].prompt_tokens
    cycle = compute_stats(hist, np.tile(prompts, 2), tail_of=len(prompts))
    wide = compute_stats(hist, np.tile(prompts, 2))
    one = compute_stats(hist, prompts)
    assert cycle.tail_context == one.tail_context <= wide.tail_context
    assert cycle.n_trajectories == wide.n_trajectories == 2 * one.n_trajectories


def test_a_running_pipeline_prices_a_new_layouts_drain_in_its_transition() -> None:
    """With an async plan in force, every async candidate on other rollout instances pays, once,
    the wait for the step in flight to drain (``SearchResult.drain_s``, as the simulator starts
    a new layout only after the previous rollout: ``test_a_changed_plan_waits_for_the_tail_as_before``);
    the plan in force's own instances pay none. Unpriced, Libra moved a K = 1 pipeline for a
    1.3 s re-shard and its next step waited out a 460 s rollout (tb-mini-swe, 36 B200, held_out_49,
    SIMULATED)."""
    from test_planner_workload import make_history

    from libra.planner.search import Planner, SearchOptions

    cl = ClusterSpec(16, "a800", "qwen3-8b")
    hist = make_history(3, n=64)
    planner = Planner(cl, options=SearchOptions(mode="async", max_staleness=1))
    in_force = planner.plan(hist, hist[-1].prompt_tokens)
    assert in_force.mode == "async"
    res = planner.search(hist, hist[-1].prompt_tokens, current=in_force)
    assert res.drain_s > 0.0
    moved = [c for c in res.candidates if c.mode == "async" and tuple(c.rollout.instances) != tuple(in_force.instances)]
    kept = [c for c in res.candidates if tuple(c.rollout.instances) == tuple(in_force.instances)]
    assert moved and kept
    assert all(c.transition_s >= res.drain_s for c in moved)
    assert min(c.transition_s for c in kept) < res.drain_s
    # no async plan in force: nothing to drain
    assert planner.search(hist, hist[-1].prompt_tokens).drain_s == 0.0
    # every planned step's rollout ended (the gate after the fill): nothing to drain either; the
    # previous step known to be rolling out: the wait where one is running, at least the mean
    assert planner.search(hist, hist[-1].prompt_tokens, current=in_force, rollouts_in_flight=0).drain_s == 0.0
    assert planner.search(hist, hist[-1].prompt_tokens, current=in_force, rollouts_in_flight=1).drain_s >= res.drain_s


def test_the_replanner_counts_the_steps_whose_rollout_has_not_ended() -> None:
    """A K = 1 pipeline plans steps 0 and 1 before any rollout ended and step 2 when step 0's
    sync opens its gate: the search is told how many planned rollouts are still running."""
    from test_planner_workload import make_history

    from libra.planner.search import Planner, Replanner, SearchOptions

    seen: list[int | None] = []

    class Recording(Planner):
        def search(self, history, prompt_tokens, current=None, rollouts_in_flight=None):  # type: ignore[no-untyped-def]
            seen.append(rollouts_in_flight)
            return super().search(history, prompt_tokens, current, rollouts_in_flight)

    hist = make_history(3, n=32)
    rp = Replanner(Recording(ClusterSpec(16, "a800", "qwen3-8b"), options=SearchOptions(mode="async", max_staleness=1)))
    rp.plan([], hist[0].prompt_tokens)  # step 0: nothing ran
    rp.plan(hist[:1], hist[1].prompt_tokens)  # step 1, step 0's rollout ended
    rp.plan(hist[:1], hist[2].prompt_tokens)  # step 2, step 1 still rolling out
    rp.plan(hist[:3], hist[2].prompt_tokens)  # step 3, every rollout ended
    assert seen[-3:] == [0, 1, 0]


@pytest.mark.parametrize("gantt_step", [0, 1, 3])
def test_recording_a_gantt_observes_the_shared_engines_and_changes_nothing(gantt_step: int) -> None:
    """``--out`` records step 0's Gantt; that step used to run without shared engines, so the
    replay written to disk was another simulation (verl-static-uniform, never-lose SWE trace,
    K=1: 267.5 s per step with the Gantt against 250.5 s without). Now the Gantt observes the
    shared engines' batches and every step's times are the same."""
    steps = [_long_tail_step(s) for s in range(4)]
    _, plain = _run(steps, simple_plan(2, 2), mode="async", max_staleness=1)
    _, seen = _run(steps, simple_plan(2, 2), mode="async", max_staleness=1, gantt_step=gantt_step)
    assert [m.step_s for m in seen.steps] == [m.step_s for m in plain.steps]
    assert [m.rollout_makespan_s for m in seen.steps] == [m.rollout_makespan_s for m in plain.steps]
    assert seen.gantt and seen.gantt_step == gantt_step and not plain.gantt
    assert all(b > a >= 0 and batch >= 0 for _, _, a, b, batch in seen.gantt)


def test_engines_are_retired_once() -> None:
    """Two steps share the engines (K=1, continuous generation) and the next plan moves the
    instances, so the engines close. When both steps' rollouts end at the same instant, each
    step's end sees them closing and idle; both retired them, and the second released GPUs
    nobody held (``InvariantViolation``: held_out_30 ``fireact-hotpotqa/b200-32-l70b/K1``, in one
    of areal-static-optimal's hindsight replays of a candidate plan, SIMULATED). Retiring is
    now idempotent: a second call changes nothing."""
    steps = [_long_tail_step(s) for s in range(3)]
    sim, res = _run(steps, simple_plan(2, 2), mode="async", max_staleness=1)
    eng = sim._engines_of[0]
    assert eng is not None and eng.retired and res.completed == res.expected
    bookings = sim.ledger.bookings
    sim._retire(eng)  # the second step's end, at the same instant
    assert sim.ledger.bookings == bookings and all(o is None for o in sim.ledger.owner)


def test_the_planner_prices_leaving_async_at_its_transition_only() -> None:
    """The time-shared and sync candidates searched from an async plan in force carry the plan
    transition and nothing for the in-force training (the simulator's gate above)."""
    from cost_models import CostEvaluator
    from libra.planner.search import Planner, SearchOptions
    from libra.planner.transfers import transition_s

    cluster = ClusterSpec(16, "a800", "qwen3-8b")
    ev = CostEvaluator("a800", "qwen3-8b")
    hist = [make_step(s, 64, seed=3) for s in range(2)]
    prompts = hist[-1].prompt_tokens
    current = Planner(cluster, ev, SearchOptions(mode="async", max_staleness=1)).plan(hist, prompts)
    assert current.mode == "async" and current.predicted_train_s > 0
    res = Planner(cluster, ev, SearchOptions(max_staleness=1))._search(hist, prompts, current, None, bound=False)
    left = [c for c in res.candidates if c.mode != "async"]
    assert left and any(c.colocated for c in left)
    for c in left:
        assert c.transition_s == pytest.approx(transition_s(ev, cluster, current, c.n_train, c.train, c.rollout.instances))


def test_a_plan_that_staggers_the_fill_rolls_its_step_out_alone() -> None:
    """``Plan.stagger_fill``: the next step's prompts join the shared engines when this step's
    rollout ends, not once its trajectories are seated; every trajectory still completes once.
    Without it, step 1 joins step 0's engines while step 0 still rolls out (the cohort)."""
    from dataclasses import replace as _replace

    asy = _replace(simple_plan(2, 2), mode="async", max_staleness=1)
    first = _replace(asy, stagger_fill=True)

    class StaggerFirst(FixedPolicy):
        def plan(self, cluster: object, history: object, prompt_tokens: object) -> object:
            self.histories.append(1)
            return first if len(self.histories) == 1 else asy

    steps = [make_step(s, 32, seed=4) for s in range(4)]
    cfg = SimConfig(noise_sigma=0.0, max_staleness=1)
    staggered = Simulator(steps, StaggerFirst(asy), ClusterSpec(16, "fake", "fake"), fake_costs(), cfg).run()
    together = Simulator(steps, FixedPolicy(asy), ClusterSpec(16, "fake", "fake"), fake_costs(), cfg).run()
    s0, s1 = staggered.steps[0], staggered.steps[1]
    assert s1.rollout_start_s == pytest.approx(s0.rollout_start_s + s0.rollout_makespan_s)
    assert together.steps[1].rollout_start_s < together.steps[0].rollout_makespan_s
    assert staggered.steps[2].rollout_start_s > s1.rollout_start_s  # only the fill is staggered
    for res in (staggered, together):
        assert all(m.completed == m.n_traj for m in res.steps)


def test_the_planner_staggers_a_throughput_bound_fill_only() -> None:
    """``Planner.staggered``: an async plan that starts a pipeline over many trajectories a step
    (the engines throughput-bound) lets its first step roll out alone, and prices the run so
    (``stagger_gain_s``: a lower predicted step); a few trajectories a step do not (the cohort
    costs little more than one step), and a plan searched while an async pipeline runs never
    does (its fill is past)."""
    from dataclasses import replace

    from test_planner_workload import make_history

    from libra.planner.search import STAGGER_MARGIN, Planner, Replanner, SearchOptions
    from libra.planner.stats import PriorSpec

    cl = ClusterSpec(16, "a800", "qwen3-8b")
    busy = make_history(1, n=2048)
    planner = Planner(cl, options=SearchOptions(mode="async", max_staleness=1, run_steps=6))
    plan = planner.plan(busy, busy[-1].prompt_tokens)
    raw = planner._search(busy, busy[-1].prompt_tokens, None, PriorSpec.of(cl)).best  # before the fill's choice
    assert plan.mode == "async" and plan.stagger_fill and not raw.stagger_fill
    assert planner.stagger_gain(raw, planner.fill_steps(1)) >= STAGGER_MARGIN
    assert plan.predicted_step_s < raw.step_s
    running = planner.search(busy, busy[-1].prompt_tokens, current=plan).best
    assert not running.stagger_fill
    # the launch plan kept for the next step (planned before any rollout ended) does not stagger again
    keep = Replanner(planner, current=replace(plan, notes={**plan.notes, "from_prior": True}))
    kept = keep.plan((), busy[-1].prompt_tokens)
    assert kept.n_train_gpus == plan.n_train_gpus and not kept.stagger_fill
    few = make_history(1, n=16)
    quiet = Planner(cl, options=SearchOptions(mode="async", max_staleness=1, run_steps=6))
    assert not quiet.plan(few, few[-1].prompt_tokens).stagger_fill


def test_a_fill_staggers_only_where_the_prior_scenarios_agree_on_average() -> None:
    """``Planner.staggered`` with prior scenarios (a hedged launch's): the plan staggers when the scenarios' mean gain reaches
    ``STAGGER_MARGIN``, and keeps the cohort when most scenarios see the cycle cost no more than
    one step alone (latency-bound steps: staggering would serialize two rollouts)."""
    from dataclasses import replace as _replace
    from types import SimpleNamespace

    from test_planner_workload import make_history

    from libra.planner.search import STAGGER_MARGIN, Planner, SearchOptions
    from libra.planner.stats import PriorSpec

    cl = ClusterSpec(16, "a800", "qwen3-8b")
    busy = make_history(1, n=2048)
    planner = Planner(cl, options=SearchOptions(mode="async", max_staleness=1, run_steps=6))
    raw = planner._search(busy, busy[-1].prompt_tokens, None, PriorSpec.of(cl)).best
    steps = planner.fill_steps(0)
    assert planner.stagger_gain(raw, steps) >= STAGGER_MARGIN
    flat = _replace(raw, cohort_s=raw.rollout.makespan_s)  # the cycle no slower than one step alone
    assert planner.stagger_gain(flat, steps) < STAGGER_MARGIN / 2
    agree = [SimpleNamespace(stats_spec=PriorSpec(workload=w), candidates=[raw]) for w in ("swe", "math")]
    assert planner.staggered(raw, None, 0, agree).stagger_fill
    split = agree[:1] + [SimpleNamespace(stats_spec=PriorSpec(workload=w), candidates=[flat]) for w in ("math", "search")]
    assert not planner.staggered(raw, None, 0, split).stagger_fill
