"""A training whose layout cannot hold the batch's longest sequence: the settle moves it to one
that does (``libra.planner.settle.memory_relayout``), and the simulator refuses one that still
does not fit, as a real trainer runs out of memory (``sim.loop``). Before, the settle kept the
layout and the simulator charged no out-of-memory (held_out_31: Libra trained 49.8K-token
sequences of Llama-3.1-70B on 72 H100 where no strategy of its layout holds them, SIMULATED)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from libra.planner.decision_tree import DecisionTree, enumerate_strategies, memory_report, training_time_fn
from libra.planner.plan import Bucket, Plan, TrainConfig, same_layout
from libra.planner.settle import batch_shape, settle_training
from libra.planner.step_costs import StepCosts
from libra.policies.static import uniform_instances
from sim.costs import SimCosts
from sim.instance import SimulationError
from sim.loop import SimConfig, Simulator
from test_sim_support import FixedPolicy, make_step

GPU, MODEL, N = "h100", "qwen3-30b-a3b", 16


@pytest.fixture(scope="module")
def tree() -> DecisionTree:
    return DecisionTree(StepCosts(CostEvaluator(GPU, MODEL), 8), 8)


def _long_step(step: int = 0) -> Any:
    return make_step(step, 16, seed=5, turns=(5, 5), gen=(6000, 6100))  # ~32K-token sequences


def _short_sized(tree: DecisionTree, long_step: Any) -> TrainConfig:
    """The fastest strategy on ``N`` GPUs sized for 2K-token sequences that cannot hold the long
    step's sequences with any micro-batch or recompute of its layout."""
    tokens, seq, memory = batch_shape(tree, long_step, [long_step], None, N)
    timer = training_time_fn(tree.costs, tokens, seq)
    fitting = [cfg for _, cfg in enumerate_strategies(tree.ev, N, 16, memory, 8, timer, bound=False).ranked]
    short = [cfg for _, cfg in enumerate_strategies(tree.ev, N, 16, 2048, 8, timer, bound=False).ranked]
    return next(cfg for cfg in short if not any(same_layout(cfg, f) for f in fitting))


def test_a_layout_that_cannot_hold_the_batch_is_settled_onto_one_that_can(tree: DecisionTree) -> None:
    long_step = _long_step()
    small = _short_sized(tree, long_step)
    memory = batch_shape(tree, long_step, [long_step], None, N)[2]
    assert not memory_report(tree.ev, small, memory).fits
    got = settle_training(tree, small, long_step, [long_step], None, N)
    assert got.n_gpus == small.n_gpus and not same_layout(got, small)
    assert memory_report(tree.ev, got, memory).fits
    # a batch the layout holds keeps it (only the knobs move)
    short_step = make_step(0, 16, seed=5)
    assert same_layout(settle_training(tree, small, short_step, [short_step], None, N), small)


class Fixed(FixedPolicy):
    """A fixed split whose training is settled by ``settle_training`` (as every policy's is), or
    not at all."""

    def __init__(self, plan: Plan, settles: bool) -> None:
        super().__init__(plan)
        self.settles = settles
        self.tree = DecisionTree(StepCosts(CostEvaluator(GPU, MODEL), 8), 8)

    def settle_training(self, plan: Plan, batch: Any, seen: Any) -> TrainConfig:
        if not self.settles:
            return plan.train
        return settle_training(self.tree, plan.train, batch, seen, None, plan.n_train_gpus)


def _plan(train: TrainConfig, colocated: bool = False) -> Plan:
    """``N`` training GPUs: beside ``N`` rollout GPUs (a split), or time-shared with them."""
    return Plan(n_rollout_gpus=N, n_train_gpus=N, train=train, instances=uniform_instances(N, 8, 8),
                buckets=(Bucket(0, 8, 0, None),), colocated=colocated)


def test_the_simulator_refuses_a_training_that_runs_out_of_memory(tree: DecisionTree) -> None:
    steps = [make_step(0, 16, seed=5), _long_step(1)]
    small = _short_sized(tree, steps[1])
    ev = CostEvaluator(GPU, MODEL)
    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        Simulator(steps, Fixed(_plan(small), settles=False), ClusterSpec(2 * N, GPU, MODEL), SimCosts(ev),
                  SimConfig(noise_sigma=0.0)).run()
    # settled onto a layout that holds it, the step trains, paying the re-shard
    res = Simulator(steps, Fixed(_plan(small), settles=True), ClusterSpec(2 * N, GPU, MODEL), SimCosts(ev),
                    SimConfig(noise_sigma=0.0)).run()
    assert res.steps[0].transition_s == 0.0 and res.steps[1].transition_s > 0.0


