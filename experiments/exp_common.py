"""What every experiment script shares: sizes, the cached replay runner, sections, figures.

Why one module: ``experiments/run_all.py`` regenerates every result with one command while other
people change the planner, so nothing here may hold a number. Each experiment is a module with
``NAME``, ``TITLE``, ``inputs(size) -> dict`` (what defines its result, JSON) and
``run(ctx) -> Section`` (computes, writes CSV + PNG under ``ctx.dir``, returns the markdown).
The expensive part, replays, is cached per replay (``replays``): a replay's key hashes its
specification, the trace file's bytes and the sweep's code key (``sim.sweep.cache.code_key``:
the sources of ``cost_models``, ``libra`` and ``sim`` and the bundled cost-model data), so a
planner change recomputes every replay and a plotting change recomputes none. Experiments that
need several policies on one workload share replays through this cache (the end-to-end
comparison, the waterfall and the C-MLFQ ablation replay the same specifications).

Every number these scripts produce is SIMULATED (the discrete-event simulator over the fitted
cost model with seeded noise) or PREDICTED by the cost model; figures say so in their titles and
axes (``finish_figure`` refuses a figure that does not).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SIZES: tuple[str, ...] = ("smoke", "quick", "full")
SIMULATED = "SIMULATED"
#: The sentence every section opens with.
SIMULATED_NOTE = ("**SIMULATED.** Every number here comes from the discrete-event simulator (`sim/`) over the fitted "
                  "cost model with 3% seeded ground-truth noise, or is a cost-model prediction; none is a GPU measurement.")
#: The three bundled traces with the model each was made for (traces/README.md) and the paper's cluster.
BUNDLED: tuple[tuple[str, str, str], ...] = (
    ("swe", "swe-qwen3-14b.jsonl.gz", "qwen3-14b"),
    ("search", "search-r1.jsonl.gz", "qwen3-8b"),
    ("math", "math-tool.jsonl.gz", "qwen3-32b"),
)


# ---- sections -------------------------------------------------------------------------------
@dataclass
class Figure:
    """One PNG of a section: ``file`` relative to the section's folder, ``caption`` what it means."""

    file: str
    title: str
    caption: str


@dataclass
class Section:
    """An experiment's result as ``docs/results.md`` shows it. ``body`` is markdown generated
    from the experiment's CSV; ``data`` holds what other parts reuse (the README's headline)."""

    name: str
    title: str
    intro: str
    figures: list[Figure] = field(default_factory=list)
    body: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    csv: list[str] = field(default_factory=list)

    def markdown(self, link_prefix: str = "") -> str:
        """The section as markdown; figure and CSV links get ``link_prefix`` (the path from the
        document to the section's folder, ending in '/', or '' when the document sits there)."""
        out = [f"## {self.title}", "", SIMULATED_NOTE, "", self.intro.strip(), ""]
        for f in self.figures:
            out += [f"![{f.title}]({link_prefix}{f.file})", "", f"*{f.title}.* {f.caption.strip()}", ""]
        if self.body.strip():
            out += [self.body.strip(), ""]
        if self.csv:
            out += ["Data: " + ", ".join(f"[`{c}`]({link_prefix}{c})" for c in self.csv), ""]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Section:
        figs = [Figure(**f) for f in d.get("figures", [])]
        return Section(d["name"], d["title"], d["intro"], figs, d.get("body", ""), dict(d.get("data", {})), list(d.get("csv", [])))


@dataclass
class Context:
    """Where an experiment writes (``dir``), the shared cache (``cache``), its size and jobs."""

    out: Path
    name: str
    size: str
    jobs: int = 1

    @property
    def dir(self) -> Path:
        d = self.out / self.name
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def cache(self) -> Path:
        d = self.out / ".cache"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def pick(self, smoke: Any, quick: Any, full: Any) -> Any:
        """The setting for this context's size."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.size]


def pick(size: str, smoke: Any, quick: Any, full: Any) -> Any:
    """The setting for ``size`` (``inputs`` functions use it; ``Context.pick`` is the same)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return {"smoke": smoke, "quick": quick, "full": full}[size]


