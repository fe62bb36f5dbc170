"""Diagnostic: decode throughput per GPU and per-token latency by TP degree, as the cost model
prices them (the simulator uses the same coefficients). SIMULATED (fitted cost model).

    .venv/bin/python experiments/tp_efficiency.py [--gpu a800] [--model qwen3-14b]   # the table
    .venv/bin/python experiments/run_all.py                                          # also its figure

Heterogeneous TP pays when a low TP decodes markedly more tokens per GPU-second than a high TP
(short trajectories go there) while the high TP is needed for the long ones' latency. For each
context length it prints, per TP, the largest batch the KV cache and ``max_running_seqs`` admit,
the iteration time at that batch, tokens / s / GPU, and the batch-1 iteration time.
"""

from __future__ import annotations

import argparse
from typing import Any

CONTEXTS = (4096, 8192, 16384, 32768)
TPS = (1, 2, 4, 8)
NAME = "tp_efficiency"
TITLE = "Decode efficiency by TP degree (cost model): when heterogeneous TP can pay"
CASES = (("a800", "qwen3-14b"), ("h100", "qwen3-32b"))


def rows(gpu: str, model: str) -> list[dict[str, Any]]:
    """Per (context, TP): KV tokens per GPU, the largest batch, iteration ms there, tok/s/GPU there, batch-1 ms."""
    from sim.costs import load_costs

    c = load_costs(gpu, model)
    out = []
    for ctx in CONTEXTS:
        for tp in TPS:
            cap = c.kv_capacity(tp)
            r: dict[str, Any] = {"gpu": gpu, "model": model, "context": ctx, "tp": tp, "kv_tokens_per_gpu": cap // tp}
            if cap < ctx:
                r.update(max_batch=0, iter_ms=float("nan"), tok_s_per_gpu=float("nan"), iter_ms_batch1=float("nan"))
            else:
                B = int(min(c.max_seqs(tp), cap // ctx))
                b, s = c.decode_coeffs(tp, B)
                it = b + s * B * ctx
                b1, s1 = c.decode_coeffs(tp, 1)
                r.update(max_batch=B, iter_ms=it * 1e3, tok_s_per_gpu=B / it / tp, iter_ms_batch1=(b1 + s1 * ctx) * 1e3)
            out.append(r)
    return out


def inputs(size: str) -> dict[str, Any]:
    return {"cases": CASES, "contexts": CONTEXTS, "tps": TPS}


def run(ctx: Any) -> Any:
    """The experiment run_all runs: both cases' tables, a figure of tok/s/GPU and batch-1 latency."""
    from exp_common import Figure, Section, finish_figure, md_table, pyplot, write_csv

    rs = [r for g, m in CASES for r in rows(g, m)]
    write_csv(ctx.dir / "tp_efficiency.csv", rs)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for g, m in CASES:
        for c in CONTEXTS:
            sel = [r for r in rs if r["gpu"] == g and r["context"] == c and r["max_batch"] > 0]
            axes[0].plot([r["tp"] for r in sel], [r["tok_s_per_gpu"] for r in sel], "o-", ms=3, label=f"{g} {m} {c // 1024}K")
            axes[1].plot([r["tp"] for r in sel], [r["iter_ms_batch1"] for r in sel], "o-", ms=3, label=f"{g} {m} {c // 1024}K")
    axes[0].set_ylabel("decode tok/s per GPU at max batch (SIMULATED)")
    axes[1].set_ylabel("batch-1 iteration, ms (SIMULATED)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("TP degree")
        ax.legend(fontsize=5, ncol=2)
    finish_figure(fig, ctx.dir / "tp_efficiency.png", "SIMULATED (cost model): decode efficiency vs latency by TP")
    best = []
    for g, m in CASES:
        for c in CONTEXTS:
            sel = [r for r in rs if r["gpu"] == g and r["context"] == c and r["max_batch"] > 0]
            if len(sel) >= 2:
                hi = max(sel, key=lambda r: r["tok_s_per_gpu"])
                lo = min(sel, key=lambda r: r["iter_ms_batch1"])
                best.append((g, m, c, hi["tp"], f"{hi['tok_s_per_gpu']:.0f}", lo["tp"], f"{lo['iter_ms_batch1']:.1f}",
                             f"{hi['tok_s_per_gpu'] / next(r['tok_s_per_gpu'] for r in sel if r['tp'] == lo['tp']):.2f}x"))
    body = md_table(("GPU", "model", "context", "most tok/s/GPU at TP", "tok/s/GPU", "lowest latency at TP", "batch-1 ms",
                     "throughput given up for latency"), best)
    fig_ = Figure("tp_efficiency.png", "SIMULATED: decode efficiency vs latency by TP",
                  "Left: decode tokens per second per GPU at the largest batch the KV cache admits; right: one sequence's "
                  "iteration time. Heterogeneous TP can only pay where the two pick different TPs and the throughput given "
                  "up (last column) is large.")
    return Section(NAME, TITLE, "The trade-off behind heterogeneous TP, as the simulator prices it.", [fig_], body, {}, ["tp_efficiency.csv"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="a800")
    ap.add_argument("--model", default="qwen3-14b")
    a = ap.parse_args()
    print(f"SIMULATED cost model, {a.model} on {a.gpu}")
    print("| context | TP | KV tokens/GPU | max batch | iter ms @max batch | tok/s/GPU @max batch | iter ms @batch 1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows(a.gpu, a.model):
        if r["max_batch"] == 0:
            print(f"| {r['context']} | {r['tp']} | {r['kv_tokens_per_gpu']} | 0 | - | - | - |")
        else:
            print(f"| {r['context']} | {r['tp']} | {r['kv_tokens_per_gpu']} | {r['max_batch']} | {r['iter_ms']:.1f} | "
                  f"{r['tok_s_per_gpu']:.0f} | {r['iter_ms_batch1']:.1f} |")


if __name__ == "__main__":
    main()
