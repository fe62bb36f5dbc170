"""AReaL (github:inclusionAI/AReaL): a plan as AReaL's YAML config with its allocation strings.

AReaL disaggregates: rollout servers and trainers on their own GPUs, with the rollout at most
``rollout.max_head_offpolicyness`` weight versions ahead (0: on-policy). It has no time-shared
layout for actor and rollout and does not stream an on-policy step's mini-batches, so colocated
and sync + streaming plans become the nearest disaggregated plan (``fit.py``).

Key names and syntax: the per-engine allocation strings ``rollout.backend`` and ``actor.backend``
(``<backend>:<dims>``, ``d``/``t``/``p``/``e``; docs/en/reference/alloc_mode.md and
areal/api/alloc_mode.py; the top-level ``allocation_mode`` is deprecated there and written only as
a comment), ``rollout.max_head_offpolicyness``, ``actor.ppo_n_minibatches``,
``actor.mb_spec.max_tokens_per_mb``, ``actor.gradient_checkpointing``, ``cluster.n_nodes``,
``cluster.n_gpus_per_node`` (examples/math/gsm8k_grpo.yaml, gsm8k_grpo_megatron.yaml; the
dataclasses in areal/api/cli_args.py). Validated against ``schemas/areal-grpo-config.keys``: the
keys of AReaL's own ``GRPOConfig`` dataclass and those it nests, read from cli_args.py without
importing it (it imports torch); the tests check the keys are in its example configs too.
Libra's micro-batch (sequences) is written as AReaL's token budget per micro-batch: that many
sequences of the longest length the plan's memory was checked at.
"""

from __future__ import annotations

from dataclasses import replace

from libra.export.render import nested_yaml
from libra.export.target import Capabilities, Emitted, ExportPlan
from libra.planner.plan import TrainConfig

NAME = "areal"
CAPABILITIES = Capabilities(colocated=False, split_sync=True, streaming=False, max_staleness=1_000_000)
#: the rollout server AReaL launches (alloc_mode.md: ``sglang`` or ``vllm``); Libra's default
#: engine profile is vLLM's
ROLLOUT_ENGINE = "vllm"


def trainers(t: TrainConfig) -> tuple[str, TrainConfig]:
    """FSDP (d, t, c: FSDP2 shards parameters, ZeRO-3) when the plan has no PP or EP and runs
    ZeRO-3 (or DP 1); Megatron otherwise, with its distributed optimizer (ZeRO-1)."""
    if t.pp == t.ep == 1 and (t.dp == 1 or t.zero_stage == 3):
        return "fsdp", t
    return "megatron", t if t.dp == 1 else replace(t, zero_stage=1)


def allocation(x: ExportPlan) -> tuple[str, str]:
    """(rollout backend string, actor backend string)."""
    t = x.train
    actor = f"fsdp:d{t.dp}t{t.tp}" if x.train_backend == "fsdp" else (
        f"megatron:d{t.dp}p{t.pp}t{t.tp}" + (f"e{t.ep}" if t.ep > 1 else ""))
    return f"{ROLLOUT_ENGINE}:d{x.n_instances}t{x.rollout_tp}", actor


def emit(x: ExportPlan) -> Emitted:
    p, t = x.plan, x.train
    n = p.n_rollout_gpus + p.n_train_gpus
    rollout, actor = allocation(x)
    keys: dict[str, object] = {
        "cluster.n_nodes": -(-n // x.gpus_per_node),
        "cluster.n_gpus_per_node": min(n, x.gpus_per_node),
        "rollout.backend": rollout,
        "rollout.max_head_offpolicyness": p.max_staleness if p.mode == "async" else 0,
        "actor.backend": actor,
        "actor.ppo_n_minibatches": x.mini_batches,
        "actor.mb_spec.max_tokens_per_mb": t.micro_batch * x.seq_max,
        "actor.gradient_checkpointing": t.recompute,
    }
    layout = "async" if p.mode == "async" else "disaggregated-sync"
    header = (f"# AReaL config from Libra's plan (merge into your experiment YAML)\n"
              f"# legacy allocation_mode: {rollout}+{actor}\n")
    notes = [f"AReaL {layout}: batch sizes stay yours: Libra planned {x.n_trajectories} trajectories per step in "
             f"{x.mini_batches} optimizer steps"]
    return Emitted(NAME, layout, keys, nested_yaml(keys, header), ("areal-grpo-config",), notes)
