"""Throughput and peak memory of the trace reader on a large synthetic trace.

Writes N trajectories (default 1,000,000; ~8 turns each on average, 100 steps) with the trace
writer, then times: the writer, pass 1 (``validate``), both passes of ``steps()``, and pass 2 alone for
``steps()`` on a step-sorted file (streamed), on a shuffled-step file (seek path) and for
``trajectories()``, for plain and/or gzip files. Each phase runs in
a forked child process; its memory figure is the child's RSS high-water mark minus its RSS when
it started, i.e. what the phase itself added (the index and one step's arrays). Both wall time
and the child's CPU time are printed: on a shared machine CPU time is the figure that does not
depend on what else runs. tracemalloc is not used: it slows allocation-heavy parsing several-fold.

    .venv/bin/python benchmarks/trace_reader.py [--n 1000000] [--gzip] [--dir /tmp]

The records are simple and synthetic on purpose (this measures I/O, not the workload model), so
the benchmark does not depend on the workload generator.
"""

from __future__ import annotations

import argparse
import os
import random
import multiprocessing
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from libra.trace import TraceHeader, TraceReader, Trajectory, Turn, open_trace, write_trace

TOOLS = ("bash", "python", "search", "edit")
OUTCOMES = ("ok", "ok", "ok", "error", "timeout")


def synthetic(n: int, steps: int, seed: int, shuffle_steps: bool) -> Iterator[Trajectory]:
    """``n`` trajectories over ``steps`` steps, 1-15 turns each (mean 8)."""
    rng = random.Random(seed)
    per_step = max(1, n // steps)
    for i in range(n):
        step = rng.randrange(steps) if shuffle_steps else min(i // per_step, steps - 1)
        k = rng.randint(1, 15)
        turns = [
            Turn(rng.randint(20, 800), rng.choice(TOOLS), round(rng.uniform(0.05, 30.0), 3), rng.randint(5, 2000), rng.choice(OUTCOMES))
            for _ in range(k - 1)
        ]
        turns.append(Turn(rng.randint(20, 800), None))
        yield Trajectory(f"s{step}-t{i}", step, rng.randint(100, 4000), tuple(turns), f"p{i // 8}", float(rng.random() < 0.4), "stop")


def _rss_kib() -> int:
    """Current resident set size (KiB) from /proc; falls back to the high-water mark."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(fn: Callable[[], Any], conn: Any) -> None:
    start = _rss_kib()
    c0 = time.process_time()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    conn.send((dt, cpu, max(0, peak - start) / 1024))
    conn.close()


def measure(label: str, n: int, fn: Callable[[], Any]) -> dict[str, float]:
    """Run ``fn`` in a forked child; print and return seconds, trajectories/s and added RSS."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, send))
    proc.start()
    dt, cpu, added_mib = recv.recv()
    proc.join()
    rate = n / dt if dt > 0 else float("inf")
    cpu_rate = n / cpu if cpu > 0 else float("inf")
    print(f"{label:<40} {dt:8.2f} s wall {rate:>9,.0f} traj/s | {cpu:7.2f} s CPU {cpu_rate:>9,.0f} traj/s"
          f" | +{added_mib:6.1f} MiB RSS", flush=True)
    return {"seconds": dt, "cpu_seconds": cpu, "traj_per_s": rate, "traj_per_cpu_s": cpu_rate, "added_rss_mib": added_mib}


def consume_steps(reader: TraceReader) -> None:
    """Iterate every step (what the simulator does), checking nothing was lost."""
    total = 0
    for s in reader.steps():
        total += s.n
    assert total == reader.validate().n_trajectories


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="trajectories (default 1,000,000)")
    ap.add_argument("--steps", type=int, default=100, help="RL steps the trajectories spread over")
    ap.add_argument("--gzip", action="store_true", help="also benchmark .jsonl.gz files")
    ap.add_argument("--dir", default=None, help="where to write the temporary traces")
    args = ap.parse_args(argv)
    n = args.n
    suffixes = [".jsonl", ".jsonl.gz"] if args.gzip else [".jsonl"]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for suffix in suffixes:
            sorted_path = os.path.join(d, "sorted" + suffix)
            shuffled_path = os.path.join(d, "shuffled" + suffix)
            hdr = TraceHeader(workload="bench", source="benchmarks/trace_reader.py")
            measure(f"write{suffix} (sorted steps)", n, lambda: write_trace(sorted_path, synthetic(n, args.steps, 1, False), hdr))
            write_trace(shuffled_path, synthetic(n, args.steps, 1, True), hdr)
            size = os.path.getsize(sorted_path)
            n_turns = open_trace(sorted_path).validate().n_turns
            print(f"  file {size / 2**20:.0f} MiB, {n:,} trajectories, {n_turns:,} turns, {args.steps} steps", flush=True)
            measure(f"validate{suffix} (pass 1)", n, lambda: open_trace(sorted_path).validate())
            measure(f"validate+steps{suffix} (sorted, 2 passes)", n, lambda: consume_steps(open_trace(sorted_path)))
            # pass 2 alone: the index is built here, in the parent, and inherited by the child
            ready_sorted = open_trace(sorted_path)
            ready_sorted.validate()
            ready_shuffled = open_trace(shuffled_path)
            ready_shuffled.validate()
            measure(f"steps(){suffix} pass 2, sorted", n, lambda: consume_steps(ready_sorted))
            measure(f"steps(){suffix} pass 2, shuffled", n, lambda: consume_steps(ready_shuffled))
            measure(f"trajectories(){suffix} pass 2", n, lambda: sum(1 for _ in ready_sorted.trajectories()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
