"""Non-blocking vs synchronous join: what a lent rollout GPU costs training when it joins.

    .venv/bin/python experiments/join.py [--size smoke|quick|full] [--out experiments/results]

The elastic pool lends drained rollout instances to training; the ``join`` policy option says
how they join: ``nonblocking`` (the shard loads in the background, the worker joins at the next
gradient-accumulation boundary) or ``sync`` (training pauses for the re-shard, the variant the
paper measured as a spike). Libra's own pool declines loans that do not pay, and on these
workloads it declines every one (the runs below count its loans), so the join mode changes
nothing there. To measure the join itself the same runs are repeated with the pool made eager
(``exp_common.eager_pool``: lend after 0.05 s idle, whatever the payoff; a what-if, not Libra).
Search-R1 trace (its streamed sync loop is where training runs during the rollout tail),
Qwen3-14B on 16 H100 and Qwen3-8B on 48 A800, K=0. SIMULATED.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from exp_common import TRACES, Context, Figure, ReplaySpec, Section, finish_figure, fx, md_table, ok, pick, pyplot, ratio, \
    replays, script_main, write_csv

NAME = "join"
TITLE = "Non-blocking vs synchronous join of lent rollout GPUs"
CASES = (("search-r1.jsonl.gz", 16, "h100", "qwen3-14b"), ("search-r1.jsonl.gz", 48, "a800", "qwen3-8b"))
VARIANTS = (("default pool", None, "nonblocking"), ("default pool", None, "sync"), ("eager pool", "eager", "nonblocking"),
            ("eager pool", "eager", "sync"))


def steps_for(size: str) -> str:
    return pick(size, "0:1", "0:6", "0:20")


def specs(size: str) -> list[ReplaySpec]:
    out = []
    for f, n, g, m in pick(size, CASES[:1], CASES, CASES):
        for _, pool, join in VARIANTS:
            opts = tuple(sorted((("join", join),) + ((("pool", pool),) if pool else ())))
            out.append(ReplaySpec(str(TRACES / f), steps_for(size), n, g, m, "libra-full", 0, opts=opts))
    return out


def inputs(size: str) -> dict[str, Any]:
    return {"specs": [s.label() for s in specs(size)]}


def run(ctx: Context) -> Section:
    ss = specs(ctx.size)
    rs, per_step = [], []
    for s, r in zip(ss, replays(ctx, ss)):
        o = dict(s.opts)
        st = r.get("steps", [])
        case = f"{s.gpus} x {s.gpu}, {s.model}"
        rs.append({"case": case, "pool": "eager" if "pool" in o else "default", "join": o["join"], "status": r["status"],
                   "mode": r.get("mode"), "throughput_tok_s": r.get("throughput_tok_s") if ok(r) else float("nan"),
                   "mean_step_s": r.get("mean_step_s"), "mean_train_s": float(np.mean([x["train_s"] for x in st])) if st else float("nan"),
                   "loans": sum(x["role_changes"] for x in st), "joins": sum(x["train_joins"] for x in st),
                   "join_pause_s": sum(x["join_pause_s"] for x in st), "error": r.get("error")})
        per_step += [{"case": case, "pool": rs[-1]["pool"], "join": o["join"], **x} for x in st]
    write_csv(ctx.dir / "join.csv", rs)
    write_csv(ctx.dir / "join_steps.csv", per_step)
    plt = pyplot()
    cases = list(dict.fromkeys(r["case"] for r in rs))
    fig, axes = plt.subplots(2, len(cases), figsize=(5 * len(cases), 6), squeeze=False)
    for j, case in enumerate(cases):
        for pool, style in (("default", "-"), ("eager", "--")):
            for join in ("nonblocking", "sync"):
                sel = [x for x in per_step if x["case"] == case and x["pool"] == pool and x["join"] == join]
                if not sel:
                    continue
                lab = f"{pool} pool, {join} join"
                axes[0][j].plot([x["step"] for x in sel], [x["step_s"] for x in sel], style, marker="o", ms=3, label=lab)
                pts = [(x["step_end_s"], x["mean_reward"]) for x in sel if math.isfinite(x["mean_reward"])]
                axes[1][j].plot([t for t, _ in pts], [v for _, v in pts], style, marker=".", label=lab)
        axes[0][j].set_title(case, fontsize=9)
        axes[0][j].set_xlabel("RL step")
        axes[0][j].set_ylabel("step time, s (SIMULATED)")
        axes[1][j].set_xlabel("simulated wall-clock, s")
        axes[1][j].set_ylabel("mean reward (SIMULATED time)")
        axes[0][j].legend(fontsize=6)
    finish_figure(fig, ctx.dir / "join.png", "SIMULATED non-blocking vs synchronous join, Search-R1 trace, K=0")
    lines = []
    for case in cases:
        d = {(r["pool"], r["join"]): r for r in rs if r["case"] == case}
        dn, ds = d.get(("default", "nonblocking")), d.get(("default", "sync"))
        en, es = d.get(("eager", "nonblocking")), d.get(("eager", "sync"))
        if dn and ds:
            lines.append(f"- {case}: Libra's pool lent {dn['loans']} times (nonblocking) and {ds['loans']} (sync); step time "
                         f"{dn['mean_step_s']:.1f} s vs {ds['mean_step_s']:.1f} s.")
        if en and es:
            lines.append(f"  With the eager pool: {en['loans']} / {es['loans']} loans, training paused {en['join_pause_s']:.1f} s "
                         f"(nonblocking) vs {es['join_pause_s']:.1f} s (sync) in all; throughput sync / nonblocking "
                         f"{fx(ratio(es['throughput_tok_s'], en['throughput_tok_s']), 3)}; eager nonblocking vs Libra's default "
                         f"{fx(ratio(en['throughput_tok_s'], dn['throughput_tok_s']) if dn else float('nan'), 3)}.")
    body = "\n".join(lines) + "\n\n" + md_table(
        ("case", "pool", "join", "loop", "gen tok/s", "mean step s", "mean train s", "loans", "joins", "join pause s"),
        [(r["case"], r["pool"], r["join"], r["mode"], f"{r['throughput_tok_s']:,.0f}", f"{r['mean_step_s']:.2f}",
          f"{r['mean_train_s']:.2f}", r["loans"], r["joins"], f"{r['join_pause_s']:.2f}") for r in rs])
    fig_ = Figure("join.png", "SIMULATED non-blocking vs synchronous join",
                  "Top: step time per step; bottom: reward against simulated time, for Libra's pool (solid) and the eager "
                  "what-if pool (dashed), each with non-blocking and synchronous joins.")
    return Section(NAME, TITLE, "How lent rollout GPUs join the training job, and what a synchronous join costs.", [fig_], body, {},
                   ["join.csv", "join_steps.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
