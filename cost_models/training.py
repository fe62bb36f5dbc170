"""Training-step timing: one optimizer step of a TP x PP x DP (x EP) strategy, composed from
operator timings.

Why composed and not a single MFU number: the planner trades TP (all-reduces on NVLink) against
PP (bubbles) against DP/ZeRO (gradient and parameter collectives, possibly over InfiniBand), so
each of those terms must move the way it does on a real cluster. Every formula and constant is in
docs/cost-model.md; in short, per micro-batch on the heaviest pipeline stage:

- forward: per block the QKV/O/MLP GEMMs (TP-sharded, m = micro-batch tokens), flash attention,
  MoE via ``moe_s``, RMSNorm/residual/SwiGLU elementwise traffic, 2 TP all-reduces, for MoE 2 EP
  all-to-alls; the last stage adds the LM head and the fp32 log-softmax.
- backward: every GEMM twice (dX and dW, with their own shapes), flash attention 2.5x forward
  (FlashAttention-2 recomputes QK^T and does 5 instead of 2 matmuls), elementwise 2x, MoE 2x,
  the same collectives again; full recomputation adds one forward.
- ZeRO-3 gathers each block's parameters in forward and backward and reduce-scatters its
  gradients, prefetched so a block costs ``max(compute, collective)``.
- 1F1B pipeline: ``(m + p - 1) * (F + B + activation p2p)``, i.e. bubble (p-1)/(m+p-1).
- after the last backward: DP gradient reduction (ZeRO-0 all-reduce, ZeRO-1 reduce-scatter +
  parameter all-gather, overlapped with the last backward), ZeRO-2 parameter all-gather,
  the Adam step (memory bound over this GPU's optimizer shard) and a fixed per-step overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec
from cost_models.memory import (
    DTYPE_BYTES,
    ep_rule,
    kv_heads_per_gpu,
    layer_params_per_gpu,
    params_per_gpu,
    pp_degrees,
    pp_rule,
    stage_layers,
    tp_degrees,
    tp_rule,
    valid_eps,
)
from cost_models.models import ModelSpec
from cost_models.strategy import TrainStrategy
from cost_models.operators.base import OperatorSet

ATTN_BWD_FACTOR = 2.5  # FlashAttention-2 backward / forward time (5 vs 2 matmuls)
OPT_STEP_BYTES = 28.0  # Adam: read+write fp32 master, m, v (24) + read grad (2) + write bf16 weight (2)
STEP_OVERHEAD_S = 0.02  # per optimizer step: grad-norm/clip, scheduler, framework bookkeeping
MICROBATCH_OVERHEAD_S = 1e-3  # per micro-batch: Python/launch overhead of DeepSpeed/Megatron loops
#: Published RL frameworks run their training passes slower than the sum of the measured kernels
#: they are made of (log-prob and entropy work over the full vocabulary in fp32, padding and
#: un-padding, data movement between the controller and the workers, un-overlapped FSDP/Megatron
#: work, kernels run outside CUDA graphs): the forward and backward compute of every block and of
#: the LM head is multiplied by this factor; collectives, the optimizer step and the per-step
#: constants are not. Fitted by ``python -m cost_models.calibration.train_framework`` on the
#: published stage times of RLinf/verl runs with known token counts (docs/cost-model.md,
#: "Training passes in RL frameworks"); 1.0 prices kernels alone.
FRAMEWORK_COMPUTE_FACTOR = 1.866
#: Training attention (FlashAttention forward and backward over packed, causal sequences) runs
#: slower than the inference prefill kernels the operator tables measure by this factor, on top
#: of ``FRAMEWORK_COMPUTE_FACTOR``; fitted with it (same script). 1.0: the tables as measured.
TRAIN_ATTENTION_FACTOR = 2.185
OPERATOR_HEAD_DIM = 128  # the operator set's attention is for head_dim 128; other head dims scale heads


def validate_strategy(s: TrainStrategy, model: ModelSpec, gpu: GPUSpec, n_gpus: int | None = None) -> None:
    """Raise ``CostModelError`` naming what would work if ``s`` cannot run ``model`` on ``gpu``.

    Rules: positive degrees; TP divides the attention heads and divides or is a multiple of the
    KV heads (KV heads then replicate), within one NVLink domain and dividing it
    (``memory.tp_rule``); PP divides the layers; EP only for MoE, dividing the experts and
    ``tp * dp`` (``memory.ep_rule``, parallel folding); ZeRO stage 0-3; ``tp * pp * dp == n_gpus``
    when given.
    """
    for f in ("tp", "pp", "dp", "ep", "micro_batch"):
        v = getattr(s, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CostModelError(f"{f} must be a positive integer, got {v!r}")
    if s.zero_stage not in (0, 1, 2, 3):
        raise CostModelError(f"zero_stage must be 0, 1, 2 or 3, got {s.zero_stage!r}")
    why = tp_rule(model, s.tp, gpu.nvlink_domain)
    if why is not None:
        ok = ", ".join(map(str, tp_degrees(model, gpu.nvlink_domain)))
        raise CostModelError(
            f"tp={s.tp} is invalid for {model.name} on {gpu.name} ({why}; {model.n_heads} heads, "
            f"{model.n_kv_heads} KV heads, {gpu.nvlink_domain} GPUs per NVLink domain); valid tp: {ok}"
        )
    why = pp_rule(model, s.pp)
    if why is not None:
        raise CostModelError(f"{why}; valid pp: 1..{model.n_layers} (uneven stages allowed, e.g. {', '.join(map(str, pp_degrees(model)[:8]))})")
    why = ep_rule(model, s.tp, s.dp, s.ep)
    if why is not None:
        raise CostModelError(f"{why}; valid ep: {', '.join(map(str, valid_eps(model, s.tp, s.dp)))}")
    if n_gpus is not None and s.n_gpus != n_gpus:
        raise CostModelError(
            f"tp*pp*dp = {s.tp}*{s.pp}*{s.dp} = {s.n_gpus} but {n_gpus} GPUs were given; "
            f"e.g. dp={n_gpus // (s.tp * s.pp)}" + ("" if n_gpus % (s.tp * s.pp) == 0 else " is not integral: change tp/pp")
        )


@dataclass(frozen=True, slots=True)
class _Phases:
    """Seconds per micro-batch on one stage, split so the step formula can overlap them."""

    fwd: float  # forward compute + TP/EP collectives
    bwd: float  # backward (+ recompute) compute + collectives
    fwd_zero3: float  # forward with ZeRO-3 gathers overlapped
    bwd_zero: float  # backward with ZeRO-2/3 gradient reduce-scatter (and ZeRO-3 gathers) overlapped


def _f(x: Any) -> float:
    return float(x)


def _gemm_fwd_bwd(ops: OperatorSet, m: float, n: float, k: float) -> tuple[float, float]:
    """(forward, backward) seconds of Y[m,n] = X[m,k] W[k,n]: backward is dX = dY W^T
    (m x n x k) and dW = X^T dY (k x m x n)."""
    fwd = _f(ops.gemm_s(m, n, k))
    bwd = _f(ops.gemm_s(m, k, n)) + _f(ops.gemm_s(k, n, m))
    return fwd, bwd


def _layer_times(
    ops: OperatorSet, gpu: GPUSpec, model: ModelSpec, s: TrainStrategy, seq_len: int, attn_factor: float = 1.0
) -> tuple[float, float, float, float]:
    """(fwd, bwd, tp+ep comm per pass, ZeRO collective per pass) of one block, one micro-batch."""
    tp, ep = s.tp, s.ep
    m = float(s.micro_batch * seq_len)
    h = float(model.hidden)
    hd = model.head_dim
    kvh = kv_heads_per_gpu(model, tp)
    scale = hd / OPERATOR_HEAD_DIM
    fwd = bwd = 0.0
    for n, k in ((model.q_dim / tp + 2 * kvh * hd, h), (h, model.q_dim / tp)):
        f, b = _gemm_fwd_bwd(ops, m, n, k)
        fwd, bwd = fwd + f, bwd + b
    attn = attn_factor * _f(ops.attn_prefill_s(s.micro_batch, seq_len, 0, model.n_heads / tp * scale, kvh * scale))
    fwd += attn
    bwd += ATTN_BWD_FACTOR * attn
    elementwise = 6 * m * h * DTYPE_BYTES  # two RMSNorms (read + write) and two residual adds
    if model.is_moe:
        # ep == 1: the experts are TP-sharded like an MLP (moe_s with moe_tp = tp). ep > 1
        # (parallel folding, ETP = 1): Megatron runs MoE with TP under sequence parallelism, so
        # each of the ep ranks routes m / tp tokens to whole experts; moe_s takes the group's total
        etp = tp if ep == 1 else 1
        moe = _f(ops.moe_s(m * ep / (tp // etp), h, model.moe_intermediate, model.experts_per_token, model.n_experts, etp, ep))
        fwd, bwd = fwd + moe, bwd + 2 * moe
        if model.shared_expert_intermediate:
            for n, k in ((2 * model.shared_expert_intermediate / tp, h), (h, model.shared_expert_intermediate / tp)):
                f, b = _gemm_fwd_bwd(ops, m, n, k)
                fwd, bwd = fwd + f, bwd + b
    else:
        for n, k in ((2 * model.intermediate / tp, h), (h, model.intermediate / tp)):
            f, b = _gemm_fwd_bwd(ops, m, n, k)
            fwd, bwd = fwd + f, bwd + b
        elementwise += 3 * m * model.intermediate / tp * DTYPE_BYTES  # SwiGLU: read gate, up; write
    mb = _f(ops.memory_bound_s(elementwise))
    fwd, bwd = fwd + mb, bwd + 2 * mb
    comm = 2 * _f(ops.allreduce_s(m * h * DTYPE_BYTES, tp, False))
    if model.is_moe and ep > 1:  # dispatch + combine all-to-all, modelled as an all-gather of the same bytes
        # folding: an EP group is ep consecutive ranks of a stage (Megatron's etp-ep-edp order),
        # so it is on NVLink when it fits one domain and tiles it (else some group straddles two)
        dom = gpu.nvlink_domain
        ep_inter = ep > dom or dom % ep != 0
        comm += 2 * _f(ops.allgather_s(m / tp * model.experts_per_token * h * DTYPE_BYTES, ep, ep_inter))
    d, e = layer_params_per_gpu(model, tp, ep)
    dp_inter = s.n_gpus > gpu.nvlink_domain and s.dp > 1
    zero = _f(ops.allgather_s(DTYPE_BYTES * (d + e), s.dp, dp_inter))
    return fwd, bwd, comm, zero


def _head_times(ops: OperatorSet, model: ModelSpec, s: TrainStrategy, seq_len: int) -> tuple[float, float]:
    """LM head and fp32 log-softmax of the last stage: (forward, backward) seconds."""
    m = float(s.micro_batch * seq_len)
    f, b = _gemm_fwd_bwd(ops, m, model.vocab / s.tp, model.hidden)
    sm = _f(ops.memory_bound_s(m * model.vocab / s.tp * (DTYPE_BYTES + 4 + 4)))
    ar = _f(ops.allreduce_s(m * 4 * 2, s.tp, False))  # vocab-parallel max and sum-exp (fp32)
    return f + sm + ar, b + 2 * sm


def _phases(ops: OperatorSet, gpu: GPUSpec, model: ModelSpec, s: TrainStrategy, seq_len: int,
            compute_factor: float | None = None, attn_factor: float | None = None) -> _Phases:
    if compute_factor is None:
        compute_factor = FRAMEWORK_COMPUTE_FACTOR
    if attn_factor is None:
        attn_factor = TRAIN_ATTENTION_FACTOR
    fwd_l, bwd_l, comm_l, zero_l = _layer_times(ops, gpu, model, s, seq_len, attn_factor)
    fwd_l, bwd_l = fwd_l * compute_factor, bwd_l * compute_factor
    layers = stage_layers(model, s.pp)  # the heaviest stage (uneven stages allowed)
    head_f, head_b = _head_times(ops, model, s, seq_len)
    head_f, head_b = head_f * compute_factor, head_b * compute_factor
    fwd_block = fwd_l + comm_l
    bwd_block = bwd_l + comm_l + (fwd_block if s.recompute else 0.0)
    fwd = layers * fwd_block + head_f
    bwd = layers * bwd_block + head_b
    if s.zero_stage >= 3:
        fwd_z = layers * max(fwd_block, zero_l) + head_f
        bwd_z = layers * max(bwd_block, 2 * zero_l) + head_b  # gather params + reduce-scatter grads
    elif s.zero_stage == 2:
        fwd_z = fwd
        bwd_z = layers * max(bwd_block, zero_l) + head_b
    else:
        fwd_z, bwd_z = fwd, bwd
    return _Phases(fwd, bwd, fwd_z, bwd_z)


def _micro_batches(s: TrainStrategy, tokens: int, seq_len: int) -> int:
    if tokens < 1 or seq_len < 1:
        raise CostModelError(f"tokens and seq_len must be >= 1, got tokens={tokens}, seq_len={seq_len}")
    # callers pass the step's MEAN sequence length, rounded to a token: ``ceil`` counted a
    # 257th sequence in a 256-sequence step whenever the mean was rounded down, one more round of
    # micro-batches on every rank (update 21.2 -> 26.5 s, Qwen3-14B on 32 A100, micro-batch 2)
    seqs = max(1, math.floor(tokens / seq_len + 0.5))
    per_rank = math.ceil(seqs / s.dp)
    return math.ceil(per_rank / s.micro_batch)


def _p2p(ops: OperatorSet, gpu: GPUSpec, model: ModelSpec, s: TrainStrategy, seq_len: int) -> float:
    if s.pp == 1:
        return 0.0
    inter = s.tp * s.pp > gpu.nvlink_domain
    return _f(ops.p2p_s(s.micro_batch * seq_len * model.hidden * DTYPE_BYTES, inter))


def train_iter_s(
    ops: OperatorSet, gpu: GPUSpec, model: ModelSpec, s: TrainStrategy, tokens: int, seq_len: int,
    compute_factor: float | None = None, attn_factor: float | None = None,
) -> float:
    """Seconds of one optimizer step over ``tokens`` tokens packed in sequences of ``seq_len``
    (``tokens / seq_len`` sequences, to the nearest whole one, spread over DP ranks, ``micro_batch`` per micro-batch).
    ``compute_factor``: the RL framework's compute slowdown (default ``FRAMEWORK_COMPUTE_FACTOR``)."""
    validate_strategy(s, model, gpu)
    n_micro = _micro_batches(s, tokens, seq_len)
    ph = _phases(ops, gpu, model, s, seq_len, compute_factor, attn_factor)
    p2p = _p2p(ops, gpu, model, s, seq_len)
    per_micro = ph.fwd_zero3 + ph.bwd_zero + (2 * p2p if s.pp > 1 else 0.0) + MICROBATCH_OVERHEAD_S
    pipe = (n_micro + s.pp - 1) * per_micro
    p = params_per_gpu(model, s.tp, s.pp, s.ep)
    grad_bytes = DTYPE_BYTES * p.total
    dp_inter = s.n_gpus > gpu.nvlink_domain and s.dp > 1
    tail = 0.0
    if s.dp > 1:
        if s.zero_stage == 0:
            red = _f(ops.allreduce_s(grad_bytes, s.dp, dp_inter))
            tail += max(0.0, red - ph.bwd)  # bucketed all-reduce overlaps the last backward
        elif s.zero_stage == 1:
            red = _f(ops.allgather_s(grad_bytes, s.dp, dp_inter))  # reduce-scatter costs as all-gather
            tail += max(0.0, red - ph.bwd) + _f(ops.allgather_s(grad_bytes, s.dp, dp_inter))
        elif s.zero_stage == 2:
            tail += _f(ops.allgather_s(grad_bytes, s.dp, dp_inter))  # updated parameters
    shard = p.total / s.dp if s.zero_stage >= 1 else p.total
    tail += _f(ops.memory_bound_s(OPT_STEP_BYTES * shard)) + STEP_OVERHEAD_S
    return pipe + tail