# ---- files ----------------------------------------------------------------------------------
def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> None:
    """``rows`` as CSV (the union of their keys in first-seen order unless ``columns``)."""
    if columns is None:
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        columns = cols
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes: the sweep cache's own (``sim.sweep.cache.sha256_file``)."""
    from sim.sweep.cache import sha256_file as sha

    return sha(path)


def digest(obj: Any) -> str:
    """A stable hash of a JSON-able object (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def code_key() -> str:
    """The sweep's code key: what a replay's numbers depend on (``sim.sweep.cache.code_key``)."""
    from sim.sweep.cache import code_key as ck

    return ck()


# ---- figures --------------------------------------------------------------------------------
def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only; no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_figure(fig: Any, path: Path, title: str) -> None:
    """Title the figure, check that the title and every labelled y axis say SIMULATED, save it
    as PNG and close it. Why a check: these figures
    travel without their captions; a reader must never mistake them for measurements."""
    plt = pyplot()
    if SIMULATED not in title:
        raise ValueError(f"figure title must say {SIMULATED}: {title!r}")
    fig.suptitle(title, fontsize=10)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.has_data():
            continue
        label = ax.get_ylabel()
        if label and SIMULATED not in label:
            raise ValueError(f"y axis {label!r} of {path.name} must say {SIMULATED}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- generated workloads ---------------------------------------------------------------------
def generated_trace(cache: Path, kind: str, steps: int, batch: int, group_size: int, seed: int = 0, **params: Any) -> str:
    """The trace the synthetic generator makes for these arguments (``libra-sim gen``), written
    once per content hash under ``cache/traces/`` (as ``libra-sim sweep`` stores its own)."""
    from libra.trace.workload import generate_steps, make_params, trace_header
    from libra.trace.workload.engine import to_trajectories
    from libra.trace.writer import write_trace
    from sim.sweep.cache import workload_key
    from sim.sweep.grid import GeneratedWorkload

    src = GeneratedWorkload(kind, steps, batch, group_size, seed, tuple(sorted(params.items())))
    tdir = cache / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    dest = tdir / f"{kind}-{workload_key(src)}.jsonl.gz"
    if not dest.is_file():
        p = make_params(kind, **params)
        header = trace_header(p, steps, batch, group_size, seed)
        rows = (t for sa in generate_steps(p, steps, batch, group_size, seed) for t in to_trajectories(sa))
        tmp = tdir / f".tmp-{os.getpid()}-{dest.name}"
        write_trace(str(tmp), rows, header)
        os.replace(tmp, dest)
    return str(dest)


# ---- cached replays --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplaySpec:
    """One replay: a trace (and step range) under one policy on one cluster, in staleness class
    ``max_staleness``. ``opts``: ``PolicyOptions`` pins as sorted (name, value) pairs
    (e.g. ``(("join", "sync"),)``). The cluster reads the trace's declared limits and the GPU's
    node size exactly as ``libra-sim replay`` does."""

    trace: str
    steps: str | None
    gpus: int
    gpu: str
    model: str
    policy: str
    max_staleness: int = 0
    engine: str | None = None
    seed: int = 0
    noise: float = 0.03
    opts: tuple[tuple[str, Any], ...] = ()

    def identity(self, code: str) -> dict[str, Any]:
        d = asdict(self)
        d["trace"] = {"sha256": _trace_sha(self.trace)}
        return {"schema": 1, "code": code, "spec": d}

    def key(self, code: str) -> str:
        return digest(self.identity(code))[:24]

    def label(self) -> str:
        o = "".join(f" {k}={v}" for k, v in self.opts)
        return f"{os.path.basename(self.trace)}[{self.steps or 'all'}] {self.gpus}x{self.gpu} {self.model} {self.policy} K={self.max_staleness}{o}"


def _trace_sha(path: str) -> str:
    """A trace's sha256, memoized per process (the sweep cache's ``file_sha256``)."""
    from sim.sweep.cache import file_sha256

    return file_sha256(path)


_STEP_FIELDS = ("step", "n_traj", "completed", "step_s", "step_end_s", "rollout_start_s", "rollout_makespan_s", "lower_bound_s",
                "critical_path_s", "work_bound_s", "train_s", "join_pause_s", "sync_s", "switch_s", "gen_tokens",
                "trained_tokens", "gen_tok_s", "trained_tok_s", "mean_reward", "n_rollout_gpus", "n_train_gpus", "rollout_tps",
                "migrations", "migrations_refused", "role_changes", "train_joins", "predicted_step_s", "predicted_rollout_s",
                "mode", "staleness", "idle_gpu_s_rollout", "idle_gpu_s_train")


def run_replay(spec: ReplaySpec, loaded: tuple[Any, Any] | None = None, costs: Any = None) -> dict[str, Any]:
    """Replay ``spec`` now; a record with ``status`` ok or failed (never raises for a policy's
    failure: a plan that does not fit is a result to report). ``loaded``: the trace's
    (steps, header) already read; ``costs``: the cluster's ``SimCosts`` already built."""
    from libra.cluster import ClusterSpec
    from libra.trace.limits import cluster_limits
    from sim.commands.common import node_size
    from sim.costs import load_costs
    from sim.loop import SimConfig
    from sim.replay import load_steps, replay_policy

    t0 = time.process_time()
    try:
        steps, header = loaded if loaded is not None else load_steps(spec.trace, spec.steps)
        limits, _ = cluster_limits(header, None, spec.trace)
        gpn = node_size(spec.gpu)
        cluster = ClusterSpec(spec.gpus, spec.gpu, spec.model, gpn, engine=spec.engine, **limits)
        costs = costs if costs is not None else load_costs(spec.gpu, spec.model, gpn, engine=spec.engine)
        opts = dict(spec.opts)
        hook = POOL_HOOKS[opts.pop("pool")] if "pool" in opts else None
        config = SimConfig(max_staleness=spec.max_staleness, seed=spec.seed, noise_sigma=spec.noise)
        with _policy_hook(hook):
            res = replay_policy(steps, spec.policy, cluster, config, costs=costs, **opts)
    except Exception as exc:  # reported, not raised: a sweep of experiments must go on
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "spec": asdict(spec), "host_s": time.process_time() - t0}
    rows = [{k: s.row()[k] for k in _STEP_FIELDS if k in s.row()} for s in res.steps]
    for r in rows:
        r["makespan_over_bound"] = r["rollout_makespan_s"] / r["lower_bound_s"] if r["lower_bound_s"] > 0 else float("nan")
    complete = all(s.completed == s.n_traj for s in res.steps)
    return {
        "status": "ok" if complete else "failed",
        "error": None if complete else "IncompleteRun: a step did not complete every trajectory",
        "spec": asdict(spec), "mode": res.mode, "max_staleness": res.max_staleness, "n_steps": len(res.steps),
        "throughput_tok_s": res.throughput_tok_s, "trained_tok_s": res.trained_tok_s, "mean_step_s": res.mean_step_s,
        "wall_s": res.wall_s, "completed": res.completed, "expected": res.expected,
        "split": ("" if not res.steps else f"{spec.gpus} coloc" if res.notes.get("colocated")
                  else f"{res.steps[-1].n_rollout_gpus}:{res.steps[-1].n_train_gpus}"),
        "rollout_tps": res.steps[-1].rollout_tps if res.steps else "",
        "colocated": bool(res.notes.get("colocated", False)), "sees_future": bool(res.notes.get("sees_future", False)),
        "steps": rows, "host_s": time.process_time() - t0,
    }


