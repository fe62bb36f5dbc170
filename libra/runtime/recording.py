"""What a run leaves behind: the trace (TRACE_FORMAT v1, measured tool latencies and token
counts), a per-step metrics CSV, plots, and the record-then-replay fidelity table."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from libra.trace.records import TraceHeader, Trajectory
from libra.trace.writer import write_trace

STEP_FIELDS: tuple[str, ...] = (
    "step", "policy", "n_rollout", "n_train", "rollout_tps", "train_dp", "zero_stage", "trajectories", "reward_mean", "reward_std",
    "reward_math", "reward_math2", "reward_search",
    "used_tool", "tool_calls", "tool_errors", "tool_timeouts", "gen_tokens", "prefill_tokens", "cached_tokens", "trained_tokens",
    "plan_s", "rollout_s", "train_s", "logprob_s", "sync_s", "checkpoint_s", "setup_s", "step_s", "gen_tok_s", "engine_busy_s", "engine_util", "train_tok_s",
    "migrations", "migration_tokens", "migration_s", "migration_pred_kv_s", "migration_pred_prefill_s", "moves_without_kv", "routed", "rerouted", "recovered",
    "trainer_restarts", "streaming", "train_overlap_s", "lent", "lend_declined", "helper_samples", "join_s", "loss", "clip_frac", "kl", "predicted_rollout_s", "predicted_train_s", "predicted_step_s",
)


def write_run_trace(path: str, trajectories: Sequence[Trajectory], model: str, gpu: str, devices: int, policy: str) -> int:
    """The run's trace so far (rewritten whole each step; the writer renames it into place)."""
    header = TraceHeader(workload="libra-run", model=model, source="libra-run (measured on a real executor)",
                         metadata={"gpu": gpu, "devices": devices, "policy": policy})
    return write_trace(path, sorted(trajectories, key=lambda t: (t.step, t.id)), header)


