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


def test_a_policy_without_the_hook_trains_every_step_under_its_own_plan() -> None:
    class Plain(Moves):
        training_plan = None  # type: ignore[assignment]

    steps = [make_step(s, 48, seed=3) for s in range(4)]
    res = Simulator(steps, Plain(adopts=True), CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, mode="async", max_staleness=1)).run()
    assert [m.n_train_gpus for m in res.steps] == [8, 8, 12, 12]
