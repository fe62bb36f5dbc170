"""slime (github:THUDM/slime): a plan as slime's launch arguments.

``train.py`` runs the on-policy loop, colocated (``--colocate``) or on separate rollout GPUs
(``--rollout-num-gpus``); ``train_async.py`` overlaps the next rollout with this step's
training: staleness 1 (it asserts no ``--colocate``). slime has no knob for more staleness and no
streaming of an on-policy step, so those plans become the nearest it can run (``fit.py``).
Training is Megatron only (``--train-backend`` has one choice), whose distributed optimizer is
ZeRO-1.

Flag names: slime/utils/arguments.py (``--actor-num-nodes``, ``--actor-num-gpus-per-node``,
``--rollout-num-gpus``, ``--rollout-num-gpus-per-engine``, ``--colocate``, ``--micro-batch-size``)
and the Megatron-LM flags its launch scripts pass (scripts/run-qwen3-4B.sh and the others:
``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--expert-model-parallel-size``,
``--recompute-granularity``/``--recompute-method``/``--recompute-num-layers``,
``--use-distributed-optimizer``). Validated against ``schemas/slime.keys``.
"""

from __future__ import annotations

from dataclasses import replace

from libra.export.render import flags
from libra.export.target import Capabilities, Emitted, ExportPlan, plan_pools
from libra.planner.plan import TrainConfig

NAME = "slime"
CAPABILITIES = Capabilities(colocated=True, split_sync=True, streaming=False, max_staleness=1, node_pools=True)


def trainers(t: TrainConfig) -> tuple[str, TrainConfig]:
    """Megatron for every shape; ZeRO-1 (its distributed optimizer) whatever the plan's stage."""
    return "megatron", t if t.dp == 1 else replace(t, zero_stage=1)


def emit(x: ExportPlan) -> Emitted:
    p, t = x.plan, x.train
    _, (nodes, per_node) = plan_pools(x, "slime")
    keys: dict[str, object] = {"--actor-num-nodes": nodes, "--actor-num-gpus-per-node": per_node}
    if p.colocated:
        keys["--colocate"] = True
    else:
        keys["--rollout-num-gpus"] = x.rollout_gpus
    keys["--rollout-num-gpus-per-engine"] = x.rollout_tp
    keys["--tensor-model-parallel-size"] = t.tp
    keys["--pipeline-model-parallel-size"] = t.pp
    keys["--expert-model-parallel-size"] = t.ep
    if t.tp > 1:  # the memory model's activations assume it (``cost_models.memory.SEQUENCE_PARALLEL``)
        keys["--sequence-parallel"] = True
    keys["--micro-batch-size"] = t.micro_batch
    if t.dp > 1:
        keys["--use-distributed-optimizer"] = True
    if t.recompute:
        keys.update({"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1})
    script = "train_async.py" if p.mode == "async" else "train.py"
    layout = "colocated" if p.colocated else ("async" if p.mode == "async" else "disaggregated-sync")
    notes = [f"slime {layout}: batch sizes stay yours: Libra planned {x.n_trajectories} trajectories per step in "
             f"{x.mini_batches} optimizer steps (--global-batch-size = trajectories / {x.mini_batches})"]
    return Emitted(NAME, layout, keys, flags(["python3", script], keys), ("slime",), notes)
