"""``libra-sim sweep``: replay a grid of workloads x clusters x policies x staleness classes.

The grid file is validated completely before anything runs (bad input: one line naming the file,
key path and rule; exit 2). Runs already in ``DIR/cache/`` (same configuration hash) are not
computed again. Exit status 0 when every run succeeded, 1 when some failed (they are listed in
``DIR/summary.md``; a loss of the subject is a result, not a failure). Ctrl-C stops the workers
at once and writes the configurations that finished, marked INCOMPLETE (exit 130); every finished
run is already in the cache, so the same command picks up where it stopped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from sim.commands.common import positive_int as _positive_int

NAME = "sweep"
HELP = "replay a grid of workloads x clusters x policies x staleness classes (cached, parallel, summarized)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("grid", metavar="GRID.yaml", help="the grid file (docs/simulator.md, 'Sweeps'; e.g. experiments/grids/ci_small.yaml)")
    p.add_argument("--out", required=True, metavar="DIR", help="results.csv, results.json, summary.md, cache/ and traces/ go here")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="configurations replayed in parallel processes (default: the CPU cores; 1 = in this process)")
    p.add_argument("--ray", default=None, metavar="ADDRESS|auto|local",
                   help="send each configuration as a Ray task to the Ray cluster at ADDRESS (auto: the running one; local: a "
                        "fresh one on this machine; needs the [run] extra)")
    p.add_argument("--dry-run", action="store_true", help="validate, count configurations and cached runs, run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _code_root() -> str:
    """The folder the replayed code was imported from (``sim``'s parent): where the commit is read."""
    import sim

    return os.path.dirname(os.path.dirname(os.path.abspath(sim.__file__)))


def _git(*args: str) -> str | None:
    root = _code_root()
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _config_row(c: Any, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from sim.sweep.staleness import class_name

    cl = c.cluster
    return {"config": c.id, "workload": c.workload.name, "workload_spec": c.workload.source.describe(), "cluster": cl.name,
            "cluster_spec": cl.describe(), "gpus": cl.gpus, "gpu": cl.gpu, "model": cl.model, "engine": cl.engine,
            "max_staleness": c.max_staleness, "class": class_name(c.max_staleness), "seed": c.seed, "runs": runs}


def run(args: argparse.Namespace) -> int:
    from libra.paths import check_output_dir
    from sim.sweep.cache import ResultCache, code_key, run_key
    from sim.sweep.grid import load_grid
    from sim.sweep.run import Progress, default_jobs, execute_local, execute_ray, make_tasks, prepare_traces, _import_ray
    from sim.sweep.summary import write_outputs

    check_output_dir(args.out, "--out")
    grid = load_grid(args.grid)  # every rule checked before anything runs
    if args.ray is not None:
        _import_ray()  # a missing extra is one line now, not after the traces are generated
    code = code_key()
    cache = ResultCache(args.out)
    records: dict[tuple[str, str], dict[str, Any]] = {}
    todo: dict[str, list[tuple[str, str]]] = {}
    for c in grid.configurations:
        for p in c.policies:
            key = run_key(c, p, code)
            rec = cache.get(key)
            if rec is not None:
                records[(c.id, p)] = dict(rec, cached=True)
            else:
                todo.setdefault(c.id, []).append((p, key))
    n_runs = sum(len(c.policies) for c in grid.configurations)
    n_todo = sum(len(v) for v in todo.values())
    print(f"sweep {grid.name}: {len(grid.configurations)} configurations, {n_runs} runs, {n_runs - n_todo} cached, "
          f"{n_todo} to compute (code key {code})", file=sys.stderr)
    if args.dry_run:
        for c in grid.configurations:
            print(f"{c.id}: {', '.join(c.policies)}" + (f" ({len(todo[c.id])} to compute)" if c.id in todo else " (cached)"))
        return 0
    t0 = time.perf_counter()
    to_run = [c for c in grid.configurations if c.id in todo]
    traces = prepare_traces(grid, args.out, to_run)
    tasks = make_tasks(to_run, todo, traces, code)

    interrupted = False
    try:
        with Progress(len(tasks), quiet=args.quiet) as prog:
            def sink(task: Any, recs: list[dict[str, Any]]) -> None:
                for r in recs:
                    if not r.get("transient"):
                        cache.put(r["hash"], r)  # at once: an interrupted sweep keeps every finished run
                    records[(task.config.id, r["policy"])] = dict(r, cached=False)
                prog.advance(task.config.id, recs)

            if args.ray is not None:
                execute_ray(tasks, args.ray, sink)
            else:
                execute_local(tasks, args.jobs or default_jobs(), sink)
    except KeyboardInterrupt:
        interrupted = True
    whole = [c for c in grid.configurations if all((c.id, p) in records for p in c.policies)]
    configs = [_config_row(c, {p: records[(c.id, p)] for p in c.policies}) for c in whole]
    computed = sum(not r.get("cached") for r in records.values())
    if interrupted:
        left = n_runs - sum(len(c.policies) for c in whole)
        print(f"libra-sim: interrupted: {len(whole)} of {len(grid.configurations)} configurations finished; their results "
              f"are written (INCOMPLETE) and every finished run is cached in {os.path.join(args.out, 'cache')}; rerun the "
              f"same command for the {left} runs left", file=sys.stderr)
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    meta = {"grid": args.grid, "grid_name": grid.name, "code_key": code, "code_root": _code_root(), "commit": _git("rev-parse", "HEAD"),
            "dirty": bool(dirty), "subject": grid.subject, "baselines": list(grid.baselines), "computed_runs": computed,
            "cached_runs": n_runs - n_todo, "wall_s": round(time.perf_counter() - t0, 1),
            "executor": f"ray {args.ray}" if args.ray is not None else f"local, {args.jobs or default_jobs()} jobs"}
    if interrupted:
        meta["incomplete"] = f"{len(whole)} of {len(grid.configurations)} configurations finished"
    comps, tot = write_outputs(args.out, meta, configs, grid.policies, grid.subject, grid.baselines)
    o = tot.outcomes
    worst = f"{tot.worst_ratio:.3f} ({tot.worst_config})" if tot.worst_ratio is not None else "n/a"
    print(f"SIMULATED {grid.subject} vs best baseline of its class over {len(comps)} configurations: {o['win']} wins, "
          f"{o['tie']} ties, {o['loss']} losses, {o['subject-failed']} {grid.subject} failed, {o['no-baseline']} without a "
          f"baseline; worst ratio {worst}; {tot.failed_runs} of {tot.runs} runs failed; computed {computed} runs in "
          f"{meta['wall_s']} s")
    print(f"wrote {', '.join(os.path.join(args.out, f) for f in ('results.csv', 'results.json', 'summary.md'))}"
          + (" (INCOMPLETE: interrupted)" if interrupted else ""))
    if interrupted:
        return 130
    return 1 if tot.failed_runs else 0
