"""B200 / GB200 in the catalog, the NVLink domain separate from the node, the one TP rule, and
Megatron MoE parallel folding (issue 10, part 4). Fast: no planner search beyond one small plan."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from cost_models import CostEvaluator, CostModelError, GPUS, get_gpu, get_model
from cost_models.memory import (
    ROLLOUT_MAX_TP,
    params_per_gpu,
    tp_degrees,
    train_breakdown,
    valid_eps,
)
from cost_models.models import MODELS
from cost_models.training import TrainStrategy, validate_strategy
from libra.cluster import ClusterSpec
from libra.planner.costs import nvlink_domain, valid_tp_degrees
from libra.planner.decision_tree import enumerate_strategies
from libra.planner.packing import fits, instance_gpus, place, placement_error
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from sim.costs import SimCosts
from sim.instance import SimulationError
from sim.loop import SimConfig, Simulator


# ---- the catalog ---------------------------------------------------------------------------
def test_b200_gb200_datasheet_entries() -> None:
    b, gb = get_gpu("b200"), get_gpu("GB200")
    assert (b.memory_bytes, b.hbm_bw, b.bf16_flops) == (180e9, 7.7e12, 2250e12)
    assert (gb.memory_bytes, gb.hbm_bw, gb.bf16_flops) == (186e9, 8.0e12, 2500e12)
    assert b.intra_node_bw == gb.intra_node_bw == 900e9  # NVLink 5: 1.8 TB/s both directions
    assert b.inter_node_bw == gb.inter_node_bw == 50e9  # one 400 Gb/s NDR NIC per GPU
    assert (b.gpus_per_node, b.nvlink_domain) == (8, 8)
    assert (gb.gpus_per_node, gb.nvlink_domain) == (4, 72)
    assert get_gpu("b200_sxm") is b and get_gpu("gb200-nvl72") is gb


def test_nvlink_domain_follows_a_board_but_keeps_a_rack() -> None:
    assert get_gpu("h100").with_gpus_per_node(4).nvlink_domain == 4  # an HGX board of 4
    assert get_gpu("gb200").with_gpus_per_node(8).nvlink_domain == 72  # trays of 8, same rack
    assert CostEvaluator("gb200", "qwen3-8b", gpus_per_node=4).gpu.nvlink_domain == 72
    with pytest.raises(CostModelError, match="multiple of gpus_per_node"):
        get_gpu("gb200").with_gpus_per_node(5)
    with pytest.raises(CostModelError, match="multiple of gpus_per_node"):
        replace(get_gpu("h100"), nvlink_domain=4)


def test_cli_gpu_choices_know_the_new_gpus(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from cost_models import cli as calib_cli
    from sim import cli as sim_cli

    assert calib_cli.main(["report", "--quick", "--gpu", "b200", "gb200", "--family", "comm_intra", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "operator_report.md").read_text()
    assert "| comm_intra | b200 |" in text and "| comm_intra | gb200 |" in text
    capsys.readouterr()
    assert sim_cli.main(["plan", "--gpus", "16", "--gpu", "gb200", "--model", "qwen3-8b", "--prompts", "64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"]["gpu"] == "gb200" and doc["cluster"]["gpus_per_node"] == 4  # the tray, from the catalog


# ---- the one TP rule ----------------------------------------------------------------------
@pytest.mark.parametrize("domain", [1, 4, 6, 8, 72])
def test_tp_rule_agrees_everywhere(domain: int) -> None:
    """memory.tp_degrees is the rule; the planner, the training validator, the rollout timer and
    the decision tree all accept exactly its degrees."""
    gpu = replace(get_gpu("gb200"), gpus_per_node=min(domain, 4) if domain % 4 == 0 else domain, nvlink_domain=domain)
    for name in sorted(MODELS):
        m = get_model(name)
        train, roll = tp_degrees(m, domain), tp_degrees(m, domain, rollout=True)
        assert roll == [t for t in train if t <= ROLLOUT_MAX_TP]
        assert valid_tp_degrees(m, gpu.gpus_per_node, domain, rollout=True) == tuple(roll)
        assert valid_tp_degrees(m, gpu.gpus_per_node, domain, rollout=False) == tuple(train)
        ok = []
        for tp in range(1, domain + 1):
            try:
                validate_strategy(TrainStrategy(tp, 1, 1), m, gpu)
                ok.append(tp)
            except CostModelError:
                pass
        assert ok == train, name
    # the rollout timer and the decision tree, on the real bundle of an 8-GPU and a 72-GPU domain
    for g in ("h100", "gb200"):
        ev = CostEvaluator(g, "qwen3-30b-a3b")
        dom = ev.gpu.nvlink_domain
        for tp in range(1, dom + 1):
            try:
                ev.decode_s(tp, 1, 100)
                assert tp in tp_degrees(ev.model, dom, rollout=True)
            except CostModelError:
                assert tp not in tp_degrees(ev.model, dom, rollout=True)
        n = 72 if g == "gb200" else 16
        res = enumerate_strategies(ev, n, 4096, 2048, ev.gpu.gpus_per_node, None)
        cut = {p.what for p in res.pruned if p.reason.startswith("rule")}  # the TP level prunes "tp=X"
        kept = {t for t in range(1, dom + 1) if n % t == 0 and f"tp={t}" not in cut}
        assert kept == {t for t in tp_degrees(ev.model, dom) if n % t == 0}
        assert {c.tp for _, c in res.ranked} <= kept


def test_gb200_rollout_tp_stops_at_8_and_training_tp_may_span_trays() -> None:
    ev = CostEvaluator("gb200", "qwen3-30b-a3b")
    assert ev.valid_rollout_tps() == [1, 2, 4, 8]  # 8 > the 4-GPU tray
    with pytest.raises(CostModelError, match="at most 8.; valid tp: 1, 2, 4, 8$"):
        ev.decode_s(16, 1, 100)  # divides the heads, but past the engine cap and not dividing 72
    ev.validate(TrainStrategy(tp=8, pp=1, dp=9), 72)  # one TP-8 group over two trays, on NVLink
    with pytest.raises(CostModelError, match="does not divide the 72-GPU NVLink domain"):
        ev.validate(TrainStrategy(tp=16, pp=1, dp=4))
    h = CostEvaluator("h100", "qwen3-30b-a3b")
    with pytest.raises(CostModelError, match="exceeds the 8 GPUs of one NVLink domain"):
        h.validate(TrainStrategy(tp=16, pp=1, dp=1))


def test_links_follow_the_nvlink_domain_not_the_tray() -> None:
    """A TP-8 all-reduce on GB200 rides NVLink (the fitted table, carried past its 4-GPU rows by
    B200's measured growth), and a data-parallel group inside the rack is not charged the NIC."""
    ev = CostEvaluator("gb200", "qwen3-8b")
    ops = ev.ops
    for nbytes in (16e3, 1e6, 64e6):
        intra8 = float(ops.allreduce_s(nbytes, 8))
        assert float(ops.allreduce_s(nbytes, 4)) * 0.9 <= intra8 < float(ops.allreduce_s(nbytes, 8, inter_node=True))
        b200 = float(CostEvaluator("b200", "qwen3-8b").ops.allreduce_s(nbytes, 8))
        assert intra8 == pytest.approx(b200, rel=0.35)
    inside = ev.train_iter_s(TrainStrategy(tp=1, pp=1, dp=64, zero_stage=1), 1 << 20, 4096)
    two_racks = CostEvaluator(replace(get_gpu("gb200"), nvlink_domain=32), "qwen3-8b")
    across = two_racks.train_iter_s(TrainStrategy(tp=1, pp=1, dp=64, zero_stage=1), 1 << 20, 4096)
    assert inside < across


# ---- placement: planner and simulator --------------------------------------------------------
def _sim(gpu: str, n: int, gpn: int) -> Simulator:
    ev = CostEvaluator(gpu, "qwen3-8b", gpus_per_node=gpn)
    return Simulator([], None, ClusterSpec(n, gpu, "qwen3-8b", gpus_per_node=gpn), SimCosts(ev, gpus_per_node=gpn), SimConfig())  # type: ignore[arg-type]


def _plan(instances: tuple[RolloutInstance, ...], n: int) -> Plan:
    used = sum(i.tp for i in instances)
    return Plan(n_rollout_gpus=used, n_train_gpus=n - used, train=TrainConfig(tp=1, pp=1, dp=n - used),
                instances=instances, buckets=(Bucket(0, instances[0].tp, 0, None),))


def test_gb200_tp8_instance_spans_two_trays_and_is_valid() -> None:
    assert placement_error(0, 0, 8, 4, 72) is None
    assert instance_gpus(0, 0, 8, 4) == tuple(range(8))
    where = place(72, 4, [8] * 9, 72)
    assert where == [(2 * k, 0) for k in range(9)]  # every instance starts a tray pair
    assert fits(72, 72, [8] * 9) and not fits(72, 4, [8])
    # across the rack boundary (GPUs 68..75 of two racks) or across an HGX board: refused
    assert "72-GPU NVLink domain" in str(placement_error(17, 0, 8, 4, 72))
    assert "8-GPU node" in str(placement_error(0, 4, 8, 8, 8))
    sim = _sim("gb200", 144, 4)
    inst = tuple(RolloutInstance(id=k, tp=8, bucket=0, node=n, first_gpu=g) for k, (n, g) in enumerate(place(72, 4, [8] * 9, 72)))
    assert sim._instance_gpus(_plan(inst, 144))[0] == tuple(range(8))
    bad = (RolloutInstance(id=0, tp=8, bucket=0, node=17, first_gpu=0),)
    with pytest.raises(SimulationError, match="does not fit one 72-GPU NVLink domain"):
        sim._instance_gpus(_plan(bad, 144))
    with pytest.raises(SimulationError, match="does not fit one 8-GPU node"):
        _sim("h100", 16, 8)._instance_gpus(_plan((RolloutInstance(id=0, tp=8, bucket=0, node=0, first_gpu=4),), 16))


def test_planner_places_what_the_simulator_accepts_on_gb200() -> None:
    from libra.planner.costs import DecodeTable
    from libra.planner.rollout_dp import RolloutDP
    from libra.planner.stats import compute_stats

    ev = CostEvaluator("gb200", "qwen3-30b-a3b")
    sim = _sim("gb200", 72, 4)
    table = DecodeTable(ev, (8,))
    stats = compute_stats([], np.full(64, 1024, np.int64))  # the documented length prior
    choice = RolloutDP(stats, table, 4, 72, tps=(8,), nvlink_domain=nvlink_domain(ev.gpu, 4)).best(40)
    assert choice is not None and [i.tp for i in choice.instances] == [8] * 5
    gpus = sim._instance_gpus(_plan(choice.instances, 72))
    assert any(g[0] // 4 != g[-1] // 4 for g in gpus)  # a TP-8 instance over two trays
    assert all(g[0] // 72 == g[-1] // 72 for g in gpus)


# ---- MoE parallel folding ----------------------------------------------------------------------
def test_tp2_ep8_on_32_gpus_validates_and_the_tree_enumerates_it() -> None:
    ev = CostEvaluator("h200", "qwen3-30b-a3b")
    for pp, dp in ((1, 16), (2, 8), (4, 4)):  # pp=4: dp=4 < ep=8, refused before folding
        ev.validate(TrainStrategy(tp=2, pp=pp, dp=dp, ep=8), 32)
    ev.validate(TrainStrategy(tp=2, pp=1, dp=4, ep=8), 8)  # EP over every rank of one board
    res = enumerate_strategies(ev, 32, 4096, 2048, 8, None)
    shapes = {(c.tp, c.pp, c.dp, c.ep) for _, c in res.ranked}
    assert (2, 4, 4, 8) in shapes and (2, 1, 16, 8) in shapes
    assert all((c.tp * c.dp) % c.ep == 0 and 128 % c.ep == 0 for _, c in res.ranked)


def test_invalid_ep_names_the_valid_ones() -> None:
    ev = CostEvaluator("h200", "qwen3-30b-a3b")
    with pytest.raises(CostModelError, match=r"ep=16 must divide the 128 experts and tp\*dp = 2\*4 = 8 .*; valid ep: 1, 2, 4, 8$"):
        ev.validate(TrainStrategy(tp=2, pp=4, dp=4, ep=16))
    with pytest.raises(CostModelError, match=r"valid ep: 1, 2, 4$"):
        ev.validate(TrainStrategy(tp=1, pp=1, dp=12, ep=3))
    with pytest.raises(CostModelError, match="needs a MoE model"):
        CostEvaluator("h200", "qwen3-8b").validate(TrainStrategy(tp=1, pp=1, dp=8, ep=2))
    assert valid_eps(get_model("qwen3-8b"), 2, 8) == [1]


def test_expert_sharding_under_folding() -> None:
    """ep > 1: each GPU holds n_experts / ep whole experts, replicated (and ZeRO-sharded) over
    tp * dp / ep ranks; ep == 1 keeps TP-sharded experts."""
    m = get_model("qwen3-30b-a3b")
    per_layer = m.n_experts * m.expert_params
    assert params_per_gpu(m, tp=2, ep=8).expert == pytest.approx(m.n_layers * per_layer / 8)
    assert params_per_gpu(m, tp=2, ep=1).expert == pytest.approx(m.n_layers * per_layer / 2)
    g = get_gpu("h200")
    s = TrainStrategy(tp=2, pp=1, dp=16, ep=8, zero_stage=3)
    p = params_per_gpu(m, 2, 1, 8)
    optim = train_breakdown(g, m, s, 4096)["optimizer"]
    assert optim == pytest.approx(12 * (p.dense / 16 + p.expert / (2 * 16 / 8)))


def test_ep_all_to_all_is_on_nvlink_when_the_group_tiles_a_domain() -> None:
    ev = CostEvaluator("h200", "qwen3-30b-a3b")
    t8 = ev.train_iter_s(TrainStrategy(tp=1, pp=1, dp=16, ep=8), 1 << 19, 4096)
    t16 = ev.train_iter_s(TrainStrategy(tp=1, pp=1, dp=16, ep=16), 1 << 19, 4096)
    wide = CostEvaluator(replace(get_gpu("h200"), gpus_per_node=8, nvlink_domain=16), "qwen3-30b-a3b")
    t16_nvl = wide.train_iter_s(TrainStrategy(tp=1, pp=1, dp=16, ep=16), 1 << 19, 4096)
    assert t16_nvl < t16  # the same EP-16 group, on NVLink instead of the NIC
    assert np.isfinite(t8)


def test_gpus_catalog_lists_the_new_entries() -> None:
    assert {"b200", "gb200"} <= set(GPUS)


@pytest.mark.parametrize("gpus,gpu,model", [(72, "gb200", "qwen3-30b-a3b"), (64, "b200", "qwen3-32b")])
def test_smoke_plans_on_the_new_gpus(gpus: int, gpu: str, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``libra-sim plan --gpus 72 --gpu gb200 --model qwen3-30b-a3b`` (and 64 x b200, qwen3-32b)
    produce a plan whose instances the simulator's placement check accepts."""
    from sim import cli as sim_cli

    assert sim_cli.main(["plan", "--gpus", str(gpus), "--gpu", gpu, "--model", model, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["instances"] and np.isfinite(doc["predicted"]["step_s"])
    t = doc["train"]
    ev = CostEvaluator(gpu, model)
    ev.validate(TrainStrategy(t["tp"], t["pp"], t["dp"], t["ep"], t["zero_stage"], t["micro_batch"], t["recompute"]))