def test_a_time_shared_plan_may_re_lay_for_a_batch_its_held_layout_cannot_hold(tree: DecisionTree) -> None:
    """After its first training a time-shared plan keeps its layout (a change is a plan
    transition), except when the held layout cannot hold the batch: then the settled re-lay is
    a re-shard the simulator charges, not a refusal."""
    steps = [make_step(0, 16, seed=5), _long_step(1)]
    small = _short_sized(tree, steps[1])
    ev = CostEvaluator(GPU, MODEL)
    res = Simulator(steps, Fixed(_plan(small, colocated=True), settles=True), ClusterSpec(N, GPU, MODEL), SimCosts(ev),
                    SimConfig(noise_sigma=0.0)).run()
    assert res.steps[1].transition_s > 0.0


def test_a_streamed_plan_holds_twice_the_longest_sequence_seen() -> None:
    """Nothing settles a streamed step (its training starts before its batch is complete), so
    the planner streams only with a strategy that holds ``STREAM_MEMORY_HEADROOM`` times the
    longest sequence seen. held_out_32: Libra streamed InterCode-Bash's step 2 on 48 H200 with
    Llama-3.1-70B in TP 4 x DP 8 ZeRO-1 at micro-batch 1 without recompute, sized on step 1's
    2,742-token longest; the step's 3,565-token sequence needs 144 GB of 141 (SIMULATED)."""
    import os

    from libra.planner.search import STREAM_MEMORY_HEADROOM
    from libra.policies import PolicyOptions, resolve
    from sim.replay import load_steps

    log = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "held_out_11", "intercode-bash-gpt-4.jsonl.gz")
    steps, _ = load_steps(log)
    cluster = ClusterSpec(48, "h200", "llama-3.1-70b")
    pol = resolve("libra", cluster, PolicyOptions())
    hist = steps[:2]
    plan = pol.plan(cluster, hist, steps[2].prompt_tokens)
    longest = max(int(s.total_tokens.max()) for s in hist)
    ev = CostEvaluator("h200", "llama-3.1-70b")
    if plan.streaming:
        assert memory_report(ev, plan.train, int(longest * STREAM_MEMORY_HEADROOM)).fits
    assert memory_report(ev, plan.train, int(steps[2].total_tokens.max())).fits


def _mb_sized(tree: DecisionTree, long_step: Any) -> TrainConfig:
    """A strategy on ``N`` GPUs at micro-batch >= 2 that cannot hold the long step's longest
    sequence, while the same layout at micro-batch 1 can."""
    from dataclasses import replace

    longest = int(long_step.total_tokens.max())
    tokens, seq, _ = batch_shape(tree, long_step, [long_step], None, N)
    timer = training_time_fn(tree.costs, tokens, seq)
    for _, cfg in enumerate_strategies(tree.ev, N, 16, 2048, 8, timer, bound=False).ranked:
        if (cfg.micro_batch >= 2 and not memory_report(tree.ev, cfg, longest).fits
                and memory_report(tree.ev, replace(cfg, micro_batch=1), longest).fits):
            return cfg
    raise AssertionError("no strategy whose micro-batch alone decides whether it holds the long step")


class Streamed(FixedPolicy):
    """A fixed streamed split that does, or does not, shrink a streamed step's micro-batch for a
    sequence its plan's cannot hold (``Policy.streamed_knobs``), and with ``relays`` re-shards it
    onto another layout of the same GPUs when no knob of its layout holds the sequence."""

    def __init__(self, plan: Plan, shrinks: bool, relays: bool = False) -> None:
        super().__init__(plan)
        self.tree = DecisionTree(StepCosts(CostEvaluator(GPU, MODEL), 8), 8)
        from libra.planner.settle import streamed_micro_batch, streamed_relayout

        if relays:
            self.streamed_knobs = lambda plan, longest, seen=(): streamed_relayout(self.tree, plan.train, longest, seen)
        elif shrinks:
            self.streamed_knobs = lambda plan, longest, seen=(): streamed_micro_batch(self.tree, plan.train, longest)


