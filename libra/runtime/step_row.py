"""What one ``libra-run`` step reports: its ``steps.csv`` row and its log line.

The row's columns are documented in docs/runtime.md ("Outputs"); ``libra-sim replay``'s
fidelity comparison and the plots read them by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from libra.planner.plan import Plan

#: the task kinds a row reports a mean reward for
REWARD_KINDS: tuple[str, ...] = ("math", "math2", "search")


def step_row(cfg: Any, step: int, plan: Plan, eps: list[Any], ro: Any, tr: dict[str, float], train_dp: int, trainer_restarts: int,
             plan_s: float, setup_s: float, sync_s: float, ck_s: float, step_s: float, rewards: list[float],
             stream: Any = None) -> dict[str, Any]:
    """The step's ``steps.csv`` row: ``ro`` the rollout's ``RolloutResult``, ``tr`` the update's
    stats, ``stream`` the streamed update's result (None: trained after the rollout)."""
    mig = ro.migrations
    streamed = {"streaming": 1 if stream is not None else 0, "train_overlap_s": stream.overlap_s if stream is not None else 0.0,
                "helper_samples": stream.helper_samples if stream is not None else 0,
                "join_s": stream.join_s if stream is not None else math.nan, "lend_declined": ro.lend_declined}
    return {**streamed,
        "step": step, "policy": cfg.policy, "n_rollout": plan.n_rollout_gpus, "n_train": plan.n_train_gpus,
        "rollout_tps": "/".join(str(i.tp) for i in plan.instances), "train_dp": train_dp,
        "zero_stage": (cfg.zero_stage or plan.train.zero_stage) if cfg.trainer == "deepspeed" else 0,
        "trajectories": len(eps), "reward_mean": float(np.mean(rewards)), "reward_std": float(np.std(rewards)),
        **{f"reward_{k}": float(np.mean([r for e, r in zip(eps, rewards) if e.task.kind == k] or [math.nan])) for k in REWARD_KINDS},
        "used_tool": float(np.mean([any(t.tool for t in e.turns) for e in eps])), "tool_calls": ro.tool_calls,
        "tool_errors": ro.tool_errors, "tool_timeouts": ro.tool_timeouts, "gen_tokens": ro.gen_tokens,
        "prefill_tokens": ro.prefill_tokens, "cached_tokens": ro.cached_tokens, "trained_tokens": int(tr.get("tokens", 0) * train_dp),
        "plan_s": plan_s, "rollout_s": ro.makespan_s, "train_s": tr["train_s"], "logprob_s": tr["logprob_s"], "sync_s": sync_s,
        "checkpoint_s": ck_s, "setup_s": setup_s, "step_s": step_s, "gen_tok_s": ro.gen_tokens / max(ro.makespan_s, 1e-9),
        "engine_busy_s": sum(ro.engine_busy_s.values()),
        "engine_util": sum(ro.engine_busy_s.values()) / max(ro.makespan_s * max(len(plan.instances), 1), 1e-9),
        "train_tok_s": tr.get("tokens", 0) * train_dp / max(tr["train_s"], 1e-9), "migrations": len(mig), "migration_tokens": sum(m.tokens for m in mig),
        "migration_s": sum(m.measured_s for m in mig), "migration_pred_kv_s": sum(m.predicted_kv_s for m in mig),
        "migration_pred_prefill_s": sum(m.predicted_prefill_s for m in mig), "moves_without_kv": ro.moves_without_kv, "routed": ro.routed, "rerouted": ro.rerouted,
        "recovered": ro.recovered, "faults_unfired": len(ro.faults_unfired), "trainer_restarts": trainer_restarts, "lent": len(ro.lent), "loss": tr.get("loss", math.nan),
        "clip_frac": tr.get("clip_frac", math.nan), "kl": tr.get("kl", math.nan), "behav_weight": tr.get("behav_weight", math.nan),
        "behav_truncated": tr.get("behav_truncated", math.nan), "predicted_rollout_s": plan.predicted_rollout_s,
        "predicted_train_s": plan.predicted_train_s, "predicted_step_s": plan.predicted_step_s,
    }


def step_done_line(step: int, steps: int, row: dict[str, Any], ro: Any, sync_s: float, setup_s: float, step_s: float, streamed: bool,
                   progress_text: str) -> str:
    """The log line of a finished step: reward by kind, stage times, routing, lending; for an
    asynchronous step the overlap with the next rollout and the policy versions it trained on."""
    lend = f", lent {row['lent']} (helper samples {row['helper_samples']})" if streamed else ""
    if row.get("loop") == "async":
        overlap = f"update, sync and checkpoint {row['async_overlap_s']:.1f} s beside the next rollout"
        lend = (f"; trained at version {row['policy_version']} on samples of versions {row['sample_version_min']}-"
                f"{row['sample_version_max']} (staleness {row['staleness_max']} of {row['staleness_k']}, "
                f"{row['mixed_version_trajs']} trajectories across two versions)")
    else:
        overlap = f"{row['train_overlap_s']:.1f} s overlapping rollout"
    adm = " ".join(f"b{b}:{n}" for b, n in sorted(ro.admitted_by_bucket.items()))
    kinds = ", ".join(f"{k} {row['reward_' + k]:.2f}" for k in REWARD_KINDS if row["reward_" + k] == row["reward_" + k])
    return (f"step {step} ({step + 1}/{steps}) done ({progress_text}): "
            f"reward {row['reward_mean']:.3f} ({kinds}); rollout {row['rollout_s']:.1f} s, train {row['train_s']:.1f} s "
            f"({overlap}), sync {sync_s:.2f} s, step {step_s:.1f} s"
            f"{f' (incl. {setup_s:.1f} s placing actors)' if setup_s >= 0.5 else ''}, "
            f"{row['gen_tok_s']:.0f} gen tok/s{lend}; routing: admitted {adm}, {ro.routed} decisions at tool calls "
            f"({ro.rerouted} to another bucket), migrations {row['migrations']}")
