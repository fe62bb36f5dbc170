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
    "faults_unfired",
    "trainer_restarts", "plan_from_prior", "streaming", "train_overlap_s", "lent", "lend_declined", "helper_samples", "join_s", "loss", "clip_frac", "kl", "predicted_rollout_s", "predicted_train_s", "predicted_step_s",
    # the loop and its policy versions (``staleness``; the async loop: docs/runtime.md)
    "loop", "staleness_k", "policy_version", "sample_version_min", "sample_version_max", "staleness_max", "staleness_mean",
    "mixed_version_trajs", "behav_weight", "behav_truncated", "rollout_start_s", "rollout_end_s", "train_start_s", "step_end_s", "wait_s",
    "async_overlap_s", "async_step_s",
)


def model_hint(model_dir: str) -> str:
    """The header's model hint for a run's model folder: the folder's name (``tiny-policy`` for
    the bundled policy), never the absolute path of this machine, which means nothing on another
    one and leaks the user's directory layout into a shared trace. ``libra-sim replay`` of the
    trace takes ``--model PATH/config.json`` (the fidelity replay passes it)."""
    return os.path.basename(os.path.normpath(model_dir)) or "model"


def write_run_trace(path: str, trajectories: Sequence[Trajectory], model_dir: str, gpu: str, devices: int, policy: str,
                    max_context: int | None = None) -> int:
    """The run's trace so far (rewritten whole each step; the writer renames it into place).
    ``max_context`` (the run's context cap) is declared in the header, so a replay or a plan of
    the trace knows the workload's hard limit (``libra.trace.limits``)."""
    meta: dict[str, Any] = {"gpu": gpu, "devices": devices, "policy": policy}
    if max_context:
        meta["max_context"] = int(max_context)
    header = TraceHeader(workload="libra-run", model=model_hint(model_dir), source="libra-run (measured on a real executor)",
                         metadata=meta)
    return write_trace(path, sorted(trajectories, key=lambda t: (t.step, t.id)), header)


def progress(elapsed_s: float, step_times_s: Sequence[float], remaining: int) -> str:
    """``elapsed 0:18, ETA 0:07``: the ETA is the mean of the steps after the first times the
    steps left (the first one also places the actors, often 10x a later step); after one step
    only, that step's time is all there is."""
    from libra.plotting import format_duration

    later = list(step_times_s[1:]) or list(step_times_s[:1])
    eta = (sum(later) / len(later)) * remaining if later else math.nan
    tail = "done" if remaining <= 0 else (f"ETA {format_duration(eta)}" if eta == eta else "ETA unknown")
    return f"elapsed {format_duration(elapsed_s)}, {tail}"


