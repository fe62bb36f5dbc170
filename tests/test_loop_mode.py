"""Issue 11, cause 3: Libra chooses its loop within the staleness class the user allows.

Before: Libra was sync unless told otherwise, never streamed (so its elastic pool could never lend
in the simulator: training started after the rollout), and the class was not a concept: ``--mode
async`` ran any policy async, areal-static-optimal always async even "on-policy". Now the user
states K (``max_staleness``); the planner prices sync, sync + streaming and (K >= 1) async with the
simulator's own prices and puts the fastest in the plan (``Plan.mode``/``streaming``/
``max_staleness``); the simulator runs what the plan says; overrides are checked against K;
baselines run their best loop in the class; results carry the class and the loop that ran.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_planner_workload import make_history
from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.search import Planner, SearchOptions, step_time, streaming_step_s
from libra.policies import POLICIES
from sim.cli import main
from sim.costs import load_costs
from sim.instance import SimulationError
from sim.loop import SimConfig, Simulator
from sim.metrics import RunResult
from sim.replay import replay_policy
from sim.report import best_baseline, vs_best_baseline

CLUSTER = ClusterSpec(16, "a800", "qwen3-8b")


@pytest.fixture(scope="module")
def ev() -> CostEvaluator:
    return CostEvaluator(gpu="a800", model="qwen3-8b")


def test_planner_picks_the_fastest_loop_the_class_allows(ev: CostEvaluator) -> None:
    """K = 0: an on-policy plan (here the time-shared one); K = 1: async, because the planner's
    own prediction of async is the fastest of the three loops it priced for that split."""
    hist = make_history(2, n=64)
    on = POLICIES["libra"](CLUSTER, ev=ev).plan(CLUSTER, hist, hist[-1].prompt_tokens)
    assert on.mode == "sync" and on.max_staleness == 0
    off = POLICIES["libra"](CLUSTER, ev=ev, max_staleness=1).plan(CLUSTER, hist, hist[-1].prompt_tokens)
    assert off.mode == "async" and off.max_staleness == 1 and not off.streaming
    loops = off.notes["loop_step_s"]
    # streaming is priced only with a strategy that holds twice the longest sequence seen
    # (``STREAM_MEMORY_HEADROOM``: nothing settles a streamed step)
    assert {"sync", "async"} <= set(loops) <= {"sync", "sync+streaming", "async"}
    assert loops["async"] == min(loops.values()) and off.predicted_step_s == pytest.approx(loops["async"])
    assert off.predicted_step_s < on.predicted_step_s  # allowing staleness paid
    # async is the simulator's continuous generation: the steady period no faster than the
    # throughput and train + sync, with a step's rollout (between alone and the staleness cycle of
    # K + 1 rollouts together, by its staggered overlap) plus train + sync over K + 1 periods,
    # never above the whole-wave price
    from libra.planner.pipeline import async_steady_s

    f = float(off.notes["rollout_factor"])
    chain = off.predicted_train_s + float(off.notes["sync_s"])
    load, cohort = float(off.notes["rollout_throughput_s"]) * f, float(off.notes["rollout_cohort_s"]) * f
    want = async_steady_s(off.predicted_rollout_s, chain, min(load, off.predicted_rollout_s), cohort, 1)
    assert loops["async"] == pytest.approx(want)
    assert max(load, chain) * (1 - 1e-9) <= loops["async"] <= max(load, chain, (cohort + chain) / 2) * (1 + 1e-9)


def test_streaming_prediction_is_between_the_overlap_and_sync() -> None:
    """Streaming never predicts more than sync, never less than rollout + the last mini-batch,
    and without length statistics nothing overlaps."""
    finals = np.array([100.0] * 30 + [4000.0] * 2)
    st = streaming_step_s(50.0, 20.0, 1.0, finals, 4)
    assert 50.0 + 20.0 * (finals[-8:].sum() / finals.sum()) + 1.0 <= st + 1e-9 <= step_time("sync", 50.0, 20.0, 1.0)
    assert st < step_time("sync", 50.0, 20.0, 1.0)
    assert streaming_step_s(50.0, 20.0, 1.0, np.array([]), 4) == step_time("sync", 50.0, 20.0, 1.0)


def test_streaming_waits_for_whole_groups() -> None:
    """Issue 22: a streamed mini-batch is cut from whole GRPO groups (the simulator's feed, GRPO's
    advantage), so a trajectory's data is ready when its group's longest member finishes. Each
    group of 4 here holds one long trajectory: every group completes at the rollout's end and
    nothing overlaps, which the per-trajectory forecast (groups ignored) missed by 17%."""
    finals = np.array([1000.0, 1000.0, 1000.0, 2000.0] * 8)
    groups = np.repeat(np.arange(8), 4)
    ready = np.array([finals[groups == g].max() for g in groups])
    sync = step_time("sync", 50.0, 20.0, 1.0)
    assert streaming_step_s(50.0, 20.0, 1.0, finals, 4, ready) == pytest.approx(sync)
    assert streaming_step_s(50.0, 20.0, 1.0, finals, 4) < 0.85 * sync  # the old, per-trajectory forecast


def test_stats_carry_each_trajectorys_group_completion() -> None:
    """``WorkloadStats.group_final_context``: aligned with ``final_context``, each entry its
    group's longest final length (never below its own)."""
    from libra.planner.stats import compute_stats

    hist = [make_step(s, 24, seed=7) for s in range(2)]
    st = compute_stats(hist, hist[-1].prompt_tokens, window=2)
    assert len(st.group_final_context) == len(st.final_context)
    assert np.all(st.group_final_context >= st.final_context)
    assert np.all(np.diff(st.final_context) >= 0)
    longest = {(s.step, g): max(int(t) for t, gg in zip(s.total_tokens, s.groups) if gg == g) for s in hist for g in set(s.groups)}
    assert sorted(st.group_final_context.tolist()) == sorted(longest[(s.step, g)] for s in hist for g in s.groups)


