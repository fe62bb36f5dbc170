"""The fixed costs of an RL step that are neither rollout nor training compute: putting the
inference engine to sleep and waking it, offloading and onloading the trainer's state between the
stages of a colocated plan, the per-message cost of a weight sync, and the per-sample bookkeeping
between rollout and training (reward, advantage, data movement).

Why a module of its own: published colocated GRPO steps carry 5-25 s of these per step for
0.6B-30B models, and without them the simulator made 8B and 30B-A3B steps 33-42 % shorter than
measured. None of them is a kernel, so the operator set cannot time them; each constant below is
fitted on named rows of ``cost_models/data/measured/rl_steps/rl_step_breakdowns.csv`` by
``python -m cost_models.calibration.rl_steps`` (which prints the fit, the rows and the per-row
residuals; ``tests/test_rl_overheads.py`` checks that the fit reproduces these values). Host-copy
rates are expressed as fractions of ``GPUSpec.pcie_bw`` (the achieved pinned-copy bandwidth), so
they move with the host link of the GPU they are applied to. Formulas, rows and residuals:
docs/cost-model.md, section "RL step overheads".
"""

from __future__ import annotations

from typing import Literal

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec
from cost_models.memory import ADAM_STATE_BYTES, DTYPE_BYTES, GRAD_BYTES, check_tp, expert_dp, params_per_gpu
from cost_models.models import ModelSpec

# --- vLLM sleep mode (engine side) -----------------------------------------------------------
#: Fixed part of waking a vLLM engine from sleep level 1 (KV-cache re-allocation, CUDA-graph
#: and allocator state), s. Fit: vllm_sleep_blog / offload_onload / {Qwen3-0.6B, Phi-3-vision
#: 4.2B, Qwen3-Coder-30B-A3B x3} (level 1, bf16, one A100), t = fixed + bytes / (eff * pcie_bw).
ENGINE_WAKE_FIXED_S = 0.2259
#: Weight onload rate of a vLLM wake-up as a fraction of the GPU's pinned-copy bandwidth (same
#: fit; 22.2 GB/s on an A100's 25 GB/s).
ENGINE_WAKE_EFF = 0.8891
#: Putting the engine to sleep frees its KV cache and drops the weights a colocated plan will
#: re-sync from the trainer anyway; the blog reports no sleep times, so the sleep is charged the
#: wake-up's fixed part (an assumption, stated as such in docs/cost-model.md).
ENGINE_SLEEP_S = ENGINE_WAKE_FIXED_S

# --- Megatron/torch_memory_saver offload and onload (trainer side) ---------------------------
#: Effective device->host rate of a trainer offload as a fraction of a plain pinned copy:
#: vime_442_443_445 / offload_onload 11.228 s (perf/sleep_time, Qwen3-0.6B, L20): 18.7 GiB parked
#: at 2.41 GiB/s against 24 GiB/s for a plain pinned copy on the same host (PR #444).
TRAINER_OFFLOAD_EFF = 2.41 / 24.0
#: Effective host->device rate of the onload, same rows: 5.32 GiB/s against 24 GiB/s
#: (vime_442_443_445 / offload_onload 3.773 s, perf/wake_up_time).
TRAINER_ONLOAD_EFF = 5.32 / 24.0
#: What the offload takes beyond its copy (process-group teardown, allocator release):
#: 11.228 s - 18.7 GiB / 2.41 GiB/s (same row). relax_230's "PG reuse" removed ~3 s of the same
#: kind from its sleep (5.4 -> 2.46 s), a framework that keeps its process groups pays ~0.
TRAINER_OFFLOAD_FIXED_S = 3.469
#: The onload's remainder beyond its copy (process-group reload): 3.773 s - 18.7 GiB / 5.32 GiB/s.
TRAINER_ONLOAD_FIXED_S = 0.258

# --- weight sync ---------------------------------------------------------------------------------
#: Seconds per message of a weight sync beyond its bytes and link latency (one tensor per
#: message when the sync is not bucketed: gather it from the trainer shards, one collective
#: call, the engine's per-tensor ``load_weights``). Fit (through the origin, relative least
#: squares): verl_fully_async / weight_sync / {Qwen3-30B-A3B 15.76 s, Qwen3-235B-A22B 58.57 s}
#: (H20, NCCL, checkpoint-engine=False), where the tensor term dominates.
SYNC_MESSAGE_S = 0.8539e-3

# --- per-sample bookkeeping between rollout and training -------------------------------------
#: Seconds per trajectory between rollout and training (reward, advantage, batching and data
#: movement, logging): the median over verl_fully_async's colocated runs (7B on 32/64/128 H20,
#: 30B-A3B on 128 H20; 512 prompts x 16 samples) of ``step - gen - old_logprob - ref_logprob -
#: actor_update``, per sample.
PER_SAMPLE_S = 1.518e-3

SwitchTo = Literal["rollout", "train"]


def weight_tensors(model: ModelSpec) -> int:
    """Named tensors of the model's state dict (what an unbucketed weight sync sends one by one).

    Per layer: q, k, v, o (+ q/k/v biases when the attention has them, + q/k norms for Qwen3),
    two RMSNorms, and either the dense MLP's gate/up/down or, for a MoE layer, the router plus
    gate/up/down of every expert (+ a shared expert's three and its gate). Plus the embedding,
    the final norm and an untied LM head. Qwen3-8B: 399; Qwen3-30B-A3B: 18,867.
    """
    per_layer = 4 + 2
    if model.attn_bias:
        per_layer += 3
    if model.qk_norm:
        per_layer += 2
    if model.is_moe:
        per_layer += 1 + 3 * model.n_experts
        if model.shared_expert_intermediate:
            per_layer += 3 + 1
    else:
        per_layer += 3
    return model.n_layers * per_layer + 2 + (0 if model.tie_embeddings else 1)


