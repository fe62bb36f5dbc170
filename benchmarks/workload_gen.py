"""Speed of the synthetic workload generator (columnar path) and of writing its output.

    .venv/bin/python benchmarks/workload_gen.py [--n 1000000] [--batch 512] [--write 20000]

For each workload: generate ``--n`` trajectories as ``StepArrays`` (what the simulator and the
planner consume) and print trajectories/s and turns/s; then write ``--write`` of them through the
trace writer (row form + JSON + gzip), which is the slow part of ``libra-sim gen``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from libra.trace.writer import write_trace
from libra.trace.workload import WORKLOADS, generate, generate_steps, make_params, trace_header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="trajectories to generate per workload")
    ap.add_argument("--batch", type=int, default=512, help="trajectories per step")
    ap.add_argument("--write", type=int, default=20_000, help="trajectories to write per workload")
    args = ap.parse_args()
    steps = max(1, args.n // args.batch)
    print(f"{'workload':8s} {'trajectories':>12s} {'turns':>11s} {'gen s':>7s} {'traj/s':>10s} "
          f"{'write traj/s':>12s} {'bytes/traj':>10s}")
    for name in WORKLOADS:
        t0 = time.perf_counter()
        n = turns = 0
        for sa in generate_steps(name, steps, args.batch, 8, 0):
            n += sa.n
            turns += len(sa.gen_tokens)
        dt = time.perf_counter() - t0
        wsteps = max(1, args.write // args.batch)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl.gz")
            t1 = time.perf_counter()
            written = write_trace(path, generate(name, wsteps, args.batch, 8, 0),
                                  trace_header(make_params(name), wsteps, args.batch, 8, 0))
            wdt = time.perf_counter() - t1
            size = os.path.getsize(path)
        print(f"{name:8s} {n:12,d} {turns:11,d} {dt:7.2f} {n / dt:10,.0f} {written / wdt:12,.0f} "
              f"{size / written:10.0f}")


if __name__ == "__main__":
    main()