def write_steps_csv(path: str, rows: Sequence[dict[str, Any]]) -> None:
    """One row per RL step (``STEP_FIELDS``)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(STEP_FIELDS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def plot_steps(out_dir: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """reward.png (reward per step) and stages.png (stage times per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return []
    steps = [r["step"] for r in rows]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.2))
    window = max(1, min(10, len(rows) // 5))

    def trailing(vals: list[float]) -> list[float]:
        """Mean of the last ``window`` steps that have a value (a kind may be absent from a step)."""
        out = []
        for i in range(len(vals)):
            seen = [v for v in vals[max(0, i - window + 1) : i + 1] if v == v]
            out.append(sum(seen) / len(seen) if seen else math.nan)
        return out

    # per task kind: a step's mean moves with its random mix of kinds, each kind's own reward less
    series = [("all", [float(r["reward_mean"]) for r in rows], "black")]
    for kind, color in (("math", "tab:blue"), ("math2", "tab:green"), ("search", "tab:orange")):
        vals = [float(r.get(f"reward_{kind}", math.nan)) for r in rows]
        if any(v == v for v in vals):
            series.append((kind, vals, color))
    for name, vals, color in series:
        ax.plot(steps, vals, marker=".", linewidth=0.5, alpha=0.35, color=color)
        ax.plot(steps, trailing(vals), linewidth=2, color=color, label=f"{name} ({window}-step mean)" if window > 1 else name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.set_title("training reward per step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "reward.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3))
    bottom = [0.0] * len(rows)
    for key in ("setup_s", "plan_s", "rollout_s", "train_s", "sync_s", "checkpoint_s"):
        vals = [float(r.get(key) or 0.0) for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=key[:-2])
        bottom = [a + b for a, b in zip(bottom, vals)]
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    ax.set_title("step time by stage")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "stages.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def replay_fidelity(out_dir: str, trace: str, rows: Sequence[dict[str, Any]], devices: int, per_node: int, gpu: str, model: str,
                    policy: str, timeout_s: float = 600, calibration: str | None = None, streaming: bool = False,
                    mini_batches: int = 1, max_context: int | None = None, max_train_gpus: int | None = None) -> list[dict[str, Any]]:
    """Replay ``trace`` with ``libra-sim replay`` on the same devices and policy (no noise) and
    write ``fidelity.csv``: measured and simulated rollout/train/step seconds per step.

    ``calibration`` (the run's ``calibration`` key) is passed on as ``--calibration``, so the
    simulator predicts with the same operator timings as the run's planner did; without it a
    replay on ``cpu`` would use the CPU roofline guess and the comparison would measure that.

    ``streaming`` (the run trained mini-batches while its rollout drained) replays with
    ``--streaming --mini-batches M``, so the simulated step overlaps the same way, and the measured
    step is rollout + train - train_overlap_s + sync. The simulated step is the simulator's own
    ``step_s`` when streaming (its training overlaps its rollout), else rollout + train + sync.

    ``max_train_gpus`` (1 for the torch trainer, a single worker) is passed on as
    ``--max-train-gpus``, so the replay's policy plans for the same training backend the run had.

    Run as a subprocess: the simulator is its own program and the runtime does not import it.
    """
    rdir = os.path.join(out_dir, "replay")
    cmd = [sys.executable, "-m", "sim.cli", "replay", trace, "--gpus", str(devices), "--gpus-per-node", str(per_node), "--gpu", gpu,
           "--model", model, "--policy", policy, "--noise", "0", "--out", rdir]
    # batch mode: one mini-batch (the simulator's update time does not depend on the count)
    cmd += ["--streaming", "--mini-batches", str(max(1, mini_batches))] if streaming else ["--mini-batches", "1"]
    if max_context:  # the run planned its first step with the prior scaled into its context cap
        cmd += ["--max-context", str(int(max_context))]
    if max_train_gpus:  # the run's training backend uses at most this many devices
        cmd += ["--max-train-gpus", str(int(max_train_gpus))]
    if calibration:
        cmd += ["--calibration", os.path.abspath(calibration)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"libra-sim replay failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    sim_rows = {int(r["step"]): r for r in read_csv(os.path.join(rdir, "steps.csv"))}
    out = []
    for r in rows:
        s = sim_rows.get(int(r["step"]))
        if s is None:
            continue

        def f(x: Any) -> float:
            try:
                return float(x)
            except (TypeError, ValueError):
                return math.nan

        m_roll, m_train = f(r["rollout_s"]), f(r["train_s"])
        streamed = streaming and f(r.get("streaming", 0)) == 1  # a colocated step does not stream (here or simulated)
        overlap = f(r.get("train_overlap_s", 0.0)) if streamed else 0.0
        m_step = m_roll + m_train - (overlap if overlap == overlap else 0.0) + f(r["sync_s"])
        s_roll, s_train, s_sync = f(s["rollout_makespan_s"]), f(s["train_s"]), f(s["sync_s"])
        s_step = s_roll + s_train + s_sync
        if streamed:  # the simulated training overlapped its rollout: its critical path
            s_step = s_roll + s_sync + max(0.0, f(s["train_start_s"]) + s_train - f(s["rollout_start_s"]) - s_roll)
        out.append({"step": r["step"], "measured_rollout_s": m_roll, "sim_rollout_s": s_roll, "measured_train_s": m_train,
                    "sim_train_s": s_train, "measured_sync_s": f(r["sync_s"]), "sim_sync_s": s_sync, "measured_step_s": m_step,
                    "sim_step_s": s_step, "step_ratio_sim_over_measured": s_step / m_step if m_step > 0 else math.nan,
                    "sim_n_rollout": s.get("n_rollout_gpus"), "sim_n_train": s.get("n_train_gpus")})
    if out:
        with open(os.path.join(out_dir, "fidelity.csv"), "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(out[0]))
            w.writeheader()
            for row in out:
                w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    return out
