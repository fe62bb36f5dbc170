"""A run's layout read from its own configuration: how many GPUs rolled out and trained, the
rollout TP, the training strategy, the loop, and the trajectories per step.

Read: verl (the Hydra config it saved, ``.hydra/config.yaml``, or the launch command's
``key=value`` overrides, e.g. what ``libra-sim plan --emit verl`` printed), AReaL and NeMo RL
YAML, and slime's launch flags. The key names are the ones ``libra.export`` writes (each
emitter's docstring names the framework file they come from); defaults are the frameworks' own
(verl's ``_generated_ppo_trainer.yaml``: ``hybrid_engine`` True, ``reshard_after_forward`` True).
A missing key the replay cannot do without is a one-line ``UserError`` naming it.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from libra.errors import UserError
from libra.planner.plan import TrainConfig


@dataclass(frozen=True)
class RunShape:
    """What the replay needs of a run (see the module docstring)."""

    framework: str
    n_gpus: int
    colocated: bool
    n_rollout_gpus: int
    rollout_tp: int
    train: TrainConfig
    trajectories: int | None
    mini_batches: int
    mode: str = "sync"
    max_staleness: int = 0
    streaming: bool = False
    kl: bool = False
    model_hint: str | None = None
    notes: tuple[str, ...] = ()
    group_size: int = 1  # samples per prompt: the GRPO group a streamed mini-batch is cut from


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(_flat(v, key))
            else:
                out[key] = v
    return out


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def read_config(path: str | Path) -> tuple[str, dict[str, Any], str]:
    """(framework, dotted keys, raw text) of a run's config file, by its content."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: config file not found")
    text = p.read_text(encoding="utf-8", errors="replace")
    flat_text = text.replace("\\\n", " ")
    if re.search(r"\btrain(_async)?\.py\b", flat_text) or re.search(r"(^|\s)--actor-num-nodes\b", flat_text):
        toks = shlex.split(flat_text, comments=True)
        keys: dict[str, Any] = {}
        for i, t in enumerate(toks):
            if t.startswith("--"):
                nxt = toks[i + 1] if i + 1 < len(toks) else None
                keys[t] = True if nxt is None or nxt.startswith("--") else _scalar(nxt)
        keys["__script__"] = "train_async.py" if "train_async.py" in flat_text else "train.py"
        return "slime", keys, text
    doc: Any = None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if isinstance(doc, dict):
        keys = _flat(doc)
        if any(k.startswith("actor_rollout_ref.") for k in keys) or any(k.startswith("async_training.") for k in keys):
            return "verl", keys, text
        if "rollout.backend" in keys or "actor.backend" in keys:
            return "areal", keys, text
        if any(k.startswith("policy.") for k in keys) or any(k.startswith("grpo.") for k in keys):
            return "nemo-rl", keys, text
        raise UserError(f"{p}: not a verl, AReaL or NeMo RL config (no actor_rollout_ref.*, rollout.backend or policy.* keys)")
    keys = {}
    for t in shlex.split(flat_text, comments=True):  # verl's command-line overrides
        if "=" in t and not t.startswith("-"):
            k, v = t.split("=", 1)
            keys[k.lstrip("+")] = _scalar(v)
        elif t.startswith("--config-name"):
            keys["__config_name__"] = t.split("=", 1)[-1]
    if not any(k.startswith(("actor_rollout_ref.", "trainer.")) for k in keys):
        raise UserError(f"{p}: no verl overrides (key=value) or YAML mapping found")
    keys["__module__"] = next((m for m in ("fully_async", "one_step_off") if m in flat_text), "main_ppo")
    return "verl", keys, text


