"""A step's micro-batch and recompute are settled for its own batch (``libra.planner.settle``);
only a layout change is a re-shard (``StepCosts.transition``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from libra.planner.decision_tree import DecisionTree, training_time_fn
from libra.planner.plan import Bucket, Plan, TrainConfig, same_layout
from libra.planner.settle import settle_training
from libra.planner.step_costs import StepCosts
from libra.policies.static import uniform_instances
from sim.costs import SimCosts
from sim.instance import SimulationError
from sim.loop import SimConfig, Simulator
from test_sim_support import FixedPolicy, make_step

#: the layout held_out_10's worst row trained on: sized for a 64K-token prior (Qwen3-32B, 24 B200)
PRIOR_SIZED = TrainConfig(tp=2, pp=1, dp=12, zero_stage=3, micro_batch=1, recompute=True)


@pytest.fixture(scope="module")
def tree() -> DecisionTree:
    ev = CostEvaluator("b200", "qwen3-32b")
    return DecisionTree(StepCosts(ev, 8), 8)


def _plan(n_gpus: int, n_rollout: int, train: TrainConfig) -> Plan:
    inst = uniform_instances(n_rollout, 8, 8)
    return Plan(n_rollout_gpus=n_rollout, n_train_gpus=n_gpus - n_rollout, train=train, instances=inst,
                buckets=(Bucket(0, 8, 0, None),))


def test_a_short_batch_settles_a_larger_micro_batch_in_the_same_layout(tree: DecisionTree) -> None:
    batch = make_step(0, 128, seed=1)
    assert int(batch.total_tokens.max()) < 4096
    got = settle_training(tree, PRIOR_SIZED, batch, [batch], None, 24)
    assert same_layout(got, PRIOR_SIZED)
    assert got.micro_batch > 1
    tokens, seq = int(batch.total_tokens.sum()), int(round(float(batch.total_tokens.mean())))
    timer = training_time_fn(tree.costs, tokens, seq)
    assert timer(got) < 0.6 * timer(PRIOR_SIZED)  # ZeRO-3 gathers the parameters once per micro-batch


def test_a_long_sequence_seen_or_declared_keeps_the_memory_safe_knobs(tree: DecisionTree) -> None:
    batch = make_step(0, 128, seed=1)
    short = settle_training(tree, PRIOR_SIZED, batch, [batch], None, 24)
    # a 64K-token sequence in an earlier step: the strategy must still hold one
    long_step = make_step(0, 4, seed=5, turns=(5, 5), gen=(13000, 13100))
    assert int(long_step.total_tokens.max()) > 65000
    held = settle_training(tree, PRIOR_SIZED, batch, [long_step, batch], None, 24)
    assert held.micro_batch <= short.micro_batch
    declared = settle_training(tree, PRIOR_SIZED, batch, [batch], 66048, 24)
    assert declared.micro_batch <= short.micro_batch and same_layout(declared, PRIOR_SIZED)
    # a user's micro-batch pin is kept
    pinned = settle_training(tree, PRIOR_SIZED, batch, [batch], None, 24, micro_batch=1)
    assert pinned.micro_batch == 1 and same_layout(pinned, PRIOR_SIZED)


def test_a_knob_change_is_not_a_reshard_and_a_layout_change_is() -> None:
    sc = StepCosts(CostEvaluator("b200", "qwen3-32b"), 8)
    cur = _plan(48, 24, PRIOR_SIZED)
    knobs = dataclasses.replace(PRIOR_SIZED, micro_batch=4, recompute=False)
    t = sc.transition(cur, 24, knobs, cur.instances)
    assert not t.train_changed and t.total_s == 0.0
    zero1 = dataclasses.replace(knobs, zero_stage=1)
    t = sc.transition(cur, 24, zero1, cur.instances)
    assert t.train_changed and t.total_s > 0


class Settling(FixedPolicy):
    """A fixed plan whose training knobs are settled to ``to`` (or to another layout)."""

    def __init__(self, plan: Plan, to: TrainConfig) -> None:
        super().__init__(plan)
        self.to = to
        self.calls: list[tuple[int, int]] = []

    def settle_training(self, plan: Plan, batch: Any, seen: Any) -> TrainConfig:
        self.calls.append((batch.step, len(seen)))
        return self.to


def test_the_simulator_trains_with_the_settled_knobs_and_refuses_a_settled_split_change() -> None:
    ev = CostEvaluator("b200", "qwen3-32b")
    cluster = ClusterSpec(48, "b200", "qwen3-32b")
    steps = [make_step(s, 64, seed=2) for s in range(2)]
    knobs = dataclasses.replace(PRIOR_SIZED, micro_batch=4, recompute=False)
    plan = _plan(48, 24, PRIOR_SIZED)
    pol = Settling(plan, knobs)
    res = Simulator(steps, pol, cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    sc = StepCosts(ev, 8)
    assert pol.calls == [(0, 1), (1, 2)]  # each step at its training start, with every rollout over by then
    for st, m in zip(steps, res.steps):
        tokens, seq = int(st.total_tokens.sum()), int(round(float(st.total_tokens.mean())))
        assert m.train_s == pytest.approx(training_time_fn(ev, tokens, seq)(knobs) + sc.step_fixed_s(st.n), rel=1e-12)
        assert m.transition_s == 0.0
    bad = Settling(plan, dataclasses.replace(PRIOR_SIZED, dp=11))
    with pytest.raises(SimulationError, match="split change"):
        Simulator(steps, bad, cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()


def test_a_settled_layout_is_one_reshard_and_the_trainer_then_holds_it() -> None:
    """A policy may settle another layout on the plan's training GPUs (Libra's first training,
    ``first_layout``): the simulator charges the re-shard once (``StepCosts.lend_s``, a plan
    transition's price), and a later step trained in the layout the trainer holds pays none,
    whatever its plan carried. Before, any settled layout change was refused. The first
    training's re-shard moves only bf16 weights (``StepCosts.build_s``): no update has made
    gradients or optimizer state yet, so the full re-shard (``lend_s``) would over-charge it."""
    ev = CostEvaluator("b200", "qwen3-32b")
    cluster = ClusterSpec(48, "b200", "qwen3-32b")
    steps = [make_step(s, 64, seed=2) for s in range(3)]
    zero1 = dataclasses.replace(PRIOR_SIZED, zero_stage=1, micro_batch=1, recompute=False)  # fits in memory
    res = Simulator(steps, Settling(_plan(48, 24, PRIOR_SIZED), zero1), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    sc = StepCosts(ev, 8)
    assert [m.transition_s for m in res.steps] == pytest.approx([sc.build_s(zero1), 0.0, 0.0], rel=1e-12)
    assert 0.0 < sc.build_s(zero1) < sc.lend_s(zero1, 1) / 2
    for st, m in zip(steps, res.steps):
        tokens, seq = int(st.total_tokens.sum()), int(round(float(st.total_tokens.mean())))
        assert m.train_s == pytest.approx(training_time_fn(ev, tokens, seq)(zero1) + sc.step_fixed_s(st.n), rel=1e-12)


def test_the_first_training_moves_a_prior_sized_layout_only_when_the_gain_pays_the_reshard() -> None:
    """Qwen3-30B-A3B on 16 H100, planned for a 64K-token prior (ZeRO-3, TP 2, no expert
    parallelism): on a batch of short sequences another layout trains about 1.1 s faster a
    step. Before any update the re-shard loads only bf16 weights, about 0.6 s (``build_s``;
    the whole training state, ``lend_s``, would take about 3.2 s), so it moves even when the
    gain is paid over one step (``libra.planner.settle.first_layout``)."""
    from libra.planner.settle import first_layout

    ev = CostEvaluator("h100", "qwen3-30b-a3b")
    tree = DecisionTree(StepCosts(ev, 8), 8)
    prior = TrainConfig(tp=2, pp=1, dp=8, zero_stage=3, micro_batch=1, recompute=True)
    batch = make_step(0, 128, seed=1)
    settled = settle_training(tree, prior, batch, [batch], None, 16)
    assert same_layout(settled, prior)
    tokens, seq = int(batch.total_tokens.sum()), int(round(float(batch.total_tokens.mean())))
    timer = training_time_fn(tree.costs, tokens, seq)
    moved = first_layout(tree, settled, batch, [batch], None, 16, 4.0)
    assert not same_layout(moved, prior) and moved.n_gpus == 16
    gain = timer(settled) - timer(moved)
    assert tree.costs.build_s(moved) < gain < tree.costs.lend_s(moved, 1) < 4 * gain
    assert first_layout(tree, settled, batch, [batch], None, 16, 1.0) == moved


def test_the_planner_prices_the_plan_in_force_with_the_knobs_its_next_step_settles() -> None:
    """Staying on the plan in force is priced with the micro-batch and recompute the step will
    settle for its batch, not with the prior-sized knobs the plan carries: the simulator runs the
    settled ones (``sim.loop``), and pricing the stale ones had made staying look 3x slower in
    training than it runs (held_out_13 FireAct, SIMULATED). Before the change the kept candidate
    carried ``PRIOR_SIZED`` itself and its time."""
    from libra.planner.search import Planner, SearchOptions, same_shape

    cluster = ClusterSpec(48, "b200", "qwen3-32b", gpus_per_node=8)
    planner = Planner(cluster, options=SearchOptions(max_staleness=0, streaming=False, colocated=False))
    hist = [make_step(s, 128, seed=3) for s in range(2)]
    current = _plan(48, 24, PRIOR_SIZED)
    res = planner.search(hist, hist[-1].prompt_tokens, current)
    kept = [c for c in res.candidates if same_shape(c, current) and same_layout(c.train, PRIOR_SIZED) and c.transition_s == 0.0]
    assert kept, "the plan in force is always a candidate while it fits"
    c = kept[0]
    assert c.train.micro_batch > 1 and same_layout(c.train, PRIOR_SIZED)
    stale = planner.tree_time(PRIOR_SIZED, *planner.train_shape(res.stats)[:2])
    fixed = c.train_s - planner.tree_time(c.train, *planner.train_shape(res.stats)[:2])
    assert c.train_s - fixed < 0.6 * stale


def test_the_first_re_layout_counts_only_the_run_time_it_saves() -> None:
    """Priced by the run (``run_price``: the steps paid over, in the plan's loop), the same
    re-layout pays over four chain-bound steps, and not in a run whose time does not depend on
    the training (all of it hidden: only the re-shard would count)."""
    from libra.planner.pipeline import pipeline_run_s
    from libra.planner.settle import first_layout

    ev = CostEvaluator("h100", "qwen3-30b-a3b")
    tree = DecisionTree(StepCosts(ev, 8), 8)
    prior = TrainConfig(tp=2, pp=1, dp=8, zero_stage=3, micro_batch=1, recompute=True)
    batch = make_step(0, 128, seed=1)
    settled = settle_training(tree, prior, batch, [batch], None, 16)

    def pipeline(rollout_s: float, steps: int) -> Any:
        return lambda cfg, train_s, reshard_s: pipeline_run_s("async", 1, rollout_s, train_s + 1.0, steps, reshard_s)

    assert not same_layout(first_layout(tree, settled, batch, [batch], None, 16, 4.0, run_price=pipeline(0.5, 4)), prior)
    assert first_layout(tree, settled, batch, [batch], None, 16, 1.0, run_price=lambda cfg, train_s, reshard_s: 60.0 + reshard_s) is settled


def test_a_short_async_run_pays_its_training_chain_at_every_step() -> None:
    """``pipeline_run_s`` is the simulator's gate recurrence: with K=1 and a rollout longer than
    the chain, the steady state hides the chain, but three steps from a standing start pay it
    twice, 2 R + 2 C (held_out_17's worst row: 4.45 s rollouts and a 2.76 s chain, 14.42 s; the
    simulator ran 14.79 s with its measured rollouts)."""
    from libra.planner.pipeline import pipeline_run_s

    assert pipeline_run_s("async", 1, 4.45, 2.76, 3) == pytest.approx(2 * 4.45 + 2 * 2.76)
    assert pipeline_run_s("async", 1, 4.45, 1.33, 3) == pytest.approx(2 * 4.45 + 2 * 1.33)
    # long runs approach the steady state max(rollout, chain) per step ((R + C) / (K + 1) at most)
    long = pipeline_run_s("async", 1, 10.0, 4.0, 200)
    assert 200 * 7.0 <= long <= 200 * 7.0 + 14.0
    assert pipeline_run_s("sync", 0, 4.0, 2.0, 3, 1.5) == pytest.approx(3 * 6.0 + 1.5)
    assert pipeline_run_s("async", 1, 4.45, 1.33, 3, 2.0) == pytest.approx(2 * 4.45 + 2 * 1.33 + 2.0)


def test_a_launch_layout_that_cannot_hold_the_first_batch_is_moved() -> None:
    """A launch layout sized for shorter sequences than the first batch brings (an undeclared
    kind launches for the short scenarios, ``Planner._launch_layout``) is not an option at the
    first training: the simulator charges no OOM, so ``first_layout`` moves it to one that holds
    the batch even where staying would price cheaper."""
    from libra.planner.decision_tree import enumerate_strategies, memory_report
    from libra.planner.settle import batch_shape, first_layout

    ev = CostEvaluator("h100", "qwen3-30b-a3b")
    tree = DecisionTree(StepCosts(ev, 8), 8)
    long_step = make_step(0, 16, seed=5, turns=(5, 5), gen=(6000, 6100))  # 32K-token sequences
    tokens, seq, memory = batch_shape(tree, long_step, [long_step], None, 16)
    timer = training_time_fn(tree.costs, tokens, seq)
    short = [cfg for _, cfg in enumerate_strategies(ev, 16, 16, 2048, 8, timer, bound=False).ranked]
    small = next(cfg for cfg in short if not memory_report(ev, cfg, memory).fits)
    hidden = lambda cfg, train_s, reshard_s: 60.0 + reshard_s  # noqa: E731 - a run whose training is all hidden
    moved = first_layout(tree, small, long_step, [long_step], None, 16, 4.0, run_price=hidden)
    assert moved is not small and memory_report(ev, moved, memory).fits
    fitting = enumerate_strategies(ev, 16, 16, memory, 8, timer, bound=False).ranked[-1][1]  # holds it, the slowest that does
    assert first_layout(tree, fitting, long_step, [long_step], None, 16, 4.0, run_price=hidden) is fitting


def _colocated(n_gpus: int, train: TrainConfig) -> Plan:
    inst = uniform_instances(n_gpus, 8, 8)
    return Plan(n_rollout_gpus=n_gpus, n_train_gpus=n_gpus, train=train, instances=inst,
                buckets=(Bucket(0, 8, 0, None),), colocated=True)


class SettlingOnce(FixedPolicy):
    """A fixed plan whose first training settles ``first`` and every later one ``later``."""

    def __init__(self, plan: Plan, first: TrainConfig, later: TrainConfig) -> None:
        super().__init__(plan)
        self.first, self.later, self.n = first, later, 0

    def settle_training(self, plan: Plan, batch: Any, seen: Any) -> TrainConfig:
        self.n += 1
        return self.first if self.n == 1 else self.later


def test_a_time_shared_plan_re_lays_at_its_first_training_and_then_holds_that_layout() -> None:
    """A time-shared plan's first training may re-lay its layout, as a split's does
    (``first_layout``: nothing has trained, the launch layout was sized for a prior): one weights-
    only re-build (``StepCosts.build_s``), then the trainer holds the new layout. Before, the
    simulator refused any settled layout change of a time-shared plan, so Libra's first
    time-shared step trained the prior's layout (intercode-sql on 24 A800, Qwen3-14B, K=0:
    116.5 s against 104.3 s for verl-colocated, SIMULATED). A later layout change is still a
    plan transition, refused when only settled."""
    ev = CostEvaluator("b200", "qwen3-32b")
    cluster = ClusterSpec(24, "b200", "qwen3-32b")
    steps = [make_step(s, 64, seed=2) for s in range(3)]
    zero1 = dataclasses.replace(PRIOR_SIZED, zero_stage=1, micro_batch=1, recompute=False)  # fits in memory
    plan = _colocated(24, PRIOR_SIZED)
    res = Simulator(steps, SettlingOnce(plan, zero1, zero1), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    sc = StepCosts(ev, 8)
    assert [m.transition_s for m in res.steps] == pytest.approx([sc.build_s(zero1), 0.0, 0.0], rel=1e-12)
    for st, m in zip(steps, res.steps):
        tokens, seq = int(st.total_tokens.sum()), int(round(float(st.total_tokens.mean())))
        assert m.train_s == pytest.approx(training_time_fn(ev, tokens, seq)(zero1) + sc.step_fixed_s(st.n), rel=1e-12)
    # after the first training, a layout neither planned nor held is a transition, not a settle
    other = dataclasses.replace(PRIOR_SIZED, tp=4, dp=6)
    with pytest.raises(SimulationError, match="split change"):
        Simulator(steps, SettlingOnce(plan, zero1, other), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()


def test_only_a_plan_made_before_the_first_training_follows_its_re_layout() -> None:
    """The first training's re-layout (``first_layout``) applies to the plans made before it,
    which carry the layout it left (at K >= 1, or the next step planned as a rollout ends). A
    plan made after it chose its layout knowing the one the trainer holds, so a plan carrying
    the old layout then is the planner's move back, priced as a transition. Before, every plan
    carrying the old layout was mapped to the new one, and the trainer kept a layout the
    planner had left (a time-shared intercode-sql run on 24 A800, Qwen3-14B, K=0: 108 s a step
    where the planned layout trains in 103 s; SIMULATED)."""
    from libra.policies import PolicyOptions, resolve

    cluster = ClusterSpec(24, "b200", "qwen3-32b")
    pol = resolve("libra", cluster, PolicyOptions())
    batch = make_step(0, 64, seed=2)
    before = pol.plan(cluster, (), batch.prompt_tokens)
    moved = dataclasses.replace(before.train, zero_stage=1, micro_batch=4, recompute=False)
    if same_layout(moved, before.train):
        moved = dataclasses.replace(moved, zero_stage=2)
    pol._relayout, pol._trained = (before.train, moved), True  # as the first training's ``first_layout`` leaves it
    after = dataclasses.replace(before, notes=dict(before.notes))  # the same layout, planned after it
    assert pol._relaid(before) == moved
    assert pol._relaid(after) is after.train


class PlansBySteps(FixedPolicy):
    """A fixed plan per step (the last one repeats), each settled to ``settled[step]`` when given."""

    def __init__(self, plans: list[Plan], settled: dict[int, TrainConfig]) -> None:
        super().__init__(plans[0])
        self.plans, self.settled = plans, settled

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
        self.histories.append(len(history))
        return self.plans[min(len(history), len(self.plans) - 1)]

    def settle_training(self, plan: Plan, batch: Any, seen: Any) -> TrainConfig:
        return self.settled.get(batch.step, plan.train)


def test_a_time_shared_plan_that_re_shards_may_settle_a_layout_that_holds_its_batch() -> None:
    """A time-shared plan that moves off the layout its trainer holds re-shards anyway; when its
    planned layout cannot hold the batch (a sequence longer than any the plan was made from),
    the settle's memory re-layout onto another layout of its GPUs is that re-shard, charged as
    one. Refused before: Workbench on 38 H100 / Llama-3.1-70B stopped at step 1, a time-shared
    plan moving to TP 1 x DP 38 whose batch brought 17,382 tokens (held_out_53, SIMULATED). A
    plan that keeps the held layout still may not settle another (the test above)."""
    ev = CostEvaluator("b200", "qwen3-32b")
    cluster = ClusterSpec(24, "b200", "qwen3-32b")
    steps = [make_step(0, 8, seed=5), make_step(1, 8, seed=5, turns=(5, 5), gen=(20000, 20100)), make_step(2, 8, seed=6)]
    longest = int(steps[1].total_tokens.max())
    planned = TrainConfig(tp=1, pp=1, dp=24, zero_stage=3, micro_batch=1, recompute=True)  # re-shards, cannot hold step 1
    relaid = TrainConfig(tp=4, pp=1, dp=6, zero_stage=3, micro_batch=1, recompute=True)
    from libra.planner.decision_tree import fits_in_memory

    assert fits_in_memory(ev, PRIOR_SIZED, longest) and fits_in_memory(ev, relaid, longest)
    assert not fits_in_memory(ev, planned, longest)
    pol = PlansBySteps([_colocated(24, PRIOR_SIZED), _colocated(24, planned)], {1: relaid, 2: relaid})
    res = Simulator(steps, pol, cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    assert res.completed == res.expected
    sc = StepCosts(ev, 8)
    assert res.steps[1].transition_s == pytest.approx(sc.lend_s(relaid, 1), rel=1e-12)  # the re-shard, charged
    assert res.steps[2].transition_s == 0.0  # held since
    # the same settle under a plan that keeps the held layout is a transition it did not make
    keep = PlansBySteps([_colocated(24, PRIOR_SIZED)], {1: relaid})
    with pytest.raises(SimulationError, match="split change"):
        Simulator(steps, keep, cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()


def test_a_first_training_may_lay_over_the_rollout_gpus_no_engine_runs_on() -> None:
    """A split whose rollout TP does not tile its share leaves rollout GPUs that run no engine
    (``Plan.idle_rollout_gpus``): 10 rollout GPUs, one TP-8 engine, two idle. A policy may settle
    its training on those too (``first_layout``'s ``spare_gpus``): the simulator books them by the
    planner's rule (``train_gpu_ids``), charges the first training's weights-only re-build
    (``build_s``), trains the larger layout and reports the split it ran (8:16). Before, any
    settled GPU count other than the plan's was refused, and held_out_54's FEVER run on 42 H100
    kept two GPUs idle for the run (0.914x, SIMULATED). A layout over more GPUs than are idle is
    still a plan transition, refused when only settled."""
    ev = CostEvaluator("b200", "qwen3-32b")
    cluster = ClusterSpec(24, "b200", "qwen3-32b")
    steps = [make_step(s, 64, seed=2) for s in range(3)]
    own = TrainConfig(tp=2, pp=1, dp=7, zero_stage=3, micro_batch=1, recompute=True)
    wide = dataclasses.replace(own, dp=8)
    plan = Plan(n_rollout_gpus=10, n_train_gpus=14, train=own, instances=uniform_instances(8, 8, 8),
                buckets=(Bucket(0, 8, 0, None),))
    assert plan.idle_rollout_gpus == 2
    res = Simulator(steps, SettlingOnce(plan, wide, wide), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    sc = StepCosts(ev, 8)
    assert [(m.n_rollout_gpus, m.n_train_gpus) for m in res.steps] == [(8, 16)] * 3
    assert [m.transition_s for m in res.steps] == pytest.approx([sc.build_s(wide), 0.0, 0.0], rel=1e-12)
    for st, m in zip(steps, res.steps):
        tokens, seq = int(st.total_tokens.sum()), int(round(float(st.total_tokens.mean())))
        assert m.train_s == pytest.approx(training_time_fn(ev, tokens, seq)(wide) + sc.step_fixed_s(st.n), rel=1e-12)
    assert plan.with_training(wide).n_rollout_gpus == 8 and plan.with_training(wide).instances == plan.instances
    beyond = dataclasses.replace(own, dp=9)  # 18 GPUs: four more than the plan's, two of them run the engine
    with pytest.raises(SimulationError, match="split change"):
        Simulator(steps, SettlingOnce(plan, beyond, beyond), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
    with pytest.raises(ValueError, match="run no engine"):
        plan.with_training(beyond)


def test_the_first_layout_takes_idle_rollout_gpus_only_when_the_run_gains() -> None:
    """``first_layout`` with ``spare_gpus`` ranks the layouts of the plan's training GPUs and of
    up to that many more, each priced by the run (``run_price``) with its weights-only re-build:
    a chain-bound run takes the two idle GPUs, one whose training is all hidden keeps its own."""
    from libra.planner.pipeline import pipeline_run_s
    from libra.planner.settle import first_layout

    ev = CostEvaluator("h100", "llama-3.1-70b")
    tree = DecisionTree(StepCosts(ev, 8), 8)
    batch = make_step(0, 128, seed=1)
    own = TrainConfig(tp=8, pp=1, dp=3, zero_stage=1, micro_batch=1, recompute=True)
    settled = settle_training(tree, own, batch, [batch], None, 42)
    chain = lambda cfg, train_s, reshard_s: pipeline_run_s("async", 1, 1.0, train_s, 4, reshard_s)  # noqa: E731
    hidden = lambda cfg, train_s, reshard_s: 600.0 + reshard_s  # noqa: E731
    assert first_layout(tree, settled, batch, [batch], None, 42, 4.0, run_price=chain).n_gpus == 24
    wider = first_layout(tree, settled, batch, [batch], None, 42, 4.0, run_price=chain, spare_gpus=2)
    assert wider.n_gpus == 26
    tokens, seq = int(batch.total_tokens.sum()), int(round(float(batch.total_tokens.mean())))
    timer = training_time_fn(tree.costs, tokens, seq)
    assert timer(wider) < timer(first_layout(tree, settled, batch, [batch], None, 42, 4.0, run_price=chain))
    assert first_layout(tree, settled, batch, [batch], None, 42, 4.0, run_price=hidden, spare_gpus=2) is settled
