"""Workload characterization from the bundled traces: tool calls vs length, rollout vs training
time as output length grows, and length drift across steps.

    .venv/bin/python experiments/workload_characterization.py [--size smoke|quick|full] [--out experiments/results]

The paper motivates Libra with three observations; this script reads them off the bundled
traces (synthetic, traces/README.md) and the cost model: (1) trajectories that call more tools
are longer, (2) as output length grows rollout time grows faster than training time (decode is
sequential per trajectory, training is parallel over tokens), so rollout dominates the step,
(3) lengths drift as training proceeds, so a plan made once goes stale. Trace statistics are
the traces' own; the times in (2) are cost-model predictions (48 A800, Qwen3-14B), no replay.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exp_common import BUNDLED, TRACES, Context, Figure, Section, finish_figure, md_table, pick, pyplot, script_main, sha256_file, write_csv

NAME = "workload_characterization"
TITLE = "Workload characterization (bundled traces; times are cost-model predictions)"
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def steps_for(size: str) -> str | None:
    return pick(size, "0:1", None, None)


def inputs(size: str) -> dict[str, Any]:
    return {"traces": {f: sha256_file(TRACES / f) for _, f, _ in BUNDLED}, "steps": steps_for(size), "lengths": LENGTHS}


def trace_rows(size: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-trajectory (workload, tool calls, final tokens) and per-step length statistics."""
    from sim.replay import load_steps

    traj, per_step = [], []
    for wl, fname, _ in BUNDLED:
        steps, _ = load_steps(str(TRACES / fname), steps_for(size))
        for s in steps:
            calls = np.add.reduceat((s.tool_code >= 0).astype(np.int64), s.turn_offsets[:-1]) if len(s.tool_code) else np.zeros(s.n)
            tot = s.total_tokens
            gen = s.total_gen_tokens
            per_step.append({"workload": wl, "step": s.step, "n": s.n, "gen_median": float(np.median(gen)),
                             "gen_p90": float(np.percentile(gen, 90)), "total_median": float(np.median(tot)),
                             "total_p99": float(np.percentile(tot, 99)), "tool_calls_mean": float(np.mean(calls)),
                             "reward_mean": float(np.nanmean(s.reward)) if np.isfinite(s.reward).any() else float("nan")})
            for c, t in zip(calls.tolist(), tot.tolist()):
                traj.append({"workload": wl, "step": s.step, "tool_calls": int(c), "total_tokens": int(t)})
    return traj, per_step


