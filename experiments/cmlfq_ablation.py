"""C-MLFQ ablation: Libra's router against no migration, reactive MLFQ, a length predictor, hindsight routing.

    .venv/bin/python experiments/cmlfq_ablation.py [--size smoke|quick|full] [--out experiments/results]

The same planner and elastic pool with five routers (``libra``: C-MLFQ; ``no-migration``: C-MLFQ's
decisions carried out by re-prefill, no KV transfer; ``reactive-mlfq``: move once a trajectory
outgrows its bucket; ``length-predictor``: route by a noisy predicted final length;
``hindsight-routing`` (formerly ``oracle``): true final lengths, hindsight placement that sees the future) on each bundled trace,
48 A800, on-policy (K=0). The replays are ``end_to_end.py``'s. SIMULATED.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import end_to_end as e2e
from exp_common import BUNDLED, Context, Figure, Section, finish_figure, fx, md_table, ok, pyplot, ratio, script_main, write_csv

NAME = "cmlfq_ablation"
TITLE = "C-MLFQ ablation: routers under the same planner and pool (bundled traces, 48 A800, K=0)"
ROUTERS = ("libra-full", "no-migration", "reactive-mlfq", "length-predictor", "hindsight-routing")


def inputs(size: str) -> dict[str, Any]:
    return {"specs": [s.label() for s in e2e.specs(size, 0, ROUTERS)]}


def run(ctx: Context) -> Section:
    recs = e2e.records(ctx, ROUTERS)
    rs = []
    for wl, _, _ in BUNDLED:
        lib = recs.get((wl, 0, "libra-full"))
        for p in ROUTERS:
            rec = recs.get((wl, 0, p))
            if rec is None:
                continue
            st = rec.get("steps", [])
            rs.append({"workload": wl, "policy": p, "status": rec["status"],
                       "throughput_tok_s": rec.get("throughput_tok_s") if ok(rec) else float("nan"),
                       "x_libra": ratio(rec.get("throughput_tok_s"), lib.get("throughput_tok_s")) if ok(rec) and ok(lib) else float("nan"),
                       "mean_rollout_s": float(np.mean([s["rollout_makespan_s"] for s in st])) if st else float("nan"),
                       "makespan_over_bound": float(np.mean([s["makespan_over_bound"] for s in st])) if st else float("nan"),
                       "migrations": sum(s["migrations"] for s in st), "migrations_refused": sum(s["migrations_refused"] for s in st)})
    write_csv(ctx.dir / "cmlfq_ablation.csv", rs)
    plt = pyplot()
    wls = [w for w, _, _ in BUNDLED if any(r["workload"] == w for r in rs)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / max(1, len(ROUTERS))
    for i, p in enumerate(ROUTERS):
        sel = [next((r for r in rs if r["workload"] == w and r["policy"] == p), None) for w in wls]
        xs = np.arange(len(wls)) + i * width
        axes[0].bar(xs, [r["x_libra"] if r else np.nan for r in sel], width, label=p)
        axes[1].bar(xs, [r["makespan_over_bound"] if r else np.nan for r in sel], width, label=p)
    for ax, yl in ((axes[0], "throughput x libra (SIMULATED)"), (axes[1], "rollout makespan / lower bound (SIMULATED)")):
        ax.set_xticks(np.arange(len(wls)) + 0.4 - width / 2, wls)
        ax.set_ylabel(yl)
        ax.legend(fontsize=6)
    axes[0].axhline(1.0, color="k", lw=0.6)
    finish_figure(fig, ctx.dir / "cmlfq_ablation.png", "SIMULATED C-MLFQ ablation, 48 x A800, K=0")
    lo = [r for r in rs if r["policy"] not in ("libra-full", "hindsight-routing") and r["x_libra"] < 0.97]
    hi = [r for r in rs if r["policy"] not in ("libra-full", "hindsight-routing") and r["x_libra"] > 1.03]
    orc = [r for r in rs if r["policy"] == "hindsight-routing"]
    text = [
        f"Routers more than 3% slower than C-MLFQ: {len(lo)}" + (" (" + ", ".join(f"{r['policy']} on {r['workload']} {fx(r['x_libra'])}" for r in lo) + ")" if lo else "")
        + f"; faster: {len(hi)}" + (" (" + ", ".join(f"{r['policy']} on {r['workload']} {fx(r['x_libra'])}" for r in hi) + ")" if hi else "")
        + (". Hindsight routing (sees the future; not an upper bound) against C-MLFQ: " + ", ".join(f"{r['workload']} {fx(r['x_libra'])}" for r in orc)
           + ": how much knowing the lengths changes on these layouts." if orc else ". Hindsight routing is not replayed at this size."),
        "",
        md_table(("workload", "router (policy)", "gen tok/s", "x libra", "rollout s", "makespan/LB", "migrations", "refused"),
                 [(r["workload"], r["policy"], f"{r['throughput_tok_s']:,.0f}", fx(r["x_libra"], 3), f"{r['mean_rollout_s']:.1f}",
                   f"{r['makespan_over_bound']:.3f}", r["migrations"], r["migrations_refused"]) for r in rs]),
    ]
    fig_ = Figure("cmlfq_ablation.png", "SIMULATED C-MLFQ ablation",
                  "Left: throughput of each router relative to C-MLFQ (libra), same planner and pool. Right: the rollout "
                  "makespan over its lower bound, the part of a step a router can change.")
    return Section(NAME, TITLE, "Libra's router replaced by each alternative, everything else equal.", [fig_], "\n".join(text), {},
                   ["cmlfq_ablation.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