def _int(keys: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = keys.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        if v is None:
            raise UserError(f"{where}: {key} is required (an integer) to replay the run")
        raise UserError(f"{where}: {key} must be an integer >= 0, got {v!r}")
    return v


def run_shape(path: str | Path, trajectories: int | None = None) -> RunShape:
    """The run's shape from its config file (``trajectories`` overrides the config's batch)."""
    fw, keys, _ = read_config(path)
    where = str(path)
    shape = {"verl": _verl, "areal": _areal, "nemo-rl": _nemo, "slime": _slime}[fw](keys, where)
    if trajectories is not None:
        shape = RunShape(**{**shape.__dict__, "trajectories": trajectories})
    return shape


def _dp(n: int, tp: int, pp: int, where: str) -> int:
    if n % (tp * pp):
        raise UserError(f"{where}: {n} training GPUs are not a multiple of TP {tp} x PP {pp}")
    return n // (tp * pp)


def _verl(k: dict[str, Any], where: str) -> RunShape:
    n_train = _int(k, "trainer.nnodes", where, 1) * _int(k, "trainer.n_gpus_per_node", where)
    split = "rollout.n_gpus_per_node" in k and k.get("actor_rollout_ref.hybrid_engine", True) is False
    n_roll = _int(k, "rollout.nnodes", where, 1) * _int(k, "rollout.n_gpus_per_node", where) if split else n_train
    tp_r = _int(k, "actor_rollout_ref.rollout.tensor_model_parallel_size", where)
    mega = "megatron" in str(k.get("__config_name__", "")) or k.get("actor_rollout_ref.actor.strategy") == "megatron" or any(
        x.startswith("actor_rollout_ref.actor.megatron.") for x in k)
    a = "actor_rollout_ref.actor."
    mb = k.get(a + "ppo_micro_batch_size_per_gpu") or 1
    if mega:
        tp, pp = _int(k, a + "megatron.tensor_model_parallel_size", where, 1), _int(k, a + "megatron.pipeline_model_parallel_size", where, 1)
        ep = _int(k, a + "megatron.expert_model_parallel_size", where, 1)
        rc = k.get(a + "megatron.override_transformer_config.recompute_granularity") not in (None, "null")
        train = TrainConfig(tp, pp, _dp(n_train, tp, pp, where), ep, 1, int(mb), rc)
    else:
        zero = 3 if k.get(a + "fsdp_config.reshard_after_forward", True) else 2
        train = TrainConfig(1, 1, n_train, 1, zero if n_train > 1 else 1, int(mb),
                            bool(k.get("actor_rollout_ref.model.enable_gradient_checkpointing", True)))
    n = _int(k, "actor_rollout_ref.rollout.n", where, 1)
    bs = k.get("data.train_batch_size")
    mini = k.get(a + "ppo_mini_batch_size")
    module = k.get("__module__", "fully_async" if any(x.startswith("async_training.") for x in k) else
                   ("one_step_off" if split else "main_ppo"))
    mode, K, streaming = "sync", 0, False
    notes = []
    if module == "one_step_off":
        mode, K = "async", 1
    elif module == "fully_async":
        thr = float(k.get("async_training.staleness_threshold", 0.1))
        trig = _int(k, "async_training.trigger_parameter_sync_step", where, 4)
        req = _int(k, "async_training.require_batches", where, 1)
        if thr > 0:
            mode, K = "async", max(1, math.ceil(thr))
        else:
            streaming = trig > 1
        if isinstance(mini, int) and mini > 0 and not (isinstance(bs, int) and bs > 0):
            bs = mini * req * trig
        if thr > 0 and thr != math.ceil(thr):
            notes.append(f"staleness_threshold {thr} replayed as async staleness {K} (Libra's bound is in weight versions)")
    traj = bs * n if isinstance(bs, int) and bs > 0 else None
    mbs = bs // mini if isinstance(bs, int) and isinstance(mini, int) and mini > 0 and bs >= mini else 1
    kl = bool(k.get(a + "use_kl_loss", False) or k.get("algorithm.use_kl_in_reward", False))
    hint = k.get("actor_rollout_ref.model.path")
    return RunShape("verl", n_roll + (0 if not split else n_train), not split, n_roll, tp_r, train, traj, max(1, mbs), mode, K,
                    streaming, kl, Path(str(hint)).name if hint else None, tuple(notes), group_size=n)


def _dims(s: Any, where: str, key: str) -> tuple[str, dict[str, int]]:
    m = re.fullmatch(r"([a-z]+):((?:[dtpce]\d+)+)", str(s or ""))
    if m is None:
        raise UserError(f"{where}: {key} must be an allocation like 'vllm:d4t2' or 'megatron:d2p2t2', got {s!r}")
    return m.group(1), {d: int(v) for d, v in re.findall(r"([dtpce])(\d+)", m.group(2))}


def _areal(k: dict[str, Any], where: str) -> RunShape:
    _, r = _dims(k.get("rollout.backend"), where, "rollout.backend")
    backend, t = _dims(k.get("actor.backend"), where, "actor.backend")
    tp, pp, dp = t.get("t", 1), t.get("p", 1), t.get("d", 1)
    train = TrainConfig(tp, pp, dp, t.get("e", 1), 3 if backend == "fsdp" and dp > 1 else 1,
                        1, bool(k.get("actor.gradient_checkpointing", False)))
    K = int(k.get("rollout.max_head_offpolicyness", 0) or 0)
    bs, n = k.get("train_dataset.batch_size"), k.get("gconfig.n_samples", 1)
    traj = bs * n if isinstance(bs, int) and isinstance(n, int) else None
    n_roll = r.get("d", 1) * r.get("t", 1) * r.get("p", 1)
    return RunShape("areal", n_roll + tp * pp * dp, False, n_roll, r.get("t", 1), train, traj,
                    int(k.get("actor.ppo_n_minibatches", 1) or 1), "async" if K else "sync", K,
                    notes=("AReaL's micro-batches are token budgets (actor.mb_spec.max_tokens_per_mb): replayed as micro-batch 1",),
                    group_size=n if isinstance(n, int) and n > 0 else 1)


def _nemo(k: dict[str, Any], where: str) -> RunShape:
    nodes, gpn = _int(k, "cluster.num_nodes", where, 1), _int(k, "cluster.gpus_per_node", where)
    n = nodes * gpn
    colo = bool(k.get("policy.generation.colocated.enabled", True))
    if colo:
        n_roll = n_train = n
    else:
        rg = k.get("policy.generation.colocated.resources.gpus_per_node")
        rn = k.get("policy.generation.colocated.resources.num_nodes") or 1
        n_roll = (rg if nodes == 1 else gpn * rn) if isinstance(rg, int) else gpn * rn
        n_train = n - n_roll
    mega = bool(k.get("policy.megatron_cfg.enabled", False))
    if mega:
        tp, pp = _int(k, "policy.megatron_cfg.tensor_model_parallel_size", where, 1), _int(k, "policy.megatron_cfg.pipeline_model_parallel_size", where, 1)
        train = TrainConfig(tp, pp, _dp(n_train, tp, pp, where), _int(k, "policy.megatron_cfg.expert_model_parallel_size", where, 1),
                            1, _int(k, "policy.train_micro_batch_size", where, 1), bool(k.get("policy.megatron_cfg.activation_checkpointing")))
    else:
        tp = _int(k, "policy.dtensor_cfg.tensor_parallel_size", where, 1)
        dp = _dp(n_train, tp, 1, where)
        train = TrainConfig(tp, 1, dp, 1, 3 if dp > 1 else 1, _int(k, "policy.train_micro_batch_size", where, 1),
                            bool(k.get("policy.dtensor_cfg.activation_checkpointing")))
    asyn = bool(k.get("grpo.async_grpo.enabled", False))
    K = _int(k, "grpo.async_grpo.max_trajectory_age_steps", where, 1) if asyn else 0
    bs, g = k.get("grpo.num_prompts_per_step"), k.get("grpo.num_generations_per_prompt")
    traj = bs * g if isinstance(bs, int) and isinstance(g, int) else None
    gb = k.get("policy.train_global_batch_size")
    mbs = traj // gb if traj and isinstance(gb, int) and gb > 0 and traj >= gb else 1
    hint = k.get("policy.model_name")
    return RunShape("nemo-rl", n, colo, n_roll, _int(k, "policy.generation.vllm_cfg.tensor_parallel_size", where, 1), train, traj,
                    mbs, "async" if asyn else "sync", K, model_hint=Path(str(hint)).name if hint else None,
                    group_size=g if isinstance(g, int) and g > 0 else 1)


def _slime(k: dict[str, Any], where: str) -> RunShape:
    n_train = _int(k, "--actor-num-nodes", where, 1) * _int(k, "--actor-num-gpus-per-node", where)
    colo = k.get("--colocate") is True
    n_roll = n_train if colo else _int(k, "--rollout-num-gpus", where)
    tp, pp = _int(k, "--tensor-model-parallel-size", where, 1), _int(k, "--pipeline-model-parallel-size", where, 1)
    train = TrainConfig(tp, pp, _dp(n_train, tp, pp, where), _int(k, "--expert-model-parallel-size", where, 1), 1,
                        _int(k, "--micro-batch-size", where, 1), "--recompute-granularity" in k)
    bs, n = k.get("--rollout-batch-size"), k.get("--n-samples-per-prompt", 1)
    traj = bs * n if isinstance(bs, int) and isinstance(n, int) else None
    gb = k.get("--global-batch-size")
    mbs = traj // gb if traj and isinstance(gb, int) and gb > 0 and traj >= gb else 1
    asyn = k.get("__script__") == "train_async.py"
    return RunShape("slime", n_train if colo else n_roll + n_train, colo, n_roll, _int(k, "--rollout-num-gpus-per-engine", where, 1),
                    train, traj, mbs, "async" if asyn else "sync", 1 if asyn else 0,
                    group_size=n if isinstance(n, int) and n > 0 else 1)
