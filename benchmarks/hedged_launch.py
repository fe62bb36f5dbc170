"""Planning time of a hedged launch: the first plan of a run whose workload kind nobody declared.

An undeclared kind's first step is planned over every prior scenario (``Planner.hedged_search``):
the loop class by worst-case regret, since session 30 the async split by mean log-regret over the
scenarios searched again with the async loop pinned (``Planner._class_runs``), and the launch
layout. It runs once per run, before the first rollout, so its cost is start-up latency, not
per-step overhead. Reports, per cluster, the CPU seconds of one cold ``Planner.plan`` (a fresh
planner; median of ``--repeat``) and the split it launches.

    .venv/bin/python benchmarks/hedged_launch.py [--repeat 3] [--staleness 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

CLUSTERS = ((28, "h100", "qwen3-14b"), (44, "b200", "qwen3-32b"), (84, "h200", "llama-3.1-70b"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--staleness", type=int, default=1)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    from libra.cluster import ClusterSpec
    from libra.planner.costs import make_evaluator
    from libra.planner.search import Planner, SearchOptions
    from libra.planner.stats import clear_prior_digests

    prompts = np.full(256, 300, np.int64)  # 256 short task statements, no kind declared
    print(f"hedged launch plan (workload: agent, K={args.staleness}, 256 prompts of 300 tokens), one core")
    print(f"{'cluster':>28} {'cpu s':>7} {'(wall)':>7}  launch split R:T")
    for n, gpu, model in CLUSTERS:
        cluster = ClusterSpec(n, gpu, model, workload="agent")
        ev = make_evaluator(cluster)
        cpu, wall = [], []
        for _ in range(args.repeat):
            planner = Planner(cluster, ev, SearchOptions(max_staleness=args.staleness, mini_batches=4, run_steps=5))
            clear_prior_digests()  # cold: no prior digest kept from the last repeat
            t0, c0 = time.perf_counter(), time.process_time()
            plan = planner.plan([], prompts)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
        name = f"{n} x {gpu} {model}"
        print(f"{name:>28} {statistics.median(cpu):7.2f} {statistics.median(wall):7.2f}  {plan.n_rollout_gpus}:{plan.n_train_gpus}")


if __name__ == "__main__":
    main()
