"""``libra-run`` configuration: one flat set of keys from a YAML or TOML file, overridden by CLI
flags. Every key, its default and meaning is listed in ``KEYS`` (docs/runtime.md prints the same
table). Unknown keys and bad values are ``UserError``s naming the file and key.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

from libra.errors import UserError

#: key -> (default, help). The dataclass below has the same fields.
KEYS: dict[str, tuple[Any, str]] = {
    "model": (None, "policy checkpoint folder (HF format); default: the bundled tiny tool-using policy"),
    "engine": ("auto", "rollout engine: auto (vllm when installed, else torch), torch, vllm"),
    "trainer": ("torch", "trainer backend: torch (one worker) or deepspeed (ZeRO across the plan's DP workers)"),
    "zero_stage": (None, "DeepSpeed ZeRO stage 1-3; default: the plan's"),
    "device": ("cpu", "cpu (CPU workers) or cuda (GPUs)"),
    "devices": (4, "devices the planner splits between rollout and training (CPU workers or GPUs)"),
    "devices_per_node": (None, "devices per node (a TP group stays inside one); default: devices"),
    "gpu": (None, "cost-model catalog name of the device (default: cpu on CPU, h100 on cuda)"),
    "calibration": (None, "operator calibration file for the cost evaluator (libra-calibrate fit output)"),
    "engine_profile": (None, "inference-engine profile the cost evaluator times rollouts with (vllm-2024, trtllm-2024, "
                             "constants, or a libra-calibrate fit-engine file); default: the calibration's engine entry, "
                             "else the profile of the engine that runs (vllm-2024 for vLLM; constants for the torch "
                             "engine, which the vLLM fits do not describe)"),
    "address": (None, "Ray cluster address to join (default: start a local Ray)"),
    "policy": ("libra", "resource policy: libra and its ablations, or a baseline (verl-static-uniform, verl-colocated); hindsight-routing and areal-static-optimal need the simulator"),
    "split": (None, "pin ROLLOUT:TRAIN devices (e.g. '2:2'); overrides the planner's split"),
    "bucket_bounds": (None, "force rollout buckets at these context lengths (e.g. [96]); instances are dealt to buckets round-robin"),
    "steps": (3, "RL steps to run"),
    "prompts_per_step": (8, "prompts (GRPO groups) per step"),
    "group_size": (4, "samples per prompt"),
    "tasks": ({"math": 1.0, "search": 1.0}, "task kinds and their weights (math, math2, search; math2, two products in one or two "
                                           "calls, is beyond the bundled tiny policy: 0% solved)"),
    "seed": (0, "seed of tasks, sampling and training"),
    "temperature": (1.0, "sampling temperature"),
    "max_new_tokens": (48, "tokens one turn may generate"),
    "max_tool_calls": (4, "tool calls per trajectory (the last one ends it: finish tool_limit)"),
    "max_context": (512, "context limit of a trajectory, tokens"),
    "max_batch": (8, "turns an instance generates per engine call"),
    "lr": (3e-4, "learning rate (AdamW; 2e-3 collapsed the tiny policy's tool calls within 20 steps)"),
    "clip": (0.2, "GRPO/PPO ratio clip"),
    "kl_coef": (0.0, "KL penalty to the initial model (0: no reference model)"),
    "mini_batches": (2, "optimizer steps per RL step"),
    "streaming": (None, "train each mini-batch as soon as its GRPO groups have finished, while the rollout tail runs (on-policy); "
                        "default: the plan's choice (Plan.streaming, the loop the policy priced fastest); true/false pins it, as "
                        "libra-sim replay --streaming/--no-streaming do; colocated plans never stream"),
    "max_staleness": (0, "staleness class K the RL algorithm tolerates (the simulator's --max-staleness): 0 on-policy (sync, sync + "
                         "streaming); K >= 1 lets the policy choose the asynchronous loop, whose rollout runs at most K policy versions "
                         "behind the trainer (docs/runtime.md, 'The asynchronous loop')"),
    "behaviour_weight_cap": (5.0, "async loop: the behaviour-policy importance weight of an off-policy token (decoupled PPO) is "
                                  "truncated at this value"),
    "pool_grace_s": (None, "elastic pool: seconds an instance must have been idle before it is lent (default: the pool's, 1.0)"),
    "pool_min_tail_s": (None, "elastic pool: least remaining rollout it assumes while trajectories are unfinished (default: the pool's, 0)"),
    "pool_payoff_factor": (None, "elastic pool: lend only if remaining rollout > factor x role-change round trip (default: the pool's, 1.0)"),
    "tool_timeout_s": (5.0, "python tool wall-clock limit"),
    "tool_memory_mb": (512, "python tool address-space limit"),
    "tool_output_bytes": (512, "python tool output cap (more: error, truncated)"),
    "checkpoint_every": (1, "checkpoint the trainer every N steps (0: never)"),
    "keep_checkpoints": (2, "checkpoints kept in OUT/ckpt, the newest ones (older ones are deleted after each save)"),
    "resume": (False, "resume from the newest checkpoint in OUT/ckpt"),
    "out": ("out/run", "output folder: trace.jsonl, steps.csv, plots, fidelity.csv, ckpt/"),
    "replay": (True, "after the run, replay trace.jsonl with libra-sim on the same devices and write fidelity.csv"),
    "faults": ([], "fault injection: [{kill: rollout, step: S, at_s: T, instance: I}, {kill: trainer, step: S}]"),
    "threads": (1, "torch threads per worker"),
    "vllm_kv_gib": (1, "vLLM CPU KV cache (VLLM_CPU_KVCACHE_SPACE, GiB)"),
    "eval_tasks": (96, "held-out tasks the starting and the final weights are evaluated on (0: no evaluation)"),
    "eval_seed": (999, "seed of the held-out tasks (the run's own tasks use 'seed')"),
    "eval_samples": (1, "episodes per held-out task"),
    "eval_temperature": (None, "sampling temperature of the held-out evaluation (default: 'temperature'; 0: greedy)"),
}


@dataclass
class RunConfig:
    """The resolved configuration (see ``KEYS``)."""

    model: str | None = None
    engine: str = "auto"
    trainer: str = "torch"
    zero_stage: int | None = None
    device: str = "cpu"
    devices: int = 4
    devices_per_node: int | None = None
    gpu: str | None = None
    calibration: str | None = None
    engine_profile: str | None = None
    address: str | None = None
    policy: str = "libra"
    split: str | None = None
    bucket_bounds: list[int] | None = None
    steps: int = 3
    prompts_per_step: int = 8
    group_size: int = 4
    tasks: dict[str, float] = field(default_factory=lambda: {"math": 1.0, "search": 1.0})
    seed: int = 0
    temperature: float = 1.0
    max_new_tokens: int = 48
    max_tool_calls: int = 4
    max_context: int = 512
    max_batch: int = 8
    lr: float = 3e-4
    clip: float = 0.2
    kl_coef: float = 0.0
    mini_batches: int = 2
    streaming: bool | None = None
    max_staleness: int = 0
    behaviour_weight_cap: float = 5.0
    pool_grace_s: float | None = None
    pool_min_tail_s: float | None = None
    pool_payoff_factor: float | None = None
    tool_timeout_s: float = 5.0
    tool_memory_mb: int = 512
    tool_output_bytes: int = 512
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    resume: bool = False
    out: str = "out/run"
    replay: bool = True
    faults: list[dict[str, Any]] = field(default_factory=list)
    threads: int = 1
    vllm_kv_gib: int = 1
    eval_tasks: int = 96
    eval_seed: int = 999
    eval_samples: int = 1
    eval_temperature: float | None = None

    @property
    def per_node(self) -> int:
        return self.devices_per_node or self.devices

    @property
    def gpu_name(self) -> str:
        return self.gpu or ("cpu" if self.device == "cpu" else "h100")

    def split_pair(self) -> tuple[int, int] | None:
        if self.split is None:
            return None
        try:
            a, b = (int(x) for x in str(self.split).split(":"))
        except ValueError:
            raise UserError(f"split {self.split!r}: expected ROLLOUT:TRAIN device counts, e.g. 2:2") from None
        if a < 1 or b < 1 or a + b > self.devices:
            raise UserError(f"split {self.split!r}: both sides >= 1 and together <= devices ({self.devices})")
        return a, b


def key_types() -> dict[str, type]:
    """Each key's value type (``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict``), read from
    ``RunConfig``'s annotations with ``None`` dropped: the one place flags and files learn how to
    read a value, whatever its default."""
    import types
    import typing

    out: dict[str, type] = {}
    for name, hint in typing.get_type_hints(RunConfig).items():
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        base = typing.get_origin(hint) or hint
        out[name] = base if base in (bool, int, float, str, list, dict) else str
    return out


@dataclass(frozen=True)
class Range:
    """The values a numeric key accepts: ``lo``/``hi`` bounds (None: unbounded), ``lo_open``
    for a strict lower bound, ``integer`` for whole numbers. Every int and float key has one
    (``RANGES``; a test checks none is missing), so a bad number is refused before Ray starts
    instead of failing inside an actor."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    integer: bool = False

    def ok(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.integer and not isinstance(v, int):
            return False
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or v <= self.hi

    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        lo = None if self.lo is None else (f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}")
        if self.hi is None:
            return f"{kind} {lo}" if lo else kind
        if lo is None:
            return f"{kind} <= {self.hi:g}"
        return f"{kind} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


_INT1 = Range(1, integer=True)
#: key -> the values it accepts (None is accepted where the key's default is None).
RANGES: dict[str, Range] = {
    "zero_stage": Range(1, 3, integer=True),
    "devices": Range(2, integer=True),  # one for rollout, one for training
    "devices_per_node": _INT1,
    "steps": _INT1,
    "prompts_per_step": _INT1,
    "group_size": Range(2, integer=True),  # GRPO normalizes within a group
    "seed": Range(0, integer=True),
    "temperature": Range(0, 100),  # 0: greedy
    "max_new_tokens": _INT1,
    "max_tool_calls": _INT1,
    "max_context": Range(16, integer=True),  # below this no prompt of the bundled tasks fits
    "max_batch": _INT1,
    "lr": Range(0, 1, lo_open=True),
    "clip": Range(0, 1, lo_open=True),
    "kl_coef": Range(0),
    "mini_batches": _INT1,
    "max_staleness": Range(0, integer=True),
    "behaviour_weight_cap": Range(1),  # below 1 it would shrink every on-policy token's weight too
    "pool_grace_s": Range(0),
    "pool_min_tail_s": Range(0),
    "pool_payoff_factor": Range(0),
    "tool_timeout_s": Range(0, 3600, lo_open=True),
    "tool_memory_mb": Range(16, integer=True),  # the sandboxed interpreter itself needs ~10 MB
    "tool_output_bytes": _INT1,
    "checkpoint_every": Range(0, integer=True),
    "keep_checkpoints": _INT1,
    "threads": _INT1,
    "vllm_kv_gib": _INT1,
    "eval_tasks": Range(0, integer=True),
    "eval_seed": Range(0, integer=True),
    "eval_samples": _INT1,
    "eval_temperature": Range(0, 100),
}


def _check(cfg: RunConfig, src: str | dict[str, str]) -> RunConfig:
    """Every key's value, checked before anything starts. ``src`` names where each key came from
    (``--lr`` for a flag, the config file, or ``(defaults)``), so the message points at what the
    user typed."""

    def where(key: str) -> str:
        return src if isinstance(src, str) else src.get(key, "(defaults)")

    def bad(key: str, rule: str) -> UserError:
        w = where(key)
        if w.startswith("--"):
            return UserError(f"{w}: {rule}")
        return UserError(f"{w}: key '{key}': {rule}")

    if cfg.engine not in ("auto", "torch", "vllm"):
        raise bad("engine", f"must be auto, torch or vllm, got {cfg.engine!r}")
    if cfg.trainer not in ("torch", "deepspeed"):
        raise bad("trainer", f"must be torch or deepspeed, got {cfg.trainer!r}")
    if cfg.device not in ("cpu", "cuda"):
        raise bad("device", f"must be cpu or cuda, got {cfg.device!r}")
    for k, rng in RANGES.items():
        v = getattr(cfg, k)
        if v is None and KEYS[k][0] is None:
            continue
        if not rng.ok(v):
            raise bad(k, f"must be {rng.text()} ({KEYS[k][1].split(';')[0].split(' (')[0]}), got {v!r}")
    for k in ("resume", "replay"):
        if not isinstance(getattr(cfg, k), bool):
            raise bad(k, f"must be true or false, got {getattr(cfg, k)!r}")
    if cfg.streaming is not None and not isinstance(cfg.streaming, bool):
        raise bad("streaming", f"must be true, false or unset (unset: the plan's choice), got {cfg.streaming!r}")
    if cfg.devices_per_node is not None and cfg.devices_per_node > cfg.devices:
        raise bad("devices_per_node", f"must be <= devices ({cfg.devices}), got {cfg.devices_per_node}")
    if not isinstance(cfg.tasks, dict):
        raise bad("tasks", f"must be a mapping of task kind to weight, e.g. {{math: 1, search: 1}}, got {cfg.tasks!r}")
    from libra.runtime.tasks import KINDS

    unknown = sorted(str(k) for k in cfg.tasks if k not in KINDS)
    if unknown:
        raise bad("tasks", f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    weights = list(cfg.tasks.values())
    if not weights or not all(Range(0).ok(w) for w in weights) or sum(weights) <= 0:
        raise bad("tasks", f"weights must be numbers >= 0 that sum to > 0, got {cfg.tasks!r}")
    if cfg.bucket_bounds is not None and (not isinstance(cfg.bucket_bounds, list) or not all(isinstance(b, int) and b > 0 for b in cfg.bucket_bounds)
                                          or cfg.bucket_bounds != sorted(set(cfg.bucket_bounds))):
        raise bad("bucket_bounds", f"must be an increasing list of positive context lengths, e.g. [96], got {cfg.bucket_bounds!r}")
    if not isinstance(cfg.faults, list):
        raise bad("faults", f"must be a list, got {cfg.faults!r}")
    for i, f in enumerate(cfg.faults):
        if not isinstance(f, dict) or f.get("kill") not in ("rollout", "trainer") or not isinstance(f.get("step"), int):
            raise bad("faults", f"item {i} must be {{kill: rollout|trainer, step: INT, at_s: SECONDS, instance: INT}}, got {f!r}")
    if not cfg.out or not isinstance(cfg.out, str):
        raise bad("out", "must name an output folder")
    if cfg.max_new_tokens >= cfg.max_context:
        raise bad("max_new_tokens", f"must be < max_context ({cfg.max_context}): a turn cannot generate more than the whole context "
                                    f"holds, got {cfg.max_new_tokens}")
    _check_names(cfg, bad)
    try:
        cfg.split_pair()
    except UserError as exc:
        raise bad("split", str(exc).removeprefix(f"split {cfg.split!r}: ") + f", got {cfg.split!r}") from None
    return cfg


def _check_names(cfg: RunConfig, bad: Any) -> None:
    """Names and files the run would otherwise only trip over after the held-out evaluation and
    Ray's start: the policy (unknown, or one a real run cannot execute: the oracle needs the
    future, areal-static-optimal hindsight replay), the cost-model GPU, the calibration file."""
    from libra.runtime.policyglue import check_policy, known_policies

    known = known_policies()
    if cfg.policy not in known:
        raise bad("policy", f"unknown policy {cfg.policy!r}; known: {', '.join(known)}")
    try:
        check_policy(cfg.policy)
    except UserError as exc:
        raise bad("policy", str(exc)) from None
    from cost_models.hardware import GPUS

    if cfg.gpu is not None and str(cfg.gpu).lower() not in GPUS:
        raise bad("gpu", f"unknown cost-model GPU {cfg.gpu!r}; known: {', '.join(sorted(GPUS))}")
    if cfg.calibration is not None:
        path = os.path.expanduser(str(cfg.calibration))
        if not os.path.isfile(path):
            why = "is a folder (give the JSON file `libra-calibrate fit -o FILE` wrote)" if os.path.isdir(path) else "file not found"
            raise bad("calibration", f"{cfg.calibration}: {why}")


def config_warnings(cfg: RunConfig) -> list[str]:
    """What is legal but probably not what the user wants (logged, the run goes on)."""
    out = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cfg.device == "cpu" and cfg.devices > cores:
        out.append(f"devices {cfg.devices} exceeds the {cores} CPU cores here: the CPU workers share cores, so stage times "
                   f"measure contention, not the plan")
    if cfg.max_staleness > 0 and cfg.checkpoint_every != 1:
        out.append(f"max_staleness {cfg.max_staleness} with checkpoint_every {cfg.checkpoint_every}: an asynchronous step whose "
                   f"trainer worker dies can only be redone from the previous step's checkpoint (checkpoint_every 1); "
                   f"without it the run stops")
    return out


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read ``path`` (``.yaml``/``.yml``/``.toml``; None: defaults only) and apply ``overrides``
    (non-None values from CLI flags)."""
    data: dict[str, Any] = {}
    src = path or "(defaults)"
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise UserError(f"config {path}: {exc.strerror}") from None
        try:
            if path.endswith(".toml"):
                import tomllib

                data = tomllib.loads(raw.decode("utf-8"))
            elif path.endswith((".yaml", ".yml")):
                import yaml

                data = yaml.safe_load(raw) or {}
            else:
                raise UserError(f"config {path}: use a .yaml, .yml or .toml file")
        except UserError:
            raise
        except Exception as exc:  # a parser's own error names the line
            raise UserError(f"config {path}: cannot parse: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise UserError(f"config {path}: the top level must be a mapping of keys")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise UserError(f"config {src}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    merged = {**data, **given}
    # where each key came from, so an error names what the user typed
    sources = {**{k: f"config {path}" for k in data}, **{k: "--" + k.replace("_", "-") for k in given}}
    types = key_types()
    for k, v in list(merged.items()):
        kind = types.get(k)
        if isinstance(v, str) and kind in (int, float):
            # YAML 1.1 reads `lr: 1e-3` (no dot) as text: a number written as text is that number
            try:
                merged[k] = int(v) if kind is int else float(v)
            except ValueError:
                pass  # the range check names the key and the value
        elif kind is str and v is not None and not isinstance(v, str):
            where = "--" + k.replace("_", "-") if k in given else f"config {path}: key '{k}'"
            if k == "split" and isinstance(v, int):  # YAML 1.1 reads an unquoted 2:2 as the base-60 number 122
                raise UserError(f"{where}: write ROLLOUT:TRAIN quoted, e.g. split: '2:2' (YAML reads an unquoted 2:2 as the "
                                f"number {v}), got {v!r}")
            raise UserError(f"{where}: must be text (a name or a path), got {v!r}")
    names = {f.name for f in fields(RunConfig)}
    cfg = RunConfig(**{k: v for k, v in merged.items() if k in names})
    for k, kind in key_types().items():  # YAML/TOML write 1 for 1.0: widen ints of float keys
        v = getattr(cfg, k)
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            setattr(cfg, k, float(v))
    if cfg.out:
        cfg.out = os.path.expanduser(cfg.out)
    return _check(cfg, sources)