def test_a_streamed_step_trains_a_longer_sequence_in_smaller_micro_batches(tree: DecisionTree) -> None:
    """held_out_33: a streamed K=0 step brought a sequence more than twice the longest before it,
    past its plan's ``STREAM_MEMORY_HEADROOM``, and Libra's run stopped (WebShop on 80 H100 /
    Qwen3-30B-A3B: micro-batch 4 needed 80.4 GB of 80, micro-batch 1 held it in 31.6 GB). A
    trainer forming micro-batches by a token budget trains it in smaller ones instead."""
    from dataclasses import replace

    from libra.planner.settle import streamed_micro_batch

    steps = [make_step(0, 16, seed=5), make_step(1, 16, seed=5, turns=(5, 5), gen=(2000, 2100))]
    cfg = _mb_sized(tree, steps[1])
    plan = replace(_plan(cfg), streaming=True)
    got = streamed_micro_batch(tree, cfg, int(steps[1].total_tokens.max()))
    assert got is not None and same_layout(got, cfg) and got.recompute == cfg.recompute and got.micro_batch < cfg.micro_batch
    assert streamed_micro_batch(tree, cfg, 512) == cfg  # a sequence it holds keeps its knobs
    ev = CostEvaluator(GPU, MODEL)
    run = lambda shrinks: Simulator(steps, Streamed(plan, shrinks), ClusterSpec(2 * N, GPU, MODEL), SimCosts(ev),  # noqa: E731
                                    SimConfig(noise_sigma=0.0, streaming=True)).run()
    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        run(False)
    res = run(True)
    assert res.completed == res.expected
    assert res.steps[1].transition_s == 0.0  # the same layout: no re-shard


def _recompute_sized(tree: DecisionTree, long_step: Any) -> TrainConfig:
    """A strategy on ``N`` GPUs without recompute that cannot hold the long step's longest
    sequence even at micro-batch 1, while the same layout with recompute can."""
    from dataclasses import replace

    longest = int(long_step.total_tokens.max())
    tokens, seq, _ = batch_shape(tree, long_step, [long_step], None, N)
    timer = training_time_fn(tree.costs, tokens, seq)
    for _, cfg in enumerate_strategies(tree.ev, N, 16, 2048, 8, timer, bound=False).ranked:
        if (not cfg.recompute and not memory_report(tree.ev, replace(cfg, micro_batch=1), longest).fits
                and memory_report(tree.ev, replace(cfg, micro_batch=1, recompute=True), longest).fits):
            return cfg
    raise AssertionError("no strategy whose recompute alone decides whether it holds the long step")


def test_a_streamed_step_no_micro_batch_holds_trains_with_recompute(tree: DecisionTree) -> None:
    """held_out_42: WebShop on 50 B200 / Llama-3.1-70B (K=0) brought a 4,748-token sequence at
    step 1 that its streamed plan's layout held at no micro-batch (189.8 GB of 180 GB per GPU at
    micro-batch 1) and Libra's run stopped where the baselines ran; recompute held it in 121.4 GB.
    Recompute is a per-step knob (``same_layout``): the trainer turns it on, no re-shard."""
    from libra.planner.settle import streamed_micro_batch

    steps = [make_step(0, 16, seed=5), make_step(1, 16, seed=5, turns=(5, 5), gen=(5000, 5200))]
    longest = int(steps[1].total_tokens.max())
    cfg = _recompute_sized(tree, steps[1])
    got = streamed_micro_batch(tree, cfg, longest)
    assert got is not None and same_layout(got, cfg) and got.recompute
    assert memory_report(tree.ev, got, longest).fits
    plan = replace(_plan(cfg), streaming=True)
    ev = CostEvaluator(GPU, MODEL)
    res = Simulator(steps, Streamed(plan, True), ClusterSpec(2 * N, GPU, MODEL), SimCosts(ev),
                    SimConfig(noise_sigma=0.0, streaming=True)).run()
    assert res.completed == res.expected
    assert res.steps[1].transition_s == 0.0  # the same layout: no re-shard