def prune_checkpoints(ckpt_dir: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints in ``ckpt_dir`` (``stepNNNNNN.pt`` files
    of the torch trainer, ``stepNNNNNN`` folders of DeepSpeed; its ``latest`` file names the
    newest, which is always kept); returns what was removed. Without this a 100-step run leaves
    100 checkpoints (5.7 MB each for the 0.48M-parameter policy, GBs for a real model)."""
    import re
    import shutil

    if keep < 1 or not os.path.isdir(ckpt_dir):
        return []
    found = sorted(n for n in os.listdir(ckpt_dir) if re.fullmatch(r"step\d{6}(\.pt)?", n))
    removed = []
    for name in found[:-keep]:
        path = os.path.join(ckpt_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        removed.append(path)
    return removed


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


def plot_steps(out_dir: str, rows: Sequence[dict[str, Any]], heldout: dict[str, Any] | None = None) -> list[str]:
    """reward.png (training reward per step, and the held-out evaluation before and after the
    run when ``heldout`` has both) and stages.png (where each step's time went)."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")  # a run writes files; it never opens a window
    import matplotlib.pyplot as plt

    if not rows:
        return []
    steps = [int(r["step"]) for r in rows]
    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
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
    title = "training reward per step (the step's own prompts, T = sampling temperature)"
    if heldout and heldout.get("before") and heldout.get("after"):
        b, a = float(heldout["before"]["reward"]), float(heldout["after"]["reward"])
        x0, x1 = steps[0] - 0.5, steps[-1] + 0.5
        ax.plot([x0, x1], [b, a], linestyle="--", color="tab:red", linewidth=1)
        ax.plot([x0], [b], marker="D", color="tab:red", markersize=7, linestyle="none",
                label=f"held-out before {b:.3f} ({int(heldout['before']['n'])} episodes)")
        ax.plot([x1], [a], marker="*", color="tab:red", markersize=11, linestyle="none", label=f"held-out after {a:.3f}")
        title = "training reward per step; held-out reward before and after"
    ax.set_xlabel("RL step")
    _integer_steps(ax)
    ax.set_ylabel("mean reward")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "reward.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    paths.append(plot_stages(out_dir, rows))
    return paths


def _integer_steps(ax: Any) -> None:
    """Step axes tick at whole steps only."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_stages(out_dir: str, rows: Sequence[dict[str, Any]]) -> str:
    """stages.png: each step as a timeline bar from its start (bottom) to its end. Training that
    overlapped the rollout (streaming) is drawn beside the rollout over the seconds it overlapped,
    not stacked on top (stacking would make the step look longer than it was). Setting up actors
    (step 0, and any step that re-placed them) is drawn in its own panel: at step 0 it is ~10x a
    later step and would flatten every other bar."""
    import matplotlib.pyplot as plt

    from libra.plotting import time_unit

    steps = [int(r["step"]) for r in rows]

    def f(r: dict[str, Any], k: str) -> float:
        try:
            v = float(r.get(k) or 0.0)
        except (TypeError, ValueError):
            return 0.0
        return v if v == v else 0.0

    setups = [f(r, "setup_s") for r in rows]
    spans = []
    for r in rows:
        t = f(r, "plan_s")
        roll = (t, t + f(r, "rollout_s"))
        overlap = min(f(r, "train_overlap_s"), f(r, "train_s"), f(r, "rollout_s"))
        train = (roll[1] - overlap, roll[1] - overlap + f(r, "train_s"))
        sync = (max(roll[1], train[1]), max(roll[1], train[1]) + f(r, "sync_s"))
        ck = (sync[1], sync[1] + f(r, "checkpoint_s"))
        spans.append(((0.0, t), roll, train, sync, ck, overlap))
    div, unit = time_unit([sp[4][1] for sp in spans])
    fig, (ax0, ax) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [1, 4]})
    placed = [(s, v) for s, v in zip(steps, setups) if v > 0]
    sdiv, sunit = time_unit([v for _, v in placed])
    if placed:
        ax0.bar([str(s) for s, _ in placed], [v / sdiv for _, v in placed], color="tab:gray")
    ax0.set_title("set-up (placing actors)", fontsize=8)
    ax0.set_xlabel("RL step")
    ax0.set_ylabel(sunit)
    colors = {"plan": "tab:purple", "rollout": "tab:blue", "train": "tab:orange", "sync": "tab:green", "checkpoint": "tab:brown"}
    for x, (plan, roll, train, sync, ck, overlap) in zip(steps, spans):
        for name, (a, b), dx, w in (("plan", plan, 0.0, 0.8), ("rollout", roll, -0.2 if overlap > 0 else 0.0, 0.4 if overlap > 0 else 0.8),
                                    ("train", train, 0.2 if overlap > 0 else 0.0, 0.4 if overlap > 0 else 0.8),
                                    ("sync", sync, 0.0, 0.8), ("checkpoint", ck, 0.0, 0.8)):
            if b > a:
                ax.bar(x + dx, (b - a) / div, bottom=a / div, width=w, color=colors[name],
                       label=name if x == steps[0] or name == "train" else None)
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, Any] = {}
    for h, lab in zip(handles, labels):
        seen.setdefault(lab, h)
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("RL step")
    _integer_steps(ax)
    ax.set_ylabel(f"{unit} from the step's start")
    streamed = any(sp[5] > 0 for sp in spans)
    ax.set_title("step timeline" + (" (train beside rollout = overlapped, streaming)" if streamed else ""), fontsize=8)
    fig.suptitle("libra-run: where each step's time went (measured)", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, "stages.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_fidelity(out_dir: str, fidelity: Sequence[dict[str, Any]]) -> str:
    """fidelity.png: measured (libra-run) against SIMULATED (libra-sim replay of the run's trace)
    step, rollout and train seconds per step."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from libra.plotting import time_unit

    steps = [int(r["step"]) for r in fidelity]
    keys = ("step", "rollout", "train")
    div, unit = time_unit([float(r[f"{w}_{k}_s"]) for r in fidelity for k in keys for w in ("measured", "sim")])
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), sharex=True)
    for ax, k in zip(axes, keys):
        ax.plot(steps, [float(r[f"measured_{k}_s"]) / div for r in fidelity], marker=".", color="black", label="measured")
        ax.plot(steps, [float(r[f"sim_{k}_s"]) / div for r in fidelity], marker=".", color="tab:red", linestyle="--", label="SIMULATED")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("RL step")
        _integer_steps(ax)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"measured (libra-run) vs SIMULATED (libra-sim replay of the run's trace): {fidelity_line(fidelity)}", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "fidelity.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fidelity_line(fidelity: Sequence[dict[str, Any]]) -> str:
    """One line for the whole run: simulated / measured, mean over steps, for step, rollout and
    train (the per-step values are in fidelity.csv)."""

    def ratio(k: str) -> str:
        vals = [float(r[f"sim_{k}_s"]) / float(r[f"measured_{k}_s"]) for r in fidelity
                if float(r[f"measured_{k}_s"]) > 0 and float(r[f"sim_{k}_s"]) == float(r[f"sim_{k}_s"])]
        return f"{sum(vals) / len(vals):.2f}x" if vals else "-"

    return (f"simulated/measured over {len(fidelity)} step(s): step {ratio('step')}, rollout {ratio('rollout')}, "
            f"train {ratio('train')}")


def replay_fidelity(out_dir: str, trace: str, rows: Sequence[dict[str, Any]], devices: int, per_node: int, gpu: str, model: str,
                    policy: str, timeout_s: float = 600, calibration: str | None = None, streaming: bool | None = False,
                    mini_batches: int = 1, max_context: int | None = None, max_train_gpus: int | None = None,
                    engine_profile: str | None = None, split: tuple[int, int] | None = None,
                    bucket_bounds: Sequence[int] | None = None, seed: int | None = None, kl_coef: float = 0.0,
                    max_staleness: int = 0) -> list[dict[str, Any]]:
    """Replay ``trace`` with ``libra-sim replay`` on the same devices and the same policy (no
    noise) and write ``fidelity.csv``: measured and simulated rollout/train/step seconds per step.

    The same policy means the policy built with the run's options, so that each step is compared
    with the simulation of the same plan: ``split``/``bucket_bounds`` (the run's pin, part of its
    policy: ``libra.policies.pinned``) go on as ``--plan-split``/``--bucket-bounds``, ``seed``
    and ``kl_coef`` as ``--seed``/``--kl``, ``mini_batches`` as ``--mini-batches`` (the planner
    prices the streamed loop with it). ``streaming`` is the run's pin of the loop: True/False go
    on as ``--streaming``/``--no-streaming``; None (the run followed each plan's own choice)
    passes neither, so the replayed policy chooses the loop the same way.

    ``calibration`` (the run's ``calibration`` key) is passed on as ``--calibration``, so the
    simulator predicts with the same operator timings as the run's planner did; without it a
    replay on ``cpu`` would use the CPU roofline guess and the comparison would measure that.

    A step the run streamed (its ``streaming`` column) is measured as rollout + train -
    train_overlap_s + sync; a step the simulator streamed (its ``mode`` sync+streaming) is
    simulated as its critical path (training overlaps its rollout), else rollout + train + sync.

    ``max_staleness`` (the run's staleness class K) goes on as ``--max-staleness``, so the
    replayed policy may plan the same asynchronous loop. An async step (the run's ``loop``
    column, the simulator's ``mode``) overlaps its update with the next rollout, so its step is
    the time between the ends of consecutive steps' weight syncs on both sides: the run's
    ``async_step_s`` (from its rollout's start for the first step: planning and placing actors
    are free in the simulator) and the simulator's ``step_s``.

    ``max_train_gpus`` (1 for the torch trainer, a single worker) is passed on as
    ``--max-train-gpus``, so the replay's policy plans for the same training backend the run had.
    ``engine_profile`` (the run's ``engine_profile`` key) is passed on as ``--engine``, so the
    replay times rollouts with the same engine profile as the run's planner.

    Run as a subprocess: the simulator is its own program and the runtime does not import it.
    """
    rdir = os.path.join(out_dir, "replay")
    cmd = [sys.executable, "-m", "sim.cli", "replay", trace, "--gpus", str(devices), "--gpus-per-node", str(per_node), "--gpu", gpu,
           "--model", model, "--policy", policy, "--noise", "0", "--out", rdir, "--mini-batches", str(max(1, mini_batches))]
    if streaming is not None:  # the user pinned the loop; else the replayed policy chooses as the run's did
        cmd += ["--streaming" if streaming else "--no-streaming"]
    if split is not None:
        cmd += ["--plan-split", f"{int(split[0])}:{int(split[1])}"]
    if bucket_bounds:
        cmd += ["--bucket-bounds", ",".join(str(int(b)) for b in bucket_bounds)]
    if seed is not None:
        cmd += ["--seed", str(int(seed))]
    if max_staleness:  # libra-run's async loop runs each step's rollout as a batch: replay that loop
        cmd += ["--max-staleness", str(int(max_staleness)), "--async-generation", "per-step"]
    if kl_coef:
        cmd += ["--kl", repr(float(kl_coef))]
    if max_context:  # the run planned its first step with the prior scaled into its context cap
        cmd += ["--max-context", str(int(max_context))]
    if max_train_gpus:  # the run's training backend uses at most this many devices
        cmd += ["--max-train-gpus", str(int(max_train_gpus))]
    if calibration:
        cmd += ["--calibration", os.path.abspath(calibration)]
    if engine_profile:  # a bundled name, or a file (made absolute: the replay may run elsewhere)
        cmd += ["--engine", os.path.abspath(engine_profile) if os.path.isfile(engine_profile) else engine_profile]
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
        streamed = f(r.get("streaming", 0)) == 1  # the loop this step ran (a colocated step does not stream)
        overlap = f(r.get("train_overlap_s", 0.0)) if streamed else 0.0
        m_step = m_roll + m_train - (overlap if overlap == overlap else 0.0) + f(r["sync_s"])
        m_loop = str(r.get("loop") or ("sync+streaming" if streamed else "sync"))
        if m_loop == "async":  # between the ends of consecutive syncs (see the docstring)
            m_step = f(r.get("async_step_s"))
        s_roll, s_train, s_sync = f(s["rollout_makespan_s"]), f(s["train_s"]), f(s["sync_s"])
        s_step = s_roll + s_train + s_sync
        sim_streamed = s.get("mode") == "sync+streaming"
        if sim_streamed:  # the simulated training overlapped its rollout: its critical path
            s_step = s_roll + s_sync + max(0.0, f(s["train_start_s"]) + s_train - f(s["rollout_start_s"]) - s_roll)
        elif s.get("mode") == "async":
            s_step = f(s["step_s"])
        out.append({"step": r["step"], "measured_rollout_s": m_roll, "sim_rollout_s": s_roll, "measured_train_s": m_train,
                    "sim_train_s": s_train, "measured_sync_s": f(r["sync_s"]), "sim_sync_s": s_sync, "measured_step_s": m_step,
                    "sim_step_s": s_step, "step_ratio_sim_over_measured": s_step / m_step if m_step > 0 else math.nan,
                    "sim_n_rollout": s.get("n_rollout_gpus"), "sim_n_train": s.get("n_train_gpus"),
                    "same_split": int(str(r.get("n_rollout")) == str(s.get("n_rollout_gpus")) and str(r.get("n_train")) == str(s.get("n_train_gpus"))),
                    "measured_loop": m_loop, "sim_loop": s.get("mode", ""), "measured_staleness_max": r.get("staleness_max", ""),
                    "sim_staleness": s.get("staleness", "")})
    if out:
        with open(os.path.join(out_dir, "fidelity.csv"), "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(out[0]))
            w.writeheader()
            for row in out:
                w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    return out