def test_streamed_forecast_matches_the_simulators_feed() -> None:
    """The planner's streamed step against the simulator running the same plan on the same step
    (noise off): within 10% (the finish time of a group is modelled as linear in its length)."""
    from libra.planner.stats import compute_stats

    step = make_step(0, 64, seed=11, turns=(1, 6), gen=(5, 400))
    cl = ClusterSpec(8, "a800", "qwen3-8b")
    pol = POLICIES["libra"](cl, streaming=True)
    plan = pol.plan(cl, [step], step.prompt_tokens)
    assert plan.streaming and not plan.colocated
    res = Simulator([step], FixedPolicy(plan), cl, load_costs("a800", "qwen3-8b"), SimConfig(noise_sigma=0.0, streaming=True)).run()
    m = res.steps[0]
    st = compute_stats([step], step.prompt_tokens, window=1)
    train = m.forward_s + m.update_s + m.prep_s
    pred = streaming_step_s(m.rollout_makespan_s, train, m.sync_s, st.final_context, 4, st.group_final_context)
    old = streaming_step_s(m.rollout_makespan_s, train, m.sync_s, st.final_context, 4)
    assert pred == pytest.approx(m.step_s, rel=0.10)
    assert abs(pred - m.step_s) < abs(old - m.step_s)


def test_split_plans_stream_when_on_policy(ev: CostEvaluator) -> None:
    """With the time-shared plan out of the way, the on-policy search streams a split plan: it
    predicts less than plain sync for the same split (training hides under the rollout's tail)."""
    hist = make_history(2, n=64)
    res = Planner(CLUSTER, ev, SearchOptions(colocated=False)).search(hist, hist[-1].prompt_tokens)
    assert res.best.streaming and res.best.mode == "sync"
    loops = res.best.mode_step_s
    assert loops["sync+streaming"] < loops["sync"]


def test_simulator_runs_the_plans_loop_and_reports_the_class() -> None:
    steps = [make_step(s, 24, seed=4) for s in range(3)]
    streamed = replace(simple_plan(), streaming=True)
    _, res = _run(steps, streamed, SimConfig(noise_sigma=0.0))
    assert res.mode == "sync+streaming" and res.max_staleness == 0 and res.staleness == 0
    assert all(m.mode == "sync+streaming" for m in res.steps)
    # streaming: training starts while this step's rollout still runs
    assert any(m.train_start_s < m.rollout_start_s + m.rollout_makespan_s for m in res.steps)
    asyn = replace(simple_plan(), mode="async", max_staleness=1)
    _, res = _run(steps, asyn, SimConfig(max_staleness=2, noise_sigma=0.0))
    assert res.mode == "async" and res.max_staleness == 2 and res.staleness == 1
    assert res.summary()["mode"] == "async" and res.summary()["max_staleness"] == 2
    with pytest.raises(SimulationError, match="staleness class K=0"):
        _run(steps, asyn, SimConfig(max_staleness=0))