def train_state_bytes_per_gpu(
    model: ModelSpec, tp: int, pp: int, dp: int, ep: int = 1, zero_stage: int = 1, grads: bool = True, optim: bool = True
) -> float:
    """Bytes one training GPU keeps between steps and must park in host memory when its GPU
    serves rollout: bf16 weights, bf16 gradients (``grads``: the buffers Megatron and FSDP keep
    allocated) and the fp32 Adam state (master, m, v; ``optim``), each sharded as ZeRO
    ``zero_stage`` does. Without both, the weights alone (``trainer_build_s``)."""
    p = params_per_gpu(model, tp, pp, ep)
    shard = p.dense / dp + p.expert / expert_dp(tp, dp, ep)  # one ZeRO shard (experts over expert-DP)
    weights = DTYPE_BYTES * (shard if zero_stage >= 3 else p.total)
    grad = GRAD_BYTES * (shard if zero_stage >= 2 else p.total) if grads else 0.0
    adam = ADAM_STATE_BYTES * (shard if zero_stage >= 1 else p.total) if optim else 0.0
    return weights + grad + adam


def rollout_weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """bf16 weights one GPU of a TP-``tp`` rollout instance holds."""
    check_tp(model, tp)
    return float(DTYPE_BYTES * params_per_gpu(model, tp).total)


def engine_wake_s(gpu: GPUSpec, model: ModelSpec, rollout_tp: int, load_weights: bool = True) -> float:
    """Seconds to wake a sleeping vLLM engine: the fixed part, plus reloading its weight shard
    from host memory when ``load_weights`` (an elastic-pool GPU going back to rollout; a
    colocated plan receives fresh weights by the weight sync instead)."""
    t = ENGINE_WAKE_FIXED_S
    if load_weights:
        t += rollout_weight_bytes_per_gpu(model, rollout_tp) / (ENGINE_WAKE_EFF * gpu.pcie_bw)
    return t


def trainer_offload_s(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, dp: int, ep: int = 1, zero_stage: int = 1) -> float:
    """Seconds to park one training GPU's state in host memory (measured effective rate)."""
    nbytes = train_state_bytes_per_gpu(model, tp, pp, dp, ep, zero_stage)
    return TRAINER_OFFLOAD_FIXED_S + nbytes / (TRAINER_OFFLOAD_EFF * gpu.pcie_bw)


def trainer_onload_s(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, dp: int, ep: int = 1, zero_stage: int = 1) -> float:
    """Seconds to bring one training GPU's parked state back (measured effective rate)."""
    nbytes = train_state_bytes_per_gpu(model, tp, pp, dp, ep, zero_stage)
    return TRAINER_ONLOAD_FIXED_S + nbytes / (TRAINER_ONLOAD_EFF * gpu.pcie_bw)


def trainer_build_s(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, dp: int, ep: int = 1, zero_stage: int = 1) -> float:
    """Seconds to re-build a trainer in a new layout *before its first optimizer step*: each GPU
    loads only its bf16 weight shard (the whole TP x PP shard, or its ZeRO-3 slice) from host
    memory at the measured onload rate, plus the onload's fixed part (process groups). Nothing
    else exists yet to move: gradients are zero buffers and the Adam state (fp32 master, m, v) is
    created on the GPU from the weights, so the full ``trainer_onload_s`` (weights, gradients and
    optimizer state) over-charges a layout chosen before any update. Used for the run's first
    training (``libra.planner.settle.first_layout`` and the simulator's charge alike)."""
    nbytes = train_state_bytes_per_gpu(model, tp, pp, dp, ep, zero_stage, grads=False, optim=False)
    return TRAINER_ONLOAD_FIXED_S + nbytes / (TRAINER_ONLOAD_EFF * gpu.pcie_bw)


def stage_switch_s(
    gpu: GPUSpec,
    model: ModelSpec,
    to: SwitchTo,
    rollout_tp: int,
    tp: int,
    pp: int,
    dp: int,
    ep: int = 1,
    zero_stage: int = 1,
) -> float:
    """Seconds one GPU of a colocated plan spends switching stage (all GPUs switch in parallel).

    To ``train``: the engine sleeps (frees KV, drops weights), the trainer onloads its state. To
    ``rollout``: the trainer offloads its state, the engine wakes (fixed part only); the new
    weights then arrive by the colocated weight sync (``transfers.weight_sync_s(mode="ipc")``),
    charged separately.
    """
    if to == "train":
        return ENGINE_SLEEP_S + trainer_onload_s(gpu, model, tp, pp, dp, ep, zero_stage)
    if to == "rollout":
        check_tp(model, rollout_tp)
        return trainer_offload_s(gpu, model, tp, pp, dp, ep, zero_stage) + engine_wake_s(gpu, model, rollout_tp, False)
    raise CostModelError(f"stage switch goes to 'rollout' or 'train', got {to!r}")


def step_fixed_s(n_samples: int) -> float:
    """Per-step bookkeeping between rollout and training for ``n_samples`` trajectories."""
    if n_samples < 0:
        raise CostModelError(f"n_samples must be >= 0, got {n_samples}")
    return PER_SAMPLE_S * n_samples
