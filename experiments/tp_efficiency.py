"""Diagnostic: decode throughput per GPU and per-token latency by TP degree, as the cost model
prices them (the simulator uses the same coefficients). SIMULATED (fitted cost model).

    .venv/bin/python experiments/tp_efficiency.py [--gpu a800] [--model qwen3-14b]

Heterogeneous TP pays when a low TP decodes markedly more tokens per GPU-second than a high TP
(short trajectories go there) while the high TP is needed for the long ones' latency. For each
context length it prints, per TP, the largest batch the KV cache and ``max_running_seqs`` admit,
the iteration time at that batch, tokens / s / GPU, and the batch-1 iteration time.
"""

from __future__ import annotations

import argparse

from sim.costs import load_costs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="a800")
    ap.add_argument("--model", default="qwen3-14b")
    a = ap.parse_args()
    c = load_costs(a.gpu, a.model)
    print(f"SIMULATED cost model, {a.model} on {a.gpu}")
    print("| context | TP | KV tokens/GPU | max batch | iter ms @max batch | tok/s/GPU @max batch | iter ms @batch 1 |")
    print("|---|---|---|---|---|---|---|")
    for ctx in (4096, 8192, 16384, 32768):
        for tp in (1, 2, 4, 8):
            cap = c.kv_capacity(tp)
            if cap < ctx:
                print(f"| {ctx} | {tp} | {cap // tp} | 0 | - | - | - |")
                continue
            B = int(min(c.max_seqs(tp), cap // ctx))
            b, s = c.decode_coeffs(tp, B)
            it = b + s * B * ctx
            b1, s1 = c.decode_coeffs(tp, 1)
            print(f"| {ctx} | {tp} | {cap // tp} | {B} | {it * 1e3:.1f} | {B / it / tp:.0f} | {(b1 + s1 * ctx) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
