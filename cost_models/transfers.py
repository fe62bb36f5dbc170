"""Data movement between roles: weight sync after a training step, role changes of elastic-pool
GPUs, and KV-cache migration between rollout instances.

Why separate from the operator set: these are whole-model or whole-context moves whose size comes
from the model (bytes of bf16 weights, bytes of KV) and whose path (NVLink inside a node, one
InfiniBand NIC per GPU across nodes, PCIe to host memory) comes from the placement. Link time is
taken from the operator set's ``p2p_s``/``allgather_s`` (so a calibration corrects bandwidth,
efficiency and latency); PCIe copies use ``GPUSpec.pcie_bw`` with ``PCIE_EFF``. Formulas and
constants: docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec
from cost_models.memory import ADAM_STATE_BYTES, DTYPE_BYTES, check_tp, expert_dp, params_per_gpu
from cost_models.models import ModelSpec
from cost_models.operators.base import OperatorSet

PCIE_EFF = 0.8  # pinned-memory cudaMemcpy reaches ~80% of the achieved-bandwidth figure in bursts
ROLE_CHANGE_FIXED_S = 1.0  # engine sleep/wake (vLLM sleep mode), allocator empty_cache, process sync
KV_MIGRATION_FIXED_S = 0.5e-3  # allocate destination blocks, update block tables, resume
TENSORS_PER_LAYER = 12  # q, k, v, o, gate, up, down, 2 norms, q/k norms, (router): one message each

SyncMode = Literal["broadcast", "sharded"]


def _f(x: object) -> float:
    return float(x)  # type: ignore[arg-type]


def weight_bytes(model: ModelSpec) -> float:
    """bf16 bytes of the whole model (what every rollout instance must receive)."""
    return float(DTYPE_BYTES * model.params_total)


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
) -> float:
    """Seconds to push freshly trained bf16 weights into every rollout instance.

    ``broadcast`` (verl / OpenRLHF style): the trainer gathers each tensor across its TP x PP
    shards, then NCCL-broadcasts it to all rollout GPUs; a pipelined broadcast costs one link
    transfer of the full ``W`` bytes regardless of the receiver count, plus per-tensor latency;
    each rollout GPU then copies its TP shard out of the received tensors.
    ``sharded`` (resharding, checkpoint-engine style): every trainer GPU sends slices it owns
    directly to the rollout GPUs that need them; the busiest link carries
    ``max(instances x W / n_train_gpus, W / min(rollout tp))`` bytes.
    ``same_node`` picks NVLink (True: trainer and rollout GPUs share one NVLink domain, which
    on GB200 NVL72 is the 72-GPU rack, not the 4-GPU tray) or the per-GPU InfiniBand NIC (False).
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
    inter = not same_node
    n_tensors = model.n_layers * TENSORS_PER_LAYER + 3
    latency = n_tensors * _f(ops.p2p_s(0.0, inter))
    min_tp = min(int(t) for t in rollout_tps)
    load = _f(ops.memory_bound_s(W + W / min_tp))  # read received tensors, write this GPU's shard
    if mode == "broadcast":
        shards = train_tp * train_pp
        gather = _f(ops.allgather_s(W, shards, shards > gpu.nvlink_domain)) if shards > 1 else 0.0
        n_recv = sum(int(t) for t in rollout_tps)
        hops = _f(ops.p2p_s(0.0, inter)) * math.log2(max(2, n_recv))
        return gather + _f(ops.p2p_s(W, inter)) + hops + latency + load
    if mode == "sharded":
        per_link = max(len(rollout_tps) * W / n_train_gpus, W / min_tp)
        return _f(ops.p2p_s(per_link, inter)) + latency + load
    raise CostModelError(f"weight sync mode must be 'broadcast' or 'sharded', got {mode!r}")


def _pcie_s(gpu: GPUSpec, nbytes: float) -> float:
    return nbytes / (gpu.pcie_bw * PCIE_EFF)


def rollout_weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """bf16 weights one GPU of a rollout instance holds."""
    check_tp(model, tp)
    return DTYPE_BYTES * params_per_gpu(model, tp).total


def train_state_bytes_per_gpu(model: ModelSpec, tp: int, pp: int, dp: int, ep: int = 1, zero_stage: int = 1) -> float:
    """bf16 weights + fp32 optimizer state one training GPU holds (gradients are recreated)."""
    p = params_per_gpu(model, tp, pp, ep)
    shard = p.dense / dp + p.expert / expert_dp(tp, dp, ep)  # experts: over tp*dp/ep (folding)
    weights = DTYPE_BYTES * (shard if zero_stage >= 3 else p.total)
    optim = ADAM_STATE_BYTES * (shard if zero_stage >= 1 else p.total)
    return weights + optim


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
    """Seconds for one GPU to switch role through host memory (PCIe), as verl's hybrid engine
    and an elastic pool do.

    To ``rollout``: optionally offload the training state (weights + optimizer shard) to host,
    load the rollout weight shard, allocate the KV cache. To ``train``: drop rollout weights and
    KV (free), reload the training state. Plus ``ROLE_CHANGE_FIXED_S`` for engine sleep/wake.
    """
    state = train_state_bytes_per_gpu(model, train_tp, train_pp, train_dp, train_ep, zero_stage)
    if to == "rollout":
        moved = rollout_weight_bytes_per_gpu(model, rollout_tp) + (state if offload_previous else 0.0)
    elif to == "train":
        moved = state
    else:
        raise CostModelError(f"role must be 'rollout' or 'train', got {to!r}")
    return ROLE_CHANGE_FIXED_S + _pcie_s(gpu, moved)


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