def test_a_streamed_step_no_knob_of_its_layout_holds_re_shards_onto_its_gpus(tree: DecisionTree) -> None:
    """held_out_44: COPRA on 42 H100 / Qwen3-32B (K=0) brought a 45,943-token sequence at streamed
    step 1 that its plan's TP 2 x DP 16 held at no micro-batch, even with recompute, and Libra's run
    stopped where verl-colocated ran; TP 4 x DP 8 on the same 32 GPUs holds it. The trainer
    re-shards onto the fastest layout of its GPUs that holds the sequence, and the re-shard is
    charged (``libra.planner.settle.streamed_relayout``)."""
    from libra.planner.settle import streamed_micro_batch, streamed_relayout

    steps = [make_step(0, 16, seed=5), _long_step(1)]
    longest = int(steps[1].total_tokens.max())
    small = _short_sized(tree, steps[1])
    assert streamed_micro_batch(tree, small, longest) is None  # no knob of its layout holds it
    got = streamed_relayout(tree, small, longest, steps[:1])
    assert got is not None and got.n_gpus == small.n_gpus and not same_layout(got, small)
    assert memory_report(tree.ev, got, longest).fits
    assert streamed_relayout(tree, small, 512, steps[:1]) == small  # a sequence it holds keeps its strategy
    plan = replace(_plan(small), streaming=True)
    ev = CostEvaluator(GPU, MODEL)
    run = lambda relays: Simulator(steps, Streamed(plan, True, relays), ClusterSpec(2 * N, GPU, MODEL), SimCosts(ev),  # noqa: E731
                                   SimConfig(noise_sigma=0.0, streaming=True)).run()
    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        run(False)
    res = run(True)
    assert res.completed == res.expected
    assert res.steps[1].transition_s == pytest.approx(StepCosts(ev, 8).lend_s(got, 1))  # the re-shard, charged


class Outgrows(FixedPolicy):
    """A fixed split whose training, when no strategy on its GPUs holds a batch, runs on the
    count ``outgrown_training`` picks (``Policy.oversized_training``), or fails without it."""

    def __init__(self, plan: Plan, gpu: str, model: str, n_gpus: int, hook: bool) -> None:
        super().__init__(plan)
        self.tree = DecisionTree(StepCosts(CostEvaluator(gpu, model), 8), 8)
        self.asked: list[TrainConfig | None] = []
        if hook:
            def oversized(plan: Plan, batch: Any, seen: Any) -> TrainConfig | None:
                from libra.planner.settle import outgrown_training

                got = outgrown_training(self.tree, plan.train, batch, seen, None, n_gpus)
                self.asked.append(got)
                return got

            self.oversized_training = oversized


