"""RL step overheads (cost_models.rl_overheads) and the one StepCosts the planner and the
simulator share: fitted constants reproduce from the published rows, MoE syncs pay per tensor,
and with noise off a replay charges exactly what the planner predicts (train, sync, switches,
transitions), single-node syncs on NVLink in both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cost_models import CostEvaluator
from cost_models import rl_overheads as ro
from cost_models.calibration import rl_steps
from cost_models.models import get_model
from cost_models.training import TrainStrategy
from cost_models.transfers import weight_bytes
from libra.cluster import ClusterSpec
from libra.planner.decision_tree import training_time_fn
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.planner.search import Planner, SearchOptions
from libra.planner.step_costs import StepCosts, train_gpu_ids
from libra.planner.transfers import transition_s, weight_sync_s
from libra.policies.static import uniform_instances
from sim.costs import SimCosts
from sim.loop import SimConfig, Simulator
from test_sim_support import FixedPolicy, make_step


# ---- the fit ------------------------------------------------------------------------------------
def test_fitted_constants_reproduce_from_the_csv() -> None:
    fit = rl_steps.fitted_constants()
    for name, value in fit.items():
        assert getattr(ro, name) == pytest.approx(value, rel=1e-3), name


def test_every_named_row_exists_once_and_the_report_prints() -> None:
    rows = rl_steps.load_rows()
    res = rl_steps.residuals(rows)
    assert {r.role for r in res} == {"fit", "check"}
    assert all(r.predicted_s > 0 and r.published_s > 0 for r in res)
    text = rl_steps.report(rows)
    assert "SYNC_MESSAGE_S" in text and "verl_fully_async / weight_sync / Qwen3-30B-A3B / 15.76 s" in text


def test_the_moe_sync_fit_rows_are_close() -> None:
    """The per-tensor cost is what makes verl's 30B-A3B sync 130x its 7B sync: the two fit rows
    land within 30 %, and the dense check row is far below both."""
    res = {r.row: r for r in rl_steps.sync_residuals(rl_steps.load_rows())}
    moe30 = res["verl_fully_async / weight_sync / Qwen3-30B-A3B / 15.76 s"]
    moe235 = res["verl_fully_async / weight_sync / Qwen3-235B-A22B / 58.57 s"]
    dense = res["verl_fully_async / weight_sync / Qwen2.5-Math-7B / 0.12 s"]
    assert abs(moe30.error) < 0.3 and abs(moe235.error) < 0.3
    assert dense.predicted_s < moe30.predicted_s / 20


# ---- the terms ----------------------------------------------------------------------------------
def test_tensor_counts_follow_the_model() -> None:
    dense, moe = get_model("qwen3-8b"), get_model("qwen3-30b-a3b")
    assert ro.weight_tensors(dense) == 36 * 11 + 3
    assert ro.weight_tensors(moe) == 48 * (8 + 1 + 3 * 128) + 3


def test_moe_weight_sync_is_slower_than_dense_of_the_same_bytes() -> None:
    moe = CostEvaluator("h100", "qwen3-30b-a3b")
    dense = CostEvaluator("h100", "qwen3-32b")  # 7 % more bytes, 27x fewer tensors
    assert weight_bytes(dense.model) > weight_bytes(moe.model)
    for same in (True, False):
        t_moe = moe.weight_sync_s(8, 1, 1, [4, 4], same_node=same)
        t_dense = dense.weight_sync_s(8, 1, 1, [4, 4], same_node=same)
        assert t_moe > 3 * t_dense
        # bucketing removes the per-tensor cost
        assert moe.weight_sync_s(8, 1, 1, [4, 4], same_node=same, bucket_bytes=1e9) < t_dense


def test_host_copies_use_the_measured_rates_not_the_datasheet() -> None:
    ev = CostEvaluator("h100", "qwen3-8b")
    s = TrainStrategy(1, 1, 8, zero_stage=3)
    state = ro.train_state_bytes_per_gpu(ev.model, 1, 1, 8, 1, 3)
    on = ro.ENGINE_SLEEP_S + ro.TRAINER_ONLOAD_FIXED_S + state / (ro.TRAINER_ONLOAD_EFF * ev.gpu.pcie_bw)
    assert ev.stage_switch_s("train", 1, s) == pytest.approx(on)
    off = ro.TRAINER_OFFLOAD_FIXED_S + state / (ro.TRAINER_OFFLOAD_EFF * ev.gpu.pcie_bw) + ro.ENGINE_WAKE_FIXED_S
    assert ev.stage_switch_s("rollout", 1, s) == pytest.approx(off)
    assert off > state / ev.gpu.pcie_bw * 5  # a tenth of pinned-copy speed, as vime measured
    assert ev.step_fixed_s(512) == pytest.approx(512 * ro.PER_SAMPLE_S)


# ---- planner and simulator share one price list ---------------------------------------------------
def _plan(n_gpus: int, n_rollout: int, rollout_tp: int, train: TrainConfig, colocated: bool = False) -> Plan:
    inst = uniform_instances(n_rollout, rollout_tp, 8)
    return Plan(n_rollout_gpus=n_rollout, n_train_gpus=n_gpus if colocated else n_gpus - n_rollout, train=train, instances=inst,
                buckets=(Bucket(0, rollout_tp, 0, None),), colocated=colocated)


class Sequenced(FixedPolicy):
    """The i-th plan at the i-th step (the last one after)."""

    def __init__(self, plans: Sequence[Plan]) -> None:
        super().__init__(plans[0])
        self.plans = list(plans)
        self.calls = 0

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
        p = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        return p


@pytest.fixture(scope="module")
def ev8() -> CostEvaluator:
    return CostEvaluator("h100", "qwen3-8b")


def _replay(ev: CostEvaluator, cluster: ClusterSpec, plans: Sequence[Plan], n_steps: int = 2, kl: bool = False):  # type: ignore[no-untyped-def]
    steps = [make_step(s, 16, seed=3) for s in range(n_steps)]
    sim = Simulator(steps, Sequenced(plans), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0, kl=0.1 if kl else 0.0))
    return steps, sim.run()


@pytest.mark.parametrize("n_gpus", [8, 16])
def test_replay_charges_what_the_planner_predicts(ev8: CostEvaluator, n_gpus: int) -> None:
    """Noise off, one split plan: the simulator's training stage is the planner's timer on the
    step's tokens plus the per-sample bookkeeping, and its sync is the planner's weight sync;
    on one node (8 GPUs) that sync is the NVLink one in both."""
    cluster = ClusterSpec(n_gpus, "h100", "qwen3-8b")
    train = TrainConfig(tp=2, pp=1, dp=n_gpus // 4, zero_stage=3)
    plan = _plan(n_gpus, n_gpus // 2, 2, train)
    steps, res = _replay(ev8, cluster, [plan], kl=True)
    sc = StepCosts(ev8)
    for st, m in zip(steps, res.steps):
        tokens, seq = int(st.total_tokens.sum()), int(round(float(st.total_tokens.mean())))
        want = training_time_fn(ev8, tokens, seq, kl=True)(train) + sc.step_fixed_s(st.n)
        assert m.train_s == pytest.approx(want, rel=1e-12)
        assert m.sync_s == pytest.approx(weight_sync_s(ev8, cluster, plan.n_train_gpus, train, plan.instances), rel=1e-12)
        assert m.transition_s == 0.0
    same = n_gpus <= 8
    assert res.steps[0].sync_s == pytest.approx(ev8.weight_sync_s(strategy=TrainStrategy(2, 1, n_gpus // 4, zero_stage=3),
                                                                  rollout_tps=[2] * (n_gpus // 4), same_node=same))
    if same:  # one node: NVLink in both, strictly cheaper than the network path the simulator used to charge
        assert res.steps[0].sync_s < ev8.weight_sync_s(strategy=TrainStrategy(2, 1, 2, zero_stage=3), rollout_tps=[2] * 2)


def test_planner_candidates_price_single_node_sync_on_nvlink(ev8: CostEvaluator) -> None:
    from test_planner_search import make_history

    cluster = ClusterSpec(8, "h100", "qwen3-8b")
    planner = Planner(cluster, ev8, SearchOptions(colocated=False))
    hist = make_history(2, n=32)
    for c in planner.search(hist, hist[-1].prompt_tokens).candidates:
        nvl = ev8.weight_sync_s(strategy=planner.step_costs.strategy(c.train), rollout_tps=[i.tp for i in c.rollout.instances], same_node=True)
        assert c.sync_s == pytest.approx(nvl)


def test_colocated_replay_charges_the_planners_switches(ev8: CostEvaluator) -> None:
    cluster = ClusterSpec(8, "h100", "qwen3-8b")
    train = TrainConfig(tp=1, pp=1, dp=8, zero_stage=3)
    plan = _plan(8, 8, 2, train, colocated=True)
    _, res = _replay(ev8, cluster, [plan])
    sc = StepCosts(ev8)
    for m in res.steps:
        assert m.switch_s + m.sync_s == pytest.approx(sc.colocated_overhead_s(train, plan.instances), rel=1e-12)
        assert m.sync_s == pytest.approx(sc.colocated_sync_s(train, plan.instances), rel=1e-12)


def test_a_replan_costs_its_transition_in_replay(ev8: CostEvaluator) -> None:
    """Step 0 runs 8:8 with TP-2 instances, step 1 moves to 12:4 with TP-4 instances and a new
    training strategy: step 1 pays exactly the planner's transition (noise off), step 0 nothing,
    and its rollout starts late by the instances' weight load."""
    cluster = ClusterSpec(16, "h100", "qwen3-8b")
    a = _plan(16, 8, 2, TrainConfig(tp=2, pp=1, dp=4, zero_stage=3))
    b = _plan(16, 12, 4, TrainConfig(tp=2, pp=1, dp=2, zero_stage=3))
    _, res = _replay(ev8, cluster, [a, b])
    _, same = _replay(ev8, cluster, [b, b])
    sc = StepCosts(ev8)
    t = sc.transition(a, b.n_train_gpus, b.train, b.instances)
    assert t.train_changed and t.moved and t.total_s > 0
    assert t.total_s == pytest.approx(transition_s(ev8, cluster, a, b.n_train_gpus, b.train, b.instances))
    m0, m1 = res.steps
    assert m0.transition_s == 0.0
    assert m1.transition_s == pytest.approx(t.total_s, rel=1e-12)
    assert same.steps[1].transition_s == 0.0
    # the same step under the same plan, without the move, is shorter by at least the re-shard
    assert m1.step_s > same.steps[1].step_s + t.to_train_s - 1e-9
    # rows in steps.csv carry it
    assert "transition_s" in m1.row()


