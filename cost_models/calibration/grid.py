"""Tables over a measured grid, in log coordinates: the representation every fitted operator uses.

Why interpolation on the grid: the calibration data are dense sweeps (GEMM shapes, batch x
length, message sizes) whose latency is shaped by tile quantization, kernel switches and protocol
changes no smooth formula follows to a few percent. Piecewise-multilinear interpolation in
(log size -> log time) reproduces the measurements and is cheap; the roofline carries the shape
beyond the grid (see ``cost_models.operators.fitted``).

The primitives that turn scattered rows into a table (``fit.log_table`` composes them):

1. ``place``: rows go to the cells of the product grid of the unique values of each axis
   (duplicates averaged in log space);
2. ``monotone_l1`` / ``make_monotone``: measured cells made non-decreasing along the size axes
   (more work never takes less time), by L1 isotonic regression (the minority side of a
   violation moves) and/or the running minimum from the top (a cell slower than some larger
   shape takes that larger shape's time);
3. ``fill``: empty cells (shapes not measured, or rows held out by ``report``) get values by
   interpolating the *residual against a baseline* (log measured - log roofline) along each axis
   from the nearest measured cells, combined over axes with ``axis_weights`` (learned
   leave-one-out on the measured cells), so a hole is filled with the baseline's shape
   corrected by its neighbours' efficiency.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LogGrid:
    """A table ``values`` over the product of ``axes`` (actual values, ascending), interpolated
    multilinearly in log(axis) coordinates and clamped at the edges."""

    axes: list[np.ndarray]
    values: np.ndarray

    def __post_init__(self) -> None:
        self.axes = [np.asarray(a, dtype=np.float64) for a in self.axes]
        self.values = np.ascontiguousarray(self.values, dtype=np.float64)  # strides index the flat copy
        self._log_axes = [np.log(a) for a in self.axes]
        self._log_axes_list = [la.tolist() for la in self._log_axes]
        self._lo = [float(a[0]) for a in self.axes]
        self._hi = [float(a[-1]) for a in self.axes]
        self._flat = self.values.ravel().tolist()
        self._flat_arr = self.values.ravel()
        self._strides = [s // 8 for s in self.values.strides]
        self._ndim = len(self.axes)

    # ---- evaluation ------------------------------------------------------------------------
    def clip(self, *x: Any) -> list[Any]:
        """Each coordinate clamped to its axis range."""
        return [np.minimum(np.maximum(v, lo), hi) for v, lo, hi in zip(x, self._lo, self._hi)]

    def inside(self, *x: float) -> bool:
        """True when a scalar point lies within the grid on every axis."""
        for v, lo, hi in zip(x, self._lo, self._hi):
            if v < lo or v > hi:
                return False
        return True

    def __call__(self, *x: Any) -> np.ndarray:
        """Vectorized interpolation at clamped points (arguments broadcast together). All 2^d
        corners are gathered in one indexing operation, so a call costs a few dozen NumPy ops
        whatever the dimension; tiny inputs take the scalar path element by element."""
        arrs = np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in x])
        shape = arrs[0].shape
        size = arrs[0].size
        if size <= 4:
            flat_in = [a.ravel().tolist() for a in arrs]
            return np.array([self.scalar(*p) for p in zip(*flat_in)], dtype=np.float64).reshape(shape)
        base = np.zeros(size, dtype=np.intp)
        weights = []
        for d, (v, la) in enumerate(zip(arrs, self._log_axes)):
            if len(la) == 1:
                continue
            # (np.minimum/np.maximum: np.clip costs several microseconds per call on small arrays)
            lv = np.log(np.minimum(np.maximum(v.ravel(), self._lo[d]), self._hi[d]))
            i = np.minimum(np.maximum(np.searchsorted(la, lv, side="right") - 1, 0), len(la) - 2)
            w = np.minimum(np.maximum((lv - la[i]) / (la[i + 1] - la[i]), 0.0), 1.0)
            base += i * self._strides[d]
            weights.append(w[:, None])
        bits, offsets = self._corners()
        vals = self._flat_arr[base[:, None] + offsets[None, :]]
        wc = np.ones_like(vals)
        for k, w in enumerate(weights):
            b = bits[:, k][None, :]
            wc *= np.where(b, w, 1.0 - w)
        return (vals * wc).sum(axis=1).reshape(shape)

    def _corners(self) -> tuple[np.ndarray, np.ndarray]:
        """(corner bits over the non-trivial axes, flat offset of each corner)."""
        cached = getattr(self, "_corner_cache", None)
        if cached is None:
            dims = [d for d in range(self._ndim) if len(self.axes[d]) > 1]
            n = len(dims)
            bits = np.array([[(c >> k) & 1 for k in range(n)] for c in range(1 << n)], dtype=bool).reshape(1 << n, n)
            strides = np.array([self._strides[d] for d in dims], dtype=np.intp)
            offsets = (bits.astype(np.intp) * strides[None, :]).sum(axis=1) if n else np.zeros(1, dtype=np.intp)
            cached = (bits, offsets)
            self._corner_cache = cached
        return cached

    def scalar(self, *x: float) -> float:
        """Pure-Python interpolation at one clamped point (no NumPy: ~1-3 us)."""
        base = 0
        lows: list[tuple[int, float]] = []
        for d in range(self._ndim):
            la = self._log_axes_list[d]
            v = x[d]
            lo, hi = self._lo[d], self._hi[d]
            v = lo if v < lo else (hi if v > hi else v)
            n = len(la)
            if n == 1:
                lows.append((0, 0.0))
                continue
            lv = math.log(v)
            i = bisect_right(la, lv) - 1
            if i < 0:
                i = 0
            elif i > n - 2:
                i = n - 2
            w = (lv - la[i]) / (la[i + 1] - la[i])
            base += i * self._strides[d]
            lows.append((self._strides[d], w))
        acc = 0.0
        flat = self._flat
        for corner in range(1 << self._ndim):
            off = base
            wc = 1.0
            for d in range(self._ndim):
                stride, w = lows[d]
                if (corner >> d) & 1:
                    if stride == 0:
                        wc = 0.0
                        break
                    off += stride
                    wc *= w
                else:
                    wc *= 1.0 - w
            if wc != 0.0:
                acc += wc * flat[off]
        return acc

    # ---- serialization ---------------------------------------------------------------------
    def to_json(self, decimals: int = 3) -> dict[str, Any]:
        """Axes as exact values; the table as integers in units of 10**-decimals (log values:
        1e-3 is a 0.1 % change of a time), which keeps the bundled files small."""
        scale = 10**decimals
        return {
            "axes": [[float(v) for v in a] for a in self.axes],
            "scale": scale,
            "q": np.rint(self.values * scale).astype(np.int64).ravel().tolist(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LogGrid:
        axes = [np.asarray(a, dtype=np.float64) for a in obj["axes"]]
        vals = np.asarray(obj["q"], dtype=np.float64) / float(obj["scale"])
        return cls(axes, vals.reshape([len(a) for a in axes]))


# ---- building tables from rows -------------------------------------------------------------
def place(coords: np.ndarray, y: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows (N x d coordinates, N values) -> (axes, table with NaN where nothing was measured);
    several rows in one cell are averaged."""
    coords = np.asarray(coords, dtype=np.float64)
    axes = [np.unique(coords[:, d]) for d in range(coords.shape[1])]
    index = tuple(np.searchsorted(a, coords[:, d]) for d, a in enumerate(axes))
    shape = tuple(len(a) for a in axes)
    total = np.zeros(shape)
    count = np.zeros(shape)
    np.add.at(total, index, y)
    np.add.at(count, index, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        table = np.where(count > 0, total / np.maximum(count, 1.0), np.nan)
    return axes, table


def _bracket(known: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest known cell at-or-below and at-or-above each cell along ``axis``
    (-1 / n where there is none)."""
    n = known.shape[axis]
    shape = [1] * known.ndim
    shape[axis] = n
    pos = np.arange(n).reshape(shape)
    left = np.where(known, pos, -1)
    left = np.maximum.accumulate(left, axis=axis)
    right = np.where(known, pos, n)
    right = np.flip(np.minimum.accumulate(np.flip(right, axis=axis), axis=axis), axis=axis)
    return left, right


def axis_estimates(axes: Sequence[np.ndarray], residual: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Leave-one-out estimates of every known cell along each axis: the linear interpolation
    (in log axis) between its nearest known neighbours strictly below and above it. Returns,
    per axis, (estimate, valid) arrays of the table's shape (valid: both neighbours exist)."""
    r = np.asarray(residual, dtype=np.float64)
    known = ~np.isnan(r)
    out = []
    for d, a in enumerate(axes):
        la = np.log(np.asarray(a, dtype=np.float64))
        n = r.shape[d]
        if n < 3:
            out.append((np.full(r.shape, np.nan), np.zeros(r.shape, dtype=bool)))
            continue
        left, right = _bracket(known, d)
        # strictly below / above: the bracket of the previous / next position
        pad_l = np.full_like(np.take(left, [0], axis=d), -1)
        pad_r = np.full_like(np.take(right, [0], axis=d), n)
        left_x = np.concatenate([pad_l, np.take(left, range(n - 1), axis=d)], axis=d)
        right_x = np.concatenate([np.take(right, range(1, n), axis=d), pad_r], axis=d)
        valid = known & (left_x >= 0) & (right_x < n)
        lc = np.clip(left_x, 0, n - 1)
        rc = np.clip(right_x, 0, n - 1)
        vl = np.take_along_axis(r, lc, axis=d)
        vr = np.take_along_axis(r, rc, axis=d)
        shape = [1] * r.ndim
        shape[d] = n
        x = la.reshape(shape)
        xl, xr = la[lc], la[rc]
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(xr > xl, (x - xl) / np.where(xr > xl, xr - xl, 1.0), 0.5)
        out.append((np.where(valid, vl + w * (vr - vl), np.nan), valid))
    return out


def axis_weights(axes: Sequence[np.ndarray], residual: np.ndarray, floor: float = 0.02) -> np.ndarray | None:
    """How much ``fill`` should trust each axis's interpolation, learned from the known cells
    alone (leave-one-out, so a held-out row never informs it): the non-negative weights summing
    to one whose combination of the per-axis estimates best predicts the known cells (least
    squares, ``scipy.optimize.nnls``). Tables differ a lot here: a GEMM's time is smooth along
    k but quantized along m and n, so its k-neighbours predict a cell better. Each weight is at
    least ``floor`` (no axis is ignored outright). None (equal weights) when fewer than 20 known
    cells per axis have an estimate on every axis."""
    from scipy.optimize import nnls

    ests = axis_estimates(axes, residual)
    dims = [d for d, a in enumerate(axes) if len(a) >= 3]
    if len(dims) < 2:
        return None
    valid = np.logical_and.reduce([ests[d][1] for d in dims])
    if valid.sum() < 20 * len(dims):
        return None
    target = np.asarray(residual, dtype=np.float64)[valid]
    design = np.column_stack([ests[d][0][valid] for d in dims])
    lam = 10.0 * np.sqrt(len(target))  # soft sum-to-one row
    w, _ = nnls(np.vstack([design, np.full(len(dims), lam)]), np.append(target, lam))
    if not np.all(np.isfinite(w)) or w.sum() <= 0:
        return None
    w = np.maximum(w / w.sum(), floor)
    full = np.ones(len(axes))
    full[dims] = w / w.sum()
    return full


def fill(
    axes: Sequence[np.ndarray],
    residual: np.ndarray,
    max_rounds: int | None = None,
    weights: Sequence[float] | None = None,
) -> np.ndarray:
    """Fill NaN cells of ``residual``: weighted average (``weights`` per axis, equal when None),
    over the axes where a cell has measured neighbours on both sides, of the linear
    interpolation (in log axis) between them; cells with neighbours on one side only take the
    nearest one's value once no two-sided estimate is left. Repeats until every cell is filled
    (a table with no measured cell at all stays NaN)."""
    r = np.array(residual, dtype=np.float64)
    if np.all(np.isnan(r)):
        return r
    wts = [1.0] * r.ndim if weights is None else [float(v) for v in weights]
    log_axes = [np.log(np.asarray(a, dtype=np.float64)) for a in axes]
    # each round fills at least every hole adjacent (along some axis) to a filled cell
    rounds = max_rounds if max_rounds is not None else int(sum(r.shape)) + 1
    for _ in range(rounds):
        missing = np.isnan(r)
        if not missing.any():
            break
        known = ~missing
        two_sum = np.zeros_like(r)
        two_cnt = np.zeros_like(r)
        one_sum = np.zeros_like(r)
        one_cnt = np.zeros_like(r)
        for d, la in enumerate(log_axes):
            n = r.shape[d]
            left, right = _bracket(known, d)
            lc = np.clip(left, 0, n - 1)
            rc = np.clip(right, 0, n - 1)
            vl = np.take_along_axis(r, lc, axis=d)
            vr = np.take_along_axis(r, rc, axis=d)
            shape = [1] * r.ndim
            shape[d] = n
            x = la.reshape(shape)
            xl = la[lc]
            xr = la[rc]
            has_l = left >= 0
            has_r = right < n
            both = missing & has_l & has_r
            with np.errstate(invalid="ignore", divide="ignore"):
                w = np.where(xr > xl, (x - xl) / np.where(xr > xl, xr - xl, 1.0), 0.5)
            est = vl + w * (vr - vl)
            two_sum += np.where(both, est * wts[d], 0.0)
            two_cnt += both * wts[d]
            one_l = missing & has_l & ~has_r
            one_r = missing & has_r & ~has_l
            one_sum += np.where(one_l, vl, 0.0) + np.where(one_r, vr, 0.0)
            one_cnt += one_l.astype(float) + one_r.astype(float)
        if two_cnt.any():
            sel = two_cnt > 0
            r[sel] = two_sum[sel] / two_cnt[sel]
        elif one_cnt.any():
            sel = one_cnt > 0
            r[sel] = one_sum[sel] / one_cnt[sel]
        else:  # pragma: no cover - cannot happen once one cell is known
            break
    return r


def make_monotone(table: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """Non-decreasing along each listed axis, by the padding argument: a smaller problem can
    always be run as a larger one, so its time is at most the smallest time measured at any
    larger size (running minimum from the high end). Unlike averaging or isotonic regression,
    this never inflates a well-measured cell because of one slow kernel at a smaller shape
    (e.g. single-head decode); each pass keeps the monotonicity earlier passes established."""
    t = np.array(table, dtype=np.float64)
    for d in axes:
        t = np.flip(np.minimum.accumulate(np.flip(t, axis=d), axis=d), axis=d)
    return t


def isotonic_l1(y: Sequence[float]) -> list[float]:
    """Non-decreasing sequence nearest to ``y`` in absolute error (pool adjacent violators with
    block medians; for log times this is the least mean absolute percentage error)."""
    blocks: list[list[float]] = []
    meds: list[float] = []
    for v in y:
        blocks.append([float(v)])
        meds.append(float(v))
        while len(meds) > 1 and meds[-2] > meds[-1]:
            merged = blocks[-2] + blocks[-1]
            blocks.pop()
            meds.pop()
            blocks[-1] = merged
            srt = sorted(merged)
            meds[-1] = srt[(len(srt) - 1) // 2] if len(srt) % 2 else 0.5 * (srt[len(srt) // 2 - 1] + srt[len(srt) // 2])
    out: list[float] = []
    for b, m in zip(blocks, meds):
        out.extend([m] * len(b))
    return out


def monotone_l1(table: np.ndarray, axes: Sequence[int], cycles: int = 3) -> np.ndarray:
    """Approximately the monotone table nearest to ``table`` in absolute error: cyclic 1-D L1
    isotonic regression of the known (non-NaN) cells along each listed axis. Not exactly
    monotone in several dimensions after finitely many cycles: follow with ``make_monotone``.

    Why: where a kernel switch makes a LARGER shape faster over a long run of smaller ones
    (A100 GEMM: m=1024, n=64, k=32 takes 2.9 us, every m from 32 to 768 takes 4.1 us), the
    running minimum alone drags the whole run down; the median pooling moves whichever side
    is the minority."""
    t = np.array(table, dtype=np.float64)
    for _ in range(cycles):
        for d in axes:
            m = np.moveaxis(t, d, -1)
            flat = m.reshape(-1, m.shape[-1])
            for row in flat:
                ok = ~np.isnan(row)
                if ok.sum() > 1 and np.any(np.diff(row[ok]) < 0):
                    row[ok] = isotonic_l1(row[ok])
            t = np.moveaxis(flat.reshape(m.shape), -1, d)
    return t


def mesh(axes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The grid's node coordinates, one array per axis, each of the table's shape."""
    return list(np.meshgrid(*axes, indexing="ij"))
