"""Fitting the rollout engine's per-iteration overhead on measured iterations (pure NumPy).

Why: the cost model times an iteration as the sum of its operators plus ``step_s + per_seq_s *
B`` of engine work (``cost_models.rollout``). For a small model that engine term is most of the
iteration, and only a measurement of real forwards can give it. ``libra-calibrate profile
--engine-model`` measures decode and prefill iterations of a model (``engine_profile``), and this
module turns them into the two numbers:

1. the cost model's own prediction of each iteration with ZERO overhead (the device's operator
   set, fitted on the same profile folder, through ``CostEvaluator.decode_s`` / ``prefill_s``:
   nothing is re-derived here) is subtracted from the measured time;
2. the remainder is fitted as ``step_s + per_seq_s * B`` by non-negative least squares in
   RELATIVE terms (each row weighted by 1 / measured time): the fit should be good in percent for
   a 2 ms decode step as for a 40 ms prefill, not only for the largest rows;
3. its fidelity is the MAPE of the full predicted iteration (operators + overhead) on grid
   points held out of a second fit (every third point), reported per kind.

``engine.csv`` keeps the rows (measured and predicted compute), so a fit can be checked or
redone without torch.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cost_models.errors import CostModelError

ENGINE_CSV = "engine.csv"
KINDS = ("decode", "prefill")
HOLDOUT_EVERY = 3  # every third grid point (per kind) is held out of the fidelity fit


@dataclass(frozen=True)
class EngineRow:
    """One measured iteration: ``batch`` sequences, each holding ``context`` KV tokens before it
    and adding ``new_tokens`` (1 for decode), ``measured_s`` of wall time, ``compute_s`` the cost
    model's operator time for it (zero engine overhead)."""

    kind: str
    batch: int
    context: int
    new_tokens: int
    measured_s: float
    compute_s: float


@dataclass(frozen=True)
class OverheadFit:
    """``step_s + per_seq_s * B`` and how well the full prediction matches on held-out rows."""

    step_s: float
    per_seq_s: float
    rows: int
    holdout_rows: int
    holdout_mape: dict[str, float]  # kind -> MAPE % of operators + overhead vs measured; "all" too
    insample_mape: dict[str, float]
    compute_share: float  # median share of the measured time the operators explain

    def to_source(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("step_s")
        d.pop("per_seq_s")
        return d


def nnls_affine(batch: np.ndarray, target: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
    """``(a, b) >= 0`` minimising ``sum(w² (a + b·B − target)²)``: two unknowns, so the
    non-negative optimum is the unconstrained one or lies on an edge (a = 0 or b = 0), each a
    closed form; the best feasible candidate wins."""
    batch = np.asarray(batch, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    if batch.size == 0:
        raise CostModelError("no measured engine iterations to fit")

    def cost(a: float, b: float) -> float:
        return float(np.sum((w * (a + b * batch - target)) ** 2))

    cands: list[tuple[float, float]] = []
    design = np.column_stack([w, w * batch])
    sol, *_ = np.linalg.lstsq(design, w * target, rcond=None)
    if sol[0] >= 0 and sol[1] >= 0:
        cands.append((float(sol[0]), float(sol[1])))
    w2 = w**2
    a_only = float(np.sum(w2 * target) / np.sum(w2))
    cands.append((max(a_only, 0.0), 0.0))
    bb = float(np.sum(w2 * batch * batch))
    b_only = float(np.sum(w2 * batch * target) / bb) if bb > 0 else 0.0
    cands.append((0.0, max(b_only, 0.0)))
    return min(cands, key=lambda ab: cost(*ab))


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas) * 100.0) if len(meas) else float("nan")


def holdout_mask(rows: Sequence[EngineRow]) -> np.ndarray:
    """True for held-out rows: every ``HOLDOUT_EVERY``-th row of each kind starting at the second
    (deterministic, spread over the grid, never a kind's first point)."""
    mask = np.zeros(len(rows), dtype=bool)
    for kind in KINDS:
        idx = [i for i, r in enumerate(rows) if r.kind == kind]
        for j, i in enumerate(idx):
            mask[i] = j % HOLDOUT_EVERY == 1
    return mask


def fit_overhead(rows: Sequence[EngineRow]) -> OverheadFit:
    """Fit on every row; the held-out MAPE comes from a separate fit without the held-out rows."""
    if not rows:
        raise CostModelError("no measured engine iterations to fit")
    bad = [r for r in rows if r.kind not in KINDS or r.batch < 1 or not (r.measured_s > 0) or r.compute_s < 0]
    if bad:
        raise CostModelError(f"bad engine row {bad[0]} (kind decode/prefill, batch >= 1, measured > 0)")
    B = np.array([r.batch for r in rows], dtype=np.float64)
    meas = np.array([r.measured_s for r in rows])
    comp = np.array([r.compute_s for r in rows])
    kinds = np.array([r.kind for r in rows])
    rem, w = meas - comp, 1.0 / meas

    def scores(a: float, b: float, sel: np.ndarray) -> dict[str, float]:
        pred = comp + a + b * B
        out = {k: _mape(pred[sel & (kinds == k)], meas[sel & (kinds == k)]) for k in KINDS if (sel & (kinds == k)).any()}
        out["all"] = _mape(pred[sel], meas[sel])
        return out

    everything = np.ones(len(rows), dtype=bool)
    step, per_seq = nnls_affine(B, rem, w)
    held = holdout_mask(rows)
    if held.any() and (~held).sum() >= 2:
        a_t, b_t = nnls_affine(B[~held], rem[~held], w[~held])
        holdout = scores(a_t, b_t, held)
    else:
        holdout = {}
    return OverheadFit(
        step_s=step, per_seq_s=per_seq, rows=len(rows), holdout_rows=int(held.sum()),
        holdout_mape=holdout, insample_mape=scores(step, per_seq, everything),
        compute_share=float(np.median(comp / meas)),
    )


def write_rows(path: Path, rows: Iterable[EngineRow]) -> Path:
    """``engine.csv``: one line per measured iteration, seconds."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "batch", "context", "new_tokens", "measured_s", "compute_s"])
        for r in rows:
            w.writerow([r.kind, r.batch, r.context, r.new_tokens, f"{r.measured_s:.6g}", f"{r.compute_s:.6g}"])
    return path


def read_rows(path: Path) -> list[EngineRow]:
    """Rows of an ``engine.csv``; a malformed line is a one-line error naming it."""
    if not path.is_file():
        raise CostModelError(f"{path}: engine measurements not found (run `libra-calibrate profile --engine-model DIR`)")
    rows = []
    with open(path, newline="") as f:
        for line, rec in enumerate(csv.DictReader(f), start=2):
            try:
                rows.append(EngineRow(rec["kind"], int(rec["batch"]), int(rec["context"]), int(rec["new_tokens"]),
                                      float(rec["measured_s"]), float(rec["compute_s"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise CostModelError(f"{path}: line {line}: {exc!r}") from None
    return rows
