"""What a backend measured of a step it ran, and the planner's correction learned from it.

The planner's rollout load model is fast enough to search thousands of plans, and wrong by
15-60% against what a run (or a replay) of those plans takes: queueing behind full batches,
spills that do not pool the way its model assumes, instances that start late, tails that share
bigger batches than it charges (issue 11: math steps under-predicted ~1.6x, two-bucket plans
predicted 5-10% faster replayed 10-25% slower). A real system measures how long each of its
rollouts took, so the planner may learn from that, exactly as it learns lengths from past steps.

After a step, the backend reports a ``StepOutcome`` (the plan it executed, the step's
trajectories, its measured rollout time). The planner re-predicts that plan's rollout on that
step's own trajectories (``Planner.hindsight_rollout_s``: the same model, fed what actually
happened, so a step that ran long because its work was long is not mistaken for a model error)
and keeps ``measured / hindsight`` per layout kind (one bucket, two buckets). The next searches
multiply each candidate's predicted rollout by its kind's factor (``RolloutCalibration.factor``):
the median of that kind's recent ratios; a kind never run borrows the other kind's (the model's
bias is mostly shared, and a two-bucket layout still has to win by ``HETERO_MARGIN``); with no
measurement yet, 1. Factors are clipped to ``[FACTOR_MIN, FACTOR_MAX]`` so that one odd step
(a fault, a re-placement) cannot swing a plan far. With noise off and a perfect model every
ratio would be 1 and nothing changes.

**Did the split pay?** A two-bucket layout is chosen for a forecast gain over the best one-bucket
layout on the same GPUs, and that gain is the most fragile number the planner has: it lives in the
tail of the length forecast. After a step that ran two buckets, the planner re-predicts the best
one-bucket layout on that step's own trajectories too, scales it by the one-bucket factor (what
one bucket would have taken), and compares it with the measured two-bucket rollout: the realized
gain. ``forecast gain / realized gain`` is kept (``record_split``); later searches require a
two-bucket layout to beat one bucket by ``HETERO_MARGIN`` times its median (``split_scale``,
at least 1: a split that paid more than forecast earns no bonus, one that did not pay must
forecast that much more). On generated Search-R1 steps (32 H100, Qwen3-14B, K=1) a split forecast
15% faster than one bucket ran 4.5% slower, and the next step chose a split again (SIMULATED).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from libra.planner.plan import Plan
from libra.planner.rollout_dp import HETERO_MARGIN
from libra.planner.stats import group_longest, group_max
from libra.trace.columnar import StepArrays

#: How many recent ratios per layout kind the median is taken over.
CALIBRATION_WINDOW = 4
FACTOR_MIN = 0.5
FACTOR_MAX = 3.0


@dataclass(frozen=True)
class StepOutcome:
    """One step as the backend that ran it measured it (``libra-run``: wall-clock; the simulator:
    its simulated time, noise included). ``plan`` is the plan it executed; ``trajectories`` the
    step's completed trajectories, as the planner's history will hold them. Only the rollout is
    reported: it is what the planner corrects, and it is known when the next plan is made (in
    async mode the step's training is still running then)."""

    step: int
    plan: Plan
    trajectories: StepArrays
    rollout_s: float
    #: the rollout shared its engines with a neighbouring step's (async continuous generation):
    #: its time measures neither rollout alone, so the per-layout correction does not learn from
    #: it; the async pace does (``RolloutCalibration.pipelined_factor``)
    overlapped: bool = False
    #: each trajectory's finish, seconds from the rollout's start, aligned with ``trajectories``
    #: (None: the backend did not record them); the order groups complete in (``CompletionOrder``)
    finish_s: np.ndarray | None = None
    #: an overlapped rollout: the other steps' rollout time inside this one's, over its length (a
    #: time-weighted count of the steps it shared the engines with; what the pipeline model's
    #: shared rollout is a function of, ``libra.planner.pipeline.shared_rollout_s``). None: not
    #: measured (the async pace then compares the rollout with the full staleness cycle)
    overlap: float | None = None


def _ratio(num: float, den: float) -> float | None:
    """``num / den`` when both are finite and positive, else None (an unusable measurement)."""
    if not (num > 0 and den > 0) or not np.isfinite(num) or not np.isfinite(den):
        return None
    return float(num / den)


def _median_clipped(pool: deque[float], lo: float, hi: float) -> float:
    """The median of ``pool`` clipped to ``[lo, hi]``; 1 when it is empty (nothing measured)."""
    if not pool:
        return 1.0
    return float(np.clip(np.median(np.asarray(pool)), lo, hi))


def layout_kind(n_buckets: int) -> int:
    """The calibration class of a layout: 1 (one bucket) or 2 (two buckets)."""
    return 1 if n_buckets <= 1 else 2


@dataclass(frozen=True)
class RolloutCorrection:
    """What past steps say of the load model's rollouts, fixed for one search: the measured
    factor per layout kind and how far splits' forecast gains overstated what they realized
    (``RolloutCalibration.correction``). One object, so the outer loop, the time-shared candidate
    and the DP apply the same correction and the same two-bucket margin."""

    one_bucket: float = 1.0
    two_buckets: float = 1.0
    split_scale: float = 1.0
    #: async continuous generation: the multiplier on the model's staleness-cycle makespan and
    #: engine pace (``RolloutCalibration.pipelined_factor``)
    pipelined: float = 1.0

    def factor(self, n_buckets: int) -> float:
        """The multiplier on a predicted rollout of a layout of ``n_buckets`` buckets."""
        return self.one_bucket if layout_kind(n_buckets) == 1 else self.two_buckets

    def margin(self, n_buckets: int) -> float:
        """How much slower a layout's rollout is ranked: a two-bucket one must win by
        ``HETERO_MARGIN`` times ``split_scale`` against every one-bucket plan; one bucket: 1."""
        return (1.0 + HETERO_MARGIN) * self.split_scale if layout_kind(n_buckets) == 2 else 1.0

    @property
    def dp_scale(self) -> tuple[float, float]:
        """The per-kind scales ``RolloutDP.best`` compares layouts on (it adds ``HETERO_MARGIN``)."""
        return (self.one_bucket, self.two_buckets * self.split_scale)


class RolloutCalibration:
    """``measured / hindsight-predicted`` rollout times per layout kind (module docstring)."""

    def __init__(self, window: int = CALIBRATION_WINDOW) -> None:
        self.window = int(window)
        self._ratios: dict[int, deque[float]] = {1: deque(maxlen=self.window), 2: deque(maxlen=self.window)}
        self._split_shortfalls: deque[float] = deque(maxlen=self.window)
        self._pipelined: deque[float] = deque(maxlen=self.window)
        self.observed = 0

    def record(self, kind: int, measured_s: float, predicted_s: float) -> float | None:
        """Keep one step's ratio; returns it (None when either time is unusable)."""
        r = _ratio(measured_s, predicted_s)
        if r is not None:
            self._ratios[layout_kind(kind)].append(r)
            self.observed += 1
        return r

    def factor(self, kind: int) -> float:
        """The multiplier on a predicted rollout of a layout of ``kind`` buckets."""
        own = self._ratios[layout_kind(kind)]
        other = self._ratios[3 - layout_kind(kind)]
        return _median_clipped(own if own else other, FACTOR_MIN, FACTOR_MAX)

    def record_split(self, forecast_gain: float, realized_gain: float) -> float | None:
        """Keep how much a two-bucket step's forecast gain over one bucket overstated the gain it
        realized (module docstring); returns the ratio kept (None: unusable)."""
        r = _ratio(forecast_gain, realized_gain)
        if r is not None:
            self._split_shortfalls.append(r)
        return r

    def split_scale(self) -> float:
        """The multiplier on ``HETERO_MARGIN``'s required gain: the median overstatement of the
        recent two-bucket steps, clipped to ``[1, FACTOR_MAX]`` (1 before any ran)."""
        return _median_clipped(self._split_shortfalls, 1.0, FACTOR_MAX)

    def record_pipelined(self, measured_s: float, shared_s: float) -> float | None:
        """Keep one async step's measured rollout (from its admission to its last trajectory,
        sharing the engines with its neighbours) over the model's rollout of it fed its own
        trajectories (``Planner.hindsight_shared_s``: the rollout alone and the staleness cycle
        mixed by the overlap measured, the whole cycle where none was); returns the ratio kept
        (None: unusable)."""
        r = _ratio(measured_s, shared_s)
        if r is not None:
            self._pipelined.append(r)
        return r

    def pipelined_factor(self) -> float:
        """The multiplier on an async plan's rollout alone, staleness-cycle makespan and engine
        pace: the median of the recent ``record_pipelined`` ratios, clipped to ``[FACTOR_MIN,
        FACTOR_MAX]``; 1 before any async step ran.

        Why: a rollout that shares its engines measures neither rollout alone, so it teaches the
        per-layout factors nothing, and the async price rests on the model's cycle alone. In
        steady state a step shares the engines with the previous step's tail and the next one's
        start, so it spans longer than K + 1 steps started together: MiniSWE on 56 A800 at K = 1
        was priced at a 567 s cycle and its steps spanned 640-996 s; the split rested on that
        price and gave training 32 GPUs where the hindsight 24 ran 5% faster (held_out_27
        mini-swe/a800-56-14b/K1, SIMULATED). Since session 25 a step's rollout in the price is
        mixed from the rollout alone and the cycle by its overlap (``libra.planner.pipeline``),
        so the ratio compares the measured span with that mix at the overlap the backend
        measured (``StepOutcome.overlap``), and one factor on both parts keeps the mix's form:
        compared with the whole cycle, a step that shared the engines with one neighbour for a
        third of its time measured a ratio well below 1, which would have shrunk the partly
        overlapped price a second time."""
        return _median_clipped(self._pipelined, FACTOR_MIN, FACTOR_MAX)

    def correction(self) -> RolloutCorrection:
        """The factors and the split scale as they stand, for one search."""
        return RolloutCorrection(self.factor(1), self.factor(2), self.split_scale(), self.pipelined_factor())

    def summary(self) -> dict[str, float | int]:
        """The current factors and how many ratios back them (for plan notes and reports)."""
        return {"rollout_factor_1": self.factor(1), "rollout_factor_2": self.factor(2),
                "rollout_ratios_1": len(self._ratios[1]), "rollout_ratios_2": len(self._ratios[2]),
                "split_scale": self.split_scale(), "split_steps": len(self._split_shortfalls),
                "pipelined_factor": self.pipelined_factor(), "pipelined_steps": len(self._pipelined)}


def group_ready_fraction(step: StepArrays, finish_s: np.ndarray) -> np.ndarray:
    """Per trajectory, when its GRPO group was complete (its last member's finish; a trajectory
    without a group is its own), as a fraction of the rollout's makespan (the last finish)."""
    fin = np.asarray(finish_s, np.float64)
    out = group_max(step, fin)
    top = float(fin.max()) if len(fin) else 0.0
    return out / top if top > 0 else np.ones_like(out)


class CompletionOrder:
    """When each GRPO group of the recent measured steps completed, as a fraction of its
    rollout, beside each trajectory's final length: what the streamed loop's price
    (``search.streaming_step_s``) reads its mini-batches' readiness from once a step was measured.

    Why measured: without it a group is predicted complete at ``rollout * its longest member's
    length / the longest``, i.e. in the order of lengths, as if a batch drained at a constant
    per-token rate. Tool waits break that: a short trajectory stuck behind slow calls finishes
    late, and a long one of fast calls early. On InterCode-SQL (24 A800, K=0) a streamed split was
    forecast at 172.7 s a step and ran 226.9 s, against 175 s time-shared (SIMULATED). Only
    rollouts that ran alone are kept (``StepOutcome.overlapped``: the next step's work on the same
    engines delays every finish). A group is never taken as ready earlier than the length order
    says (``record``)."""

    def __init__(self, window: int = CALIBRATION_WINDOW) -> None:
        self._steps: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=max(1, int(window)))

    def record(self, outcome: StepOutcome) -> bool:
        """Keep ``outcome``'s completion order; False when it carries none (or overlapped)."""
        step, fin = outcome.trajectories, outcome.finish_s
        if outcome.overlapped or fin is None or len(fin) != step.n or not step.n or not np.all(np.isfinite(fin)):
            return False
        # never earlier than the length order says: a layout with fewer instances than the one
        # measured drains its queue at a constant rate, as the length order assumes (Search-R1
        # steps 45-49 on 32 H200, K=0: the measured order alone, taken from time-shared steps on
        # 8 TP-4 instances, priced a streamed 8:24 split at 89.4 s that ran 104.9 s, SIMULATED)
        finals = step.total_tokens.astype(np.float64)
        by_length = group_longest(step).astype(np.float64) / max(float(finals.max()), 1.0)
        self._steps.append((finals, np.maximum(group_ready_fraction(step, fin), by_length)))
        return True

    def arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(final lengths, group ready fractions)`` pooled over the kept steps; None before any."""
        if not self._steps:
            return None
        return (np.concatenate([f for f, _ in self._steps]), np.concatenate([r for _, r in self._steps]))
