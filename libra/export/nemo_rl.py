"""NeMo RL (github:NVIDIA-NeMo/RL): a plan as NeMo RL GRPO YAML keys.

Colocated generation (``policy.generation.colocated.enabled``) time-shares the GPUs; otherwise
generation gets ``policy.generation.colocated.resources.gpus_per_node`` GPUs on a one-node cluster
and ``...resources.num_nodes`` whole nodes on a larger one (nemo_rl/algorithms/grpo.py's
resource check: one node, ``num_nodes`` None or 1; more, ``gpus_per_node`` = the cluster's). Async GRPO
(``grpo.async_grpo.enabled``, ``max_trajectory_age_steps``) bounds the trajectories' age in
training steps. No streaming of an on-policy step, so such plans become the nearest it can run.
Training: DTensor (FSDP2 with TP, parameters sharded: ZeRO-3; ``policy.dtensor_cfg``) or Megatron
(``policy.megatron_cfg``; its distributed optimizer is ZeRO-1).

Key names: examples/configs/grpo_math_1B.yaml and grpo_math_1B_megatron.yaml
(``cluster.gpus_per_node``, ``cluster.num_nodes``, ``policy.generation.vllm_cfg.tensor_parallel_size``,
``policy.dtensor_cfg.{enabled,tensor_parallel_size,activation_checkpointing}``,
``policy.megatron_cfg.{enabled,tensor_model_parallel_size,pipeline_model_parallel_size,
expert_model_parallel_size,activation_checkpointing}``, ``...megatron_cfg.optimizer.use_distributed_optimizer``,
``policy.train_micro_batch_size``, ``grpo.async_grpo.*``). Validated against ``schemas/nemo-rl-grpo.keys``.
"""

from __future__ import annotations

from dataclasses import replace

from libra.export.render import nested_yaml
from libra.export.target import Capabilities, Emitted, ExportPlan
from libra.planner.plan import TrainConfig

NAME = "nemo-rl"
CAPABILITIES = Capabilities(colocated=True, split_sync=True, streaming=False, max_staleness=1_000_000, whole_nodes=True)


def trainers(t: TrainConfig) -> tuple[str, TrainConfig]:
    """DTensor when the plan has no PP or EP and runs ZeRO-3 (or DP 1); Megatron otherwise (ZeRO-1)."""
    if t.pp == t.ep == 1 and (t.dp == 1 or t.zero_stage == 3):
        return "dtensor", t
    return "megatron", t if t.dp == 1 else replace(t, zero_stage=1)


def emit(x: ExportPlan) -> Emitted:
    p, t = x.plan, x.train
    n = p.n_rollout_gpus + p.n_train_gpus if not p.colocated else p.n_rollout_gpus
    one_node = n <= x.gpus_per_node
    keys: dict[str, object] = {"cluster.num_nodes": -(-n // x.gpus_per_node), "cluster.gpus_per_node": min(n, x.gpus_per_node),
                               "policy.generation.colocated.enabled": p.colocated}
    if not p.colocated:
        if one_node:
            keys["policy.generation.colocated.resources.gpus_per_node"] = p.n_rollout_gpus
            keys["policy.generation.colocated.resources.num_nodes"] = 1
        else:
            keys["policy.generation.colocated.resources.gpus_per_node"] = x.gpus_per_node
            keys["policy.generation.colocated.resources.num_nodes"] = p.n_rollout_gpus // x.gpus_per_node
    keys["policy.generation.vllm_cfg.tensor_parallel_size"] = x.rollout_tp
    keys["policy.train_micro_batch_size"] = t.micro_batch
    dtensor = x.train_backend == "dtensor"
    keys["policy.dtensor_cfg.enabled"] = dtensor
    keys["policy.megatron_cfg.enabled"] = not dtensor
    if dtensor:
        keys["policy.dtensor_cfg.tensor_parallel_size"] = t.tp
        keys["policy.dtensor_cfg.sequence_parallel"] = t.tp > 1  # as the memory model assumes (``cost_models.memory.SEQUENCE_PARALLEL``)
        keys["policy.dtensor_cfg.activation_checkpointing"] = t.recompute
    else:
        keys["policy.megatron_cfg.tensor_model_parallel_size"] = t.tp
        keys["policy.megatron_cfg.pipeline_model_parallel_size"] = t.pp
        keys["policy.megatron_cfg.expert_model_parallel_size"] = t.ep
        keys["policy.megatron_cfg.sequence_parallel"] = t.tp > 1
        keys["policy.megatron_cfg.activation_checkpointing"] = t.recompute
        keys["policy.megatron_cfg.optimizer.use_distributed_optimizer"] = t.dp > 1
    keys["grpo.async_grpo.enabled"] = p.mode == "async"
    if p.mode == "async":
        keys["grpo.async_grpo.max_trajectory_age_steps"] = p.max_staleness
    layout = "colocated" if p.colocated else ("async" if p.mode == "async" else "disaggregated-sync")
    notes = [f"NeMo RL {layout}: batch sizes stay yours: Libra planned {x.n_trajectories} trajectories per step in "
             f"{x.mini_batches} optimizer steps (policy.train_global_batch_size = "
             f"grpo.num_prompts_per_step x num_generations_per_prompt / {x.mini_batches})"]
    return Emitted(NAME, layout, keys, nested_yaml(keys, "# NeMo RL GRPO keys from Libra's plan (merge into your config)"),
                   ("nemo-rl-grpo",), notes)
