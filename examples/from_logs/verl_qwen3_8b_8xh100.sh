# verl GRPO run (colocated hybrid engine) whose step metrics are in verl_console.log, verl_metrics.jsonl
# and verl_wandb_export.csv: an example written by hand in verl's documented formats (not a real run).
python3 -m verl.trainer.main_ppo \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.hybrid_engine=True \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=8 \
    trainer.logger=['console','file','wandb']
