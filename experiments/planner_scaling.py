"""Planner search time vs GPU count, up to 4,096 GPUs (host CPU time of the policy core).

    .venv/bin/python experiments/planner_scaling.py [--size smoke|quick|full] [--out experiments/results]

For each cluster size it plans step 3 of the bundled SWE trace from steps 0-2 (Qwen3-14B on
A800 nodes of 8, the upcoming step's prompts scaled to ``max(512, 4 x GPUs)`` trajectories), as
``benchmarks/planner_search.py`` does: the cold search (a fresh ``Planner``) in CPU seconds of
this process, median of ``repeat`` runs, in the sync class (K=0) and the async class (K=1).
These are measured host times of our planner code (not SIMULATED cluster time); the plan's
predicted step time is the cost model's (SIMULATED). Host times vary with the machine and its
load, so the cache key of this experiment is the code, not the machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from exp_common import TRACES, Context, Figure, Section, finish_figure, md_table, pick, pyplot, script_main, write_csv

NAME = "planner_scaling"
TITLE = "Planner search time vs GPU count (host CPU time; plans are cost-model predictions)"


def sizes(size: str) -> tuple[int, ...]:
    return pick(size, (48, 256), (48, 256, 1024, 4096), (8, 48, 128, 256, 512, 1024, 2048, 4096))


def inputs(size: str) -> dict[str, Any]:
    return {"sizes": sizes(size), "repeat": pick(size, 1, 2, 3)}


def measure(gpus: int, history: list[Any], prompts: np.ndarray, k: int, repeat: int) -> dict[str, Any]:
    """Cold search time of the planner for ``gpus`` A800 in class ``k`` (median CPU s of ``repeat``)."""
    from cost_models import CostEvaluator
    from libra.cluster import ClusterSpec
    from libra.planner.search import Planner, SearchOptions

    ev = CostEvaluator(gpu="a800", model="qwen3-14b")
    cluster = ClusterSpec(gpus, "a800", "qwen3-14b")
    n = max(len(prompts), 4 * gpus)
    p = np.resize(prompts, n)
    cpu = []
    for _ in range(repeat):
        planner = Planner(cluster, ev, SearchOptions(max_staleness=k))
        c0 = time.process_time()
        res = planner.search(history, p)
        cpu.append(time.process_time() - c0)
    b = res.best
    return {"gpus": gpus, "K": k, "trajectories": n, "search_cpu_s": statistics.median(cpu), "candidates": len(res.candidates),
            "cut_by_bound": res.skipped, "plan": "time-shared" if b.colocated else f"{gpus - b.n_train}:{b.n_train}",
            "loop": b.loop, "rollout_tps": "+".join(f"TP{t}x{m}" for t, m in zip(b.rollout.layout.tps, b.rollout.counts)),
            "predicted_step_s": b.step_s}


def run(ctx: Context) -> Section:
    from sim.replay import load_steps

    steps, _ = load_steps(str(TRACES / "swe-qwen3-14b.jsonl.gz"), "0:4")
    history, prompts = steps[:3], steps[3].prompt_tokens
    rep = inputs(ctx.size)["repeat"]
    rs = [measure(n, history, prompts, k, rep) for k in (0, 1) for n in sizes(ctx.size)]
    write_csv(ctx.dir / "planner_scaling.csv", rs)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for k in (0, 1):
        sel = [r for r in rs if r["K"] == k]
        ax.plot([r["gpus"] for r in sel], [1e3 * r["search_cpu_s"] for r in sel], "o-", label=f"K={k}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (A800, 8 per node)")
    ax.set_ylabel("cold search, CPU ms (host; plans SIMULATED)")
    ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "planner_scaling.png", "Planner search time vs GPUs (host CPU; plans for a SIMULATED cluster)")
    big = max(rs, key=lambda r: (r["gpus"], r["K"]))
    body = (f"At {big['gpus']:,} GPUs (K={big['K']}) one cold search takes {big['search_cpu_s'] * 1e3:.0f} ms of CPU, "
            f"evaluating {big['candidates']} splits ({big['cut_by_bound']} cut by the bound). Measured on the machine that ran "
            "run_all (shared cores inflate it).\n\n"
            + md_table(("GPUs", "K", "trajectories", "CPU ms", "splits", "cut", "plan", "loop", "rollout", "pred. step s"),
                       [(r["gpus"], r["K"], r["trajectories"], f"{r['search_cpu_s'] * 1e3:.0f}", r["candidates"], r["cut_by_bound"],
                         r["plan"], r["loop"], r["rollout_tps"], f"{r['predicted_step_s']:.1f}") for r in rs]))
    fig_ = Figure("planner_scaling.png", "Planner search time vs GPUs (host CPU; plans for a SIMULATED cluster)",
                  "CPU time of one cold hierarchical search (fresh memo tables) as the cluster grows, on-policy (K=0) and "
                  "with one step of staleness allowed (K=1, more loops priced). A host measurement of the planner code.")
    return Section(NAME, TITLE, "How long Libra's planner takes to decide a step as the cluster grows to 4,096 GPUs.", [fig_], body,
                   {}, ["planner_scaling.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
