"""The memory model: what one GPU holds for a rollout instance or a training strategy.

Why: the planner must only propose strategies that fit, the simulator's KV-cache capacity (and
hence its batching and preemption) comes from here, and a user whose strategy does not fit wants
to be told what would. Every size is computed from tensor shapes (``ModelSpec``), not from
parameter-count rules of thumb, so GQA, SwiGLU, MoE and untied embeddings are right.

Sharding rules (documented in docs/cost-model.md):
- TP shards q/o projections, MLP (or each expert's FFN), embedding and LM head (vocab-parallel)
  by ``tp``. KV heads shard by ``tp`` while ``tp <= n_kv_heads``; beyond that each GPU keeps one
  KV head, i.e. KV heads are replicated ``tp / n_kv_heads`` times (vLLM and Megatron do this), so
  KV bytes per GPU stop shrinking. Norms and the MoE router are replicated.
- PP gives each stage ``ceil(L / pp)`` layers; the first stage also holds the embedding, the last
  the final norm and LM head (a tied embedding is held by both when pp > 1). The heaviest stage
  sets the per-GPU need.
- EP (Megatron MoE parallel folding, expert tensor parallel ETP = 1, CP = 1): the MoE layers
  re-fold the same ``tp * dp`` ranks of a stage as EP x EDP, so ``ep`` divides ``tp * dp`` (not
  only ``dp``) and the experts; each GPU holds ``n_experts / ep`` WHOLE experts (not
  TP-sharded), replicated over the expert-data-parallel group of ``tp * dp / ep`` ranks. With
  ``ep == 1`` experts are TP-sharded like a dense MLP (Megatron's default ETP = TP; vLLM).
- Training state is mixed-precision Adam as in the ZeRO paper: bf16 weights (2 B/param), bf16
  gradients (2 B/param), fp32 master weights + Adam m + v (12 B/param). ZeRO-1 shards the 12,
  ZeRO-2 also the gradients, ZeRO-3 also the weights, across the DP group (experts across the
  expert-DP group, ``expert_dp``).

TP validity is ONE rule, here (``tp_rule``): TP divides the attention heads, divides or is a
multiple of the KV heads, stays inside one NVLink domain (``GPUSpec.nvlink_domain``: 8 on
HGX boards, 72 on GB200 NVL72, where a group spans trays) and divides it, so instances and TP
groups tile the domain without holes; a rollout engine is further capped at ``ROLLOUT_MAX_TP``.
The planner (``libra.planner.costs.valid_tp_degrees``), the decision tree, the training
validator and the rollout timer all call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.models import ModelSpec, get_model

if TYPE_CHECKING:
    from cost_models.strategy import TrainStrategy

DTYPE_BYTES = 2  # bf16 weights, activations and KV cache
ADAM_STATE_BYTES = 12  # fp32 master weights + Adam m + Adam v, per parameter
GRAD_BYTES = 2  # bf16 gradients (the ZeRO paper's 2 + 2 + 12 accounting)

# Training: CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers take ~1-2 GB per
# process in PyTorch/DeepSpeed/Megatron jobs; the caching allocator's fragmentation typically
# wastes a few percent of the device. Both are subtracted before anything else is placed.
TRAIN_RESERVE_BYTES = 2.0e9
TRAIN_FRAGMENTATION = 0.05

# Rollout (vLLM-like): "non-torch" memory (CUDA context, cuBLAS workspace) ~1 GB, NCCL buffers
# ~0.5 GB when TP > 1, CUDA-graph pools ~0.5 GB. vLLM counts these inside gpu_memory_utilization.
ROLLOUT_CONTEXT_BYTES = 1.0e9
ROLLOUT_NCCL_BYTES = 0.5e9
ROLLOUT_CUDA_GRAPH_BYTES = 0.5e9
KV_BLOCK_TOKENS = 16  # vLLM's default block size; capacity is a whole number of blocks
DEFAULT_MAX_BATCHED_TOKENS = 8192  # vLLM V1 default max_num_batched_tokens (chunked prefill)
DEFAULT_MAX_NUM_SEQS = 256  # vLLM default max_num_seqs


# ---- sharding ----------------------------------------------------------------------------------
#: Largest TP a rollout engine runs. vLLM/SGLang deployments stop at one 8-GPU board; on an
#: NVL72 rack a larger group would be possible, but per-layer all-reduce latency then outweighs
#: the halved GEMMs for decode, no engine profile covers it, and the measured collective tables
#: stop at 4 (GB200) or 8 GPUs. So rollout uses 1, 2, 4, 8 on GB200 as on HGX; training TP may
#: use the whole domain (the rule below still applies).
ROLLOUT_MAX_TP = 8


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    """TP shards the model: divides the heads, divides or is a multiple of the KV heads."""
    return tp >= 1 and model.n_heads % tp == 0 and (model.n_kv_heads % tp == 0 or tp % model.n_kv_heads == 0)


def tp_rule(model: ModelSpec, tp: int, nvlink_domain: int, rollout: bool = False) -> str | None:
    """Why ``tp`` cannot be used for ``model`` on an NVLink domain of ``nvlink_domain`` GPUs, or
    None when it can: THE TP rule of the project (see the module docstring). ``rollout`` adds
    the engine cap ``ROLLOUT_MAX_TP``."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return f"tp must be a positive integer, got {tp!r}"
    if model.n_heads % tp:
        return f"tp={tp} does not divide the {model.n_heads} attention heads"
    if model.n_kv_heads % tp and tp % model.n_kv_heads:
        return f"tp={tp} neither divides nor is a multiple of the {model.n_kv_heads} KV heads"
    if tp > nvlink_domain:
        return f"tp={tp} exceeds the {nvlink_domain} GPUs of one NVLink domain (a TP group stays on one NVLink fabric)"
    if nvlink_domain % tp:
        return f"tp={tp} does not divide the {nvlink_domain}-GPU NVLink domain (TP groups would leave holes)"
    if rollout and tp > ROLLOUT_MAX_TP:
        return f"tp={tp} exceeds the rollout engine's largest TP ({ROLLOUT_MAX_TP})"
    return None


