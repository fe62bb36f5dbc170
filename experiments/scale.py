"""Scale what-if: the same workload on 48 to 1,024 GPUs (throughput per GPU, planner time).

    .venv/bin/python experiments/scale.py [--size smoke|quick|full] [--out experiments/results]

Weak scaling: a generated SWE workload (``libra-sim gen --workload swe``, 16K context cap) with
a fixed number of trajectories per GPU, so the batch grows with the cluster (A800, Qwen3-14B,
on-policy K=0). Per cluster size: generated tokens per second per GPU for Libra and the K=0
baselines, Libra's plan, and the planner's cold search time on that workload (host CPU time).
Flat throughput per GPU means the plans scale. The replays run as a ``libra-sim sweep`` grid
(``exp_common.sweep_grid``: the grid file is written under the results' ``.cache/grids/``).
SIMULATED replays.
"""

from __future__ import annotations

import time
from typing import Any

from exp_common import Context, Figure, Section, finish_figure, fx, generated_trace, md_table, pick, pyplot, ratio, script_main, \
    sweep_grid, sweep_value, write_csv

NAME = "scale"
TITLE = "Scale what-if: 48 to 1,024 GPUs (weak scaling, generated SWE workload)"
POLICIES = ("libra", "verl-colocated", "verl-static-uniform")
GPU, MODEL = "a800", "qwen3-14b"


def shape(size: str) -> dict[str, Any]:
    """Cluster sizes, trajectories per GPU and steps of each size."""
    return pick(size, {"gpus": (16, 32), "per_gpu": 4, "steps": 1},
                {"gpus": (48, 128, 384), "per_gpu": 8, "steps": 2},
                {"gpus": (48, 96, 192, 384, 768, 1024), "per_gpu": 8, "steps": 3})


def inputs(size: str) -> dict[str, Any]:
    return {"shape": shape(size), "policies": POLICIES, "gpu": GPU, "model": MODEL}


def planner_s(trace: str, gpus: int) -> float:
    """Cold planner search on the workload's first step (history) for its second (CPU s)."""
    from libra.cluster import ClusterSpec
    from libra.planner.search import Planner
    from sim.replay import load_steps

    steps, _ = load_steps(trace, "0:2")
    if len(steps) < 2:
        steps = steps * 2
    planner = Planner(ClusterSpec(gpus, GPU, MODEL, max_context=16384))
    c0 = time.process_time()
    planner.search(steps[:1], steps[1].prompt_tokens)
    return time.process_time() - c0


def run(ctx: Context) -> Section:
    sh = shape(ctx.size)
    grid = {
        "name": f"scale_{ctx.size}", "description": "weak scaling (experiments/scale.py)", "policies": list(POLICIES),
        "subject": "libra",
        "workloads": {f"swe-{n}": {"generate": {"workload": "swe", "steps": sh["steps"], "batch": sh["per_gpu"] * n, "group_size": 8,
                                                "seed": 0, "max_context": 16384}} for n in sh["gpus"]},
        "clusters": {f"{GPU}-{n}": {"gpus": n, "gpu": GPU, "model": MODEL} for n in sh["gpus"]},
        "sweeps": [{"workloads": [f"swe-{n}"], "clusters": [f"{GPU}-{n}"], "max_staleness": [0]} for n in sh["gpus"]],
    }
    got = sweep_grid(ctx, f"scale_{ctx.size}", grid)
    rs = []
    for n in sh["gpus"]:
        for p in POLICIES:
            r = got.get((f"swe-{n}/{GPU}-{n}/K0/s0", p))
            tok = sweep_value(r, "throughput_tok_s")
            rs.append({"gpus": n, "trajectories_per_step": sh["per_gpu"] * n, "policy": p, "status": r["status"] if r else "missing",
                       "throughput_tok_s": tok, "tok_s_per_gpu": tok / n, "mean_step_s": sweep_value(r, "mean_step_s"),
                       "rollout_tps": r.get("rollout_tps") if r else "", "mode": r.get("mode") if r else "",
                       "error": r.get("error") if r else "not run"})
    traces = {n: generated_trace(ctx.cache, "swe", 2, sh["per_gpu"] * n, 8, 0, max_context=16384) for n in sh["gpus"]}
    plan_t = {n: planner_s(traces[n], n) for n in sh["gpus"]}
    for r in rs:
        r["planner_cpu_s"] = plan_t[r["gpus"]]
    write_csv(ctx.dir / "scale.csv", rs)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for p in POLICIES:
        sel = [r for r in rs if r["policy"] == p]
        axes[0].plot([r["gpus"] for r in sel], [r["tok_s_per_gpu"] for r in sel], "o-", label=p)
    axes[0].set_ylabel("generated tok/s per GPU (SIMULATED)")
    axes[1].plot(list(plan_t), [1e3 * v for v in plan_t.values()], "o-", color="k")
    axes[1].set_ylabel("planner cold search, CPU ms (host; plans SIMULATED)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"GPUs ({GPU.upper()}), {sh['per_gpu']} trajectories per GPU per step")
    axes[0].legend(fontsize=7)
    finish_figure(fig, ctx.dir / "scale.png", f"SIMULATED weak scaling, {MODEL}, generated SWE")
    lib = [r for r in rs if r["policy"] == "libra"]
    first, last = lib[0], lib[-1]
    best_of = {n: max((r["throughput_tok_s"] for r in rs if r["gpus"] == n and r["policy"] != "libra" and r["status"] == "ok"),
                      default=float("nan")) for n in sh["gpus"]}
    body = (f"Libra's throughput per GPU goes from {first['tok_s_per_gpu']:.1f} at {first['gpus']} GPUs to "
            f"{last['tok_s_per_gpu']:.1f} at {last['gpus']} ({fx(ratio(last['tok_s_per_gpu'], first['tok_s_per_gpu']))}); "
            "against the best K=0 baseline: " + ", ".join(f"{n} GPUs {fx(ratio(next(r['throughput_tok_s'] for r in lib if r['gpus'] == n), best_of[n]))}"
                                                           for n in sh["gpus"])
            + f". Planner search grows to {max(plan_t.values()) * 1e3:.0f} ms.\n\n"
            + md_table(("GPUs", "trajectories/step", "policy", "tok/s/GPU", "mean step s", "rollout TPs", "loop", "planner ms"),
                       [(r["gpus"], r["trajectories_per_step"], r["policy"], f"{r['tok_s_per_gpu']:.1f}",
                         f"{r['mean_step_s']:.1f}" if r["status"] == "ok" else "failed", r["rollout_tps"], r["mode"],
                         f"{r['planner_cpu_s'] * 1e3:.0f}") for r in rs]))
    fig_ = Figure("scale.png", "SIMULATED weak scaling",
                  "Left: generated tokens per second per GPU as the cluster and the batch grow together; right: the planner's "
                  "cold search time for that cluster (host CPU).")
    return Section(NAME, TITLE, "The same workload shape on ever larger clusters.", [fig_], body, {}, ["scale.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