def eager_pool(policy: Any) -> Any:
    """The policy with its elastic pool made eager: lend an idle rollout instance after 0.05 s
    and whenever the tail is longer than nothing (``grace_s=0.05``, ``payoff_factor=0``; what
    ``libra-run --pool-grace-s 0.05 --pool-payoff-factor 0`` does). A what-if, not Libra's
    policy: it exists to measure what a join costs when loans happen (the default pool declines
    every loan on the bundled traces)."""
    make = policy.pool

    def pool(plan: Any) -> Any:
        p = make(plan)
        if p is not None:
            p.grace_s, p.payoff_factor = 0.05, 0.0
        return p

    policy.pool = pool
    return policy


#: Pool variants a ``ReplaySpec`` may ask for with ``opts`` ``("pool", NAME)``.
POOL_HOOKS: dict[str, Callable[[Any], Any]] = {"eager": eager_pool}


class _policy_hook:
    """Within the block, ``sim.replay`` builds policies through ``hook`` (None: unchanged). Why
    here: the what-if variants are the experiments' own, so the simulator stays untouched."""

    def __init__(self, hook: Callable[[Any], Any] | None) -> None:
        self.hook = hook
        self.saved: Any = None

    def __enter__(self) -> None:
        if self.hook is None:
            return
        import sim.replay as R

        self.saved = R.resolve
        hook, orig = self.hook, R.resolve
        R.resolve = lambda *a, **kw: hook(orig(*a, **kw))  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            import sim.replay as R

            R.resolve = self.saved  # type: ignore[assignment]


