"""Stage overheads fitted on a user's own RL logs: ``logged ~ scale * predicted + fixed_s`` per
stage of an RL step, applied by the evaluator to every price it gives for that stage.

Why in the calibration file: the planner and the simulator both price through one
``CostEvaluator``; a fitted stage correction carried by the calibration file (``--calibration``)
changes the planner's predictions and the simulator's charges alike, so a calibrated replay
still charges exactly what the planner predicts. The stages and the evaluator calls they scale:

* ``rollout``: decode and prefill iterations (``decode_s``, ``decode_coeffs``, ``prefill_s``);
  scale only (a per-iteration fixed term belongs to the engine profile);
* ``log_prob``: the forward-only log-prob pass (``forward_s``);
* ``update``: the optimizer step (``train_iter_s``);
* ``sync``: moving weights between the stages (``weight_sync_s``, ``stage_switch_s``);
* ``step``: the per-step bookkeeping between rollout and training (``step_fixed_s``).

Written by ``libra-calibrate from-logs`` (``sim.calibrate``); ``fixed_s`` is seconds per call,
and each of these calls happens once per step (sync: once per weight push or stage switch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cost_models.errors import CostModelError

STAGES: tuple[str, ...] = ("rollout", "log_prob", "update", "sync", "step")


@dataclass(frozen=True)
class StageFit:
    """``scale * predicted + fixed_s`` for one stage."""

    scale: float = 1.0
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and 0.0 < self.scale < 100.0):
            raise CostModelError(f"stage scale must be a number in (0, 100), got {self.scale!r}")
        if not (isinstance(self.fixed_s, (int, float)) and math.isfinite(self.fixed_s) and 0.0 <= self.fixed_s < 3600.0):
            raise CostModelError(f"stage fixed_s must be seconds in [0, 3600), got {self.fixed_s!r}")

    def apply(self, seconds: Any) -> Any:
        return seconds * self.scale + self.fixed_s


@dataclass(frozen=True)
class StageOverheads:
    """The fitted stages (absent: unchanged) and where they came from (``source``: the logs, the
    run, the fit's residuals)."""

    stages: dict[str, StageFit] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def get(self, stage: str) -> StageFit | None:
        return self.stages.get(stage)

    def to_json(self) -> dict[str, Any]:
        return {"stages": {k: {"scale": v.scale, "fixed_s": v.fixed_s} for k, v in self.stages.items()}, "source": self.source}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> StageOverheads:
        """Parse a ``stage_overheads`` entry; ``where`` names the file for the one-line error."""
        if not isinstance(obj, dict) or not isinstance(obj.get("stages"), dict):
            raise CostModelError(f"{where}: 'stage_overheads' must be an object with a 'stages' object")
        out: dict[str, StageFit] = {}
        for name, v in obj["stages"].items():
            if name not in STAGES:
                raise CostModelError(f"{where}: stage_overheads.stages.{name}: unknown stage; valid: {', '.join(STAGES)}")
            if not isinstance(v, dict) or set(v) - {"scale", "fixed_s"}:
                raise CostModelError(f"{where}: stage_overheads.stages.{name}: must be an object with scale and fixed_s")
            if name == "rollout" and v.get("fixed_s", 0.0):
                raise CostModelError(f"{where}: stage_overheads.stages.rollout: fixed_s must be 0 (a per-iteration term "
                                     "belongs to the engine profile)")
            try:
                out[name] = StageFit(scale=v.get("scale", 1.0), fixed_s=v.get("fixed_s", 0.0))
            except CostModelError as exc:
                raise CostModelError(f"{where}: stage_overheads.stages.{name}: {exc}") from None
        return cls(out, dict(obj.get("source") or {}))