def test_the_training_gpus_are_placed_alike() -> None:
    inst = (RolloutInstance(0, 2, 0, node=0, first_gpu=0), RolloutInstance(1, 2, 0, node=0, first_gpu=4))
    assert train_gpu_ids(16, 6, False, inst, 8) == (2, 3, 6, 7, 8, 9)
    assert train_gpu_ids(16, 4, True, inst, 8) == (0, 1, 2, 3)


def test_a_move_from_time_shared_to_an_async_split_is_priced_as_the_replay_charges_it(ev8: CostEvaluator) -> None:
    """From a time-shared plan the planner priced every move as free (its engines reload between
    stages anyway). Libra's time-shared step now trains on a following async split's training
    GPUs (``LibraPolicy.training_plan``) and the split's rollout starts at once: its engines that
    none of the time-shared plan's ran start first, in the planner's price and the replay's alike."""
    cluster = ClusterSpec(16, "h100", "qwen3-8b")
    shared = _plan(16, 16, 4, TrainConfig(tp=2, pp=1, dp=8, zero_stage=3), colocated=True)
    split = _plan(16, 4, 2, TrainConfig(tp=2, pp=1, dp=6, zero_stage=3))
    sc = StepCosts(ev8)
    start = sc.engine_start_s(2)
    assert start > 0
    assert transition_s(ev8, cluster, shared, split.n_train_gpus, split.train, split.instances, "async") == pytest.approx(start)
    assert transition_s(ev8, cluster, shared, split.n_train_gpus, split.train, split.instances, "sync") == 0.0
    # an async split on the time-shared engines' own GPUs and TP starts no engine
    kept = _plan(16, 4, 4, TrainConfig(tp=2, pp=1, dp=6, zero_stage=3))
    assert transition_s(ev8, cluster, shared, kept.n_train_gpus, kept.train, kept.instances, "async") == 0.0