def run_group(items: Sequence[tuple[str, ReplaySpec]]) -> list[tuple[str, dict[str, Any]]]:
    """Replay specs that share a trace and step range: the trace is read once and each
    cluster's cost tables built once (why groups: reading a bundled trace costs about as much
    as replaying a step of it)."""
    from sim.commands.common import node_size
    from sim.costs import load_costs
    from sim.replay import load_steps

    s0 = items[0][1]
    try:
        loaded: tuple[Any, Any] | None = load_steps(s0.trace, s0.steps)
    except Exception:  # every spec then reports the reading error itself
        loaded = None
    costs: dict[tuple[str, str, str | None], Any] = {}
    out = []
    for key, spec in items:
        ck = (spec.gpu, spec.model, spec.engine)
        if ck not in costs:
            try:
                costs[ck] = load_costs(spec.gpu, spec.model, node_size(spec.gpu), engine=spec.engine)
            except Exception:
                costs[ck] = None
        out.append((key, run_replay(spec, loaded, costs[ck])))
    return out


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def replays(ctx: Context, specs: Sequence[ReplaySpec], progress: bool = True) -> list[dict[str, Any]]:
    """The records of ``specs`` in order: from ``ctx.cache/replays/<key>.json`` where present,
    else replayed in ``ctx.jobs`` forked processes and stored (atomically, as each returns)."""
    code = code_key()
    rdir = ctx.cache / "replays"
    rdir.mkdir(parents=True, exist_ok=True)
    keys = [s.key(code) for s in specs]
    out: dict[str, dict[str, Any]] = {}
    todo: dict[str, ReplaySpec] = {}
    for s, k in zip(specs, keys):
        rec = _load(rdir / f"{k}.json")
        if rec is not None:
            out[k] = dict(rec, cached=True)
        else:
            todo.setdefault(k, s)
    if todo and progress:
        print(f"  [{ctx.name}] {len(todo)} replays to compute, {len(set(keys)) - len(todo)} cached", file=sys.stderr, flush=True)

    def store(k: str, rec: dict[str, Any]) -> None:
        atomic_write(rdir / f"{k}.json", json.dumps(rec, sort_keys=True, default=str))
        out[k] = dict(rec, cached=False)
        if progress:
            tag = "" if rec["status"] == "ok" else f" FAILED: {rec['error']}"
            print(f"  [{ctx.name}] {todo[k].label()}: {rec['host_s']:.1f} CPU s{tag}", file=sys.stderr, flush=True)

    groups: dict[tuple[str, str | None], list[tuple[str, ReplaySpec]]] = {}
    for k, s in todo.items():
        groups.setdefault((s.trace, s.steps), []).append((k, s))
    tasks = list(groups.values())
    if ctx.jobs > 1 and len(tasks) < ctx.jobs:  # too few traces to keep every process busy: split them
        n = ctx.jobs
        tasks = [g[i::n] for g in tasks for i in range(n) if g[i::n]]
    if ctx.jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            for k, rec in run_group(t):
                store(k, rec)
    else:
        import sim.replay  # noqa: F401  (imported before the fork: every worker runs this moment's code)
        import libra.policies  # noqa: F401
        from concurrent.futures import as_completed

        mp = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        # the longest first (hindsight baselines, many replays), so the pool's tail is short
        tasks.sort(key=lambda t: -sum(10 if s.policy == "areal-static-optimal" else 1 for _, s in t))
        with ProcessPoolExecutor(min(ctx.jobs, len(tasks)), mp_context=mp) as pool:
            futs = [pool.submit(run_group, t) for t in tasks]
            for f in as_completed(futs):
                for k, rec in f.result():
                    store(k, rec)
    return [out[k] for k in keys]


