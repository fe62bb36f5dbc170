"""The sweep grid: its YAML schema as dataclasses, validation, and expansion into configurations.

A grid names its workloads and clusters once and then lists ``sweeps``: blocks whose axes
(workloads x clusters x max_staleness x seeds) are crossed, so a grid covers exactly the
combinations that make sense instead of one huge product. A configuration is one (workload,
cluster, staleness class, seed); every policy of it replays the same steps::

    name: example
    policies: [libra, verl-colocated, verl-static-uniform, areal-static-optimal]
    subject: libra                 # compared with the best baseline of its class (default libra)
    replay: {noise: 0.03, mini_batches: 4, kl: 0.0, tool_kv: keep}
    workloads:
      swe-short: {generate: {workload: swe, steps: 4, batch: 128, group_size: 8, seed: 0, max_context: 16384}}
      swe-bundled: {trace: ../../traces/swe-qwen3-14b.jsonl.gz, steps: "0:4"}
    clusters:
      h100-16: {gpus: 16, gpu: h100, model: qwen3-8b, engine: vllm-2024}
    sweeps:
      - {workloads: [swe-short, swe-bundled], clusters: [h100-16], max_staleness: [0, 1], seeds: [0]}

Why validate everything first: a sweep runs for an hour; a typo in its 40th configuration must
not surface after 39 of them. Every rule violation is one ``UserError`` line naming the file, the
key path and the rule (the CLI prints it and exits 2) before any run starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libra.errors import UserError
from sim.commands.common import MAX_GPUS  # the largest cluster a configuration may ask for: replay's own limit
from sim.sweep.staleness import runs_in_class

#: Keys of the generator spec that shape the run (the rest are workload parameters).
SHAPE_KEYS: tuple[str, ...] = ("workload", "steps", "batch", "group_size", "seed")
#: The replay options a grid may set, with their defaults (``sim.loop.SimConfig`` fields).
REPLAY_DEFAULTS: dict[str, Any] = {"noise": 0.03, "mini_batches": 4, "kl": 0.0, "tool_kv": "keep", "streaming": None}
TOP_KEYS = ("name", "description", "policies", "subject", "replay", "workloads", "clusters", "sweeps")
CLUSTER_KEYS = ("gpus", "gpu", "model", "engine", "gpus_per_node", "max_train_gpus", "max_context")
SWEEP_KEYS = ("workloads", "clusters", "max_staleness", "seeds", "policies")


@dataclass(frozen=True)
class GeneratedWorkload:
    """A workload the synthetic generator makes (``libra-sim gen``'s arguments)."""

    kind: str
    steps: int
    batch: int
    group_size: int
    seed: int
    params: tuple[tuple[str, Any], ...] = ()  # workload parameter overrides, sorted by name

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params)
        return f"gen {self.kind} {self.steps}x{self.batch} (group {self.group_size}, seed {self.seed}{extra})"


@dataclass(frozen=True)
class TraceWorkload:
    """A trace file (absolute path) and the step range ``A:B`` to replay (None: all of it)."""

    path: str
    steps: str | None = None

    def describe(self) -> str:
        return os.path.basename(self.path) + (f" steps {self.steps}" if self.steps else "")


@dataclass(frozen=True)
class WorkloadEntry:
    name: str
    source: GeneratedWorkload | TraceWorkload


@dataclass(frozen=True)
class ClusterEntry:
    """A cluster of the grid: ``libra.cluster.ClusterSpec``'s fields by their grid names.
    ``gpus_per_node`` None: the GPU's own node size; ``max_context`` None: the trace's declared cap."""

    name: str
    gpus: int
    gpu: str
    model: str
    engine: str | None = None
    gpus_per_node: int | None = None
    max_train_gpus: int | None = None
    max_context: int | None = None

    def describe(self) -> str:
        eng = f", {self.engine}" if self.engine else ""
        return f"{self.gpus} x {self.gpu}, {self.model}{eng}"


@dataclass(frozen=True)
class ReplayOptions:
    """What every replay of the grid shares (``SimConfig`` fields; the seed is an axis)."""

    noise: float = 0.03
    mini_batches: int = 4
    kl: float = 0.0
    tool_kv: str = "keep"
    streaming: bool | None = None  # None: each policy runs its own loop choice (libra may stream); a bool pins it for all


