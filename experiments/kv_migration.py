"""KV migration time vs context per link: what a C-MLFQ move costs, from the cost model.

    .venv/bin/python experiments/kv_migration.py [--out experiments/results]

``CostEvaluator.kv_migration_s(tokens, tp_src, tp_dst, same_node)`` for contexts from 1K to
128K tokens over NVLink (one NVLink domain) and InfiniBand, on each GPU of the catalog, for
Qwen3-14B with TP 1 -> TP 2 and TP 4 -> TP 8, next to the median tool latency of each bundled
workload's tool family: a migration that finishes within the tool call it overlaps is free.
Cost-model predictions (SIMULATED), no replay.
"""

from __future__ import annotations

from typing import Any

from exp_common import Context, Figure, Section, finish_figure, md_table, pyplot, script_main, write_csv

NAME = "kv_migration"
TITLE = "KV migration time vs context per link (cost model)"
GPUS = ("a800", "h100", "h200", "b200", "gb200")
CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072)
MODEL = "qwen3-14b"
PAIRS = ((1, 2), (4, 8))


def inputs(size: str) -> dict[str, Any]:
    return {"gpus": GPUS, "contexts": CONTEXTS, "model": MODEL, "pairs": PAIRS}


def rows() -> list[dict[str, Any]]:
    from cost_models import CostEvaluator

    out = []
    for g in GPUS:
        ev = CostEvaluator(g, MODEL)
        for src, dst in PAIRS:
            for same, link in ((True, "NVLink"), (False, "InfiniBand")):
                for c in CONTEXTS:
                    out.append({"gpu": g, "tp_src": src, "tp_dst": dst, "link": link, "context": c,
                                "seconds": float(ev.kv_migration_s(c, src, dst, same))})
    return out


def run(ctx: Context) -> Section:
    from libra.trace.latencies import FAMILIES as FAMS

    FAMILIES = [(f.name, f.median_s) for f in FAMS]
    rs = rows()
    write_csv(ctx.dir / "kv_migration.csv", rs)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PAIRS), figsize=(5.2 * len(PAIRS), 3.6), squeeze=False)
    for ax, (src, dst) in zip(axes[0], PAIRS):
        for g in GPUS:
            for link, style in (("NVLink", "-"), ("InfiniBand", "--")):
                sel = [r for r in rs if r["gpu"] == g and r["link"] == link and r["tp_src"] == src]
                ax.plot([r["context"] for r in sel], [r["seconds"] for r in sel], style, marker=".", label=f"{g} {link}")
        for name, med in FAMILIES:
            ax.axhline(med, color="grey", lw=0.5, ls=":")
            ax.text(CONTEXTS[0], med, f"median {name} tool call", fontsize=6, va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context moved, tokens")
        ax.set_ylabel("migration time, s (SIMULATED cost model)")
        ax.set_title(f"{MODEL}, TP {src} -> TP {dst}", fontsize=9)
        ax.legend(fontsize=5, ncol=2)
    finish_figure(fig, ctx.dir / "kv_migration.png", "SIMULATED (cost-model prediction): KV migration time vs context")
    at = [r for r in rs if r["context"] == 32768 and r["tp_src"] == PAIRS[0][0]]
    body = ("Moving a 32K-token context (TP 1 -> 2): " + "; ".join(f"{r['gpu']} {r['link']} {r['seconds'] * 1e3:.0f} ms" for r in at)
            + ". Median tool calls: " + ", ".join(f"{n} {m:.2f} s" for n, m in FAMILIES)
            + ". A move overlapping a call longer than its transfer costs nothing but the KV it reserves.\n\n"
            + md_table(("GPU", "link", "TP", *[f"{c // 1024}K" for c in CONTEXTS]),
                       [(g, link, f"{s}->{d}", *[f"{next(r['seconds'] for r in rs if r['gpu'] == g and r['link'] == link and r['tp_src'] == s and r['context'] == c) * 1e3:.1f} ms" for c in CONTEXTS])
                        for g in GPUS for link in ("NVLink", "InfiniBand") for s, d in PAIRS]))
    fig_ = Figure("kv_migration.png", "SIMULATED: KV migration time vs context",
                  "Predicted seconds to move one trajectory's KV cache between two rollout instances, per GPU, over NVLink "
                  "(solid) and InfiniBand (dashed); GPUs with the same link speed draw on top of each other; dotted: median tool-call latencies of the default tool families.")
    return Section(NAME, TITLE, "What a KV migration costs per link, against the tool call it hides behind.", [fig_], body, {},
                   ["kv_migration.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
