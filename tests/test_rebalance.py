"""Tool-time rebalancing within a bucket (``libra.scheduling.rebalance``, ``LeastLoadedRouter``
with a decode table, the simulator's call-start routing)."""

from __future__ import annotations

from typing import Any

from test_sim_support import FakeEvaluator, FixedPolicy, fake_costs, simple_plan

from libra.cluster import ClusterSpec
from libra.planner.costs import DecodeTable
from libra.planner.plan import Plan
from libra.scheduling.base import InstanceLoad, TrajectoryObservation
from libra.scheduling.rebalance import REBALANCE_GAIN, iteration_s, rebalance_target
from libra.scheduling.routers import LeastLoadedRouter
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from sim.loop import SimConfig, Simulator

TABLE = DecodeTable(FakeEvaluator(), (2,))  # type: ignore[arg-type]  # batch-dependent decode: 0.005 + 0.0002 b s
PLAN = simple_plan(n_inst=2, tp=2)


def _obs(instance: int, context: int = 1000, at_call_start: bool = True) -> TrajectoryObservation:
    return TrajectoryObservation("t", 0, 0, None, 100, context, 1, "bash", None, 1.0, instance, 0, at_call_start)


def _load(i: int, running: int, kv: int = 0, started: bool = True) -> InstanceLoad:
    return InstanceLoad(i, 0, running, 0, kv, 100_000, 64, started)


def test_a_trajectory_moves_only_to_a_clearly_faster_instance_of_its_bucket() -> None:
    busy, idle = _load(0, 40), _load(1, 2)
    assert iteration_s(TABLE, 2, idle, 1000) < iteration_s(TABLE, 2, busy) * (1 - REBALANCE_GAIN)
    assert rebalance_target(PLAN, TABLE, [busy, idle], _obs(0)) == 1
    # the same loads the other way round: its own instance is the fast one
    assert rebalance_target(PLAN, TABLE, [busy, idle], _obs(1)) is None
    # a gain under REBALANCE_GAIN is churn
    assert rebalance_target(PLAN, TABLE, [_load(0, 12), _load(1, 8)], _obs(0)) is None
    # only at a call's start (the move overlaps the tool), only to a started instance with room
    assert rebalance_target(PLAN, TABLE, [busy, idle], _obs(0, at_call_start=False)) is None
    assert rebalance_target(PLAN, TABLE, [busy, _load(1, 2, started=False)], _obs(0)) is None
    assert rebalance_target(PLAN, TABLE, [busy, _load(1, 2, kv=99_900)], _obs(0)) is None


def test_the_router_asks_the_rule_only_with_a_table_and_only_within_the_bucket() -> None:
    loads = [_load(0, 40), _load(1, 2)]
    with_table = LeastLoadedRouter(PLAN, work_conserving=True, table=TABLE)
    assert with_table.rebalances and with_table.choose_instance(0, loads, _obs(0)) == 1
    assert with_table.choose_instance(0, [_load(0, 12), _load(1, 8)], _obs(0)) == 0  # stays
    plain = LeastLoadedRouter(PLAN, work_conserving=True)
    assert not plain.rebalances
    baseline = LeastLoadedRouter(PLAN, table=TABLE)  # the baselines' balancer never moves work
    assert not baseline.rebalances


def _skewed_step(n: int = 24) -> StepArrays:
    """Every even trajectory long (12 turns), every odd one a single short turn: admitted in
    turn to two instances, the long ones pile onto one of them."""
    trajs = []
    for i in range(n):
        if i % 2 == 0:
            turns = tuple([Turn(150, "bash", 0.5, 50, "ok") for _ in range(11)] + [Turn(150, None)])
        else:
            turns = (Turn(20, None),)
        trajs.append(Trajectory(id=f"t{i}", step=0, prompt_tokens=200, turns=turns, group=f"g{i // 4}", reward=1.0, finish="stop"))
    return StepArrays.from_trajectories(0, trajs)


class _Routed(FixedPolicy):
    def __init__(self, plan: Plan, table: DecodeTable | None) -> None:
        super().__init__(plan)
        self.table = table

    def scheduler(self, plan: Plan, future: Any = None) -> LeastLoadedRouter:  # type: ignore[override]
        return LeastLoadedRouter(plan, work_conserving=True, table=self.table)


def _run(table: DecodeTable | None) -> Any:
    sim = Simulator([_skewed_step()], _Routed(PLAN, table), ClusterSpec(16, "fake", "fake"), fake_costs(),
                    SimConfig(noise_sigma=0.0))
    return sim.run()


def test_the_simulator_moves_a_trajectory_off_its_overloaded_instance_while_its_tool_runs() -> None:
    stay, moved = _run(None), _run(TABLE)
    assert stay.steps[0].migrations == 0
    assert moved.steps[0].migrations > 0  # within the one bucket, as its calls started
    assert moved.steps[0].migration_wait_s == 0.0  # each transfer hidden by the 0.5 s tool
    assert moved.completed == moved.expected == stay.expected  # every trajectory once
    assert moved.steps[0].rollout_makespan_s < stay.steps[0].rollout_makespan_s
