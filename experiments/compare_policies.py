"""Every policy on one trace, sync and async: throughput table and the four-component waterfall.

    .venv/bin/python experiments/compare_policies.py [--trace T] [--gpus 48 --gpu a800 --model qwen3-14b]
        [--steps A:B] [--modes sync,async] [--jobs 1] [--out experiments/results/compare_policies]

Writes ``results.csv`` (one row per policy x mode), ``steps.csv`` (one row per policy x mode x
step), ``waterfall.png`` and ``summary.md`` into ``--out``. ALL NUMBERS ARE SIMULATED: the
discrete-event simulator (``sim/``) with the fitted cost model, seeded noise (seed 0).

Why one script per result: the README's tables are regenerated from this file alone, and it
calls only the public replay API (``sim.replay.replay_policy``), the same path as
``libra-sim replay --compare``.

Columns: ``gen_tok_s`` generated tokens / simulated wall time; ``trained_tok_s`` trained tokens
(every trajectory's full context) / wall time; ``mean_step_s``; ``makespan_over_bound`` the mean
over steps of rollout makespan / lower bound (``libra/planner/bounds.py``: max(critical path at batch 1,
work / capacity)); speedups are throughput ratios against ``verl-static-uniform`` and
``areal-static-optimal`` in the same mode. ``hindsight-routing`` (formerly ``oracle``) sees the future (hindsight placement, not a policy and not a proven bound).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

WATERFALL = (
    ("verl-static-uniform", "static uniform (verl)"),
    ("libra-homogeneous", "+ planner, homogeneous TP"),
    ("libra-hetero", "+ heterogeneous TP"),
    ("libra-cmlfq", "+ C-MLFQ"),
    ("libra-full", "+ elastic pool (libra-full)"),
)
SIMULATED = "SIMULATED numbers (discrete-event simulator with the fitted cost model, seed 0), not measurements."


def _one(args: tuple[str, str, str, str, int, str, str]) -> dict[str, Any]:
    """Replay one (policy, mode); returns the summary row and the per-step rows."""
    trace, steps_arg, gpu, model, gpus, policy, mode = args
    from libra.cluster import ClusterSpec
    from sim.loop import SimConfig
    from sim.replay import load_steps, replay_policy

    from libra.errors import UserError

    from libra.trace.limits import cluster_limits
    from sim.commands.common import node_size

    steps, header = load_steps(trace, steps_arg)
    # the trace's declared limits and the GPU's node size, read as `libra-sim replay` reads them,
    # so these tables are the README command's; "sync" is staleness class K=0 (each policy's
    # fastest on-policy loop), "async" is K=1
    limits, _ = cluster_limits(header, None, trace)
    cluster = ClusterSpec(gpus, gpu, model, node_size(gpu), **limits)
    t0 = time.process_time()
    try:
        res = replay_policy(steps, policy, cluster, SimConfig(max_staleness=0 if mode == "sync" else 1, seed=0))
    except UserError as exc:  # e.g. verl-colocated has no async mode
        return {"row": None, "steps": [], "skipped": f"{policy} {mode}: {exc}"}
    cpu = time.process_time() - t0
    ratios = [s.makespan_over_bound for s in res.steps]
    tail = [s.makespan_over_bound for s in res.steps[1:]] or ratios
    row = {
        "policy": policy,
        "mode": mode,
        "steps": len(res.steps),
        "completed": res.completed,
        "expected": res.expected,
        "gen_tok_s": res.throughput_tok_s,
        "trained_tok_s": res.trained_tok_s,
        "mean_step_s": res.mean_step_s,
        "mean_step_s_after_first": float(np.mean([s.step_s for s in res.steps[1:]])) if len(res.steps) > 1 else res.mean_step_s,
        "mean_rollout_s": float(np.mean([s.rollout_makespan_s for s in res.steps])),
        "mean_lower_bound_s": float(np.mean([s.lower_bound_s for s in res.steps])),
        "makespan_over_bound": float(np.mean(ratios)),
        "makespan_over_bound_after_first": float(np.mean(tail)),
        "mean_train_s": float(np.mean([s.train_s for s in res.steps])),
        "split": f"{res.steps[-1].n_rollout_gpus}:{res.steps[-1].n_train_gpus}",
        "rollout_tps": res.steps[-1].rollout_tps,
        "migrations": sum(s.migrations for s in res.steps),
        "role_changes": sum(s.role_changes for s in res.steps),
        "sees_future": bool(res.notes.get("sees_future", False)),
        "cpu_s": cpu,
    }
    per_step = [{"policy": policy, "mode": mode, **s.row()} for s in res.steps]
    return {"row": row, "steps": per_step}


def _fmt_table(rows: list[dict[str, Any]]) -> str:
    head = ("policy", "tok/s gen", "tok/s trained", "mean step s", "makespan/LB", "x verl-static", "x areal-opt", "split", "rollout TPs")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = r["policy"] + (" (hindsight, sees future)" if r["sees_future"] else "")
        out.append(
            f"| {name} | {r['gen_tok_s']:.0f} | {r['trained_tok_s']:.0f} | {r['mean_step_s']:.1f} | "
            f"{r['makespan_over_bound']:.3f} | {r['x_verl_static']:.2f} | {r['x_areal_opt']:.2f} | {r['split']} | {r['rollout_tps']} |"
        )
    return "\n".join(out)


def _fmt_waterfall(rows: dict[str, dict[str, Any]]) -> str:
    out = ["| component | policy | trained tok/s | x previous | x static-uniform |", "|---|---|---|---|---|"]
    prev = None
    base = rows["verl-static-uniform"]["trained_tok_s"]
    for name, label in WATERFALL:
        r = rows[name]
        v = r["trained_tok_s"]
        out.append(f"| {label} | {name} | {v:.0f} | {(v / prev if prev else 1.0):.3f} | {v / base:.3f} |")
        prev = v
    return "\n".join(out)


def _plot(by_mode: dict[str, dict[str, dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(by_mode), figsize=(6 * len(by_mode), 4), squeeze=False)
    for ax, (mode, rows) in zip(axes[0], by_mode.items()):
        vals = [rows[n]["trained_tok_s"] for n, _ in WATERFALL]
        ax.bar(range(len(vals)), vals, color=["#999999"] + ["#4477aa"] * (len(vals) - 1))
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(vals)), [lbl for _, lbl in WATERFALL], rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("trained tokens / s (SIMULATED)")
        ax.set_title(f"{mode} mode")
    fig.suptitle("Waterfall of Libra's components (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="traces/swe-qwen3-14b.jsonl.gz")
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--gpu", default="a800")
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--steps", default=None, help="A:B trace steps (default: the whole trace)")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--policies", default=None, help="comma list (default: every policy)")
    ap.add_argument("--jobs", type=int, default=1, help="processes (the replays are independent)")
    ap.add_argument("--out", default="experiments/results/compare_policies")
    a = ap.parse_args(argv)

    from libra.policies import POLICY_NAMES

    policies = a.policies.split(",") if a.policies else list(POLICY_NAMES)
    modes = a.modes.split(",")
    jobs = [(a.trace, a.steps, a.gpu, a.model, a.gpus, p, m) for m in modes for p in policies]
    t0 = time.time()
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            results = list(ex.map(_one, jobs))
    else:
        results = []
        for j in jobs:
            results.append(_one(j))
            r = results[-1]
            print(f"  {j[5]:22s} {j[6]:5s} " + (f"done ({r['row']['cpu_s']:.1f} s CPU)" if r["row"] else "skipped"), file=sys.stderr, flush=True)
    wall = time.time() - t0
    skipped = [r["skipped"] for r in results if r["row"] is None]
    results = [r for r in results if r["row"] is not None]

    by_mode: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in modes}
    for r in results:
        by_mode[r["row"]["mode"]][r["row"]["policy"]] = r["row"]
    for rows in by_mode.values():
        v = rows.get("verl-static-uniform", {}).get("trained_tok_s", float("nan"))
        o = rows.get("areal-static-optimal", {}).get("trained_tok_s", float("nan"))
        for r in rows.values():
            r["x_verl_static"] = r["trained_tok_s"] / v
            r["x_areal_opt"] = r["trained_tok_s"] / o

    os.makedirs(a.out, exist_ok=True)
    rows_all = [r for m in modes for r in by_mode[m].values()]
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_all[0]))
        w.writeheader()
        w.writerows(rows_all)
    steps_all = [s for r in results for s in r["steps"]]
    with open(os.path.join(a.out, "steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(steps_all[0]))
        w.writeheader()
        w.writerows(steps_all)

    n_steps = rows_all[0]["steps"]
    md = [
        f"# Policy comparison: {a.trace}, {a.gpus} x {a.gpu}, {a.model}",
        "",
        f"**{SIMULATED}** Steps replayed: {a.steps or 'all'} ({n_steps} steps); replay CPU time "
        f"{sum(r['row']['cpu_s'] for r in results):.0f} s total ({wall:.0f} s wall, {a.jobs} job(s)).",
        "Speedups are trained-token throughput ratios in the same mode; makespan/LB is the mean over steps.",
        "",
    ] + ([f"Not run: {x}" for x in skipped] + [""] if skipped else [])
    for m in modes:
        rows = by_mode[m]
        md += [f"## {m} mode", "", _fmt_table(list(rows.values())), ""]
        if all(n in rows for n, _ in WATERFALL):
            md += [f"### Waterfall ({m})", "", _fmt_waterfall(rows), ""]
    text = "\n".join(md)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text + "\n")
    if all(all(n in by_mode[m] for n, _ in WATERFALL) for m in modes):
        _plot(by_mode, os.path.join(a.out, "waterfall.png"))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
