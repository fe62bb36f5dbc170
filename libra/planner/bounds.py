"""The rollout makespan lower bound of a step: the simulator reports makespan / lower bound,
and the static baselines (``libra.policies``) rank and prune candidate configurations with it.
It lives in the policy core because both use it (``sim`` imports the core, never the reverse).

``max(critical path, work / capacity)`` where

* **critical path**: the slowest trajectory run alone at its fastest TP (each trajectory picks
  the TP minimising its own time, among TPs whose KV cache holds it): its prefills and decodes
  at batch 1 plus its tool latencies (the same resolved latencies the replay uses). No schedule
  can finish the step before that trajectory does.
* **work / capacity**: the step's GPU-seconds at the most efficient configuration (for each TP,
  decode at the largest batch the KV cache admits at the step's mean context and the step's
  trajectories per instance allow, plus prefill per token), divided by the GPUs the plan gives rollout. The work term is an estimate of the best
  achievable efficiency, not a proof; it is exact for the cost model at that batch size.

Both are computed vectorized over the step's turns (no per-token loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libra.trace.columnar import StepArrays
from libra.planner.rollout_costs import RolloutCosts


@dataclass(frozen=True, slots=True)
class StepBound:
    """The two terms of the bound and the bound itself (seconds)."""

    critical_path_s: float
    work_s: float

    @property
    def bound_s(self) -> float:
        return max(self.critical_path_s, self.work_s)


def _turn_geometry(step: StepArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per turn: owning trajectory, tokens prefilled before it, context after that prefill."""
    owner = np.repeat(np.arange(step.n), step.n_turns)
    per_turn = step.gen_tokens + step.tool_tokens
    csum = np.cumsum(per_turn) - per_turn  # exclusive, global
    first = step.turn_offsets[:-1]
    start_of_owner = csum[first][owner] if len(owner) else csum
    before = step.prompt_tokens[owner] + (csum - start_of_owner)  # context before this turn's gen
    new = np.empty_like(before)
    if len(new):
        new[:] = np.concatenate(([0], step.tool_tokens[:-1]))
        new[first] = step.prompt_tokens
    return owner, new, before - new, before


def _vec(fn, *args: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Call a cost function on arrays; fall back to a loop if it is scalar-only."""
    try:
        out = np.asarray(fn(*args), dtype=float)
        if out.shape == np.broadcast(*args).shape:
            return out
    except (TypeError, ValueError):
        pass
    return np.array([float(fn(*a)) for a in zip(*np.broadcast_arrays(*args))])


def step_bound(step: StepArrays, latencies: np.ndarray, costs: RolloutCosts, tps: Sequence[int], rollout_gpus: int) -> StepBound:
    """The lower bound of ``step``'s rollout on ``rollout_gpus`` GPUs, TPs among ``tps``."""
    if step.n == 0:
        return StepBound(0.0, 0.0)
    owner, new, cached, ctx0 = _turn_geometry(step)
    g = step.gen_tokens.astype(float)
    # sum over a turn's decoded tokens of the context each one reads
    ctx_sum = g * ctx0 + g * (g - 1) / 2
    tool_per_traj = np.bincount(owner, weights=latencies, minlength=step.n)
    total = step.total_tokens
    usable = [tp for tp in sorted(set(tps)) if costs.kv_capacity(tp) > 0]
    best_path = np.full(step.n, np.inf)
    best_work = np.inf
    n_tokens_ctx = float(ctx_sum.sum())
    G = float(g.sum())
    mean_ctx = float(np.mean(total))
    new_total = float(new.sum())
    memo = costs.memo
    for tp in usable:
        key = ("path", id(step), step.step, step.n, tp, float(tool_per_traj.sum()))
        path = memo.get(key)
        if path is None:
            base1, slope1 = costs.decode_coeffs(tp, 1)
            pre = _vec(costs.ev.prefill_s, np.full(len(new), tp), np.maximum(new, 0), cached, np.ones(len(new), int))
            pre[new == 0] = 0.0
            turn_t = pre + g * base1 + slope1 * ctx_sum
            path = memo[key] = np.bincount(owner, weights=turn_t, minlength=step.n) + tool_per_traj
        fits = total + 1 <= costs.kv_capacity(tp)
        best_path = np.where(fits, np.minimum(best_path, path), best_path)
        per_instance = -(-step.n // max(1, rollout_gpus // tp))
        B = int(max(1, min(costs.max_seqs(tp), costs.kv_capacity(tp) // max(mean_ctx, 1.0), per_instance)))
        baseB, slopeB = costs.decode_coeffs(tp, B)
        per_tok_prefill = costs.prefill_batch_s(tp, [(512, int(mean_ctx))]) / 512
        work = tp * (G * baseB / B + slopeB * n_tokens_ctx + per_tok_prefill * new_total)
        best_work = min(best_work, work)
    crit = float(np.max(np.where(np.isfinite(best_path), best_path, np.nan))) if np.isfinite(best_path).any() else float("nan")
    return StepBound(crit, best_work / max(rollout_gpus, 1))
