"""A step's training under a later plan's split (``Policy.training_plan``, ``Simulator._adopt``).

At K >= 1 the plan of step j + 1 is made as step j's training is about to start. When it moves
GPUs to training, the step's training may take them now (one re-shard, charged at the price of
the later plan's move) instead of leaving them idle until step j + 1 trains."""

from __future__ import annotations

from typing import Any

from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from sim.loop import SimConfig, Simulator

CLUSTER = ClusterSpec(16, "fake", "fake")
FIRST = simple_plan(n_inst=4, tp=2)  # 8 rollout GPUs, 8 training
MOVED = simple_plan(n_inst=2, tp=2)  # 4 rollout GPUs, 12 training


class Moves(FixedPolicy):
    """``FIRST`` for the first two plans (made at launch, K=1), ``MOVED`` after."""

    def __init__(self, adopts: bool) -> None:
        super().__init__(FIRST)
        self.adopts = adopts
        self.asked: list[tuple[int, int]] = []

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
        self.histories.append(len(history))
        return FIRST if len(self.histories) <= 2 else MOVED

    def training_plan(self, plan: Plan, latest: Plan) -> Plan:
        self.asked.append((plan.n_train_gpus, latest.n_train_gpus))
        return latest if self.adopts else plan


def _run(adopts: bool) -> tuple[Moves, Any, Simulator]:
    steps = [make_step(s, 48, seed=3) for s in range(4)]
    pol = Moves(adopts)
    sim = Simulator(steps, pol, CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, mode="async", max_staleness=1))
    return pol, sim.run(), sim


def test_a_training_takes_the_gpus_a_later_plan_moved_to_training() -> None:
    kept_pol, kept, _ = _run(adopts=False)
    pol, res, sim = _run(adopts=True)
    assert [m.n_train_gpus for m in kept.steps] == [8, 8, 12, 12]
    assert [m.n_train_gpus for m in res.steps] == [8, 12, 12, 12]
    assert (8, 12) in pol.asked and (8, 12) in kept_pol.asked
    assert res.completed == res.expected and kept.completed == kept.expected
    assert all(o is None for o in sim.ledger.owner)  # every GPU released
    # the move's training re-shard is charged once, at the training that made it
    assert res.steps[1].transition_s > 0.0 and res.steps[2].transition_s <= kept.steps[2].transition_s
    assert res.steps[1].train_s < kept.steps[1].train_s  # 12 GPUs train it faster than 8


def test_a_training_under_a_later_plan_is_settled_with_that_plan_s_whole_split() -> None:
    """The plan a step trains under after taking a later plan's split carries that plan's
    rollout side too, not only its training: the settle reads the split's idle rollout GPUs
    (``Plan.idle_rollout_gpus``, what a first training may take). Carrying the step's own
    rollout count (8 where the later plan has 4) had the settle count four rollout GPUs as idle
    and ask for GPUs an engine runs on (held_out_54 fireact-hotpotqa/h100-42-l70b/K0 stopped,
    SIMULATED)."""

    class Settles(Moves):
        def __init__(self) -> None:
            super().__init__(adopts=True)
            self.settled: list[tuple[int, int, int]] = []

        def settle_training(self, plan: Plan, batch: Any, seen: Any) -> Any:
            self.settled.append((plan.n_rollout_gpus, plan.n_train_gpus, plan.idle_rollout_gpus))
            return plan.train

    steps = [make_step(s, 48, seed=3) for s in range(4)]
    pol = Settles()
    res = Simulator(steps, pol, CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, mode="async", max_staleness=1)).run()
    assert [m.n_train_gpus for m in res.steps] == [8, 12, 12, 12]
    assert pol.settled == [(8, 8, 0), (4, 12, 0), (4, 12, 0), (4, 12, 0)]


def test_a_policy_without_the_hook_trains_every_step_under_its_own_plan() -> None:
    class Plain(Moves):
        training_plan = None  # type: ignore[assignment]

    steps = [make_step(s, 48, seed=3) for s in range(4)]
    res = Simulator(steps, Plain(adopts=True), CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, mode="async", max_staleness=1)).run()
    assert [m.n_train_gpus for m in res.steps] == [8, 8, 12, 12]


def _shared_then_split(adopts: bool) -> tuple[Any, Simulator]:
    """Step 0 time-shared on all 16 GPUs (4 TP-4 engines), then an async split (MOVED: 2 TP-2
    engines on 4 rollout GPUs, 12 training) from step 1 on, at K = 1."""
    import dataclasses

    shared = dataclasses.replace(simple_plan(n_inst=4, tp=4, train_gpus=16), n_rollout_gpus=16, colocated=True)
    split = dataclasses.replace(MOVED, mode="async", max_staleness=1)

    class SharedThenSplit(Moves):
        def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
            self.histories.append(len(history))
            return shared if len(self.histories) == 1 else split

    steps = [make_step(s, 48, seed=3) for s in range(4)]
    sim = Simulator(steps, SharedThenSplit(adopts), CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, max_staleness=1))
    return sim.run(), sim


def test_a_time_shared_training_moves_onto_the_next_async_split_and_its_rollout_does_not_wait() -> None:
    """ToRA GSM8K on 34 A100 (K=1) launched time-shared and moved to a split at step 1, whose
    rollout waited for step 0's time-shared training and both engine switches (0.771x,
    held_out_43, SIMULATED). Now step 0 trains on the split's 12 training GPUs, as a split's
    training (no switch back), while step 1's rollout starts on the other 4 once its engines
    (TP 2 where the time-shared ones ran TP 4) have started."""
    kept, kept_sim = _shared_then_split(adopts=False)
    res, sim = _shared_then_split(adopts=True)
    assert [m.n_train_gpus for m in kept.steps] == [16, 12, 12, 12]
    assert [m.n_train_gpus for m in res.steps] == [12, 12, 12, 12]
    assert res.completed == res.expected and kept.completed == kept.expected
    assert all(o is None for o in sim.ledger.owner)
    train0_end = res.steps[0].train_start_s + res.steps[0].train_s
    assert res.steps[1].rollout_start_s < train0_end  # step 1's rollout overlaps step 0's training
    assert kept.steps[1].rollout_start_s < kept.steps[0].step_end_s  # seated early, but it waited for the GPUs:
    assert res.steps[1].rollout_makespan_s < kept.steps[1].rollout_makespan_s
    # step 1's new engines start once (the engine start of a TP-2 instance), charged to it
    assert res.steps[1].transition_s == sim.costs.step.engine_start_s(2) > 0.0
    assert res.steps[0].switch_s > 0.0  # the time-shared engines on the training GPUs sleep first
    assert res.wall_s < kept.wall_s


def test_libra_moves_a_time_shared_training_only_onto_an_async_split() -> None:
    import dataclasses

    from libra.policies.registry import resolve

    pol = resolve("libra", ClusterSpec(16, "a800", "qwen3-8b"), max_staleness=1)
    shared = dataclasses.replace(simple_plan(n_inst=8, tp=2, train_gpus=16), n_rollout_gpus=16, colocated=True)
    async_split = dataclasses.replace(MOVED, mode="async", max_staleness=1)
    sync_split = dataclasses.replace(MOVED, mode="sync")
    assert pol.training_plan(shared, async_split) is async_split
    assert pol.training_plan(shared, sync_split) is shared
    assert pol.training_plan(async_split, shared) is async_split
