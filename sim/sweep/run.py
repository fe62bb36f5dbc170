"""Running a sweep: one task per configuration, in local processes or as Ray tasks.

Why a configuration (not a single replay) is the unit of work: every policy of a configuration
replays the same steps on the same cluster, so the task loads the trace and builds the cost
evaluator once and shares them across its policies; configurations are independent and seeded,
so the results do not depend on how many run at once, or where.

A policy that fails on a valid configuration (a plan that does not fit, a simulation error, any
exception) is recorded as a failed run with its error, never a crash of the sweep; a run whose
steps did not complete every trajectory exactly once is failed too (a policy that drops work
must not look fast). The driver stores each record in the cache the moment its task returns, so
an interrupted sweep keeps what it finished.

Ray stays an optional extra: ``ray`` is imported only inside ``execute_ray``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from typing import Any

from libra.errors import UserError
from sim.processes import InterruptiblePool
from sim.sweep.cache import code_key, workload_key
from sim.sweep.grid import Configuration, GeneratedWorkload, Grid, TraceWorkload

#: What a record says when a policy ran but lost or repeated trajectories.
INCOMPLETE = "IncompleteRun"
#: What a record says when the replay reports another staleness class than its configuration's.
WRONG_CLASS = "WrongStalenessClass"


@dataclass(frozen=True)
class Task:
    """One configuration's replays still to compute: ``runs`` pairs each policy with its hash."""

    config: Configuration
    runs: tuple[tuple[str, str], ...]
    trace_path: str  # the trace file the steps come from (generated ones under DIR/traces/)
    step_range: str | None
    code: str  # the driver's code key: a worker whose code differs says so instead of mixing results


def prepare_traces(grid: Grid, out_dir: str, configs: Sequence[Configuration] | None = None) -> dict[str, str]:
    """Generate each generated workload of ``configs`` once per hash into ``DIR/traces/`` (kept:
    a rerun reads the file) and return workload name -> trace path. Writes are atomic."""
    from libra.trace.workload import generate_steps, make_params, trace_header
    from libra.trace.workload.engine import to_trajectories
    from libra.trace.writer import write_trace

    tdir = os.path.join(out_dir, "traces")
    os.makedirs(tdir, exist_ok=True)
    paths: dict[str, str] = {}
    for c in configs if configs is not None else grid.configurations:
        wl = c.workload
        if wl.name in paths:
            continue
        src = wl.source
        if isinstance(src, TraceWorkload):
            paths[wl.name] = src.path
            continue
        assert isinstance(src, GeneratedWorkload)
        dest = os.path.join(tdir, f"{src.kind}-{workload_key(src)}.jsonl.gz")
        if not os.path.isfile(dest):
            params = make_params(src.kind, **dict(src.params))
            header = trace_header(params, src.steps, src.batch, src.group_size, src.seed)
            rows = (t for sa in generate_steps(params, src.steps, src.batch, src.group_size, src.seed) for t in to_trajectories(sa))
            tmp = os.path.join(tdir, f".tmp-{os.getpid()}-{os.path.basename(dest)}")
            write_trace(tmp, rows, header)
            os.replace(tmp, dest)
        paths[wl.name] = dest
    return paths


def _step_range(c: Configuration) -> str | None:
    return c.workload.source.steps if isinstance(c.workload.source, TraceWorkload) else None


def _failed(task: Task, policy: str, key: str, error: str, *, transient: bool = False) -> dict[str, Any]:
    return {"config": task.config.id, "policy": policy, "hash": key, "status": "failed", "error": error,
            "transient": transient, "code": task.code}


def _splits(steps: Any, n_gpus: int) -> str | None:
    """The rollout:training splits the steps ran, in order of first use ("16:48/28:36"; a
    time-shared step, rollout on all ``n_gpus``, as "64 colocated"), for a policy whose plan notes
    carry no fixed split (Libra re-plans every step)."""
    seen: list[str] = []
    for s in steps:
        key = f"{s.n_rollout_gpus} colocated" if s.n_rollout_gpus == n_gpus else f"{s.n_rollout_gpus}:{s.n_train_gpus}"
        if key not in seen:
            seen.append(key)
    return "/".join(seen) or None