def tp_degrees(model: ModelSpec, nvlink_domain: int, rollout: bool = False) -> list[int]:
    """Every TP degree ``tp_rule`` accepts, ascending."""
    top = min(nvlink_domain, ROLLOUT_MAX_TP) if rollout else nvlink_domain
    return [t for t in range(1, top + 1) if tp_rule(model, t, nvlink_domain, rollout) is None]


def pp_rule(model: ModelSpec, pp: int) -> str | None:
    """Why ``pp`` pipeline stages cannot split ``model``'s blocks, or None.

    Megatron does not need ``pp`` to divide the layer count: uneven stages are configured with
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (e.g.
    Qwen3-235B-A22B's 94 layers on PP 8 as 11 + 6 x 12 + 11). The heaviest stage then holds
    ``ceil(L / pp)`` blocks, which is what time and memory are charged for; a stage must hold at
    least one block."""
    if pp > model.n_layers:
        return f"pp={pp} exceeds the {model.n_layers} layers of {model.name} (each stage needs a layer)"
    return None


def pp_degrees(model: ModelSpec, limit: int | None = None) -> list[int]:
    """PP degrees worth enumerating, ascending: the divisors of the layer count (even stages) and
    the powers of two (the layouts published runs use, uneven when they do not divide ``L``),
    up to ``limit`` (default: the layer count)."""
    top = model.n_layers if limit is None else min(limit, model.n_layers)
    divs = {d for d in range(1, top + 1) if model.n_layers % d == 0}
    pows = {1 << k for k in range(0, 12) if (1 << k) <= top}
    return sorted(divs | pows)


def stage_layers(model: ModelSpec, pp: int) -> int:
    """Blocks on the heaviest pipeline stage (``pp_rule``: uneven stages allowed)."""
    return math.ceil(model.n_layers / pp)


