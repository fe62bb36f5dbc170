"""Per-call cost of the cost evaluator's hot paths (the planner and simulator call decode time
millions of times). Prints microseconds per call; not a test, no assertions.

    .venv/bin/python benchmarks/cost_model_calls.py [--gpu h100] [--model qwen3-14b]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from cost_models import CostEvaluator
from cost_models.training import TrainStrategy


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Best of 3 runs of ``n`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--model", default="qwen3-14b")
    args = ap.parse_args()

    t0 = time.perf_counter()
    ev = CostEvaluator(args.gpu, args.model)
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    ev.decode_s(2, 64, 1e5)
    t_table = time.perf_counter() - t0
    print(f"{ev!r}")
    print(f"  construct evaluator (load calibration):      {t_init * 1e3:9.2f} ms")
    print(f"  first decode_s at a new TP (builds table):   {t_table * 1e3:9.2f} ms")
    print(f"  decode_s scalar (int tp, int batch, ctx):    {per_call_us(lambda: ev.decode_s(2, 64, 262144.0), 200_000):9.3f} us")
    print(f"  decode_coeffs scalar:                        {per_call_us(lambda: ev.decode_coeffs(2, 64), 200_000):9.3f} us")
    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], size=10_000)
    b = rng.integers(1, 256, size=10_000)
    ctx = rng.integers(0, 1_000_000, size=10_000).astype(float)
    for t in (1, 4, 8):
        ev.decode_s(t, 1, 0.0)  # build the other tables outside the timing
    us = per_call_us(lambda: ev.decode_s(tp, b, ctx), 50)
    print(f"  decode_s vectorized, 10k mixed-TP elements:  {us:9.1f} us  ({us / 10_000 * 1e3:.1f} ns/element)")
    print(f"  prefill_s scalar (4096 new, 1024 cached):    {per_call_us(lambda: ev.prefill_s(2, 4096, 1024), 2_000):9.1f} us")
    s = TrainStrategy(4, 1, 2)
    print(f"  train_iter_s (tp4 dp2, 1M tokens):           {per_call_us(lambda: ev.train_iter_s(s, 1 << 20, 4096), 2_000):9.1f} us")
    print(f"  train_memory, no suggestions:                {per_call_us(lambda: ev.train_memory(s, 4096, suggest=False), 2_000):9.1f} us")


if __name__ == "__main__":
    main()