def _result_record(task: Task, policy: str, key: str, res: Any, elapsed: float) -> dict[str, Any]:
    steps = res.steps
    bad = [s.step for s in steps if s.completed != s.n_traj]
    rec: dict[str, Any] = {
        "config": task.config.id, "policy": policy, "hash": key, "status": "ok", "error": None, "code": task.code,
        "mode": res.mode, "max_staleness": getattr(res, "max_staleness", task.config.max_staleness),
        "staleness": getattr(res, "staleness", None), "n_steps": len(steps),
        "mean_step_s": res.mean_step_s, "throughput_tok_s": res.throughput_tok_s, "trained_tok_s": res.trained_tok_s,
        "wall_s": res.wall_s, "completed": res.completed, "expected": res.expected, "all_completed": not bad,
        "mean_rollout_makespan_s": sum(s.rollout_makespan_s for s in steps) / len(steps) if steps else 0.0,
        "mean_train_s": sum(s.train_s for s in steps) / len(steps) if steps else 0.0,
        "split": res.notes.get("split") or _splits(steps, task.config.cluster.gpus), "rollout_tps": res.notes.get("rollout_tps"), "host_s": elapsed,
    }
    if bad:
        rec.update(status="failed", error=f"{INCOMPLETE}: steps {bad[:5]} did not complete every trajectory exactly once "
                                          f"({res.completed} of {res.expected} in all)")
    elif rec["max_staleness"] != task.config.max_staleness:  # compared outside its class: not a valid result
        rec.update(status="failed", error=f"{WRONG_CLASS}: the replay ran in staleness class {rec['max_staleness']}, "
                                          f"the configuration's is {task.config.max_staleness}")
    return rec


def run_task(task: Task, preloaded: tuple[Any, Any] | None = None) -> list[dict[str, Any]]:
    """Replay every policy of ``task`` on its configuration; one record per policy, never raises
    for a policy's failure. ``preloaded``: the (steps, header) of the trace (Ray ships them
    through its object store); else the task reads ``trace_path``."""
    from libra.cluster import ClusterSpec
    from libra.trace.limits import cluster_limits
    from sim.commands.common import node_size
    from sim.costs import load_costs
    from sim.loop import SimConfig
    from sim.replay import load_steps, replay_policy
    from sim.sweep.staleness import class_config

    mine = code_key()
    if mine != task.code:
        return [_failed(task, p, k, f"worker code key {mine} differs from the driver's {task.code}: install the same "
                                    "revision on every node", transient=True) for p, k in task.runs]
    c, cl = task.config, task.config.cluster
    try:
        steps, header = preloaded if preloaded is not None else load_steps(task.trace_path, task.step_range)
        limits, _ = cluster_limits(header, cl.max_context, task.trace_path)
        gpn = cl.gpus_per_node or node_size(cl.gpu)
        cluster = ClusterSpec(cl.gpus, cl.gpu, cl.model, gpn, max_train_gpus=cl.max_train_gpus, engine=cl.engine, **limits)
        costs = load_costs(cl.gpu, cl.model, gpn, engine=cl.engine)
        r = c.replay
        base = SimConfig(kl=r.kl, kv_mode=r.tool_kv, seed=c.seed, noise_sigma=r.noise, mini_batches=r.mini_batches,
                         streaming=r.streaming)
        config = class_config(base, c.max_staleness)
    except Exception as exc:  # the whole configuration cannot start: every policy of it failed
        return [_failed(task, p, k, f"{type(exc).__name__}: {exc}") for p, k in task.runs]
    out = []
    for policy, key in task.runs:
        t0 = time.perf_counter()
        try:
            res = replay_policy(steps, policy, cluster, config, costs=costs)
        except Exception as exc:  # a policy that cannot run this configuration is a reported failure
            out.append(_failed(task, policy, key, f"{type(exc).__name__}: {exc}"))
            continue
        out.append(_result_record(task, policy, key, res, time.perf_counter() - t0))
    return out


