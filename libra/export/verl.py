"""verl (github:volcengine/verl): a plan as Hydra overrides of verl's own trainer configs.

Layouts, chosen by the plan's loop:

* colocated sync -> ``python3 -m verl.trainer.main_ppo`` with the hybrid engine (rollout and
  training time-share every GPU): ``verl/trainer/config/ppo_trainer.yaml`` (FSDP) or
  ``ppo_megatron_trainer.yaml``;
* async with staleness 1 -> ``verl.experimental.one_step_off_policy.main_ppo``
  (``verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml``: its own
  ``rollout.nnodes``/``rollout.n_gpus_per_node`` pool, ``hybrid_engine=False``);
* disaggregated sync, sync + streaming, and async K >= 2 ->
  ``verl.experimental.fully_async_policy.fully_async_main``
  (``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``; its README's
  "Supported Modes": ``staleness_threshold=0, trigger_parameter_sync_step=1`` is the on-policy
  pipeline (one local update on all ``require_batches`` mini-batches, then the weight sync),
  ``staleness_threshold=0, trigger_parameter_sync_step>1`` the streamed on-policy one (a local
  update per mini-batch while the rollout goes on: Libra's sync + streaming), and
  ``staleness_threshold=K`` lets the rollouter produce up to K extra batches ahead, about K
  weight versions of staleness). ``partial_rollout`` is off: Libra does not model interrupted
  rollouts.

Key names: ``verl/trainer/config/_generated_ppo_trainer.yaml`` and
``_generated_ppo_megatron_trainer.yaml`` (``actor_rollout_ref.rollout.tensor_model_parallel_size``,
``actor_rollout_ref.actor.fsdp_config.fsdp_size``/``reshard_after_forward``,
``actor_rollout_ref.actor.megatron.{tensor,pipeline,expert}_model_parallel_size``,
``...megatron.use_distributed_optimizer``, ``...megatron.override_transformer_config.recompute_*``,
``actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu``, ``actor_rollout_ref.model.enable_gradient_checkpointing``,
``trainer.nnodes``/``n_gpus_per_node``, ``actor_rollout_ref.hybrid_engine``); the layouts' keys from
the two experimental configs above and their ``shell/*.sh`` examples. Validated against
``schemas/verl-*.keys`` (commit recorded there). Batch sizes (``data.train_batch_size``,
``actor_rollout_ref.rollout.n``, ``ppo_mini_batch_size``) stay the user's: a note says the plan's.
"""

from __future__ import annotations

from dataclasses import replace

from libra.export.render import hydra
from libra.export.target import Capabilities, Emitted, ExportPlan, plan_pools
from libra.planner.plan import TrainConfig

NAME = "verl"
#: every loop has a layout; one rollout TP; fully_async takes any staleness threshold
CAPABILITIES = Capabilities(colocated=True, split_sync=True, streaming=True, max_staleness=1_000_000, node_pools=True)


def trainers(t: TrainConfig) -> tuple[str, TrainConfig]:
    """FSDP when the plan has no TP/PP/EP and shards at least gradients (ZeRO-2:
    ``reshard_after_forward=False``; ZeRO-3: ``True``); Megatron otherwise, whose distributed
    optimizer is ZeRO-1."""
    if t.tp == t.pp == t.ep == 1 and (t.dp == 1 or t.zero_stage >= 2):
        return "fsdp", t
    return "megatron", t if t.dp == 1 else replace(t, zero_stage=1)


def emit(x: ExportPlan) -> Emitted:
    """The overrides and the command line (see the module docstring)."""
    p, t = x.plan, x.train
    mega = x.train_backend == "megatron"
    if p.colocated:
        layout, module, base = "colocated", "verl.trainer.main_ppo", "ppo_trainer"
    elif p.mode == "async" and p.max_staleness == 1:
        layout, module, base = "one_step_off", "verl.experimental.one_step_off_policy.main_ppo", "one_step_off_ppo_trainer"
    else:
        layout, module, base = "fully_async", "verl.experimental.fully_async_policy.fully_async_main", "fully_async_ppo_trainer"
    config = base.replace("_trainer", "_megatron_trainer") if mega else base
    keys: dict[str, object] = {}
    rollout_pool, (tn, tg) = plan_pools(x, "verl")
    keys["trainer.nnodes"], keys["trainer.n_gpus_per_node"] = tn, tg
    keys["actor_rollout_ref.hybrid_engine"] = p.colocated
    if rollout_pool is not None:
        keys["rollout.nnodes"], keys["rollout.n_gpus_per_node"] = rollout_pool
    keys["actor_rollout_ref.rollout.tensor_model_parallel_size"] = x.rollout_tp
    keys["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = t.micro_batch
    # the log-prob forwards (old policy on the rollout workers' trainer side, reference model): verl wants
    # them set unless dynamic batch sizes are on; Libra times them with the training micro-batch
    keys["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] = t.micro_batch
    keys["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = t.micro_batch
    if mega:
        keys["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] = t.tp
        keys["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"] = t.pp
        keys["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] = t.ep
        # the memory model keeps TP's activations split by Megatron's sequence parallelism
        # (``cost_models.memory.SEQUENCE_PARALLEL``); verl's default, set so the plan says it
        keys["actor_rollout_ref.actor.megatron.sequence_parallel"] = t.tp > 1
        keys["actor_rollout_ref.actor.megatron.use_distributed_optimizer"] = t.dp > 1
        keys["actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity"] = "full" if t.recompute else None
        if t.recompute:
            keys["actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method"] = "uniform"
            keys["actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers"] = 1
    else:
        keys["actor_rollout_ref.actor.strategy"] = "fsdp2"
        keys["actor_rollout_ref.actor.fsdp_config.fsdp_size"] = -1  # shard over every training rank: DP = the training GPUs
        keys["actor_rollout_ref.actor.fsdp_config.reshard_after_forward"] = t.zero_stage >= 3
        keys["actor_rollout_ref.model.enable_gradient_checkpointing"] = t.recompute
    if layout == "fully_async":
        if p.mode == "async":
            sync_every, require, threshold = 1, x.mini_batches, float(p.max_staleness)
        elif p.streaming:
            sync_every, require, threshold = x.mini_batches, 1, 0.0
        else:
            sync_every, require, threshold = 1, x.mini_batches, 0.0
        keys["async_training.staleness_threshold"] = threshold
        keys["async_training.trigger_parameter_sync_step"] = sync_every
        keys["async_training.require_batches"] = require
        keys["async_training.partial_rollout"] = False
    schemas = ("verl-ppo_megatron_trainer" if mega else "verl-ppo_trainer",) + (
        () if layout == "colocated" else (f"verl-{layout}",))
    # the Megatron configs sit next to the FSDP ones; the shell examples select them so
    head = ["python3", "-m", module] + (["--config-path=config", f"--config-name={config}.yaml"] if mega else [])
    notes = [f"verl {layout}: batch sizes stay yours: Libra planned {x.n_trajectories} trajectories per step in "
             f"{x.mini_batches} optimizer steps (actor_rollout_ref.actor.ppo_mini_batch_size = data.train_batch_size / {x.mini_batches})"]
    return Emitted(NAME, layout, keys, hydra(head, keys), schemas, notes)
