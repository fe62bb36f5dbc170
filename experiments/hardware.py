"""Hardware what-if: A800 vs H100 vs H200 vs B200 vs GB200 for one GPU budget; GPU-hours and
wall-clock per 1,000 RL steps.

    .venv/bin/python experiments/hardware.py [--size smoke|quick|full] [--out experiments/results]

The bundled SWE trace (Qwen3-14B) on the same number of GPUs of each kind (GB200: 4-GPU trays
in a 72-GPU NVLink domain), Libra and the on-policy baselines (K=0). Per GPU kind: throughput,
and the wall-clock hours and GPU-hours 1,000 RL steps would take at the replay's mean step time.
The replays run as a ``libra-sim sweep`` grid (``exp_common.sweep_grid``). SIMULATED replays; no
prices are assumed (GPU-hours, not dollars).
"""

from __future__ import annotations

from typing import Any

from exp_common import TRACES, Context, Figure, Section, finish_figure, fx, md_table, pick, pyplot, ratio, script_main, sweep_grid, \
    sweep_value, write_csv

NAME = "hardware"
TITLE = "Hardware what-if: five GPU kinds for one budget; cost of 1,000 RL steps"
POLICIES = ("libra", "verl-colocated", "verl-static-uniform")
TRACE, MODEL = "swe-qwen3-14b.jsonl.gz", "qwen3-14b"


def shape(size: str) -> dict[str, Any]:
    return pick(size, {"gpus": 16, "kinds": ("a800", "h100"), "steps": "0:1"},
                {"gpus": 64, "kinds": ("a800", "h100", "h200", "b200", "gb200"), "steps": "0:3"},
                {"gpus": 64, "kinds": ("a800", "h100", "h200", "b200", "gb200"), "steps": None})


def inputs(size: str) -> dict[str, Any]:
    return {"shape": shape(size), "policies": POLICIES}


def run(ctx: Context) -> Section:
    sh = shape(ctx.size)
    pols = POLICIES[:2] if ctx.size == "smoke" else POLICIES
    wl: dict[str, Any] = {"trace": str(TRACES / TRACE)}
    if sh["steps"]:
        wl["steps"] = sh["steps"]
    grid = {"name": f"hardware_{ctx.size}", "description": "GPU kinds for one budget (experiments/hardware.py)",
            "policies": list(pols), "subject": "libra", "workloads": {"swe-bundled": wl},
            "clusters": {f"{g}-{sh['gpus']}": {"gpus": sh["gpus"], "gpu": g, "model": MODEL} for g in sh["kinds"]},
            "sweeps": [{"workloads": ["swe-bundled"], "clusters": [f"{g}-{sh['gpus']}" for g in sh["kinds"]], "max_staleness": [0]}]}
    got = sweep_grid(ctx, f"hardware_{ctx.size}", grid)
    rs = []
    for g in sh["kinds"]:
        for p in pols:
            r = got.get((f"swe-bundled/{g}-{sh['gpus']}/K0/s0", p))
            step = sweep_value(r, "mean_step_s")
            rs.append({"gpu": g, "gpus": sh["gpus"], "policy": p, "status": r["status"] if r else "missing",
                       "throughput_tok_s": sweep_value(r, "throughput_tok_s"), "mean_step_s": step,
                       "wall_h_per_1000_steps": step * 1000 / 3600, "gpu_h_per_1000_steps": step * 1000 / 3600 * sh["gpus"],
                       "rollout_tps": r.get("rollout_tps") if r else "", "mode": r.get("mode") if r else "",
                       "error": r.get("error") if r else "not run"})
    write_csv(ctx.dir / "hardware.csv", rs)
    plt = pyplot()
    import numpy as np

    kinds = list(sh["kinds"])
    pols = list(dict.fromkeys(r["policy"] for r in rs))
    w = 0.8 / len(pols)
    figs = []
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, p in enumerate(pols):
        ax.bar(np.arange(len(kinds)) + i * w, [next(r["throughput_tok_s"] for r in rs if r["gpu"] == g and r["policy"] == p) for g in kinds], w, label=p)
    ax.set_xticks(np.arange(len(kinds)) + w, [g.upper() for g in kinds])
    ax.set_ylabel("generated tok/s (SIMULATED)")
    ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "hardware_throughput.png", f"SIMULATED throughput by GPU kind, {sh['gpus']} GPUs, {MODEL}, SWE trace")
    figs.append(Figure("hardware_throughput.png", "SIMULATED throughput by GPU kind",
                       f"The bundled SWE trace on {sh['gpus']} GPUs of each kind, per policy."))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, p in enumerate(pols):
        sel = [next(r for r in rs if r["gpu"] == g and r["policy"] == p) for g in kinds]
        axes[0].bar(np.arange(len(kinds)) + i * w, [r["wall_h_per_1000_steps"] for r in sel], w, label=p)
        axes[1].bar(np.arange(len(kinds)) + i * w, [r["gpu_h_per_1000_steps"] for r in sel], w, label=p)
    axes[0].set_ylabel("wall-clock h per 1,000 steps (SIMULATED)")
    axes[1].set_ylabel("GPU-hours per 1,000 steps (SIMULATED)")
    for ax in axes:
        ax.set_xticks(np.arange(len(kinds)) + w, [g.upper() for g in kinds])
        ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "hardware_cost.png", "SIMULATED cost of 1,000 RL steps by GPU kind")
    figs.append(Figure("hardware_cost.png", "SIMULATED cost of 1,000 RL steps",
                       "Wall-clock hours (left) and GPU-hours (right) of 1,000 RL steps at each replay's mean step time; the "
                       "same GPU count for every kind, so the two panels differ by that constant."))
    lib = {r["gpu"]: r for r in rs if r["policy"] == "libra"}
    base = lib[kinds[0]]
    body = ("Libra, 1,000 steps: " + "; ".join(f"{g.upper()} {lib[g]['wall_h_per_1000_steps']:.0f} h wall, "
                                                  f"{lib[g]['gpu_h_per_1000_steps']:,.0f} GPU-h ({fx(ratio(base['mean_step_s'], lib[g]['mean_step_s']))} "
                                                  f"faster than {kinds[0].upper()})" for g in kinds)
            + ". Libra against the best K=0 baseline per kind: "
            + ", ".join(f"{g.upper()} {fx(ratio(lib[g]['throughput_tok_s'], max(r['throughput_tok_s'] for r in rs if r['gpu'] == g and r['policy'] != 'libra')))}" for g in kinds)
            + ".\n\n" + md_table(("GPU", "policy", "gen tok/s", "mean step s", "h / 1,000 steps", "GPU-h / 1,000 steps", "rollout TPs", "loop"),
                                 [(r["gpu"], r["policy"], f"{r['throughput_tok_s']:,.0f}", f"{r['mean_step_s']:.1f}",
                                   f"{r['wall_h_per_1000_steps']:.1f}", f"{r['gpu_h_per_1000_steps']:,.0f}", r["rollout_tps"],
                                   r["mode"]) for r in rs]))
    return Section(NAME, TITLE, f"One GPU budget ({sh['gpus']} GPUs) of each kind running the bundled SWE trace.", figs, body, {},
                   ["hardware.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