class Progress:
    """A rich progress bar on stderr when it is a terminal, else one line per finished task."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.total, self.done, self.quiet, self.bar, self.tid = total, 0, quiet, None, None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    TimeRemainingColumn(), console=Console(stderr=True), transient=False)

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
            self.tid = self.bar.add_task("configurations", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)  # type: ignore[arg-type]

    def advance(self, label: str, records: Sequence[dict[str, Any]]) -> None:
        self.done += 1
        failed = sum(r["status"] != "ok" for r in records)
        if self.bar is not None:
            self.bar.update(self.tid, advance=1, description=f"configurations (last: {label})")  # type: ignore[arg-type]
        elif not self.quiet:
            note = f", {failed} failed" if failed else ""
            print(f"[{self.done}/{self.total}] {label}: {len(records)} runs{note}", file=sys.stderr, flush=True)


Sink = Callable[[Task, list[dict[str, Any]]], None]


def execute_local(tasks: Sequence[Task], jobs: int, sink: Sink) -> None:
    """Run ``tasks`` in ``jobs`` processes (forked where the platform can, so workers share the
    imported code of this moment; ``jobs`` 1: in this process). ``sink`` gets each task's records
    as it finishes, in completion order. A worker that dies fails its task's runs (transient: not
    cached), the other tasks go on. On Ctrl-C the workers are terminated without waiting and
    ``KeyboardInterrupt`` propagates (what ``sink`` got is kept)."""
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            sink(t, run_task(t))
        return
    # import what a replay runs before the fork, so every worker runs the code of this moment
    # (the code key's) even if the files change while the sweep runs
    import libra.trace.limits  # noqa: F401
    import sim.commands.plan  # noqa: F401
    import sim.replay  # noqa: F401
    import libra.policies  # noqa: F401

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    # Ctrl-C: the workers are terminated at once (sim.processes) and KeyboardInterrupt reaches the
    # command, which writes what finished; every finished task is already in the cache (sink)
    with InterruptiblePool(min(jobs, len(tasks)), ctx) as pool:
        futures: dict[Future[list[dict[str, Any]]], Task] = dict(zip(pool.submit_all(run_task, tasks), tasks))
        for f in as_completed(futures):
            t = futures[f]
            try:
                recs = f.result()
            except Exception as exc:  # the worker process died (memory, a signal): report, go on
                recs = [_failed(t, p, k, f"worker failed: {type(exc).__name__}: {exc}", transient=True) for p, k in t.runs]
            sink(t, recs)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs ray, which is not installed: install the [run] extra (pip install 'libra-rl[run]')") from None
    return ray


def execute_ray(tasks: Sequence[Task], address: str, sink: Sink) -> None:
    """Send each task to the existing Ray cluster at ``address`` (``auto``: the local one) as one
    Ray task of one CPU. The driver loads each trace once and ships its steps through the object
    store, so the workers need the package (the same revision: the code key is checked) but not
    the driver's files."""
    from sim.replay import load_steps

    ray = _import_ray()
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except Exception as exc:  # no cluster there, a bad address
        raise UserError(f"--ray {address}: cannot connect to a Ray cluster ({type(exc).__name__}: {exc})") from None
    remote = ray.remote(num_cpus=1)(run_task)
    refs: dict[tuple[str, str | None], Any] = {}
    pending: dict[Any, Task] = {}
    for t in tasks:
        k = (t.trace_path, t.step_range)
        if k not in refs:
            refs[k] = ray.put(load_steps(t.trace_path, t.step_range))
        pending[remote.remote(t, refs[k])] = t
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            t = pending.pop(ref)
            try:
                recs = ray.get(ref)
            except Exception as exc:  # the Ray task itself failed (node lost, worker died)
                recs = [_failed(t, p, k, f"ray task failed: {type(exc).__name__}: {exc}", transient=True) for p, k in t.runs]
            sink(t, recs)


def default_jobs() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def make_tasks(configs: Sequence[Configuration], todo: dict[str, list[tuple[str, str]]], traces: dict[str, str],
               code: str) -> list[Task]:
    """A task per configuration with runs still to compute (``todo``: config id -> (policy, hash))."""
    return [Task(c, tuple(todo[c.id]), traces[c.workload.name], _step_range(c), code) for c in configs if todo.get(c.id)]
