"""Component waterfall: homogeneous planner -> + heterogeneous TP -> + C-MLFQ -> + elastic pool.

    .venv/bin/python experiments/waterfall.py [--size smoke|quick|full] [--out experiments/results]

On each bundled trace (48 A800) and staleness class, the throughput of ``verl-static-uniform``
(the static split the planner replaces) and of Libra's cumulative ablations in the order of
``compare_policies.WATERFALL``: ``libra-homogeneous`` (the planner, one TP), ``libra-hetero``
(+ heterogeneous TP buckets, reactive routing), ``libra-cmlfq`` (+ C-MLFQ) and ``libra-full``
(+ the elastic pool; the default ``libra`` is the planner alone since issue 22). Each bar's ratio to the previous one is that mechanism's gain on top of
the others. The replays are ``end_to_end.py``'s (shared through the cache). SIMULATED.
"""

from __future__ import annotations

from typing import Any

import end_to_end as e2e
from compare_policies import WATERFALL
from exp_common import BUNDLED, Context, Figure, Section, finish_figure, fx, md_table, ok, pyplot, ratio, script_main, write_csv

NAME = "waterfall"
TITLE = "Component waterfall: what each mechanism adds (bundled traces, 48 A800)"
ORDER = tuple(n for n, _ in WATERFALL)


def inputs(size: str) -> dict[str, Any]:
    return {"specs": [s.label() for k in (0, 1) for s in e2e.specs(size, k, ORDER)]}


def rows(recs: dict[tuple[str, int, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, K, component): throughput, x previous component, x static split."""
    out = []
    for wl, _, _ in BUNDLED:
        for k in (0, 1):
            present = [n for n in ORDER if (wl, k, n) in recs]
            if "libra" not in present:
                continue
            prev = None
            base = recs.get((wl, k, ORDER[0]))
            for n, label in WATERFALL:
                rec = recs.get((wl, k, n))
                if rec is None:
                    continue
                v = rec["throughput_tok_s"] if ok(rec) else float("nan")
                out.append({"workload": wl, "K": k, "component": label, "policy": n, "throughput_tok_s": v,
                            "x_previous": ratio(v, prev) if prev is not None else float("nan"),
                            "x_static_uniform": ratio(v, base["throughput_tok_s"]) if ok(base) else float("nan"),
                            "split": rec.get("split"), "rollout_tps": rec.get("rollout_tps"), "mode": rec.get("mode")})
                prev = v
    return out


def run(ctx: Context) -> Section:
    recs = e2e.records(ctx, ORDER)
    rs = rows(recs)
    write_csv(ctx.dir / "waterfall.csv", rs)
    plt = pyplot()
    keys = sorted({(r["workload"], r["K"]) for r in rs}, key=lambda x: (x[1], [w for w, _, _ in BUNDLED].index(x[0])))
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(3.3 * max(1, len(keys)), 3.6), squeeze=False)
    for ax, (wl, k) in zip(axes[0], keys):
        sel = [r for r in rs if r["workload"] == wl and r["K"] == k]
        vals = [r["x_static_uniform"] for r in sel]
        ax.bar(range(len(sel)), vals, color=["#999999"] + ["#4477aa"] * (len(sel) - 1))
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(sel)), [r["policy"].replace("verl-static-uniform", "static") for r in sel], rotation=40,
                      ha="right", fontsize=7)
        ax.set_title(f"{wl}, K={k}", fontsize=9)
        ax.set_ylabel("throughput x static-uniform (SIMULATED)")
    finish_figure(fig, ctx.dir / "waterfall.png", "SIMULATED component waterfall, 48 x A800")
    gains = [r for r in rs if r["policy"] != ORDER[0] and r["policy"] != ORDER[1]]
    paid = [r for r in gains if r["x_previous"] > 1.03]
    hurt = [r for r in gains if r["x_previous"] < 0.97]
    planner = [r for r in rs if r["policy"] == ORDER[1]]
    text = [
        f"The planner alone (`libra-homogeneous`) against the static split: "
        + ", ".join(f"{r['workload']} K={r['K']} {fx(r['x_static_uniform'])}" for r in planner) + ".",
        f"Of the {len(gains)} mechanism steps on top of the planner (heterogeneous TP, C-MLFQ, pool; per trace and class), "
        f"{len(paid)} gained more than 3%" + (": " + ", ".join(f"{r['component']} on {r['workload']} K={r['K']} {fx(r['x_previous'])}" for r in paid) if paid else "")
        + f"; {len(hurt)} lost more than 3%" + (": " + ", ".join(f"{r['component']} on {r['workload']} K={r['K']} {fx(r['x_previous'])}" for r in hurt) if hurt else "")
        + "; the rest are within noise (3%).",
        "",
        md_table(("workload", "K", "component", "policy", "gen tok/s", "x previous", "x static-uniform", "split", "rollout TPs", "loop"),
                 [(r["workload"], r["K"], r["component"], r["policy"], f"{r['throughput_tok_s']:,.0f}", fx(r["x_previous"], 3),
                   fx(r["x_static_uniform"], 3), r["split"], r["rollout_tps"], r["mode"]) for r in rs]),
    ]
    fig_ = Figure("waterfall.png", "SIMULATED component waterfall",
                  "Throughput of each cumulative ablation relative to verl-static-uniform (grey), per trace and staleness "
                  "class. A bar equal to its left neighbour means that mechanism changed nothing on this workload.")
    return Section(NAME, TITLE, "Libra's mechanisms switched on one after the other, on the end-to-end runs.", [fig_],
                   "\n".join(text), {}, ["waterfall.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
