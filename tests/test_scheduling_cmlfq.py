"""C-MLFQ routing on hand-built cases, and the rule that it never sees the step it routes."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from test_planner_workload import make_history, make_step

from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.scheduling.base import InstanceLoad, Route, TrajectoryObservation
from libra.scheduling.cmlfq import CMLFQScheduler, NoMigrationScheduler, floor_bucket
from libra.scheduling.history_model import RemainingWorkModel


def two_bucket_plan(bound: int = 8000) -> Plan:
    buckets = (Bucket(0, 1, 0, bound), Bucket(1, 4, bound, None))
    inst = (RolloutInstance(0, 1, 0, 0, 0), RolloutInstance(1, 1, 0, 0, 1), RolloutInstance(2, 4, 1, 1, 0))
    return Plan(n_rollout_gpus=6, n_train_gpus=2, train=TrainConfig(1, 1, 2), instances=inst, buckets=buckets)


def obs(context: int, outcome: str | None = "ok", turns: int = 1, bucket: int | None = 0, tool: str | None = "bash") -> TrajectoryObservation:
    return TrajectoryObservation(
        traj_id="t", index=0, step=5, group=None, prompt_tokens=500, context_tokens=context, turns_done=turns,
        last_tool=tool, last_outcome=outcome, elapsed_s=10.0, instance=0 if bucket is not None else None, bucket=bucket,
    )


class SlowLinkCost:
    """TEST DOUBLE (not a cost model): a KV migration that always takes ``mig`` seconds."""

    def __init__(self, mig: float) -> None:
        self.mig = mig

    def kv_migration_s(self, tokens: float, tp_src: int, tp_dst: int, same_node: bool = True) -> float:
        return self.mig


@pytest.fixture(scope="module")
def model() -> RemainingWorkModel:
    # errors on the first tool call mark trajectories that run 4x longer (past the 8K bound)
    return RemainingWorkModel.fit(make_history(4, n=128, median=3000, sigma=0.3, error_long=True))


def test_error_return_is_promoted_when_history_says_errors_run_long(model: RemainingWorkModel) -> None:
    s = CMLFQScheduler(two_bucket_plan(), model)
    assert s.admit(obs(500, outcome=None, turns=0, bucket=None)) == 0
    err = s.on_tool_return(obs(1500, outcome="error"))
    ok = s.on_tool_return(obs(1500, outcome="ok"))
    assert err == Route(1, True)
    assert ok == Route(0, False)
    assert model.p_exceeds("error", 1, 1500, 8000) > 0.5 > model.p_exceeds("ok", 1, 1500, 8000)


def test_same_error_is_not_promoted_when_history_says_errors_are_short() -> None:
    hist = make_history(4, n=128, median=3000, sigma=0.3, error_long=False)
    s = CMLFQScheduler(two_bucket_plan(), RemainingWorkModel.fit(hist))
    assert s.on_tool_return(obs(1500, outcome="error")) == Route(0, False)


def test_outgrown_context_always_moves_and_never_demotes(model: RemainingWorkModel) -> None:
    s = CMLFQScheduler(two_bucket_plan(), model, ev=SlowLinkCost(1e6))
    assert s.on_tool_return(obs(9000, outcome="ok")) == Route(1, True)  # floor move, even if slow
    assert s.on_tool_return(obs(9000, outcome="ok", bucket=1)) == Route(1, False)
    assert s.on_tool_return(obs(100, outcome="ok", bucket=1)).bucket == 1  # no demotion
    assert floor_bucket(two_bucket_plan(), 7999) == 0 and floor_bucket(two_bucket_plan(), 8000) == 1


def test_promotion_skipped_when_migration_outlasts_the_tool_and_gain_is_small(model: RemainingWorkModel) -> None:
    # the tool takes ~2 s (history); a 60 s migration would be exposed and gains little
    slow = CMLFQScheduler(two_bucket_plan(), model, ev=SlowLinkCost(60.0))
    assert slow.on_tool_return(obs(1500, outcome="error")) == Route(0, False)
    assert slow.skipped == 1
    fast = CMLFQScheduler(two_bucket_plan(), model, ev=SlowLinkCost(0.5))
    # at a call's start the 0.5 s migration hides behind the ~2 s tool
    import dataclasses

    start = dataclasses.replace(obs(1500, outcome="error"), at_call_start=True)
    assert fast.on_tool_return(start) == Route(1, True)
    assert model.expected_tool_latency("bash") == pytest.approx(2.0)
    # at the return nothing hides it: promoted only if the expected gain pays the exposed 0.5 s
    at_return = CMLFQScheduler(two_bucket_plan(), model, ev=SlowLinkCost(0.5))
    exposed = at_return.migration_s(obs(1500, outcome="error"), 1)
    gain = at_return.gain_s(obs(1500, outcome="error"), 1)
    expect = Route(1, True) if gain >= at_return.gain_factor * exposed else Route(0, False)
    assert at_return.on_tool_return(obs(1500, outcome="error")) == expect


def test_no_migration_variant_moves_without_kv(model: RemainingWorkModel) -> None:
    s = NoMigrationScheduler(two_bucket_plan(), model)
    assert s.on_tool_return(obs(1500, outcome="error")) == Route(1, False)


def test_instance_choice_is_least_loaded(model: RemainingWorkModel) -> None:
    s = CMLFQScheduler(two_bucket_plan(), model)
    loads = [InstanceLoad(0, 0, 10, 2, 50_000, 100_000), InstanceLoad(1, 0, 3, 0, 10_000, 100_000)]
    assert s.choose_instance(0, loads) == 1


def test_constructor_cannot_take_the_current_step() -> None:
    """C-MLFQ is built from a plan and a model fitted on completed steps; no parameter takes the
    step being routed, and the model fits only on what it is given."""
    params = inspect.signature(CMLFQScheduler.__init__).parameters
    assert "future" not in params and "step" not in params
    assert {p.annotation for p in params.values()}.isdisjoint({"StepArrays"})
    past = make_history(2, n=32)
    m1 = RemainingWorkModel.fit(past)
    current = make_step(step=2, n=32, median=20000)
    m2 = RemainingWorkModel.fit(past)  # fitting again on the same past ignores the current step
    assert m1.remaining("ok", 1, 1500) == m2.remaining("ok", 1, 1500)
    assert current.total_tokens.mean() > 3 * np.mean([s.total_tokens.mean() for s in past])


def test_empty_history_falls_back_to_reactive(model: RemainingWorkModel) -> None:
    s = CMLFQScheduler(two_bucket_plan(), RemainingWorkModel.fit([]))
    assert s.on_tool_return(obs(1500, outcome="error")) == Route(0, False)
    assert s.on_tool_return(obs(8500, outcome="error")) == Route(1, True)


def test_early_promotion_respects_destination_capacity(model: RemainingWorkModel) -> None:
    """Bucket 1 has 4 GPUs of slots (no cost table: GPUs are the proxy); once 4 trajectories
    were promoted early, a fifth stays unless its own bucket is fuller."""
    s = CMLFQScheduler(two_bucket_plan(), model)
    for _ in range(2):
        s.admit(obs(500, None, 0, None))
    routes = [s.on_tool_return(obs(1500, outcome="error")) for _ in range(5)]
    assert routes[:4] == [Route(1, True)] * 4
    assert routes[4] == Route(0, False) and s.live[1] == 4
    s.on_finish(obs(9000, None, bucket=1))
    assert s.on_tool_return(obs(1500, outcome="error")) == Route(1, True)
    # an outgrown trajectory moves regardless of the destination's load
    assert s.on_tool_return(obs(8500, outcome="ok")) == Route(1, True)


def test_call_start_states_without_outcome_use_turns_and_context() -> None:
    """The simulator routes when the call starts (outcome unknown): the model then conditions
    on turns and context only, from call-start states of past steps."""
    m = RemainingWorkModel.fit(make_history(4, n=128, median=3000, sigma=0.3, error_long=True))
    p_none = m.p_exceeds(None, 1, 1200, 8000)
    assert 0.0 < p_none < 1.0
    assert m.p_exceeds("error", 1, 1500, 8000) > p_none > m.p_exceeds("ok", 1, 1500, 8000)
