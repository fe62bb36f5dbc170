"""``libra-run`` and ``libra-sim`` drive the same decision calls (issue 11, "one step interface").

One real ``libra-run`` step (torch engine and trainer on CPU workers, C-MLFQ over two forced
buckets) is recorded with ``libra.scheduling.recorder``; its trace is replayed by the simulator
(``sim.loop.Simulator``, noise off) on the same cluster, with the same policy (by name from the
core's registry, on the simulator's evaluator, with the run's loop options) and the same pin of
split and bucket bounds, which is part of that policy (``libra.policies.pinned``), recorded the
same way: in each backend the plan the policy returned is the plan it executed. Both backends
get the recorder through the one object they share, the ``Policy``. Compared: the plan (split, training strategy, instances' TP and bucket,
buckets), each trajectory's admission bucket, the (from, to, migrate) of every routing decision at
a tool call per (trajectory, turn), the observations those decisions were made from, and what
``on_finish`` was told. Not compared: which instance of a bucket ran what and when
(``choose_instance``, ``next_for``), which depend on timing and differ by design.

The step is built to need routing decisions: contexts cross the bound (26 tokens) at their call
(floor moves to bucket 1), some stay below it, and the 36-token context limit ends the math
trajectories as their tool output returns (finish ``length``), the case the backends disagreed
on: the simulator did not route a trajectory's trailing call, which ``libra-run`` routes since it
cannot know at the call's start that the output will end it (fixed in ``sim/rollout.py``).

The same comparison runs over two asynchronous steps (staleness class K=1, issue 20).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from runtime_markers import needs_ray

#: one step, 4 prompts x 3 (math, two-product math, search), a 36-token context limit
RUN = dict(steps=1, prompts_per_step=4, group_size=3, max_new_tokens=20, max_context=36, max_tool_calls=2,
           tasks={"math": 1, "math2": 1, "search": 1}, replay=False, eval_tasks=0, engine="torch", trainer="torch",
           devices=3, split="2:1", bucket_bounds=[26], policy="libra-cmlfq")


def _shape(plan: Any) -> tuple[Any, ...]:
    """The decided parts of a plan (not its notes: those carry timings and digests)."""
    return (plan.n_rollout_gpus, plan.n_train_gpus, plan.colocated, plan.mode, plan.streaming, plan.train,
            tuple((i.id, i.tp, i.bucket, i.node, i.first_gpu) for i in plan.instances),
            tuple((b.index, b.tp, b.min_context, b.max_context) for b in plan.buckets))


@needs_ray
def test_one_recorded_step_makes_the_same_decisions_in_both_backends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from libra.cluster import ClusterSpec
    from libra.runtime.config import load_config
    from libra.runtime.loop import Runner
    from libra.scheduling.recorder import DecisionLog, recorded
    from libra.runtime.policyglue import make_policy
    from sim.costs import load_costs
    from sim.loop import SimConfig, Simulator
    from sim.replay import load_steps

    cfg = load_config(None, {"out": str(tmp_path / "run"), **RUN})
    run = DecisionLog()
    runner = Runner(cfg, log=lambda m: print(m, flush=True), decisions=run)
    out = runner.run()["out"]

    steps, _header = load_steps(os.path.join(out, "trace.jsonl"))
    assert [s.step for s in steps] == [0] and steps[0].n == 12
    cluster: ClusterSpec = runner.cluster  # the run's: devices, per node, context cap, torch trainer's one device, engine profile
    costs = load_costs(cluster.gpu, cluster.model, cluster.gpus_per_node, cfg.calibration, engine=cluster.engine)
    # the loop is the plan's in both (streaming unset here, as in the run)
    conf = SimConfig(noise_sigma=0.0, seed=cfg.seed, streaming=cfg.streaming, mini_batches=cfg.mini_batches)
    replay = DecisionLog()
    # the policy by name from the core's registry, built as libra-run builds it (its pin included),
    # on the simulator's evaluator
    policy = make_policy(cfg.policy, cluster, costs.ev, cfg.seed, cfg.kl_coef > 0, streaming=cfg.streaming, mini_batches=cfg.mini_batches,
                         split=cfg.split_pair(), bucket_bounds=cfg.bucket_bounds, per_node=cfg.per_node)
    res = Simulator(steps, recorded(policy, replay), cluster, costs, conf).run()
    assert res.steps[0].completed == 12

    # the plan (same cluster, no history, same prompts, the same pin): in each backend the plan the
    # policy returned is the one it executed, and the two backends' plans are equal
    assert len(run.planned) == len(replay.planned) == 1 and len(run.executed) == len(replay.executed) == 1
    a, b = run.planned[0], replay.planned[0]
    assert a.plan is run.executed[0] and b.plan is replay.executed[0]
    assert (a.history_steps, a.n_prompts) == (b.history_steps, b.n_prompts) == (0, 12)
    assert _shape(a.plan) == _shape(b.plan)
    assert a.plan.predicted_rollout_s == pytest.approx(b.plan.predicted_rollout_s, rel=1e-9)
    assert (a.plan.n_rollout_gpus, a.plan.n_train_gpus) == (2, 1)
    assert [(x.tp, x.max_context) for x in a.plan.buckets] == [(1, 26), (1, None)]
    # the loop: each backend ran the plan's (steps.csv's streaming column, the simulator's step mode)
    (row,) = _csv(os.path.join(out, "steps.csv"))
    assert int(row["streaming"]) == int(a.plan.streaming)
    assert res.steps[0].mode == ("sync+streaming" if a.plan.streaming else "sync")

    # what each backend reported of the step it ran (Policy.observe, the planner's feedback): the
    # executed plan, the step's trajectories, a measured rollout time (wall-clock / simulated)
    assert len(run.observed) == len(replay.observed) == 1
    for log in (run, replay):
        o = log.observed[0]
        assert o.step == 0 and o.plan is log.executed[0] and o.trajectories.n == 12 and o.rollout_s > 0
    assert run.observed[0].trajectories.ids == replay.observed[0].trajectories.ids

    # admission: by the prompt alone
    assert run.admissions(0) == replay.admissions(0) and len(run.admissions(0)) == 12

    # routing at tool calls: what each decided from, then what it decided
    assert run.route_inputs(0) == replay.route_inputs(0)
    routes = run.routes(0)
    assert routes == replay.routes(0)
    assert len(routes) >= 4
    assert any(f != t for f, t, _m in routes.values()), "some context must cross the 26-token bound at a call (a floor move)"
    assert any(f == t for f, t, _m in routes.values()), "some trajectory must stay in its bucket"
    ends = {t.id for t in _trajectories(out) if t.finish == "length" and t.turns[-1].tool}
    assert ends & {k[0] for k in routes}, "a routed call after which the trajectory ended by length (the case that differed)"

    # what the router was told at each finish (it learns from it)
    assert run.finishes(0) == replay.finishes(0) and len(run.finishes(0)) == 12


#: the same step, asynchronous (staleness class K=1; the policy plans async at CPU scale), 2 steps
ASYNC_RUN = dict(steps=2, prompts_per_step=4, group_size=3, max_new_tokens=20, max_context=36, max_tool_calls=2,
           tasks={"math": 1, "math2": 1, "search": 1}, replay=False, eval_tasks=0, engine="torch", trainer="torch",
           devices=3, split="2:1", bucket_bounds=[26], policy="libra-cmlfq", max_staleness=1)


@needs_ray
def test_async_steps_make_the_same_decisions_in_both_backends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two async steps (issue 20): the plan of step 1 is made as rollout 0 ends, while step 0
    still trains, from the same history in both backends; plans, admissions, routing and
    finishes match step by step."""
    from libra.runtime.config import load_config
    from libra.runtime.loop import Runner
    from libra.runtime.policyglue import make_policy
    from libra.scheduling.recorder import DecisionLog, recorded
    from sim.costs import load_costs
    from sim.loop import SimConfig, Simulator
    from sim.replay import load_steps

    cfg = load_config(None, {"out": str(tmp_path / "run"), **ASYNC_RUN})
    run = DecisionLog()
    runner = Runner(cfg, log=lambda m: print(m, flush=True), decisions=run)
    out = runner.run()["out"]
    steps, _ = load_steps(os.path.join(out, "trace.jsonl"))
    cluster = runner.cluster
    costs = load_costs(cluster.gpu, cluster.model, cluster.gpus_per_node, cfg.calibration, engine=cluster.engine)
    policy = make_policy(cfg.policy, cluster, costs.ev, cfg.seed, cfg.kl_coef > 0, streaming=cfg.streaming, mini_batches=cfg.mini_batches,
                         split=cfg.split_pair(), bucket_bounds=cfg.bucket_bounds, per_node=cfg.per_node, max_staleness=cfg.max_staleness)
    replay = DecisionLog()
    # libra-run's async loop: each step's rollout a batch whose tail gates the next (per-step)
    conf = SimConfig(noise_sigma=0.0, seed=cfg.seed, streaming=cfg.streaming, mini_batches=cfg.mini_batches, max_staleness=cfg.max_staleness,
                     continuous=False)
    res = Simulator(steps, recorded(policy, replay), cluster, costs, conf).run()
    assert [m.mode for m in res.steps] == ["async", "async"]
    assert [r["loop"] for r in _csv(os.path.join(out, "steps.csv"))] == ["async", "async"]
    # each step planned with the same history (the steps whose rollout had finished: the plan of
    # step 1 is made while step 0 still trains, in both backends), the same plan
    assert [(p.history_steps, p.n_prompts) for p in run.planned] == [(p.history_steps, p.n_prompts) for p in replay.planned] == [(0, 12), (1, 12)]
    for a, b in zip(run.planned, replay.planned):
        assert _shape(a.plan) == _shape(b.plan) and a.plan.mode == "async" and a.plan.max_staleness == 1
    for j in (0, 1):
        assert run.admissions(j) == replay.admissions(j) and len(run.admissions(j)) == 12
        assert run.route_inputs(j) == replay.route_inputs(j) and run.routes(j) == replay.routes(j)
        assert run.finishes(j) == replay.finishes(j)
    assert len(run.routes(0)) + len(run.routes(1)) >= 4


def _csv(path: str) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _trajectories(out: str) -> list[Any]:
    from libra.trace.reader import read_trajectories

    return read_trajectories(os.path.join(out, "trace.jsonl"))
