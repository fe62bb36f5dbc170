"""Planner search time versus cluster size, on one core.

For each cluster size (8, 48, 256, 1024, 4096 GPUs of 8-GPU A800 nodes, Qwen3-14B) it plans step
3 of the bundled SWE trace from steps 0-2 (or, without the trace, from the default length prior),
with the upcoming step's trajectory count scaled as ``max(512, 4 x GPUs)``. It reports the cold
search (a fresh ``Planner``: empty memo tables; the cost evaluator's own caches warm, as in a run)
as the median of ``--repeat`` runs in CPU time of this process (``time.process_time``: robust to
other processes sharing the core; wall time alongside), the warm search (same statistics again: memo hits), how many
splits were evaluated or cut by the bound, and the chosen plan.

Targets (issue 5): <= 100 ms at 48 GPUs, <= 1 s at 1024 GPUs.

    .venv/bin/python benchmarks/planner_search.py [--repeat 3] [--sizes 8,48,256,1024,4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="8,48,256,1024,4096")
    ap.add_argument("--mode", choices=("sync", "async"), default="sync")
    ap.add_argument("--trace", default=str(Path(__file__).resolve().parents[1] / "traces" / "swe-qwen3-14b.jsonl.gz"))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    from cost_models import CostEvaluator
    from libra.cluster import ClusterSpec
    from libra.planner.search import Planner, SearchOptions

    ev = CostEvaluator(gpu="a800", model="qwen3-14b")
    if Path(args.trace).exists():
        from libra.trace.reader import open_trace

        steps = list(open_trace(args.trace).steps())
        history, prompts, source = steps[:3], steps[3].prompt_tokens, Path(args.trace).name + " steps 0-2"
    else:
        history, prompts, source = [], np.full(512, 1024), "default length prior"
    print(f"planner search, qwen3-14b on a800 (8/node), {args.mode} mode, history: {source}, one core")
    header = f"{'GPUs':>6} {'traj':>6} {'cold ms':>9} {'(wall)':>8} {'warm ms':>9} {'splits':>7} {'cut':>5} {'tree walks':>10}  plan (rollout/train, train TP/PP/DP/ZeRO, buckets TPxcount)  predicted step s"
    print(header)
    print("-" * len(header))
    for n in (int(x) for x in args.sizes.split(",")):
        cluster = ClusterSpec(n, "a800", "qwen3-14b")
        k = max(len(prompts), 4 * n)
        p = np.resize(prompts, k)
        cold = []
        for _ in range(args.repeat):
            planner = Planner(cluster, ev, SearchOptions(mode=args.mode, max_staleness=1 if args.mode == "async" else 0))
            t0, c0 = time.perf_counter(), time.process_time()
            res = planner.search(history, p)
            cold.append((time.process_time() - c0, time.perf_counter() - t0))
        c0 = time.process_time()
        planner.search(history, p)
        warm = time.process_time() - c0
        b = res.best
        buckets = "+".join(f"TP{t}x{m}" for t, m in zip(b.rollout.layout.tps, b.rollout.counts))
        t = b.train
        print(
            f"{n:>6} {k:>6} {1e3 * statistics.median(c for c, _ in cold):>9.1f} {1e3 * statistics.median(w for _, w in cold):>8.1f} {1e3 * warm:>9.1f} {len(res.candidates):>7} {res.skipped:>5} "
            f"{planner.tree.misses:>10}  {'time-shared' if b.colocated else f'{n - b.n_train}/{b.n_train}'}, {t.tp}/{t.pp}/{t.dp}/Z{t.zero_stage}, {buckets}  {b.step_s:.1f}"
        )


if __name__ == "__main__":
    main()