def _outgrowing_run(gpu: str, model: str, n_gpus: int, n_train: int, gen: tuple[int, int], hook: bool) -> tuple[Any, Outgrows]:
    """A split of ``n_train`` training GPUs (TP 2, ZeRO-3, recompute) on ``n_gpus``, replaying a
    short step, then a step of ~5 x ``gen`` -token sequences no strategy on ``n_train`` GPUs
    holds, then a short one."""
    steps = [make_step(0, 8, seed=5), make_step(1, 8, seed=5, turns=(5, 5), gen=gen), make_step(2, 8, seed=6)]
    n_roll = n_gpus - n_train
    plan = Plan(n_rollout_gpus=n_roll, n_train_gpus=n_train, train=TrainConfig(tp=2, pp=1, dp=n_train // 2, zero_stage=3, recompute=True),
                instances=uniform_instances(n_roll, 8, 8), buckets=(Bucket(0, 8, 0, None),))
    pol = Outgrows(plan, gpu, model, n_gpus, hook)
    res = Simulator(steps, pol, ClusterSpec(n_gpus, gpu, model), SimCosts(CostEvaluator(gpu, model)), SimConfig(noise_sigma=0.0)).run()
    return res, pol


@pytest.mark.parametrize("gpu,model,n_gpus,n_train,gen,want", [
    # 89,978 tokens of Qwen3-14B on A800s fit 16, 24 or 28 training GPUs, not 20 (TP 8 wants a
    # multiple of 8, and TP 4 on 20 needs 82.9 GB of 80): fewer of its own GPUs, nothing waits
    ("a800", "qwen3-14b", 44, 20, (17500, 17600), 16),
    # ~50K tokens of Llama-3.1-70B on H100s fit no count below 24: four GPUs come from rollout
    # (Qwen3-32B's, the case until sequence parallelism, now fit 16 of them)
    ("h100", "llama-3.1-70b", 40, 20, (9700, 9800), 24),
])
def test_a_batch_its_plans_training_gpus_cannot_hold_trains_on_a_count_that_holds_it(
        gpu: str, model: str, n_gpus: int, n_train: int, gen: tuple[int, int], want: int) -> None:
    """held_out_35: MiniSWE on 44 A800 (Qwen3-14B, K=1) brought 89,978 tokens at step 3 to a plan
    whose 20 training GPUs hold none, and SWE-agent on 36 H100 (Qwen3-32B) 49,809 at step 1 to
    another 20; both runs stopped where a baseline ran (SIMULATED). A policy may train such a
    batch on another GPU count (``Policy.oversized_training``); without it the step fails."""
    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        _outgrowing_run(gpu, model, n_gpus, n_train, gen, hook=False)
    res, pol = _outgrowing_run(gpu, model, n_gpus, n_train, gen, hook=True)
    assert res.completed == res.expected
    assert [c.n_gpus if c else None for c in pol.asked] == [want]  # asked once: the long step only
    assert res.steps[1].n_train_gpus == max(n_train, want)
    assert res.steps[1].transition_s > 0.0  # the re-shard onto the new count
    assert res.steps[2].n_train_gpus == n_train and res.steps[2].transition_s > 0.0  # and back


def test_a_streamed_step_no_layout_of_its_gpus_holds_trains_once_its_rollout_ends() -> None:
    """held_out_49: ToolBench DFSDT on 38 H200 / Llama-3.1-70B (K = 0) brought a 44,924-token
    sequence at a streamed step that no layout of its 16 training GPUs holds (32 do), and Libra's
    run stopped where verl-static-uniform ran (SIMULATED). The step is not streamed: its training
    waits for the complete batch and runs on the count ``oversized_training`` picks, as a
    synchronous step's outgrown batch does; without that hook it still fails."""
    from libra.planner.settle import streamed_relayout

    gpu, model, n_gpus, n_train = "h100", "llama-3.1-70b", 40, 20
    steps = [make_step(0, 8, seed=5), make_step(1, 8, seed=5, turns=(5, 5), gen=(9700, 9800)), make_step(2, 8, seed=6)]
    n_roll = n_gpus - n_train
    plan = Plan(n_rollout_gpus=n_roll, n_train_gpus=n_train, train=TrainConfig(tp=2, pp=1, dp=n_train // 2, zero_stage=3, recompute=True),
                instances=uniform_instances(n_roll, 8, 8), buckets=(Bucket(0, 8, 0, None),), streaming=True)

    def run(hook: bool) -> tuple[Any, Outgrows]:
        pol = Outgrows(plan, gpu, model, n_gpus, hook)
        pol.streamed_knobs = lambda plan, longest, seen=(): streamed_relayout(pol.tree, plan.train, longest, seen)
        res = Simulator(steps, pol, ClusterSpec(n_gpus, gpu, model), SimCosts(CostEvaluator(gpu, model)),
                        SimConfig(noise_sigma=0.0, streaming=True)).run()
        return res, pol

    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        run(hook=False)
    res, pol = run(hook=True)
    assert res.completed == res.expected
    assert [c.n_gpus if c else None for c in pol.asked] == [pol.asked[0].n_gpus] and pol.asked[0].n_gpus > n_train
    long_step = res.steps[1]
    assert long_step.n_train_gpus == pol.asked[0].n_gpus
    # trained after its rollout ended (not streamed), where the short steps' training overlapped theirs
    assert long_step.train_start_s >= long_step.rollout_start_s + long_step.rollout_makespan_s - 1e-6
    assert res.steps[0].train_start_s < res.steps[0].rollout_start_s + res.steps[0].rollout_makespan_s


def test_a_plan_made_after_a_step_holds_its_longest_sequence() -> None:
    """The planner checks memory at the longest sequence measured, not only at its forecast's
    tail (the trajectory of the longest critical path, which need not be the longest one): the
    settle holds the longest seen (``batch_shape``). SWE-agent on 36 H100 / Qwen3-32B, K=1: the
    plan after a 49,809-token step kept a training layout that holds none of it (SIMULATED)."""
    import os

    from libra.policies import PolicyOptions, resolve
    from sim.replay import load_steps

    log = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "held_out_31",
                       "sweagent-rep-gpt-4-0125-swebench-lite.jsonl.gz")
    steps, _ = load_steps(log)
    cluster = ClusterSpec(36, "h100", "qwen3-32b")
    pol = resolve("libra", cluster, PolicyOptions(max_staleness=1))
    for k in range(3):
        plan = pol.plan(cluster, tuple(steps[:k]), steps[k].prompt_tokens)
    longest = max(int(s.total_tokens.max()) for s in steps[:2])
    assert longest > 45_000
    assert memory_report(CostEvaluator("h100", "qwen3-32b"), plan.train, longest).fits


def test_a_synchronous_loop_trains_an_outgrown_batch_on_the_fastest_count() -> None:
    """With the rollout over (a synchronous loop), nothing waits for rollout GPUs: the outgrown
    batch takes the fastest count up to the cap, its extra GPUs' return to rollout included; in
    an async loop, fewer of its own GPUs first (no wait for a running rollout)."""
    from libra.planner.settle import outgrown_training

    tree = DecisionTree(StepCosts(CostEvaluator("a800", "qwen3-14b"), 8), 8)
    step = make_step(1, 8, seed=5, turns=(5, 5), gen=(17500, 17600))  # ~89K tokens: 20 GPUs hold none
    train = TrainConfig(tp=2, pp=1, dp=10, zero_stage=3, recompute=True)
    during = outgrown_training(tree, train, step, [step], None, 44)
    after = outgrown_training(tree, train, step, [step], None, 44, rollout_idle=True, rollout_tp=8)
    assert during is not None and after is not None
    assert during.n_gpus < 20 < after.n_gpus <= 44
    tokens, seq, _ = batch_shape(tree, step, [step], None, 44)
    timer = training_time_fn(tree.costs, tokens, seq)
    assert timer(after) + tree.costs.return_s(after, 8) < timer(during)


def test_a_time_shared_batch_no_layout_of_its_gpus_holds_trains_on_fewer_of_them() -> None:
    """A time-shared plan trains on every GPU, and a GPU count the tensor-parallel degrees do not
    divide may hold no long sequence: on 38 H100 only TP 1 and 2 lay Llama-3.1-70B over all 38,
    and none holds SWE-agent's 35,968-token step, which 32 of them at TP 4 do. The simulator had
    refused every outgrown time-shared batch, and Libra's run stopped at step 0 (held_out_53
    sweagent-rep/h100-38-l70b/K1 once its launch went time-shared, SIMULATED). Like a split's, the
    batch trains on the count ``oversized_training`` picks, fewer of its GPUs (the re-shard there
    and back charged as layout changes); without the hook it still fails."""
    gpu, model, n_gpus = "h100", "llama-3.1-70b", 38
    steps = [make_step(0, 8, seed=5), make_step(1, 8, seed=5, turns=(5, 5), gen=(7000, 7100)), make_step(2, 8, seed=6)]
    plan = Plan(n_rollout_gpus=n_gpus, n_train_gpus=n_gpus, train=TrainConfig(tp=2, pp=1, dp=19, zero_stage=3, recompute=True),
                instances=uniform_instances(n_gpus, 8, 8), buckets=(Bucket(0, 8, 0, None),), colocated=True)

    def run(hook: bool) -> tuple[Any, Outgrows]:
        pol = Outgrows(plan, gpu, model, n_gpus, hook)
        res = Simulator(steps, pol, ClusterSpec(n_gpus, gpu, model), SimCosts(CostEvaluator(gpu, model)), SimConfig(noise_sigma=0.0)).run()
        return res, pol

    with pytest.raises(SimulationError, match=r"cannot train step 1: its longest sequence .* does not fit in memory"):
        run(hook=False)
    res, pol = run(hook=True)
    assert res.completed == res.expected
    assert len(pol.asked) == 1 and pol.asked[0] is not None and pol.asked[0].n_gpus < n_gpus
    assert res.steps[1].transition_s > 0.0 and res.steps[2].transition_s > 0.0  # the re-shard there and back
    assert res.steps[0].transition_s == 0.0