def check_tp(model: ModelSpec, tp: int, gpu: GPUSpec | None = None, rollout: bool = False) -> None:
    """Raise ``CostModelError`` naming the valid degrees when ``tp`` breaks ``tp_rule`` on
    ``gpu``'s NVLink domain; without ``gpu`` only the sharding part (heads, KV heads) is checked
    and the valid degrees up to ``ROLLOUT_MAX_TP`` are listed."""
    if gpu is None:
        if isinstance(tp, int) and not isinstance(tp, bool) and _tp_ok(model, tp):
            return
        why = tp_rule(model, tp, 1 << 30) or f"tp={tp} is invalid"
        ok = valid_tps(model, ROLLOUT_MAX_TP)
        raise CostModelError(
            f"tp={tp} does not shard {model.name} ({model.n_heads} heads, {model.n_kv_heads} KV heads): {why}; "
            f"valid tp: {', '.join(map(str, ok))}"
        )
    why = tp_rule(model, tp, gpu.nvlink_domain, rollout)
    if why is not None:
        ok = tp_degrees(model, gpu.nvlink_domain, rollout)
        cap = f", a rollout engine runs at most {ROLLOUT_MAX_TP}" if rollout else ""
        raise CostModelError(
            f"{why} on {gpu.name} ({gpu.nvlink_domain} GPUs per NVLink domain{cap}); valid tp: {', '.join(map(str, ok))}"
        )


def valid_tps(model: ModelSpec, max_tp: int) -> list[int]:
    """TP degrees up to ``max_tp`` that shard ``model`` (heads and KV heads only; placement
    is ``tp_rule``'s job)."""
    return [t for t in range(1, max_tp + 1) if _tp_ok(model, t)]


def ep_rule(model: ModelSpec, tp: int, dp: int, ep: int) -> str | None:
    """Why expert parallelism ``ep`` cannot run with ``tp x dp`` ranks per pipeline stage, or
    None. Megatron MoE parallel folding with ETP = 1, CP = 1: the MoE layers use the same
    ``tp * dp`` ranks as EP x EDP, so ``ep`` divides ``tp * dp`` and the expert count."""
    if ep == 1:
        return None
    if not model.is_moe:
        return f"ep={ep} needs a MoE model; {model.name} is dense, use ep=1"
    if model.n_experts % ep or (tp * dp) % ep:
        return f"ep={ep} must divide the {model.n_experts} experts and tp*dp = {tp}*{dp} = {tp * dp} (MoE parallel folding)"
    return None


def valid_eps(model: ModelSpec, tp: int, dp: int) -> list[int]:
    """Every EP degree ``ep_rule`` accepts for ``tp x dp`` ranks per stage (1 for dense models)."""
    if not model.is_moe:
        return [1]
    return [e for e in range(1, model.n_experts + 1) if model.n_experts % e == 0 and ep_rule(model, tp, dp, e) is None]