@dataclass(frozen=True)
class Configuration:
    """One cell of the grid: every policy in ``policies`` replays ``workload`` on ``cluster`` in
    staleness class ``max_staleness`` with noise seed ``seed``."""

    workload: WorkloadEntry
    cluster: ClusterEntry
    max_staleness: int
    seed: int
    policies: tuple[str, ...]
    replay: ReplayOptions

    @property
    def id(self) -> str:
        """A readable, unique label: ``workload/cluster/K<k>/s<seed>``."""
        return f"{self.workload.name}/{self.cluster.name}/K{self.max_staleness}/s{self.seed}"


@dataclass(frozen=True)
class Grid:
    """A validated grid file: its configurations in file order, duplicates removed."""

    path: str
    name: str
    subject: str
    policies: tuple[str, ...]
    configurations: tuple[Configuration, ...] = field(default_factory=tuple)

    @property
    def baselines(self) -> tuple[str, ...]:
        """The grid's policies that are baselines (``libra.policies.BASELINES``: what the subject must beat)."""
        from libra.policies import BASELINES

        return tuple(p for p in self.policies if p in BASELINES)


class _Where:
    """Builds the one-line error: ``FILE: key.path: rule``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, keypath: str, rule: str) -> UserError:
        return UserError(f"{self.path}: {keypath or '(top level)'}: {rule}")


def _mapping(w: _Where, value: Any, keypath: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise w.error(keypath, f"must be a mapping, got {type(value).__name__}")
    return value


def _known_keys(w: _Where, m: Mapping[str, Any], keypath: str, allowed: Sequence[str]) -> None:
    for k in m:
        if k not in allowed:
            prefix = f"{keypath}." if keypath else ""
            raise w.error(f"{prefix}{k}", f"unknown key; allowed: {', '.join(allowed)}")


def _int(w: _Where, value: Any, keypath: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi:,}]"
        raise w.error(keypath, f"must be an integer {rng}, got {value!r}")
    return value


def _name_list(w: _Where, value: Any, keypath: str) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise w.error(keypath, "must not be empty")
    return items


def _policies(w: _Where, value: Any, keypath: str) -> tuple[str, ...]:
    from libra.policies import policy_names

    names = policy_names()
    items = _name_list(w, value, keypath)
    for i, p in enumerate(items):
        if p not in names:
            raise w.error(f"{keypath}[{i}]", f"unknown policy {p!r}; known: {', '.join(names)}")
    if len(set(items)) != len(items):
        raise w.error(keypath, "lists a policy twice")
    return tuple(items)


def _generated(w: _Where, spec: Any, keypath: str) -> GeneratedWorkload:
    from libra.trace.workload import WORKLOADS, make_params
    from libra.trace.workload.engine import RunShape

    spec = _mapping(w, spec, keypath)
    kind = spec.get("workload")
    if kind not in WORKLOADS:
        raise w.error(f"{keypath}.workload", f"must be one of {', '.join(WORKLOADS)}, got {kind!r}")
    fields = WORKLOADS[kind].field_names()
    _known_keys(w, spec, keypath, SHAPE_KEYS + tuple(f for f in fields if f != "workload"))
    for key in ("steps", "batch", "group_size"):
        if key not in spec:
            raise w.error(f"{keypath}.{key}", "is required")
        _int(w, spec[key], f"{keypath}.{key}", 1)
    seed = _int(w, spec.get("seed", 0), f"{keypath}.seed", 0)
    try:
        RunShape(spec["steps"], spec["batch"], spec["group_size"], seed)
    except UserError as exc:
        raise w.error(keypath, str(exc).replace("--group-size", "group_size").replace("--batch", "batch")) from None
    params = {k: v for k, v in spec.items() if k not in SHAPE_KEYS}
    for k, v in params.items():
        if isinstance(v, (Mapping, list)) or v is None:
            raise w.error(f"{keypath}.{k}", f"must be a number or a string, got {v!r}")
    try:
        make_params(kind, **params)
    except UserError as exc:
        bad = next((k for k in params if f" {k}=" in str(exc)), None)
        raise w.error(f"{keypath}.{bad}" if bad else keypath, str(exc)) from None
    return GeneratedWorkload(kind, spec["steps"], spec["batch"], spec["group_size"], seed, tuple(sorted(params.items())))


def _trace(w: _Where, spec: Mapping[str, Any], keypath: str, base_dir: str) -> TraceWorkload:
    from sim.replay import parse_step_range

    path = spec["trace"]
    if not isinstance(path, str) or not path:
        raise w.error(f"{keypath}.trace", f"must be a trace file path, got {path!r}")
    full = path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))
    if not os.path.isfile(full):
        raise w.error(f"{keypath}.trace", f"no such file {full} (a relative path is read from the grid file's folder)")
    steps = spec.get("steps")
    if steps is not None:
        if not isinstance(steps, str):
            raise w.error(f"{keypath}.steps", f"must be a step range string 'A:B', got {steps!r}")
        try:
            parse_step_range(steps)
        except UserError as exc:
            raise w.error(f"{keypath}.steps", str(exc).replace("--steps ", "")) from None
    return TraceWorkload(full, steps)


def _workloads(w: _Where, value: Any, base_dir: str) -> dict[str, WorkloadEntry]:
    m = _mapping(w, value, "workloads")
    if not m:
        raise w.error("workloads", "must name at least one workload")
    out: dict[str, WorkloadEntry] = {}
    for name, spec in m.items():
        kp = f"workloads.{name}"
        spec = _mapping(w, spec, kp)
        if ("generate" in spec) == ("trace" in spec):
            raise w.error(kp, "needs exactly one of 'generate' (generator parameters) or 'trace' (a file)")
        if "generate" in spec:
            _known_keys(w, spec, kp, ("generate",))
            out[str(name)] = WorkloadEntry(str(name), _generated(w, spec["generate"], f"{kp}.generate"))
        else:
            _known_keys(w, spec, kp, ("trace", "steps"))
            out[str(name)] = WorkloadEntry(str(name), _trace(w, spec, kp, base_dir))
    return out


def _cluster(w: _Where, name: str, spec: Any) -> ClusterEntry:
    from cost_models import get_model
    from cost_models.engines.registry import get_profile
    from cost_models.errors import CostModelError
    from cost_models.hardware import GPUS

    kp = f"clusters.{name}"
    spec = _mapping(w, spec, kp)
    _known_keys(w, spec, kp, CLUSTER_KEYS)
    for key in ("gpus", "gpu", "model"):
        if key not in spec:
            raise w.error(f"{kp}.{key}", "is required")
    gpus = _int(w, spec["gpus"], f"{kp}.gpus", 1, MAX_GPUS)
    gpu = spec["gpu"]
    if gpu not in GPUS:
        raise w.error(f"{kp}.gpu", f"unknown GPU {gpu!r}; known: {', '.join(sorted(GPUS))}")
    model = spec["model"]
    try:
        get_model(model)
    except (CostModelError, OSError, ValueError, TypeError):
        from cost_models import MODELS

        raise w.error(f"{kp}.model", f"{model!r} is not a catalog model or config.json; known: {', '.join(sorted(MODELS))}") from None
    engine = spec.get("engine")
    if engine is not None:
        try:
            get_profile(engine)
        except (CostModelError, OSError, ValueError, TypeError) as exc:
            raise w.error(f"{kp}.engine", str(exc)) from None
    opt = {k: _int(w, spec[k], f"{kp}.{k}", 1) for k in ("gpus_per_node", "max_train_gpus", "max_context") if spec.get(k) is not None}
    return ClusterEntry(str(name), gpus, gpu, model, engine, **opt)


def _replay(w: _Where, value: Any) -> ReplayOptions:
    m = _mapping(w, value, "replay")
    _known_keys(w, m, "replay", tuple(REPLAY_DEFAULTS))
    noise = m.get("noise", REPLAY_DEFAULTS["noise"])
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise <= 1:
        raise w.error("replay.noise", f"must be a number in [0, 1] (sigma of the ground-truth noise), got {noise!r}")
    kl = m.get("kl", REPLAY_DEFAULTS["kl"])
    if isinstance(kl, bool) or not isinstance(kl, (int, float)) or not kl >= 0:
        raise w.error("replay.kl", f"must be a number >= 0, got {kl!r}")
    tool_kv = m.get("tool_kv", REPLAY_DEFAULTS["tool_kv"])
    if tool_kv not in ("keep", "release"):
        raise w.error("replay.tool_kv", f"must be keep or release, got {tool_kv!r}")
    streaming = m.get("streaming", REPLAY_DEFAULTS["streaming"])
    if streaming is not None and not isinstance(streaming, bool):
        raise w.error("replay.streaming", f"must be true, false or null (each policy's own choice), got {streaming!r}")
    mb = _int(w, m.get("mini_batches", REPLAY_DEFAULTS["mini_batches"]), "replay.mini_batches", 1)
    return ReplayOptions(float(noise), mb, float(kl), tool_kv, streaming)


def parse_grid(data: Any, path: str) -> Grid:
    """Validate a loaded grid document (``path`` names it in errors; relative trace paths are read
    from its folder) and expand it into configurations."""
    w = _Where(path)
    top = _mapping(w, data, "")
    _known_keys(w, top, "", TOP_KEYS)
    for key in ("policies", "workloads", "clusters", "sweeps"):
        if key not in top:
            raise w.error(key, "is required")
    name = top.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str) or not name:
        raise w.error("name", f"must be a non-empty string, got {name!r}")
    policies = _policies(w, top["policies"], "policies")
    subject = top.get("subject", "libra")
    if subject not in policies:
        raise w.error("subject", f"{subject!r} must be one of the grid's policies ({', '.join(policies)})")
    from libra.policies import BASELINES

    if not any(p in BASELINES for p in policies):
        raise w.error("policies", f"must include at least one baseline to compare {subject} with ({', '.join(BASELINES)})")
    replay = _replay(w, top.get("replay", {}))
    workloads = _workloads(w, top["workloads"], os.path.dirname(os.path.abspath(path)))
    cm = _mapping(w, top["clusters"], "clusters")
    if not cm:
        raise w.error("clusters", "must name at least one cluster")
    clusters = {str(n): _cluster(w, str(n), s) for n, s in cm.items()}
    sweeps = top["sweeps"]
    if not isinstance(sweeps, list) or not sweeps:
        raise w.error("sweeps", "must be a non-empty list of blocks (workloads x clusters x max_staleness x seeds)")
    configs: dict[str, Configuration] = {}
    for i, block in enumerate(sweeps):
        kp = f"sweeps[{i}]"
        block = _mapping(w, block, kp)
        _known_keys(w, block, kp, SWEEP_KEYS)
        for key in ("workloads", "clusters"):
            if key not in block:
                raise w.error(f"{kp}.{key}", "is required")
        wl = _name_list(w, block["workloads"], f"{kp}.workloads")
        for j, n in enumerate(wl):
            if n not in workloads:
                raise w.error(f"{kp}.workloads[{j}]", f"unknown workload {n!r}; defined: {', '.join(workloads)}")
        cl = _name_list(w, block["clusters"], f"{kp}.clusters")
        for j, n in enumerate(cl):
            if n not in clusters:
                raise w.error(f"{kp}.clusters[{j}]", f"unknown cluster {n!r}; defined: {', '.join(clusters)}")
        ks = [_int(w, k, f"{kp}.max_staleness[{j}]", 0) for j, k in enumerate(_name_list(w, block.get("max_staleness", [0]), f"{kp}.max_staleness"))]
        seeds = [_int(w, s, f"{kp}.seeds[{j}]", 0) for j, s in enumerate(_name_list(w, block.get("seeds", [0]), f"{kp}.seeds"))]
        pols = _policies(w, block["policies"], f"{kp}.policies") if "policies" in block else policies
        if subject not in pols:
            raise w.error(f"{kp}.policies", f"must include the subject {subject!r}")
        for j, p in enumerate(pols):
            if p not in policies:
                raise w.error(f"{kp}.policies[{j}]", f"{p!r} is not in the grid's top-level policies")
        for wn in wl:
            for cn in cl:
                for k in ks:
                    in_class = tuple(p for p in pols if runs_in_class(p, k))
                    if not any(p in BASELINES for p in in_class):
                        raise w.error(f"{kp}.policies", f"no baseline runs in staleness class {k}")
                    for s in seeds:
                        c = Configuration(workloads[wn], clusters[cn], k, s, in_class, replay)
                        configs.setdefault(c.id, c)
    return Grid(path, name, subject, policies, tuple(configs.values()))


def load_grid(path: str) -> Grid:
    """Read and validate the grid file ``path`` (YAML; a missing file or bad YAML is one line)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the grid file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:  # a gzip, a trace, any binary file given as the grid
        kind = "a gzip file" if exc.object[:2] == b"\x1f\x8b" else "not UTF-8 text"
        raise UserError(f"{path}: byte {exc.start}: {kind}, not a YAML grid file (docs/simulator.md, 'Sweeps'; e.g. "
                        "experiments/grids/ci_small.yaml)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        raise UserError(f"{path}: {where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    return parse_grid(data, path)
