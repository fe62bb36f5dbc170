"""Baseline routers: round-robin, least-loaded, reactive MLFQ, length predictor, oracle."""

from __future__ import annotations

import numpy as np
import pytest
from test_planner_workload import make_history, make_step
from test_scheduling_cmlfq import obs, two_bucket_plan

from libra.scheduling.base import InstanceLoad, Route
from libra.scheduling.history_model import RemainingWorkModel
from libra.scheduling.routers import LeastLoadedRouter, LengthPredictorRouter, OracleRouter, ReactiveMLFQRouter, RoundRobinRouter


def test_reactive_mlfq_migrates_only_when_outgrown() -> None:
    r = ReactiveMLFQRouter(two_bucket_plan(8000))
    assert r.admit(obs(500, None, 0, None)) == 0
    for ctx in (600, 4000, 7999):
        assert r.on_tool_return(obs(ctx, "error")) == Route(0, False)
    assert r.on_tool_return(obs(8000, "ok")) == Route(1, True)
    assert r.on_tool_return(obs(20000, "ok", bucket=1)) == Route(1, False)
    assert r.moves == 1


def test_round_robin_cycles_instances_and_never_moves() -> None:
    plan = two_bucket_plan()
    r = RoundRobinRouter(plan)
    assert [r.admit(obs(500, None, 0, None)) for _ in range(6)] == [0, 0, 1, 0, 0, 1]
    loads = [InstanceLoad(0, 0, 0, 0, 0, 1), InstanceLoad(1, 0, 0, 0, 0, 1)]
    assert [r.choose_instance(0, loads) for _ in range(3)] == [0, 1, 0]
    assert r.on_tool_return(obs(50000, "ok")) == Route(0, False)


def test_least_loaded_balances_per_gpu() -> None:
    r = LeastLoadedRouter(two_bucket_plan())  # bucket 0: 2 GPUs, bucket 1: 4 GPUs
    picks = [r.admit(obs(500, None, 0, None)) for _ in range(6)]
    assert picks.count(1) == 4 and picks.count(0) == 2
    r.on_finish(obs(900, None, bucket=1))
    assert r.admit(obs(500, None, 0, None)) == 1


def test_length_predictor_is_seeded_and_its_error_grows_with_drift() -> None:
    past = make_history(3, n=128, median=3000, sigma=0.3)
    m = RemainingWorkModel.fit(past)
    plan = two_bucket_plan(8000)
    a = LengthPredictorRouter(plan, m, sigma=0.5, seed=1)
    b = LengthPredictorRouter(plan, m, sigma=0.5, seed=1)
    o = obs(1500, "ok")
    assert a.predicted_final(o) == b.predicted_final(o)
    assert LengthPredictorRouter(plan, m, sigma=0.5, seed=2).predicted_final(o) != a.predicted_final(o)

    def mean_abs_log_error(step) -> float:  # type: ignore[no-untyped-def]
        r = LengthPredictorRouter(plan, m, sigma=0.0)
        errs = []
        for i in range(step.n):
            ctx = int(step.prompt_tokens[i] + step.gen_tokens[step.turn_offsets[i]] + step.tool_tokens[step.turn_offsets[i]])
            pred = r.predicted_final(obs(ctx, "ok", turns=1))
            errs.append(abs(np.log(pred / step.total_tokens[i])))
        return float(np.mean(errs))

    near = mean_abs_log_error(make_step(step=3, n=64, median=3000, sigma=0.3))
    drifted = mean_abs_log_error(make_step(step=3, n=64, median=9000, sigma=0.3))
    assert drifted > near + 0.5


def test_oracle_is_flagged_places_by_true_final_and_needs_the_future() -> None:
    step = make_step(n=16, median=6000, sigma=1.0)
    plan = two_bucket_plan(8000)
    r = OracleRouter(plan, step)
    assert OracleRouter.sees_future is True
    for i in range(step.n):
        o = obs(int(step.prompt_tokens[i]), None, 0, None)
        o = type(o)(**{**{f: getattr(o, f) for f in o.__slots__}, "index": i})
        assert r.admit(o) == (1 if step.total_tokens[i] > 8000 else 0)
    with pytest.raises(TypeError):
        OracleRouter(plan)  # type: ignore[call-arg]