def forward_s(
    ops: OperatorSet, gpu: GPUSpec, model: ModelSpec, s: TrainStrategy, tokens: int, seq_len: int,
    compute_factor: float | None = None, attn_factor: float | None = None,
) -> float:
    """Seconds of a forward-only log-prob pass (old policy or reference model) over ``tokens``:
    the same pipeline with no backward, no gradient traffic and no optimizer step."""
    validate_strategy(s, model, gpu)
    n_micro = _micro_batches(s, tokens, seq_len)
    ph = _phases(ops, gpu, model, s, seq_len, compute_factor, attn_factor)
    p2p = _p2p(ops, gpu, model, s, seq_len)
    return (n_micro + s.pp - 1) * (ph.fwd_zero3 + p2p + MICROBATCH_OVERHEAD_S)


def train_flops(model: ModelSpec, tokens: int, seq_len: int, recompute: bool = False) -> float:
    """Model FLOPs of one step (6 x active non-embedding params x tokens + attention + LM head;
    8x with recomputation): the numerator of MFU reports."""
    per_tok = 2.0 * (model.params_active - model.embedding_params - model.lm_head_params)
    attn = 2.0 * 2.0 * model.n_layers * model.q_dim * (seq_len + 1) / 2.0
    head = 2.0 * model.vocab * model.hidden
    fwd = tokens * (per_tok + attn + head)
    return fwd * (4.0 if recompute else 3.0)