def ok(rec: Mapping[str, Any] | None) -> bool:
    """Whether a replay record is a successful run with a positive throughput."""
    return rec is not None and rec.get("status") == "ok" and float(rec.get("throughput_tok_s") or 0) > 0


# ---- experiments as sweep grids ---------------------------------------------------------------
def sweep_grid(ctx: Context, name: str, grid: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, str]]:
    """Run ``grid`` (a ``libra-sim sweep`` grid as a mapping; trace paths absolute) with the sweep
    command itself: the file goes to ``<cache>/grids/<name>.yaml`` and the sweep's output and cache
    to ``<cache>/sweeps/<name>/``, so a rerun replays only what changed and the same file runs on
    a Ray cluster (``libra-sim sweep FILE --out DIR --ray ADDRESS``). Returns the rows of its
    ``results.csv`` by (configuration id, policy). Why a sweep where the records suffice: one
    cache, one way to run, the grid a user can read and rerun."""
    import yaml

    from sim.commands import sweep as S

    gdir = ctx.cache / "grids"
    gdir.mkdir(parents=True, exist_ok=True)
    path = gdir / f"{name}.yaml"
    atomic_write(path, "# written by experiments/exp_common.sweep_grid; rerun with libra-sim sweep THIS --out DIR\n"
                 + yaml.safe_dump(dict(grid), sort_keys=False))
    out = ctx.cache / "sweeps" / name
    out.mkdir(parents=True, exist_ok=True)
    ap = argparse.ArgumentParser()
    S.add_arguments(ap)  # the command's own flags and defaults: the same run as typing it
    S.run(ap.parse_args([str(path), "--out", str(out), "--jobs", str(max(1, ctx.jobs)), "--quiet"]))
    return {(r["config"], r["policy"]): r for r in read_csv(out / "results.csv")}


def sweep_value(row: Mapping[str, str] | None, key: str) -> float:
    """A numeric field of a sweep row; NaN when the run failed or the field is empty."""
    if row is None or row.get("status") != "ok" or not row.get(key):
        return float("nan")
    return float(row[key])


# ---- numbers in text -------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float:
    """``a / b``, NaN when either is missing or ``b`` is not positive."""
    if a is None or b is None or not (b > 0) or not math.isfinite(a):
        return float("nan")
    return a / b


def fx(v: float, digits: int = 2) -> str:
    """A ratio as text (``1.04x``; ``n/a`` for NaN)."""
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}x"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(x) for x in r) + " |")
    return "\n".join(lines)


# ---- one experiment as a script ---------------------------------------------------------------
def save_section(ctx: Context, section: Section) -> None:
    """``section.json`` (what run_all composes) and ``summary.md`` (links relative to the folder)."""
    atomic_write(ctx.dir / "section.json", json.dumps(section.to_json(), indent=1, default=str))
    atomic_write(ctx.dir / "summary.md", section.markdown())


def script_main(name: str, run: Callable[[Context], Section], doc: str | None, argv: Sequence[str] | None = None) -> int:
    """``python experiments/<name>.py [--size quick] [--out experiments/results] [--jobs N]``: one
    experiment alone (no stamp check: run_all decides what is cached)."""
    ap = argparse.ArgumentParser(description=(doc or name).split("\n\n")[0])
    ap.add_argument("--size", choices=SIZES, default="quick")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    ctx = Context(Path(a.out), name, a.size, a.jobs)
    section = run(ctx)
    save_section(ctx, section)
    print(section.markdown())
    return 0