def rollout_vs_train(gpu: str = "a800", model: str = "qwen3-14b", gpus: int = 48, batch: int = 512, prompt: int = 2048,
                     tp: int = 4) -> list[dict[str, Any]]:
    """Cost-model times of one step whose every trajectory generates ``L`` tokens: the rollout on
    half the GPUs at TP ``tp`` (every trajectory decoding together, closed form per iteration,
    batches limited by KV capacity) and the training stage on the other half (the decision
    tree's best strategy)."""
    from cost_models import CostEvaluator
    from libra.planner.decision_tree import DecisionTree
    from sim.commands.common import node_size

    ev = CostEvaluator(gpu, model)
    gpn = node_size(gpu)
    tree = DecisionTree(ev, gpn)
    half = gpus // 2
    inst = half // tp
    out = []
    for L in LENGTHS:
        per_inst = int(np.ceil(batch / inst))
        cap = ev.kv_capacity_tokens(tp)
        b = max(1, min(per_inst, int(cap // (prompt + L)), ev.max_running_seqs(tp)))
        waves = int(np.ceil(per_inst / b))
        base, slope = ev.decode_coeffs(tp, b)
        one_wave = L * float(base) + float(slope) * b * (L * prompt + L * (L - 1) / 2)
        rollout = waves * one_wave + float(ev.prefill_s(tp, prompt, 0, b)) * waves
        tokens = batch * (prompt + L)
        res = tree.best(half, tokens, prompt + L, prompt + L)
        train = res.best_time_s if res.best is not None else float("nan")
        out.append({"output_tokens": L, "rollout_s": rollout, "train_s": train, "rollout_share": rollout / (rollout + train),
                    "batch_per_instance": b, "waves": waves})
    return out


def run(ctx: Context) -> Section:
    traj, per_step = trace_rows(ctx.size)
    rvt = rollout_vs_train()
    agg = []
    for wl, _, _ in BUNDLED:
        c = np.array([r["tool_calls"] for r in traj if r["workload"] == wl])
        t = np.array([r["total_tokens"] for r in traj if r["workload"] == wl])
        for k in np.unique(c):
            tk = t[c == k]
            agg.append({"workload": wl, "tool_calls": int(k), "trajectories": int(len(tk)), "tokens_p10": float(np.percentile(tk, 10)),
                        "tokens_median": float(np.median(tk)), "tokens_p90": float(np.percentile(tk, 90))})
    write_csv(ctx.dir / "tool_calls_vs_length.csv", agg)
    write_csv(ctx.dir / "per_step.csv", per_step)
    write_csv(ctx.dir / "rollout_vs_train.csv", rvt)
    plt = pyplot()
    figs = []
    # (1) tool calls vs length
    fig, axes = plt.subplots(1, len(BUNDLED), figsize=(4.4 * len(BUNDLED), 3.2), squeeze=False)
    corr = {}
    for ax, (wl, _, _) in zip(axes[0], BUNDLED):
        sel = [r for r in traj if r["workload"] == wl]
        c = np.array([r["tool_calls"] for r in sel])
        t = np.array([r["total_tokens"] for r in sel])
        corr[wl] = float(np.corrcoef(c, t)[0, 1]) if len(sel) > 2 and c.std() > 0 else float("nan")
        med = [(k, float(np.median(t[c == k]))) for k in np.unique(c) if (c == k).sum() >= 5]
        show = np.random.default_rng(0).permutation(len(c))[:20000]  # a readable scatter; statistics use every trajectory
        ax.scatter(c[show] + np.random.default_rng(1).uniform(-0.25, 0.25, len(show)), t[show], s=2, alpha=0.15)
        ax.plot([k for k, _ in med], [m for _, m in med], "r-o", ms=3, label="median")
        ax.set_yscale("log")
        ax.set_title(f"{wl}: Pearson r = {corr[wl]:.2f}", fontsize=9)
        ax.set_xlabel("tool calls per trajectory")
        ax.set_ylabel("final context, tokens (SIMULATED trace)")
        ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "tool_calls_vs_length.png", "SIMULATED (synthetic traces): tool calls vs trajectory length")
    figs.append(Figure("tool_calls_vs_length.png", "SIMULATED: tool calls vs trajectory length",
                       "Every trajectory of the bundled traces (jittered), its number of tool calls against its final "
                       "context; red: the median length per call count. Longer trajectories call more tools: a router "
                       "that sees the calls so far learns something about the remaining length."))
    # (2) rollout vs training
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot([r["output_tokens"] for r in rvt], [r["rollout_s"] for r in rvt], "o-", label="rollout (24 GPUs, TP 4)")
    ax.plot([r["output_tokens"] for r in rvt], [r["train_s"] for r in rvt], "s-", label="training (24 GPUs, best strategy)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("output tokens per trajectory (512 trajectories, 2K prompt)")
    ax.set_ylabel("stage time, s (SIMULATED cost model)")
    ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "rollout_vs_train.png", "SIMULATED (cost-model prediction): rollout vs training time, Qwen3-14B, A800")
    figs.append(Figure("rollout_vs_train.png", "SIMULATED: rollout vs training time as output grows",
                       "Predicted time of the rollout and of the training stage of one step as every trajectory's output "
                       "grows (48 A800 split in half). Rollout grows faster: it decodes token by token, and longer "
                       "contexts shrink the batch the KV cache holds."))
    # (3) drift
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
    for wl, _, _ in BUNDLED:
        sel = [r for r in per_step if r["workload"] == wl]
        g0 = sel[0]["gen_median"] or 1.0
        axes[0].plot([r["step"] for r in sel], [r["gen_median"] / g0 for r in sel], "-o", ms=2, label=wl)
        axes[1].plot([r["step"] for r in sel], [r["total_p99"] for r in sel], "-o", ms=2, label=wl)
    axes[0].set_ylabel("median generated tokens / step 0's (SIMULATED trace)")
    axes[1].set_ylabel("p99 final context, tokens (SIMULATED trace)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "drift.png", "SIMULATED (synthetic traces): length drift across RL steps")
    figs.append(Figure("drift.png", "SIMULATED: length drift across steps",
                       "Median generated tokens per trajectory relative to the first step (left) and the p99 final "
                       "context (right), step by step. Drift is why Libra re-plans from recent steps."))
    drift = []
    for wl, _, _ in BUNDLED:
        sel = [r for r in per_step if r["workload"] == wl]
        drift.append((wl, len(sel), f"{sel[0]['gen_median']:.0f}", f"{sel[-1]['gen_median']:.0f}",
                      f"{sel[-1]['gen_median'] / max(sel[0]['gen_median'], 1):.2f}x", f"{corr[wl]:.2f}",
                      f"{np.mean([r['tool_calls_mean'] for r in sel]):.1f}"))
    cross = next((r["output_tokens"] for r in rvt if r["rollout_s"] > r["train_s"]), None)
    body = "\n".join([
        md_table(("trace", "steps read", "median gen tokens, first step", "last step", "drift", "r(tool calls, length)", "mean tool calls"), drift),
        "",
        "Rollout share of the two stages by output length: " + ", ".join(f"{r['output_tokens']}: {100 * r['rollout_share']:.0f}%" for r in rvt)
        + (f"; rollout exceeds training from {cross} output tokens on." if cross else "; training stays longer at every length here."),
    ])
    return Section(NAME, TITLE, "What the three bundled (synthetic) traces look like, and why rollout dominates agentic RL steps.",
                   figs, body, {}, ["tool_calls_vs_length.csv", "per_step.csv", "rollout_vs_train.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
