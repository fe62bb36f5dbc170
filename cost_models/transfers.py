"""Data movement between roles: weight sync after a training step, role changes of elastic-pool
GPUs, and KV-cache migration between rollout instances.

Why separate from the operator set: these are whole-model or whole-context moves whose size comes
from the model (bytes of bf16 weights, bytes of KV) and whose path (NVLink inside a node, one
InfiniBand NIC per GPU across nodes, PCIe to host memory) comes from the placement. Link time is
taken from the operator set's ``p2p_s``/``allgather_s`` (so a calibration corrects bandwidth,
efficiency and latency); host copies (engine wake-up, trainer offload/onload) use the measured
effective rates of ``cost_models.rl_overheads`` as fractions of ``GPUSpec.pcie_bw``; a weight sync
pays ``rl_overheads.SYNC_MESSAGE_S`` per message (per tensor unless bucketed), so an MoE with
thousands of expert tensors syncs far slower than a dense model of the same bytes. Formulas,
constants and the rows they are fitted on: docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec
from cost_models.memory import DTYPE_BYTES, check_tp
from cost_models.models import ModelSpec
from cost_models.operators.base import OperatorSet
from cost_models.rl_overheads import (
    ENGINE_SLEEP_S,
    SYNC_MESSAGE_S,
    engine_wake_s,
    rollout_weight_bytes_per_gpu,
    train_state_bytes_per_gpu,
    trainer_offload_s,
    trainer_onload_s,
    weight_tensors,
)

KV_MIGRATION_FIXED_S = 0.5e-3  # allocate destination blocks, update block tables, resume

SyncMode = Literal["broadcast", "sharded", "ipc"]

__all__ = [
    "KV_MIGRATION_FIXED_S", "SyncMode", "kv_migration_s", "role_change_s", "rollout_weight_bytes_per_gpu",
    "sync_messages", "train_state_bytes_per_gpu", "weight_bytes", "weight_sync_s",
]


def _f(x: object) -> float:
    return float(x)  # type: ignore[arg-type]


def weight_bytes(model: ModelSpec) -> float:
    """bf16 bytes of the whole model (what every rollout instance must receive)."""
    return float(DTYPE_BYTES * model.params_total)


def sync_messages(model: ModelSpec, bucket_bytes: float | None = None) -> int:
    """Messages a weight sync sends: one per tensor (``weight_tensors``) when unbucketed (verl's
    and most frameworks' default), else ``ceil(W / bucket_bytes)`` packed buckets."""
    if bucket_bytes is None:
        return weight_tensors(model)
    if bucket_bytes <= 0:
        raise CostModelError(f"bucket_bytes must be > 0 or None, got {bucket_bytes}")
    return max(1, math.ceil(weight_bytes(model) / bucket_bytes))


def weight_sync_s(
    ops: OperatorSet,
    gpu: GPUSpec,
    model: ModelSpec,
    n_train_gpus: int,
    train_tp: int,
    train_pp: int,
    rollout_tps: Sequence[int],
    same_node: bool = False,
    mode: SyncMode = "broadcast",
    bucket_bytes: float | None = None,
) -> float:
    """Seconds to push freshly trained bf16 weights into every rollout instance.

    Every form pays, per message (a tensor, or a bucket when ``bucket_bytes`` is given),
    ``SYNC_MESSAGE_S`` (gather from the shards, one collective call, the engine's
    ``load_weights``; fitted on published syncs) plus the link's latency; then each rollout GPU
    copies its TP shard out of the received tensors (memory bound).

    ``broadcast`` (verl / OpenRLHF style): the trainer gathers each tensor across its TP x PP
    shards, then NCCL-broadcasts it to all rollout GPUs; a pipelined broadcast costs one link
    transfer of the full ``W`` bytes regardless of the receiver count, plus ``log2`` hop latencies.
    ``sharded`` (resharding, checkpoint-engine style): every trainer GPU sends slices it owns
    directly to the rollout GPUs that need them; the busiest link carries
    ``max(instances x W / n_train_gpus, W / min(rollout tp))`` bytes.
    ``ipc`` (colocated plans: the engine lives on the trainer's GPUs): the trainer gathers each
    tensor over its shards and the engine maps it through CUDA IPC; no network transfer.
    ``same_node`` (training and every instance in one NVLink domain) picks NVLink, else the
    per-GPU InfiniBand NIC.
    """
    if not rollout_tps:
        return 0.0
    if n_train_gpus < 1 or train_tp < 1 or train_pp < 1 or train_tp * train_pp > n_train_gpus:
        raise CostModelError(
            f"weight sync needs n_train_gpus >= train_tp*train_pp >= 1, got {n_train_gpus}, tp={train_tp}, pp={train_pp}"
        )
    for t in rollout_tps:
        check_tp(model, int(t))
    W = weight_bytes(model)
    min_tp = min(int(t) for t in rollout_tps)
    load = _f(ops.memory_bound_s(W + W / min_tp))  # read received tensors, write this GPU's shard
    messages = sync_messages(model, bucket_bytes)
    shards = train_tp * train_pp
    shards_inter = shards > gpu.nvlink_domain
    gather = _f(ops.allgather_s(W, shards, shards_inter)) if shards > 1 else 0.0
    if mode == "ipc":
        lat = _f(ops.p2p_s(0.0, shards_inter)) if shards > 1 else 0.0
        return gather + messages * (SYNC_MESSAGE_S + lat) + load
    inter = not same_node
    per_message = messages * (SYNC_MESSAGE_S + _f(ops.p2p_s(0.0, inter)))
    if mode == "broadcast":
        n_recv = sum(int(t) for t in rollout_tps)
        hops = _f(ops.p2p_s(0.0, inter)) * math.log2(max(2, n_recv))
        return gather + _f(ops.p2p_s(W, inter)) + hops + per_message + load
    if mode == "sharded":
        per_link = max(len(rollout_tps) * W / n_train_gpus, W / min_tp)
        return _f(ops.p2p_s(per_link, inter)) + per_message + load
    raise CostModelError(f"weight sync mode must be 'broadcast', 'sharded' or 'ipc', got {mode!r}")


def role_change_s(
    gpu: GPUSpec,
    model: ModelSpec,
    to: Literal["rollout", "train"],
    rollout_tp: int = 1,
    train_tp: int = 1,
    train_pp: int = 1,
    train_dp: int = 1,
    train_ep: int = 1,
    zero_stage: int = 1,
    offload_previous: bool = True,
) -> float:
    """Seconds for one GPU to switch role through host memory outside a colocated step: an
    elastic-pool GPU lent to training and given back, or a GPU whose role a new plan changes.

    To ``train``: the engine sleeps (frees KV, drops its weights) and the training shard is
    onloaded from host memory at the measured trainer onload rate. To ``rollout``: the training
    state is offloaded (if ``offload_previous``) at the measured offload rate, and the engine
    wakes, reloading its weight shard from host memory. Constants: ``cost_models.rl_overheads``.
    """
    if to == "rollout":
        check_tp(model, rollout_tp)
        off = trainer_offload_s(gpu, model, train_tp, train_pp, train_dp, train_ep, zero_stage) if offload_previous else 0.0
        return off + engine_wake_s(gpu, model, rollout_tp, load_weights=True)
    if to == "train":
        return ENGINE_SLEEP_S + trainer_onload_s(gpu, model, train_tp, train_pp, train_dp, train_ep, zero_stage)
    raise CostModelError(f"role must be 'rollout' or 'train', got {to!r}")


def kv_migration_s(
    ops: OperatorSet, model: ModelSpec, tokens: float, tp_src: int, tp_dst: int, same_node: bool = True
) -> float:
    """Seconds to move ``tokens`` of one sequence's KV cache between instances: the logical KV
    bytes (all layers, all KV heads, bf16) split over ``min(tp_src, tp_dst)`` parallel GPU-to-GPU
    links (each source GPU sends the heads it holds), NVLink when ``same_node`` (one NVLink
    domain) else InfiniBand,
    plus block-table bookkeeping. 0 for an empty context."""
    if tokens < 0:
        raise CostModelError(f"tokens must be >= 0, got {tokens}")
    check_tp(model, tp_src)
    check_tp(model, tp_dst)
    if tokens == 0:
        return 0.0
    lanes = min(tp_src, tp_dst, model.n_kv_heads)
    per_lane = tokens * model.kv_bytes_per_token(DTYPE_BYTES) / lanes
    return _f(ops.p2p_s(per_lane, not same_node)) + KV_MIGRATION_FIXED_S
