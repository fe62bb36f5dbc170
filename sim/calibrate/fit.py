"""Per-stage overheads fitted on logged against predicted stage times.

For each stage, ``logged ~ scale * predicted + fixed_s`` by non-negative least squares over the
steps (``scipy.optimize.nnls``); the fixed part is fitted only when the predictions vary enough
across steps to tell it from the scale (coefficient of variation >= ``MIN_CV`` over >= 3 steps),
else ``scale`` alone (through the origin). The rollout gets a scale only (a per-iteration fixed
cost belongs to the engine profile). The ``step`` stage is fitted on what is left of a
synchronous step after its logged stages (reward, advantage, data movement) against the
predicted per-step bookkeeping (``step_fixed_s``); async steps overlap their stages, so it is
not fitted there. Stage names map onto ``cost_models.calibration.stages.STAGES``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.calibrate.replay import StageTimes

MIN_CV = 0.05
#: log stage -> the evaluator's stage it calibrates
TO_EVALUATOR: dict[str, str] = {"gen": "rollout", "log_prob": "log_prob", "update": "update", "sync": "sync", "step": "step"}


@dataclass(frozen=True)
class StageResult:
    """One stage: how many steps had it, mean logged and predicted seconds, mean absolute
    percentage error before and after the fit, and the fit."""

    stage: str
    n: int
    logged_s: float
    predicted_s: float
    mape_before: float
    mape_after: float
    scale: float
    fixed_s: float


def _pairs(stage: str, pred: Sequence[StageTimes], logged: Sequence[StageTimes], sync_loop: bool) -> tuple[np.ndarray, np.ndarray]:
    p, lg = [], []
    for a, b in zip(pred, logged):
        if stage == "step":
            if not sync_loop:
                continue
            rest = b.step_s - sum(b.get(s) for s in ("gen", "log_prob", "update", "sync"))
            x, y = a.fixed, rest
        else:
            x, y = a.get(stage), b.get(stage)
        if math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0:
            p.append(x)
            lg.append(y)
    return np.asarray(p), np.asarray(lg)


def fit_stage(stage: str, pred: Sequence[StageTimes], logged: Sequence[StageTimes], sync_loop: bool) -> StageResult | None:
    """The fit of one stage (None when no step has it both logged and predicted)."""
    from scipy.optimize import nnls

    p, y = _pairs(stage, pred, logged, sync_loop)
    if len(p) == 0:
        return None
    can_fix = stage != "gen" and len(p) >= 3 and float(np.std(p) / np.mean(p)) >= MIN_CV
    if can_fix:
        (scale, fixed), _ = nnls(np.column_stack([p, np.ones_like(p)]), y)
    else:
        scale, fixed = float(np.dot(p, y) / np.dot(p, p)), 0.0
    scale = float(min(max(scale, 1e-3), 99.0))
    after = scale * p + fixed
    return StageResult(stage, len(p), float(y.mean()), float(p.mean()), float(np.mean(np.abs(p - y) / y)),
                       float(np.mean(np.abs(after - y) / y)), scale, float(fixed))