def test_overrides_are_checked_against_the_class() -> None:
    steps = [make_step(0, 8, seed=1)]
    for cfg, msg in ((SimConfig(mode="async", max_staleness=0), "--max-staleness K >= 1"),
                     (SimConfig(mode="async", staleness=3, max_staleness=1), "exceeds --max-staleness 1"),
                     (SimConfig(mode="async", streaming=True, max_staleness=1), "synchronous loop")):
        with pytest.raises(UserError, match=msg):
            _run(steps, simple_plan(), cfg)
    with pytest.raises(UserError, match="staleness bound of at least 1"):
        SearchOptions(mode="async", max_staleness=0)


def test_cli_async_with_k0_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = _trace(tmp_path)
    assert main(["replay", str(tr), "--gpus", "16", "--mode", "async"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-staleness" in err[0]


def test_baselines_in_their_class() -> None:
    """areal-static-optimal is async by design: refused at K = 0, left out of a K = 0 --compare
    (which then exits 0); verl-static-uniform runs sync at K = 0 and may run verl's one-step-off
    async at K >= 1; verl-colocated stays sync in every class."""
    costs = load_costs("a800", "qwen3-8b")
    steps = [make_step(s, 32, seed=2, gen=(50, 400)) for s in range(2)]
    with pytest.raises(UserError, match="asynchronous by design"):
        replay_policy(steps, "areal-static-optimal", CLUSTER, SimConfig(), costs=costs)
    a = replay_policy(steps, "areal-static-optimal", CLUSTER, SimConfig(max_staleness=2), costs=costs)
    assert a.mode == "async" and a.max_staleness == 2 and a.staleness == 2
    for k in (0, 1):
        v = replay_policy(steps, "verl-static-uniform", CLUSTER, SimConfig(max_staleness=k), costs=costs)
        assert v.max_staleness == k and (v.mode == "sync" if k == 0 else v.mode in ("sync", "async"))
        assert v.staleness <= min(k, 1)
        c = replay_policy(steps, "verl-colocated", CLUSTER, SimConfig(max_staleness=k), costs=costs)
        assert c.mode == "sync" and c.max_staleness == k


def test_compare_skips_policies_outside_the_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = _trace(tmp_path)
    rc = main(["replay", str(tr), "--gpus", "16", "--compare", "--jobs", "1", "--policies", "verl-static-uniform,areal-static-optimal,libra"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "not in staleness class K=0" in out and "libra (" in out and "best baseline of staleness class K=0" in out


def test_ratio_is_against_the_best_baseline_of_the_same_class() -> None:
    def run(policy: str, k: int, step_s: float) -> RunResult:
        r = RunResult(policy=policy, mode="sync", max_staleness=k)
        r.steps = [_metrics(step_s)]
        return r

    rs = [run("verl-static-uniform", 0, 30.0), run("verl-colocated", 0, 40.0), run("areal-static-optimal", 1, 10.0),
          run("libra", 0, 20.0), run("libra", 1, 20.0)]
    assert best_baseline(rs, 0) is rs[0]
    assert vs_best_baseline(rs[3], rs) == pytest.approx(1.5)
    assert vs_best_baseline(rs[4], rs) == pytest.approx(0.5)
    assert vs_best_baseline(rs[0], rs) != vs_best_baseline(rs[0], rs)  # NaN for a baseline


# ---- helpers --------------------------------------------------------------------------------------
def _run(steps, plan, cfg):  # type: ignore[no-untyped-def]
    sim = Simulator(steps, FixedPolicy(plan), ClusterSpec(16, "fake", "fake"), fake_costs(), cfg)
    return sim, sim.run()


def _trace(tmp_path: Path) -> Path:
    from test_sim_replay_cli import _trace as write

    return write(tmp_path / "t.jsonl", steps=2, n=16)


def _metrics(step_s: float):  # type: ignore[no-untyped-def]
    from sim.metrics import StepMetrics

    fields = {f: 0 for f in StepMetrics.__dataclass_fields__}
    fields.update(step=0, step_s=step_s, rollout_tps="1x1", mode="sync")
    return StepMetrics(**fields)


def test_streaming_pool_lends_only_when_the_training_gain_pays_the_return() -> None:
    """With streaming the pool can lend in a sync step (training runs beside the rollout), but a
    lent GPU returns at the next rollout's start: it lends only when the training tail it
    shortens beats that return (rule 5 of libra.pool.elastic)."""
    from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
    from libra.pool.base import InstanceState, PoolObservation, RoleChange
    from libra.pool.elastic import ElasticPool

    ev = CostEvaluator(gpu="a800", model="qwen3-14b")
    inst = tuple(RolloutInstance(i, 2, 0, 0, 2 * i) for i in range(3))

    def plan(tail: float) -> Plan:
        return Plan(n_rollout_gpus=6, n_train_gpus=2, train=TrainConfig(2, 1, 1, zero_stage=3), instances=inst,
                    buckets=(Bucket(0, 2, 0, None),), mode="sync", streaming=True, predicted_rollout_s=600.0,
                    predicted_train_s=tail + 10.0, predicted_step_s=600.0 + tail, notes={"sync_s": 0.0})

    states = (InstanceState(0, 2, 0, 0, 0, 10.0), InstanceState(1, 2, 0, 5, 0, None), InstanceState(2, 2, 0, 5, 0, None))
    obs = PoolObservation(100.0, 0.0, states, 10, 0, True, 2)
    small, big = ElasticPool(plan(0.5), ev=ev), ElasticPool(plan(500.0), ev=ev)
    assert small.training_gain_s(2) < small.return_s(2) and small.on_rollout_progress(obs) == []
    assert big.training_gain_s(2) > big.return_s(2) and big.on_rollout_progress(obs) == [RoleChange(0, "nonblocking")]


def test_compare_several_classes_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-staleness 0,1``: each class replayed, one table, the ratio per class, JSON keys per class."""
    import json

    tr = _trace(tmp_path)
    out = tmp_path / "r.json"
    rc = main(["replay", str(tr), "--gpus", "16", "--compare", "--jobs", "1", "--policies", "verl-static-uniform,areal-static-optimal,libra",
               "--max-staleness", "0,1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "best baseline of staleness class K=0" in text and "best baseline of staleness class K=1" in text
    doc = json.loads(out.read_text())["policies"]
    assert set(doc) == {"verl-static-uniform K=0", "libra K=0", "verl-static-uniform K=1", "areal-static-optimal K=1", "libra K=1"}
    assert all(v["max_staleness"] == int(k[-1]) for k, v in doc.items())


def test_first_step_prior_comes_in_declared_grpo_groups() -> None:
    """Before any step ran, the planner knows the run's group size (a trace header's
    ``group_size``, via ``cluster_limits``); the prior's trajectories come in such groups, so the
    first streamed forecast waits for whole groups too. Without it each is its own group."""
    from libra.planner.stats import PriorSpec, compute_stats
    from libra.trace.limits import cluster_limits
    from libra.trace.records import TraceHeader

    kwargs, _ = cluster_limits(TraceHeader(workload="search", metadata={"group_size": 8, "params": {"max_context": 8192}}))
    assert kwargs["group_size"] == 8 and kwargs["max_context"] == 8192
    cl = ClusterSpec(16, "a800", "qwen3-8b", **kwargs)
    prompts = np.full(64, 300)
    grouped = compute_stats([], prompts, prior=PriorSpec.of(cl))
    alone = compute_stats([], prompts, prior=PriorSpec.of(replace(cl, group_size=None)))
    assert np.all(alone.group_final_context == alone.final_context)
    assert np.mean(grouped.group_final_context > grouped.final_context) > 0.5
    with pytest.raises(UserError, match="group_size"):
        cluster_limits(TraceHeader(workload="search", metadata={"group_size": 0}))
