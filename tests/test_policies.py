"""Libra and its ablations: every name builds, plans validly, routes through the contract; the CLI.
(The whole registry, baselines included: tests/test_policy_registry.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_planner_workload import make_history, make_step
from test_sim_support import simple_plan

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policies import LIBRA_POLICIES as POLICIES
from libra.scheduling.base import InstanceLoad, TrajectoryObservation
from sim.cli import main as libra_sim

EXPECTED = {"libra", "libra-homogeneous", "libra-full", "libra-hetero", "libra-cmlfq", "no-migration", "reactive-mlfq", "length-predictor", "hindsight-routing"}


@pytest.fixture(scope="module")
def ev() -> CostEvaluator:
    return CostEvaluator(gpu="a800", model="qwen3-8b")


def _drive(policy, plan, step) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """A minimal backend: admit every trajectory, return each tool call, finish. Checks routes."""
    fut = step if policy.sees_future else None
    sched = policy.scheduler(plan, future=fut) if fut is not None else policy.scheduler(plan)
    n_b = len(plan.buckets)
    moves = 0
    for i in range(step.n):
        ctx = int(step.prompt_tokens[i])
        o = TrajectoryObservation(step.ids[i], i, step.step, None, ctx, ctx, 0, None, None, 0.0, None, None)
        b = sched.admit(o)
        assert 0 <= b < n_b
        loads = [InstanceLoad(x.id, b, 0, 0, 0, 1000) for x in plan.instances_in(b)]
        inst = sched.choose_instance(b, loads)
        assert inst in {x.id for x in plan.instances_in(b)}
        for t in range(int(step.turn_offsets[i]), int(step.turn_offsets[i + 1]) - 1):
            ctx += int(step.gen_tokens[t] + step.tool_tokens[t])
            o = TrajectoryObservation(step.ids[i], i, step.step, None, int(step.prompt_tokens[i]), ctx, t - int(step.turn_offsets[i]) + 1,
                                      "bash", "ok", 1.0, inst, b)
            r = sched.on_tool_return(o)
            assert 0 <= r.bucket < n_b and r.bucket >= b or policy.name in ("libra-homogeneous",)
            moves += r.bucket != b
            b = r.bucket
        sched.on_finish(o)
    return {"moves": moves}


def test_registry_names_and_flags(ev: CostEvaluator) -> None:
    assert set(POLICIES) == EXPECTED
    cl = ClusterSpec(24, "a800", "qwen3-8b")
    for name, make in POLICIES.items():
        p = make(cl, ev=ev)
        assert p.name == name
        assert p.sees_future is (name == "hindsight-routing")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_policy_plans_and_routes(ev: CostEvaluator, name: str) -> None:
    cl = ClusterSpec(24, "a800", "qwen3-8b")
    pol = POLICIES[name](cl, ev=ev)
    hist = make_history(3, n=48, median=4000, error_long=True)
    nxt = make_step(step=3, n=48, median=4000, error_long=True)
    plan = pol.plan(cl, hist, nxt.prompt_tokens)
    if plan.colocated:  # the time-shared plan: both stages on every GPU
        assert plan.n_rollout_gpus == plan.n_train_gpus == 24
    else:
        assert plan.n_rollout_gpus + plan.n_train_gpus == 24
    assert plan.train.n_gpus == plan.n_train_gpus
    assert sum(i.tp for i in plan.instances) <= plan.n_rollout_gpus
    assert plan.mode == "sync" and plan.max_staleness == 0
    if name == "libra-homogeneous":
        assert len(plan.buckets) == 1
    _drive(pol, plan, nxt)
    pool = pol.pool(plan)
    assert (pool is None) == (plan.colocated or name in ("libra-homogeneous", "libra-hetero", "libra-cmlfq"))


def test_future_only_for_the_oracle(ev: CostEvaluator) -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b")
    hist = make_history(2, n=32)
    step = make_step(step=2, n=32)
    libra = POLICIES["libra"](cl, ev=ev)
    plan = libra.plan(cl, hist, step.prompt_tokens)
    with pytest.raises(ValueError, match="does not see the future"):
        libra.scheduler(plan, future=step)
    oracle = POLICIES["hindsight-routing"](cl, ev=ev)
    plan = oracle.plan(cl, hist, step.prompt_tokens)
    with pytest.raises(ValueError, match="needs the step"):
        oracle.scheduler(plan)
    assert oracle.scheduler(plan, future=step) is not None


def test_async_mode_and_bad_options(ev: CostEvaluator) -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b")
    pol = POLICIES["libra"](cl, ev=ev, mode="async", max_staleness=2)
    plan = pol.plan(cl, make_history(2, n=32), np.full(32, 500))
    assert plan.mode == "async" and plan.max_staleness == 2
    assert plan.predicted_step_s < plan.predicted_rollout_s + plan.predicted_train_s
    with pytest.raises(UserError, match="unknown option"):
        POLICIES["libra"](cl, ev=ev, nonsense=1)
    with pytest.raises(UserError, match="mode"):
        POLICIES["libra"](cl, ev=ev, mode="bulk")


def test_first_step_plans_from_the_prior(ev: CostEvaluator) -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b")
    plan = POLICIES["libra"](cl, ev=ev).plan(cl, [], np.full(64, 800))
    assert plan.notes["from_prior"] is True and plan.instances


def test_cli_plan_text_json_and_errors(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert libra_sim(["plan", "--gpus", "16", "--gpu", "a800", "--model", "qwen3-8b", "--prompts", "64"]) == 0
    out = capsys.readouterr().out
    assert "split:" in out and "buckets:" in out and "predicted:" in out
    assert libra_sim(["plan", "--gpus", "16", "--model", "qwen3-8b", "--prompts", "64", "--mode", "async", "--max-staleness", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["split"]["rollout_gpus"] + doc["split"]["train_gpus"] == 16
    assert doc["mode"] == "async" and doc["buckets"][-1]["max_context"] is None
    assert sum(b["instances"] for b in doc["buckets"]) == len(doc["instances"])
    assert libra_sim(["plan", "--gpus", "2", "--model", "qwen3-32b"]) == 2
    assert "GPU" in capsys.readouterr().err
    assert libra_sim(["plan", "--gpus", "16", "--trace", str(tmp_path / "missing.jsonl")]) != 0


def test_layout_pin_expresses_heterogeneous_layouts() -> None:
    """Issue 22: ``--plan-split``/``--bucket-bounds`` could pin only TP-1 instances; a layout pin
    forces any per-bucket count x TP x bound, on a split or on a time-shared plan's devices."""
    import pytest as _pt

    from libra.errors import UserError
    from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
    from libra.policies.pinned import PlanPin, layout_text, parse_layout, pin_plan

    lay = parse_layout("1x8,8x1@2048")
    assert lay == ((8, 1, 2048), (1, 8, None)) and layout_text(lay) == "8x1@2048,1x8"
    assert parse_layout("4x2@1024,2x4@8192,1x8") == ((4, 2, 1024), (2, 4, 8192), (1, 8, None))
    for bad in ("8x1@2048", "8x3,1x8@5", "x8", "2x2@10,1x8@10,1x8", ""):
        with _pt.raises(UserError):
            parse_layout(bad)
    coloc = Plan(16, 16, TrainConfig(2, 1, 8), tuple(RolloutInstance(i, 4, 0, i // 2, (i % 2) * 4) for i in range(4)),
                 (Bucket(0, 4, 0, None),), colocated=True)
    p = pin_plan(coloc, PlanPin(None, None, 8, lay))
    assert p.colocated and p.n_rollout_gpus == 16 and p.train == coloc.train
    assert [(b.tp, b.min_context, b.max_context) for b in p.buckets] == [(1, 0, 2048), (8, 2048, None)]
    assert sorted((i.bucket, i.tp) for i in p.instances) == [(0, 1)] * 8 + [(1, 8)]
    # no instance straddles a node, no two share a device
    used = set()
    for i in p.instances:
        assert i.first_gpu + i.tp <= 8
        devs = {i.node * 8 + i.first_gpu + k for k in range(i.tp)}
        assert not devs & used
        used |= devs
    # with a split: the layout must use the split's rollout devices
    sp = pin_plan(coloc, PlanPin((16, 8), None, 8, lay))
    assert not sp.colocated and sp.n_rollout_gpus == 16 and sp.n_train_gpus == 8 and len(sp.instances) == 9
    with _pt.raises(UserError):
        PlanPin((12, 12), None, 8, lay)
    with _pt.raises(UserError):
        pin_plan(coloc, PlanPin(None, None, 8, parse_layout("1x8")))  # 8 of the 16 time-shared devices


def test_default_libra_carries_only_the_mechanisms_that_paid() -> None:
    """Issue 22: heterogeneous TP (causal routing), C-MLFQ and the elastic pool paid nowhere they
    were measured (docs/results.md, "Which mechanisms pay"), so ``libra`` is the planner with
    one bucket, work-conserving least-loaded routing with tool-time rebalancing within it (the
    mechanism that paid, on MoE decode), no pool; ``libra-homogeneous`` the same without the
    rebalancing. ``libra-full`` keeps them all."""
    from libra.cluster import ClusterSpec
    from libra.policies.libra_policy import LIBRA_POLICIES

    cl = ClusterSpec(16, "a800", "qwen3-8b")
    lib, full = LIBRA_POLICIES["libra"](cl), LIBRA_POLICIES["libra-full"](cl)
    assert (lib.router, lib.elastic, lib._options.max_buckets) == ("least-loaded-rebalance", False, 1)
    homo = LIBRA_POLICIES["libra-homogeneous"](cl)
    assert (homo.router, homo.elastic, homo._options.max_buckets) == ("least-loaded", False, 1)
    plan = simple_plan()
    assert lib.scheduler(plan).rebalances and not homo.scheduler(plan).rebalances  # type: ignore[attr-defined]
    assert (full.router, full.elastic, full._options.max_buckets) == ("cmlfq", True, 2)
