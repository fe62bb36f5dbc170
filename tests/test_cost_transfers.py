"""Transfers: weight sync, role changes and KV migration scale with bytes and links as modelled."""

from __future__ import annotations

import pytest

from cost_models import CostEvaluator, CostModelError
from cost_models.training import TrainStrategy
from cost_models.rl_overheads import ENGINE_SLEEP_S, ENGINE_WAKE_EFF, ENGINE_WAKE_FIXED_S
from cost_models.transfers import weight_bytes


@pytest.fixture(scope="module")
def ev() -> CostEvaluator:
    return CostEvaluator("h100", "qwen3-14b")


def test_weight_sync_bytes_over_links(ev: CostEvaluator) -> None:
    W = weight_bytes(ev.model)
    assert W == 2 * ev.model.params_total
    ib = ev.weight_sync_s(8, 4, 1, [2, 2, 4], same_node=False)
    nvl = ev.weight_sync_s(8, 4, 1, [2, 2, 4], same_node=True)
    assert nvl < ib
    # the full model over one 50 GB/s NIC is the floor of a broadcast
    assert ib > W / ev.gpu.inter_node_bw
    assert ev.weight_sync_s(8, 4, 1, []) == 0.0
    assert ev.weight_sync_s(strategy=TrainStrategy(4, 1, 2), rollout_tps=[2, 2, 4]) == ib
    # sharded sync: more trainer GPUs (more senders) never slower
    few = ev.weight_sync_s(8, 4, 1, [1] * 16, mode="sharded")
    many = ev.weight_sync_s(32, 4, 1, [1] * 16, mode="sharded")
    assert many < few


def test_weight_sync_errors(ev: CostEvaluator) -> None:
    with pytest.raises(CostModelError, match="valid tp"):
        ev.weight_sync_s(8, 4, 1, [3])
    with pytest.raises(CostModelError, match="'broadcast', 'sharded' or 'ipc'"):
        ev.weight_sync_s(8, 4, 1, [2], mode="magic")  # type: ignore[arg-type]
    with pytest.raises(CostModelError, match="needs n_train_gpus"):
        ev.weight_sync_s(rollout_tps=[2])


def test_role_change(ev: CostEvaluator) -> None:
    s = TrainStrategy(4, 1, 2)
    to_roll = ev.role_change_s("rollout", rollout_tp=2, strategy=s)
    to_roll_no_offload = ev.role_change_s("rollout", rollout_tp=2, strategy=s, offload_previous=False)
    to_train = ev.role_change_s("train", strategy=s)
    assert to_roll > to_roll_no_offload > ENGINE_WAKE_FIXED_S
    # rollout weights of tp=2: half the model's bf16 bytes (+ norms) at the measured wake-up rate
    expect = ENGINE_WAKE_FIXED_S + 2 * (ev.model.params_total / 2) / (ev.gpu.pcie_bw * ENGINE_WAKE_EFF)
    assert to_roll_no_offload == pytest.approx(expect, rel=0.01)
    assert to_train > ENGINE_SLEEP_S
    with pytest.raises(CostModelError, match="'rollout' or 'train'"):
        ev.role_change_s("idle")  # type: ignore[arg-type]


def test_kv_migration(ev: CostEvaluator) -> None:
    assert ev.kv_migration_s(0, 2, 2) == 0.0
    t1 = ev.kv_migration_s(10_000, 2, 4)
    t2 = ev.kv_migration_s(100_000, 2, 4)
    assert t2 > t1 > 0
    assert ev.kv_migration_s(100_000, 4, 4) < t2  # more parallel links
    assert ev.kv_migration_s(100_000, 2, 4, same_node=False) > t2
    # 100k tokens x 160 KiB over 2 NVLink lanes: bytes / (2 x 450 GB/s) is a floor
    assert t2 > 100_000 * ev.model.kv_bytes_per_token() / (2 * ev.gpu.intra_node_bw)
    with pytest.raises(CostModelError, match="tokens must be >= 0"):
        ev.kv_migration_s(-1, 2, 2)