def expert_dp(tp: int, dp: int, ep: int) -> int:
    """Ranks one expert's parameters are replicated over (ZeRO shards them across these):
    ``tp * dp / ep`` under parallel folding; with ``ep == 1`` experts are TP-sharded like dense
    weights and replicated over ``dp``."""
    return max(1, dp if ep == 1 else tp * dp // ep)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: sharded while tp <= n_kv_heads, then one (replicated)."""
    return max(1, model.n_kv_heads // tp)


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, dtype_bytes: int = DTYPE_BYTES) -> int:
    """KV-cache bytes one token takes on each GPU of a TP group (all layers, K and V)."""
    return 2 * model.n_layers * kv_heads_per_gpu(model, tp) * model.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class ShardParams:
    """Parameters one GPU holds: ``dense`` (replicated across DP) and ``expert`` (across DP/EP)."""

    dense: float
    expert: float
    layers: int  # transformer blocks on this GPU's stage

    @property
    def total(self) -> float:
        return self.dense + self.expert


def layer_params_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> tuple[float, float]:
    """(dense, expert) parameters of ONE block on one GPU under TP (and EP for experts: see the
    module docstring, experts are TP-sharded only when ``ep == 1``)."""
    hd = model.head_dim
    kvh = kv_heads_per_gpu(model, tp)
    attn = 2 * model.hidden * model.q_dim / tp + 2 * model.hidden * kvh * hd
    if model.attn_bias:
        attn += model.q_dim / tp + 2 * kvh * hd
    if model.qk_norm:
        attn += 2 * hd
    dense = attn + 2 * model.hidden  # + the two RMSNorms (replicated)
    expert = 0.0
    if model.is_moe:
        # ep > 1: whole experts per GPU (ETP = 1, parallel folding); ep == 1: TP-sharded FFNs
        expert = model.n_experts / ep * model.expert_params / (tp if ep == 1 else 1)
        dense += model.hidden * model.n_experts  # router, replicated
        if model.shared_expert_intermediate:
            dense += 3 * model.hidden * model.shared_expert_intermediate / tp + model.hidden
    else:
        dense += 3 * model.hidden * model.intermediate / tp
    return dense, expert


def params_per_gpu(model: ModelSpec, tp: int = 1, pp: int = 1, ep: int = 1) -> ShardParams:
    """Parameters on one GPU of the heaviest pipeline stage (see module docstring)."""
    layers = stage_layers(model, pp)
    d, e = layer_params_per_gpu(model, tp, ep)
    vocab_shard = model.vocab * model.hidden / tp
    if pp == 1:
        ends = vocab_shard + (0 if model.tie_embeddings else vocab_shard) + model.hidden
    else:  # first stage: embedding; last stage: final norm + LM head (a tied copy too)
        ends = max(vocab_shard, vocab_shard + model.hidden)
    return ShardParams(dense=layers * d + ends, expert=layers * e, layers=layers)


# ---- activations ---------------------------------------------------------------------------------
#: Megatron's sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large
#: Transformer Models", 2022): with TP > 1 the parts of a block that tensor parallelism leaves
#: whole (the norms, the residual adds, dropout) run split along the sequence over the TP group,
#: and the input a linear layer all-gathers is kept sharded and gathered again in backward. It is
#: the default of every trainer this project plans for: verl's Megatron workers
#: (``actor_rollout_ref.actor.megatron.sequence_parallel: true`` in
#: ``_generated_ppo_megatron_trainer.yaml``), slime (``--sequence-parallel`` in its scripts), NeMo
#: RL's ``megatron_cfg.sequence_parallel``; the exporters set it with the TP (``libra.export``).
#: It moves no more bytes than TP's all-reduces (a reduce-scatter plus an all-gather in their
#: place), so the time model is unchanged. Why it matters: without it the block input a full
#: recomputation keeps (2h a token a layer) was not TP-sharded, so Llama-3.1-70B at TP 8 x PP 2
#: kept 86 GB of block inputs for one 64K-token sequence where Megatron keeps 11, no strategy on
#: 34 H200 held the length prior's 64K tokens below 24 training GPUs, and the planner launched 70B
#: runs with one TP-8 rollout engine where the hindsight split runs two. On held_out_52's K = 1
#: converted logs (128 configurations, seen) Libra's step got 1.2% faster on geometric mean, up to
#: 13% (MAD debate on 44 H100: 8:36 on one engine, 26.5 s a step -> 16:28 on two, 23.4 s), and its
#: losses against those runs' baselines went 20 -> 11 (SIMULATED).
SEQUENCE_PARALLEL = True


def activation_bytes_per_token_layer(model: ModelSpec, tp: int, recompute: bool = False, ep: int = 1,
                                     sequence_parallel: bool | None = None) -> float:
    """Bytes one token's activations keep for backward in one block (flash attention, bf16),
    per GPU of a TP group of ``tp``.

    Stored: residual input and RMSNorm output before attention and before the MLP (4 x 2h:
    TP-sharded only under sequence parallelism, ``SEQUENCE_PARALLEL``), q/k/v and the attention
    output (sharded), flash attention's fp32 log-sum-exp per head, and for SwiGLU gate, up,
    silu(gate) and their product (4 x inter/tp). MoE keeps the permuted input and the SwiGLU
    tensors per routed copy, plus fp32 router logits; with expert parallelism (``ep`` > 1,
    expert TP 1) each TP rank routes its own sequence shard, so the permuted input is sharded too
    under sequence parallelism, and with ``ep`` = 1 the experts are TP-sharded like an MLP on the
    gathered sequence. Full recomputation keeps only the block input (2h, sharded under sequence
    parallelism).
    """
    h = model.hidden
    if sequence_parallel is None:  # the module's setting, read per call (a trainer without it: set it False)
        sequence_parallel = SEQUENCE_PARALLEL
    sp = tp if sequence_parallel and tp > 1 else 1  # what the sequence-split parts are divided by
    if recompute:
        return DTYPE_BYTES * h / sp
    qkv = model.q_dim / tp + 2 * kv_heads_per_gpu(model, tp) * model.head_dim
    b = DTYPE_BYTES * (4 * h / sp + qkv + model.q_dim / tp) + 4 * model.n_heads / tp
    if model.is_moe:
        routed_h = h / sp if ep > 1 else h
        b += model.experts_per_token * DTYPE_BYTES * (routed_h + 4 * model.moe_intermediate / tp)
        b += 4 * model.n_experts
        if model.shared_expert_intermediate:
            b += DTYPE_BYTES * 4 * model.shared_expert_intermediate / tp
    else:
        b += DTYPE_BYTES * 4 * model.intermediate / tp
    return b


def logits_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """bf16 logits plus their fp32 copy for the log-softmax / loss (vocab-parallel)."""
    return (DTYPE_BYTES + 4) * model.vocab / tp


# ---- reports ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryReport:
    """Per-GPU memory need against capacity. ``breakdown`` is bytes by component;
    ``suggestions`` (only when it does not fit) lists changes that would fit, best first."""

    fits: bool
    capacity_bytes: float
    total_bytes: float
    breakdown: dict[str, float]
    suggestions: tuple[str, ...] = ()
    what: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    def summary(self) -> str:
        """One line: need vs capacity and, if it does not fit, what would."""
        gb = 1e9
        s = f"{self.what}: {self.total_bytes / gb:.1f} GB of {self.capacity_bytes / gb:.1f} GB per GPU"
        if self.fits:
            return s + " (fits)"
        tail = "; ".join(self.suggestions) if self.suggestions else "nothing nearby fits"
        return s + f" (does not fit; would fit: {tail})"


def _usable_train_bytes(gpu: GPUSpec) -> float:
    return gpu.memory_bytes * (1.0 - TRAIN_FRAGMENTATION) - TRAIN_RESERVE_BYTES


def train_breakdown(gpu: GPUSpec, model: ModelSpec, s: "TrainStrategy", seq_len: int) -> dict[str, float]:
    """Bytes per GPU by component for training ``model`` with strategy ``s`` (heaviest stage)."""
    p = params_per_gpu(model, s.tp, s.pp, s.ep)
    sharded = p.dense / s.dp + p.expert / expert_dp(s.tp, s.dp, s.ep)  # one DP shard of this GPU's parameters
    z = s.zero_stage
    weights = DTYPE_BYTES * (sharded if z >= 3 else p.total)
    grads = GRAD_BYTES * (sharded if z >= 2 else p.total)
    optim = ADAM_STATE_BYTES * (sharded if z >= 1 else p.total)
    tokens = s.micro_batch * seq_len
    per_layer = activation_bytes_per_token_layer(model, s.tp, s.recompute, s.ep)
    in_flight = s.pp  # 1F1B: the first stage holds pp micro-batches (assumes >= pp micro-batches)
    acts = in_flight * p.layers * per_layer * tokens
    if s.recompute:  # one block's full activations are rebuilt during its backward
        acts += activation_bytes_per_token_layer(model, s.tp, False, s.ep) * tokens
    logits = logits_bytes_per_token(model, s.tp) * tokens
    out = {"weights": weights, "gradients": grads, "optimizer": optim, "activations": acts, "logits": logits}
    if z >= 3:  # gathered full-layer parameters: the current and the prefetched block
        d, e = layer_params_per_gpu(model, s.tp, s.ep)
        out["zero3_gather_buffers"] = 2 * DTYPE_BYTES * (d + e)
    out["reserve"] = TRAIN_RESERVE_BYTES + TRAIN_FRAGMENTATION * gpu.memory_bytes
    return out


def train_memory(
    gpu: str | GPUSpec, model: str | ModelSpec, strategy: "TrainStrategy", seq_len: int, suggest: bool = True
) -> MemoryReport:
    """Does ``strategy`` fit for sequences of ``seq_len`` tokens? With suggestions if not."""
    g, m = get_gpu(gpu), get_model(model)
    if seq_len < 1:
        raise CostModelError(f"seq_len must be >= 1, got {seq_len}")
    bd = train_breakdown(g, m, strategy, seq_len)
    total = sum(bd.values())
    ok = total <= g.memory_bytes
    sugg: tuple[str, ...] = ()
    if not ok and suggest:
        sugg = _train_suggestions(g, m, strategy, seq_len)
    return MemoryReport(ok, float(g.memory_bytes), total, bd, sugg, what=f"train {_describe(strategy)} seq {seq_len}")


def fits(
    gpu: str | GPUSpec, model: str | ModelSpec, strategy: "TrainStrategy", seq_len: int
) -> MemoryReport:
    """Alias of ``train_memory`` with suggestions: the question the planner asks."""
    return train_memory(gpu, model, strategy, seq_len, suggest=True)


def _describe(s: "TrainStrategy") -> str:
    txt = f"tp={s.tp} pp={s.pp} dp={s.dp}"
    if s.ep > 1:
        txt += f" ep={s.ep}"
    txt += f" zero={s.zero_stage} mb={s.micro_batch}"
    return txt + (" recompute" if s.recompute else "")


def _valid_for(g: GPUSpec, m: ModelSpec, s: "TrainStrategy") -> bool:
    return (
        tp_rule(m, s.tp, g.nvlink_domain) is None
        and pp_rule(m, s.pp) is None
        and ep_rule(m, s.tp, s.dp, s.ep) is None
    )


def _train_suggestions(g: GPUSpec, m: ModelSpec, s: "TrainStrategy", seq_len: int) -> tuple[str, ...]:
    """Nearby strategies that fit: same GPUs first (recompute, ZeRO-3, TP/PP up with DP down),
    then more GPUs (TP/PP/DP doubled), else the smallest GPU count that fits at all."""
    n = s.tp * s.pp * s.dp
    cands: list[tuple[int, str, Any]] = []
    if not s.recompute:
        cands.append((n, "recompute", replace(s, recompute=True)))
    if s.zero_stage < 3:
        cands.append((n, "ZeRO-3", replace(s, zero_stage=3)))
        if not s.recompute:
            cands.append((n, "ZeRO-3 + recompute", replace(s, zero_stage=3, recompute=True)))
    if s.micro_batch > 1:
        cands.append((n, "micro_batch=1", replace(s, micro_batch=1)))
    if s.dp % 2 == 0:
        cands.append((n, f"tp={s.tp * 2} dp={s.dp // 2}", replace(s, tp=s.tp * 2, dp=s.dp // 2)))
        cands.append((n, f"pp={s.pp * 2} dp={s.dp // 2} (fewer layers per stage)", replace(s, pp=s.pp * 2, dp=s.dp // 2)))
    cands.append((2 * n, f"tp={s.tp * 2} on {2 * n} GPUs", replace(s, tp=s.tp * 2)))
    cands.append((2 * n, f"pp={s.pp * 2} on {2 * n} GPUs (fewer layers per stage)", replace(s, pp=s.pp * 2)))
    if s.zero_stage >= 1:
        cands.append((2 * n, f"dp={s.dp * 2} on {2 * n} GPUs (smaller ZeRO shards)", replace(s, dp=s.dp * 2)))
    out = []
    for _, label, c in sorted(cands, key=lambda x: x[0]):
        if not _valid_for(g, m, c):
            continue
        total = sum(train_breakdown(g, m, c, seq_len).values())
        if total <= g.memory_bytes:
            out.append(f"{label} ({total / 1e9:.1f} GB)")
        if len(out) == 4:
            break
    if out:
        return tuple(out)
    smallest = _smallest_fitting(g, m, s, seq_len)
    if smallest is None:
        return (f"no strategy up to 4096 GPUs fits {m.name} at seq {seq_len} on {g.name}",)
    return (f"at least {smallest.tp * smallest.pp * smallest.dp} GPUs, e.g. {_describe(smallest)}",)


def _smallest_fitting(g: GPUSpec, m: ModelSpec, s: "TrainStrategy", seq_len: int) -> "TrainStrategy | None":
    tps = tp_degrees(m, g.nvlink_domain)
    pps = pp_degrees(m)
    n = 1
    while n <= 4096:
        for tp in reversed(tps):
            for pp in pps:
                if n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                c = replace(s, tp=tp, pp=pp, dp=dp, ep=1, zero_stage=3 if dp > 1 else 0, recompute=True, micro_batch=1)
                if _valid_for(g, m, c) and sum(train_breakdown(g, m, c, seq_len).values()) <= g.memory_bytes:
                    return c
        n *= 2
    return None


# ---- rollout (vLLM-like) -------------------------------------------------------------------------------
def rollout_activation_peak_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> float:
    """Peak transient memory of vLLM's profiling forward pass: one block's intermediates for
    ``max_num_batched_tokens`` tokens (residual, norm output, q/k/v, attention output, SwiGLU
    gate-up and its activation) plus fp32 logits and probabilities for ``max_num_seqs`` samples."""
    h = model.hidden
    qkv = model.q_dim / tp + 2 * kv_heads_per_gpu(model, tp) * model.head_dim
    per_tok = DTYPE_BYTES * (2 * h + qkv + model.q_dim / tp)
    if model.is_moe:
        per_tok += model.experts_per_token * DTYPE_BYTES * (h + 3 * model.moe_intermediate / tp) + 4 * model.n_experts
    else:
        per_tok += DTYPE_BYTES * 3 * model.intermediate / tp
    sampler = 2 * 4 * max_num_seqs * model.vocab
    return max_num_batched_tokens * per_tok + sampler


def rollout_reserve_bytes(tp: int) -> float:
    """Non-torch memory of one vLLM worker (context, NCCL when tp > 1, CUDA graphs)."""
    return ROLLOUT_CONTEXT_BYTES + ROLLOUT_CUDA_GRAPH_BYTES + (ROLLOUT_NCCL_BYTES if tp > 1 else 0.0)


def rollout_memory(
    gpu: str | GPUSpec, model: str | ModelSpec, tp: int, gpu_mem_util: float = 0.9,
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> MemoryReport:
    """A rollout instance's per-GPU budget: ``util * memory - weights - activation peak - reserve``
    is the KV cache (``extra['kv_tokens']`` tokens, whole blocks). Fits when at least one KV
    block remains; suggestions list the TP degrees that would."""
    g, m = get_gpu(gpu), get_model(model)
    check_tp(m, tp)
    if not 0.0 < gpu_mem_util <= 1.0:
        raise CostModelError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util}")
    budget = gpu_mem_util * g.memory_bytes
    bd = {
        "weights": DTYPE_BYTES * params_per_gpu(m, tp).total,
        "activation_peak": rollout_activation_peak_bytes(m, tp, max_num_batched_tokens, max_num_seqs),
        "reserve": rollout_reserve_bytes(tp),
    }
    kv_bytes = budget - sum(bd.values())
    per_tok = kv_bytes_per_token_per_gpu(m, tp)
    tokens = 0 if kv_bytes <= 0 else int(kv_bytes // per_tok) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
    bd["kv_cache"] = max(0.0, float(tokens * per_tok))
    ok = tokens >= KV_BLOCK_TOKENS
    sugg: tuple[str, ...] = ()
    if not ok:
        good = [
            t for t in tp_degrees(m, g.nvlink_domain, rollout=True)
            if t > tp and kv_capacity_tokens(g, m, t, gpu_mem_util, max_num_batched_tokens, max_num_seqs) >= KV_BLOCK_TOKENS
        ]
        top = min(g.nvlink_domain, ROLLOUT_MAX_TP)
        sugg = tuple(f"tp={t}" for t in good[:3]) or (f"no TP up to {top} fits {m.name} on {g.name}",)
    return MemoryReport(
        ok, budget, sum(bd.values()), bd, sugg, what=f"rollout {m.name} tp={tp} on {g.name}",
        extra={"kv_tokens": tokens, "kv_bytes_per_token_per_gpu": per_tok},
    )


def kv_capacity_tokens(
    gpu: str | GPUSpec, model: str | ModelSpec, tp: int, gpu_mem_util: float = 0.9,
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> int:
    """KV-cache tokens a rollout instance of ``tp`` GPUs holds (0 when the weights do not fit)."""
    g, m = get_gpu(gpu), get_model(model)
    check_tp(m, tp)
    budget = gpu_mem_util * g.memory_bytes
    free = (
        budget
        - DTYPE_BYTES * params_per_gpu(m, tp).total
        - rollout_activation_peak_bytes(m, tp, max_num_batched_tokens, max_num_seqs)
        - rollout_reserve_bytes(tp)
    )
    if free <= 0:
        return 0
    return int(free // kv_bytes_per_token_per_gpu(m, tp)) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
