"""Fitting operator models on measured rows: rows in, JSON-able tables out.

One function per operator family; each takes validated rows (latency in seconds) and the
device's roofline, and returns the tables ``cost_models.operators.fitted`` evaluates:

- gemm: log-latency table over the measured (m, n, k) grid;
- attn_prefill: log-latency table over (batch, isl, heads, kv_heads) (cached tokens enter via an
  equivalent length, see fitted.py);
- attn_decode: per (heads, kv_heads, batch) an affine law ``A + C * total_kv`` fitted for the
  least mean absolute relative error over the KV lengths, then tables of log A and log C;
- moe: per measured model shape (hidden, inter, topk, experts, tp, ep), a log-latency table
  over tokens;
- comm: per collective, a log-latency table over (GPUs, bytes), plus alpha-beta parameters per
  GPU count (``t = alpha + bytes / beta``) used to rescale link bandwidth (a800, or inter-node
  data measured on another GPU) and shown in the docs.

Holes in a table (shapes not measured, rows held out by ``report``) are filled with the baseline
shape (roofline; a collective's own alpha-beta line) corrected by the neighbours' measured
efficiency (``grid.fill`` with learned axis weights), and every table is made monotone in its
size axes without letting a filled hole move a measured cell (``log_table``). MoE token curves
and decode KV curves are completed from the other measured curves (``fill_by_shape_curvature``).
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cost_models.calibration import data as cdata
from cost_models.calibration.grid import LogGrid, axis_weights, fill, make_monotone, mesh, monotone_l1, place
from cost_models.calibration.store import Calibration, EngineOverhead
from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.operators.roofline import DTYPE_BYTES, HEAD_DIM, LAUNCH_S, RooflineOperators

TOOL_VERSION = "libra-calibrate 1"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")


PROJECTIONS = ("min", "l1")


def log_table(
    coords: np.ndarray,
    latency_s: np.ndarray,
    roof: Callable[..., np.ndarray],
    monotone_axes: tuple[int, ...],
    projection: str = "auto",
) -> LogGrid:
    """Rows -> monotone log-latency table. ``roof`` evaluates the roofline at grid nodes (one
    array per axis).

    1. the measured cells are made monotone among themselves (holes do not take part), by the
       padding argument (``projection="min"``: a cell slower than a larger measured shape takes
       that shape's time) or by L1 isotonic regression first (``"l1"``, ``grid.monotone_l1``:
       the minority side of a violation moves); ``"auto"`` picks the one that predicts better
       a seeded 20 % of the MEASURED cells held out of the fit (inner validation: rows held out
       by ``report`` never take part);
    2. holes are filled in residual (measured / roofline) space, each axis's interpolation
       weighted by how well it predicts the known cells (``grid.axis_weights``);
    3. a filled hole is never faster than a measured shape smaller than it (running maximum of
       the measured cells), nor left non-monotone among the other holes (``make_monotone``).
       Step 3 can only lower holes and never moves a measured cell, so one under-estimated
       hole cannot drag down every smaller measured shape (which a plain running minimum over
       the filled table did: held-out A100 GEMM rows of 4 us came out 30-50 % low)."""
    y = np.log(np.asarray(latency_s, dtype=np.float64))
    axes, table = place(coords, y)
    base = np.log(roof(*mesh(axes)))
    if projection == "auto":
        projection = choose_projection(axes, table, base, monotone_axes)
    return LogGrid(axes, _complete(axes, table, base, monotone_axes, projection))


def _complete(
    axes: list[np.ndarray], table: np.ndarray, base: np.ndarray, monotone_axes: tuple[int, ...], projection: str
) -> np.ndarray:
    """Steps 1-3 of ``log_table`` on a table of measured log times (NaN: holes)."""
    if projection not in PROJECTIONS:
        raise ValueError(projection)
    known = ~np.isnan(table)
    if projection == "l1":
        table = monotone_l1(table, monotone_axes)
    measured = np.where(known, make_monotone(np.where(known, table, np.inf), monotone_axes), np.nan)
    residual = measured - base
    residual = fill(axes, residual, weights=axis_weights(axes, residual))
    if np.isnan(residual).any():
        raise CostModelError("a fitted table has cells no measurement reaches (no rows at all?)")
    lower = np.where(known, measured, -np.inf)
    for d in monotone_axes:
        lower = np.maximum.accumulate(lower, axis=d)
    full = np.where(known, measured, np.maximum(base + residual, lower))
    return make_monotone(full, monotone_axes)


def choose_projection(
    axes: list[np.ndarray], table: np.ndarray, base: np.ndarray, monotone_axes: tuple[int, ...],
    holdout: float = 0.2, seed: int = 0, min_cells: int = 100,
) -> str:
    """The monotone projection (``PROJECTIONS``) whose table best predicts (mean absolute
    percentage error) a seeded ``holdout`` share of the measured cells left out of it; "min"
    for tables with fewer than ``min_cells`` measured cells (too few to tell)."""
    idx = np.flatnonzero(~np.isnan(table))
    if len(idx) < min_cells:
        return "min"
    rng = np.random.default_rng(seed)
    val = rng.choice(idx, size=max(1, int(round(holdout * len(idx)))), replace=False)
    inner = table.copy().ravel()
    inner[val] = np.nan
    inner = inner.reshape(table.shape)
    truth = table.ravel()[val]
    best, best_err = "min", np.inf
    for proj in PROJECTIONS:
        pred = _complete(axes, inner, base, monotone_axes, proj).ravel()[val]
        err = float(np.mean(np.abs(np.exp(pred - truth) - 1.0)))
        if err < best_err - 1e-12:
            best, best_err = proj, err
    return best


# ---- GEMM ----------------------------------------------------------------------------------
def fit_gemm(frame: pd.DataFrame, roof: RooflineOperators) -> dict[str, Any]:
    coords = frame[["m", "n", "k"]].to_numpy(np.float64)
    grid = log_table(coords, frame["latency_s"].to_numpy(), roof.gemm_s, (0, 1, 2))
    return {"grid": grid.to_json(), "rows": int(len(frame))}


# ---- attention -----------------------------------------------------------------------------
def fit_attn_prefill(frame: pd.DataFrame, roof: RooflineOperators) -> dict[str, Any]:
    coords = frame[["batch_size", "isl", "num_heads", "num_key_value_heads"]].to_numpy(np.float64)

    def roof_bshk(b: np.ndarray, s: np.ndarray, h: np.ndarray, kv: np.ndarray) -> np.ndarray:
        return roof.attn_prefill_s(b, s, 0.0, h, kv)

    grid = log_table(coords, frame["latency_s"].to_numpy(), roof_bshk, (0, 1, 2, 3))
    return {"grid": grid.to_json(), "rows": int(len(frame))}


def decode_roof_parts(roof: RooflineOperators, b: Any, h: Any, kv: Any) -> tuple[Any, Any]:
    """The roofline's decode law split as (intercept, slope per KV token)."""
    intercept = roof.attn_decode_s(b, 0.0, h, kv)
    slope = roof.attn_decode_s(b, 1.0, h, kv) - intercept
    return intercept, slope


def affine_fit(x: np.ndarray, y: np.ndarray, slope_floor: float, intercept_floor: float) -> tuple[float, float]:
    """``y ~ A + C x`` minimizing the mean ABSOLUTE relative error (MAPE itself), with
    ``C >= slope_floor`` and ``A >= intercept_floor``.

    The optimum of this linear program lies on a vertex: a line through two measured points,
    or through one point with a bound active. There are few KV lengths per (heads, batch), so
    every candidate is enumerated and scored exactly."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    cand_a: list[np.ndarray] = []
    cand_c: list[np.ndarray] = []
    i, j = np.triu_indices(len(x), k=1)
    ok = x[j] != x[i]
    c = (y[j][ok] - y[i][ok]) / (x[j][ok] - x[i][ok])
    cand_c.append(c)
    cand_a.append(y[i][ok] - c * x[i][ok])
    cand_c.append(np.full(len(x), slope_floor))  # slope at its bound through each point
    cand_a.append(y - slope_floor * x)
    with np.errstate(divide="ignore", invalid="ignore"):
        c_at = np.where(x > 0, (y - intercept_floor) / np.where(x > 0, x, 1.0), slope_floor)
    cand_c.append(c_at)  # intercept at its bound through each point
    cand_a.append(np.full(len(x), intercept_floor))
    cand_a.append(np.array([intercept_floor]))
    cand_c.append(np.array([slope_floor]))
    a_all = np.concatenate(cand_a)
    c_all = np.concatenate(cand_c)
    feasible = (a_all >= intercept_floor * (1 - 1e-12)) & (c_all >= slope_floor * (1 - 1e-12))
    a_all, c_all = a_all[feasible], c_all[feasible]
    err = np.abs(a_all[:, None] + c_all[:, None] * x[None, :] - y[None, :]) / y[None, :]
    best = int(np.argmin(err.mean(axis=1)))
    return float(a_all[best]), float(c_all[best])


def decode_design(frame: pd.DataFrame) -> tuple[np.ndarray, list[tuple[float, float, float]], np.ndarray]:
    """Each (heads, kv_heads, batch) cell's KV sweep on the measurement design's step grid:
    (steps, cells, log-latency matrix cells x steps, NaN outside each cell's KV range).

    The affine law is fitted to minimize the mean relative error over the KV lengths of the
    design (log-spaced steps: every octave of KV weighs the same). A cell's KV range is its own
    measured range, widened to the range measured for any cell with the same KV heads and at
    least as many query heads and sequences (in the aiconfigurator sweeps the range only
    shrinks as heads and batch grow, so on complete data this is the cell's own range, and
    a complete sweep is fitted on exactly its measurements). Steps a cell misses inside that
    range (not measured, or held out by ``report``, including its longest KV) come from its
    measured neighbours and the bend / step of the most parallel measured cells
    (``fill_by_shape_curvature``: the launch-bound plateau turns into the bandwidth-bound line
    at similar KV for similar cells), so the fit weighs the KV range the same whichever steps
    happen to be missing."""
    steps = np.unique(frame["step"].to_numpy(np.float64))
    groups = list(frame.groupby(["num_heads", "num_key_value_heads", "batch_size"], sort=True))
    total = np.zeros((len(groups), len(steps)))
    count = np.zeros_like(total)
    for i, (_, g) in enumerate(groups):
        j = np.searchsorted(steps, g["step"].to_numpy(np.float64))
        np.add.at(total[i], j, np.log(g["latency_s"].to_numpy(np.float64)))
        np.add.at(count[i], j, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mat = np.where(count > 0, total / np.maximum(count, 1.0), np.nan)
    cells = [tuple(float(v) for v in key) for key, _ in groups]
    # beyond a cell's measured steps, borrow only from cells with the same KV heads and batch
    # (the same KV bytes per step: their line has this cell's slope); inside, from any cell
    same_kv_batch = np.array([c[1] * 1e6 + c[2] for c in cells])
    filled = fill_by_shape_curvature(steps, mat, extend=True, groups=same_kv_batch)
    known = ~np.isnan(mat)
    first = np.array([np.flatnonzero(r)[0] for r in known])
    last = np.array([np.flatnonzero(r)[-1] for r in known])
    arr = np.array(cells)
    for i, (h, kv, b) in enumerate(cells):
        # the design's KV range only shrinks as heads and batch grow: a cell spans at least
        # the range measured for any cell with as many KV heads and more heads and sequences
        dom = (arr[:, 1] == kv) & (arr[:, 0] >= h) & (arr[:, 2] >= b)
        lo, hi = min(first[dom].min(), first[i]), max(last[dom].max(), last[i])
        filled[i, :lo] = np.nan
        filled[i, hi + 1:] = np.nan
    return steps, cells, filled  # type: ignore[return-value]


def fit_attn_decode(frame: pd.DataFrame, roof: RooflineOperators) -> dict[str, Any]:
    peak_bw = roof.spec.hbm_bw
    steps, cells, filled = decode_design(frame)
    rows = []
    for (h, kv, b), curve in zip(cells, filled):
        sel = ~np.isnan(curve)
        x, y = steps[sel] * b, np.exp(curve[sel])
        # a KV token cannot stream faster than the datasheet bandwidth allows (a quarter of it
        # leaves room for L2 hits); the intercept is at least a kernel launch
        slope_floor = 0.25 * 2.0 * DTYPE_BYTES * HEAD_DIM * kv / peak_bw
        a, c = affine_fit(x, y, slope_floor, LAUNCH_S)
        rows.append((h, kv, b, a, c))
    arr = np.asarray(rows, dtype=np.float64)
    coords = arr[:, :3]
    axes, log_a = place(coords, np.log(arr[:, 3]))
    _, log_c = place(coords, np.log(arr[:, 4]))
    hh, kk, bb = mesh(axes)
    base_a, base_c = decode_roof_parts(roof, bb, hh, kk)
    # Monotone in the simulator's size arguments only: the intercept in batch, and batch * C
    # (time per KV token of each sequence) in batch, so a batch of b sequences of length L never
    # decodes faster than b-1 of them. Not forced in the head counts: the measured kernel is not
    # monotone there (few-head shapes launch fewer blocks and stream KV more slowly per token).
    log_a = make_monotone(np.log(base_a) + fill(axes, log_a - np.log(base_a)), (2,))
    log_c = np.log(base_c) + fill(axes, log_c - np.log(base_c))
    log_b = np.log(bb)
    log_c = make_monotone(log_c + log_b, (2,)) - log_b
    return {
        "A": LogGrid(axes, log_a).to_json(),
        "C": LogGrid(axes, log_c).to_json(),
        "rows": int(len(frame)),
    }


# ---- MoE -----------------------------------------------------------------------------------
MOE_KEYS = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")


def moe_token_matrix(frame: pd.DataFrame) -> tuple[list[tuple[float, ...]], np.ndarray, np.ndarray]:
    """(shapes, token axis, log-latency matrix shape x tokens with NaN where not measured)."""
    keys = frame[list(MOE_KEYS)].to_numpy(np.float64)
    shapes, sidx = np.unique(keys, axis=0, return_inverse=True)
    tokens, tidx = np.unique(frame["num_tokens"].to_numpy(np.float64), return_inverse=True)
    total = np.zeros((len(shapes), len(tokens)))
    count = np.zeros_like(total)
    np.add.at(total, (sidx.ravel(), tidx.ravel()), np.log(frame["latency_s"].to_numpy(np.float64)))
    np.add.at(count, (sidx.ravel(), tidx.ravel()), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mat = np.where(count > 0, total / np.maximum(count, 1.0), np.nan)
    return [tuple(float(v) for v in row) for row in shapes], tokens, mat


def _similar(mat: np.ndarray, known: np.ndarray, s: int, others: np.ndarray, count: int) -> np.ndarray:
    """Indices (into ``np.flatnonzero(others)``) of the ``count`` shapes whose measured curves
    run most parallel to shape ``s``'s (least spread of the log-time difference over the token
    counts both measured)."""
    both = known[others] & known[s]
    diff = np.where(both, mat[others] - mat[s], np.nan)
    with np.errstate(invalid="ignore"):
        spread = np.nanstd(diff, axis=1)
    spread = np.where(np.isnan(spread) | (both.sum(axis=1) < 2), np.inf, spread)
    order = np.argsort(spread, kind="stable")[:count]
    finite = order[np.isfinite(spread[order])]
    return finite if len(finite) else order  # no comparable curve: every candidate votes


def fill_by_shape_curvature(
    tokens: np.ndarray, mat: np.ndarray, neighbours: int = 16, extend: bool = True, groups: np.ndarray | None = None
) -> np.ndarray:
    """Complete curves of log latency over a shared size axis (``mat``: one row per curve, one
    column per value of ``tokens``, NaN where not measured): MoE shapes over tokens, decode
    cells over KV steps.

    Such curves share a shape no formula follows to a few percent (MoE: expert weights dominate
    at few tokens, compute at many; decode: a launch-bound plateau turning into a
    bandwidth-bound line), so the other curves' MEASURED values carry it: the ``neighbours``
    curves running most parallel to this one (least spread of the log difference where both
    were measured), median of their estimates; a fixed choice, not tuned on held-out rows.

    - a size missing between two measured ones: the straight log-log line between the measured
      neighbours plus the median bend of the other curves away from that same line;
    - with ``extend``, below / above the measured range: the nearest measured value plus the
      median log step of the other curves from that size, kept monotone (never faster than a
      larger size, never slower than a smaller one), as far as other curves were measured;
      with ``groups`` (one label per curve), only curves with the same label are borrowed
      from there."""
    lx = np.log(tokens)
    out = mat.copy()
    known = ~np.isnan(mat)
    for s in range(mat.shape[0]):
        idx = np.flatnonzero(known[s])
        if len(idx) == 0:
            continue
        for j in range(idx[0] + 1, idx[-1]):
            if known[s, j]:
                continue
            lo = idx[idx < j][-1]
            hi = idx[idx > j][0]
            w = (lx[j] - lx[lo]) / (lx[hi] - lx[lo])
            line = mat[s, lo] + w * (mat[s, hi] - mat[s, lo])
            others = known[:, lo] & known[:, j] & known[:, hi]
            others[s] = False
            if others.any():
                bend = mat[others, j] - (mat[others, lo] + w * (mat[others, hi] - mat[others, lo]))
                line += float(np.median(bend[_similar(mat, known, s, others, neighbours)]))
            out[s, j] = line
        for direction, e, js in ((-1, idx[0], range(idx[0] - 1, -1, -1) if extend else ()),
                                 (1, idx[-1], range(idx[-1] + 1, mat.shape[1]) if extend else ())):
            for j in js:
                others = known[:, e] & known[:, j]
                if groups is not None:
                    others &= groups == groups[s]
                others[s] = False
                if not others.any():
                    break  # no curve reaches this far: the roofline takes over (fitted.py)
                step = mat[others, j] - mat[others, e]
                val = out[s, e] + float(np.median(step[_similar(mat, known, s, others, neighbours)]))
                prev = out[s, j - direction]
                out[s, j] = min(val, prev) if direction < 0 else max(val, prev)
    return out


def fit_moe(frame: pd.DataFrame, roof: RooflineOperators) -> dict[str, Any]:
    configs = []
    shapes, tokens, mat = moe_token_matrix(frame)
    filled = fill_by_shape_curvature(tokens, mat)
    for s, key in enumerate(shapes):
        sel = ~np.isnan(filled[s])
        configs.append({"shape": list(key), "grid": LogGrid([tokens[sel]], make_monotone(filled[s, sel], (0,))).to_json()})
    return {"configs": configs, "rows": int(len(frame))}


# ---- communication -------------------------------------------------------------------------
def alpha_beta(nbytes: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``t ~ alpha + nbytes / beta`` by relative least squares; alpha, beta >= 0."""
    design = np.column_stack([1.0 / t, nbytes / t])
    (a, inv_b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if inv_b <= 0:
        return float(np.min(t)), float("inf")
    if a < 0:
        a = 0.0
        inv_b = float(np.sum(nbytes / t) / np.sum(nbytes**2 / t**2))
    return float(a), float(1.0 / inv_b)


def comm_table(n: np.ndarray, nbytes: np.ndarray, t: np.ndarray, roof_fn: Callable[..., np.ndarray]) -> dict[str, Any]:
    """(GPUs, bytes) -> log-latency table, monotone in bytes, plus alpha-beta per GPU count.

    Holes are filled in residual space against each GPU count's own fitted alpha-beta line
    rather than the datasheet roofline: the measured link has its own latency and bandwidth,
    and an affine law is far from linear in log-log coordinates (its slope goes from 0 to 1),
    so interpolating the residual against the measured line is what keeps a filled size on the
    curve (random-split MAPE of intra-node collectives 6-7 % -> 4-6 %). ``roof_fn`` is the
    fallback baseline for a GPU count whose alpha-beta fit is degenerate."""
    coords = np.column_stack([n, nbytes])
    ab: dict[str, list[float]] = {}
    floor: dict[float, float] = {}
    for g in np.unique(n):
        sel = n == g
        ab[str(int(g))] = list(alpha_beta(nbytes[sel], t[sel]))
        floor[float(g)] = 0.5 * float(np.min(t[sel]))

    def baseline(nn: np.ndarray, bb: np.ndarray) -> np.ndarray:
        out = np.asarray(roof_fn(nn, bb), dtype=np.float64).copy()
        for key, (alpha, beta) in ab.items():
            sel = nn == float(key)
            if np.isfinite(beta) and beta > 0:
                out[sel] = max(alpha, floor[float(key)]) + bb[sel] / beta
            else:
                out[sel] = max(alpha, floor[float(key)])
        return out

    grid = log_table(coords, t, baseline, (1,))
    return {"grid": grid.to_json(), "alpha_beta": ab}


def _min_per_cell(frames: list[pd.DataFrame]) -> pd.DataFrame:
    both = pd.concat(frames, ignore_index=True)
    return both.groupby(["n_gpus", "nbytes"], as_index=False)["latency_s"].min()


def _collective_cells(nccl: pd.DataFrame, custom: pd.DataFrame | None, op: str) -> pd.DataFrame | None:
    """(n_gpus, nbytes, latency_s) cells of one collective as modelled: NCCL's, and for
    all-reduce the faster of NCCL and vLLM's custom all-reduce at each size."""
    rows = nccl[nccl["op_name"].astype(str) == op]
    if rows.empty:
        return None
    parts = [pd.DataFrame({
        "n_gpus": rows["num_gpus"].to_numpy(np.float64),
        "nbytes": rows["message_size"].to_numpy(np.float64) * cdata.COMM_ELEMENT_BYTES,
        "latency_s": rows["latency_s"].to_numpy(np.float64),
    })]
    if op == "all_reduce" and custom is not None:
        parts.append(pd.DataFrame({
            "n_gpus": custom["num_gpus"].to_numpy(np.float64),
            "nbytes": custom["message_size"].to_numpy(np.float64) * cdata.COMM_ELEMENT_BYTES,
            "latency_s": custom["latency_s"].to_numpy(np.float64),
        }))
    return _min_per_cell(parts)


def extend_gpu_counts(cells: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """``cells`` plus rows for the GPU counts ``other`` measured beyond ``cells``' largest:
    at each size both measured, this system's time at its largest count times ``other``'s
    growth from that count (``t(n) = t_own(n_max) * t_other(n) / t_other(n_max)``).

    Why: GB200's tables stop at 4 GPUs (one tray) while its NVLink domain is 72; B200 has the
    same NVLink 5 switch generation and measured 8, and at 2 and 4 GPUs the two systems' NCCL
    times agree within a few percent. The datasheet roofline would instead add 10 us per
    doubling (``alpha log2 n``), twice the growth the switch fabric shows."""
    n_max = float(cells["n_gpus"].max())
    base = cells[cells["n_gpus"] == n_max].set_index("nbytes")["latency_s"]
    ref = other[other["n_gpus"] == n_max].set_index("nbytes")["latency_s"]
    extra = []
    for n in sorted(float(v) for v in other["n_gpus"].unique() if v > n_max):
        at = other[other["n_gpus"] == n].set_index("nbytes")["latency_s"]
        common = base.index.intersection(ref.index).intersection(at.index)
        if len(common):
            extra.append(pd.DataFrame({"n_gpus": n, "nbytes": common.to_numpy(np.float64),
                                       "latency_s": (base[common] * at[common] / ref[common]).to_numpy(np.float64)}))
    return pd.concat([cells, *extra], ignore_index=True) if extra else cells


def fit_comm(
    nccl: pd.DataFrame | None,
    custom: pd.DataFrame | None,
    roof: RooflineOperators,
    p2p: pd.DataFrame | None = None,
    inter: pd.DataFrame | None = None,
    inter_bw_scale: float = 1.0,
    p2p_bw_scale: float = 1.0,
    extend: tuple[pd.DataFrame, pd.DataFrame | None] | None = None,
) -> dict[str, Any]:
    """Intra-node collectives from aiconfigurator's nccl (and vLLM custom all-reduce: the
    faster of the two per size, as vLLM picks; ``extend``, another system's (nccl, custom)
    tables, carries them to GPU counts not measured here, ``extend_gpu_counts``), intra-node p2p from Vidur send/recv with its
    bandwidth term scaled by ``p2p_bw_scale`` (measured NVLink / this GPU's: a profile taken on
    another NVLink generation), inter-node all-reduce from nccl-tests logs with its bandwidth
    term scaled by ``inter_bw_scale`` (measured link bandwidth / this GPU's)."""
    out: dict[str, Any] = {"intra": {}, "inter": {}, "p2p": {}}
    if nccl is not None:
        for op in COLLECTIVES:
            cells = _collective_cells(nccl, custom, op)
            if cells is None:
                continue
            if extend is not None:
                other = _collective_cells(extend[0], extend[1], op)
                if other is not None:
                    cells = extend_gpu_counts(cells, other)

            def roof_intra(n: np.ndarray, b: np.ndarray, op: str = op) -> np.ndarray:
                return roof.collective_s(op, b, n, inter_node=False)

            out["intra"][op] = comm_table(cells["n_gpus"].to_numpy(), cells["nbytes"].to_numpy(),
                                          cells["latency_s"].to_numpy(), roof_intra)
    if inter is not None and not inter.empty:
        n = inter["n_gpus"].to_numpy(np.float64)
        b = inter["nbytes"].to_numpy(np.float64)
        t = inter["latency_s"].to_numpy(np.float64).copy()
        if inter_bw_scale != 1.0:
            for g in np.unique(n):
                sel = n == g
                alpha, _ = alpha_beta(b[sel], t[sel])
                t[sel] = alpha + np.maximum(t[sel] - alpha, 0.0) * inter_bw_scale
            t = np.maximum(t, 1e-7)

        def roof_inter(n: np.ndarray, b: np.ndarray) -> np.ndarray:
            return roof.collective_s("all_reduce", b, n, inter_node=True)

        out["inter"]["all_reduce"] = comm_table(n, b, t, roof_inter)
        out["inter"]["bw_scale_applied"] = inter_bw_scale
    if p2p is not None:
        rows = p2p[~p2p["inter_node"].astype(bool)]
        if not rows.empty:
            cells = rows.groupby("nbytes", as_index=False)["latency_s"].median()
            b = cells["nbytes"].to_numpy(np.float64)
            t = cells["latency_s"].to_numpy(np.float64)
            if p2p_bw_scale != 1.0:  # latency kept, bandwidth term moved to this GPU's NVLink
                alpha, _ = alpha_beta(b, t)
                t = np.maximum(alpha + np.maximum(t - alpha, 0.0) * p2p_bw_scale, 1e-7)

            def roof_p2p(x: np.ndarray) -> np.ndarray:
                return roof.p2p_s(x, inter_node=False)

            grid = log_table(b[:, None], t, roof_p2p, (0,))
            out["p2p"]["intra"] = {"grid": grid.to_json(), "alpha_beta": list(alpha_beta(b, t))}
    return out


# ---- a whole folder ------------------------------------------------------------------------
FAMILY_FITS: dict[str, Callable[[pd.DataFrame, RooflineOperators], dict[str, Any]]] = {
    "gemm": fit_gemm,
    "attn_prefill": fit_attn_prefill,
    "attn_decode": fit_attn_decode,
    "moe": fit_moe,
}


def fit_frames(
    frames: dict[str, pd.DataFrame],
    spec: GPUSpec,
    p2p: pd.DataFrame | None = None,
    inter: pd.DataFrame | None = None,
    inter_bw_scale: float = 1.0,
    p2p_bw_scale: float = 1.0,
    comm_extend: dict[str, pd.DataFrame] | None = None,
) -> dict[str, Any]:
    """Fit every family present in ``frames`` (keys as ``data.SCHEMAS``); ``comm_extend``:
    another system's frames whose collectives extend these to more GPUs (``fit_comm``)."""
    roof = RooflineOperators(spec)
    families: dict[str, Any] = {}
    for fam, fn in FAMILY_FITS.items():
        if fam in frames and not frames[fam].empty:
            families[fam] = fn(frames[fam], roof)
    if "nccl" in frames or p2p is not None or inter is not None:
        ext = None
        if comm_extend is not None and "nccl" in comm_extend:
            ext = (comm_extend["nccl"], comm_extend.get("custom_allreduce"))
        families["comm"] = fit_comm(frames.get("nccl"), frames.get("custom_allreduce"), roof, p2p, inter,
                                    inter_bw_scale, p2p_bw_scale, ext)
    return families


def fit_folder(
    data_dir: str | Path,
    gpu: str | GPUSpec,
    network_dir: str | Path | None = None,
    nccl_logs: str | Path | None = None,
    nccl_logs_gpu: str = "a100",
    network_gpu: str | None = None,
    comm_extend_dir: str | Path | None = None,
) -> Calibration:
    """``libra-calibrate fit``: validate and fit an aiconfigurator-style folder, plus optional
    Vidur network CSVs (``network_dir``, measured on ``network_gpu``, default this GPU: the
    send/recv bandwidth term is rescaled to this GPU's NVLink) and multi-node nccl-tests logs
    (``nccl_logs``, measured on ``nccl_logs_gpu``: their bandwidth term is rescaled to this GPU's
    network). ``comm_extend_dir``: an aiconfigurator folder of the same NVLink generation whose
    collective tables carry this folder's to GPU counts it did not measure (gb200: b200's)."""
    spec = get_gpu(gpu)
    data_dir = Path(data_dir)
    tables = cdata.load_folder(data_dir)
    frames = {fam: t.frame for fam, t in tables.items()}
    files = {t.path.name: t.sha256 for t in tables.values()}
    meta: dict[str, Any] = {}
    meta_path = data_dir / "profile_meta.json"
    if meta_path.is_file():
        import json

        meta = json.loads(meta_path.read_text())
    p2p = None
    p2p_scale = 1.0
    if network_dir is not None:
        t = cdata.load_vidur_p2p(Path(network_dir))
        p2p = t.frame
        files[f"network/{t.path.name}"] = t.sha256
        if network_gpu is not None:
            p2p_scale = get_gpu(network_gpu).intra_node_bw / spec.intra_node_bw
    inter = None
    scale = 1.0
    if nccl_logs is not None:
        src = get_gpu(nccl_logs_gpu)
        inter, shas = cdata.load_nccl_logs(Path(nccl_logs), src.gpus_per_node)
        files.update({f"nccl_logs/{k}": v for k, v in shas.items()})
        if spec.inter_node_bw <= 0:
            raise CostModelError(f"GPU {spec.name!r} has no inter-node bandwidth to rescale nccl logs to")
        scale = src.inter_node_bw / spec.inter_node_bw
    comm_extend = None
    if comm_extend_dir is not None:
        ext_tables = {fam: cdata.load_family(Path(comm_extend_dir), fam) for fam in ("nccl", "custom_allreduce")}
        comm_extend = {fam: t.frame for fam, t in ext_tables.items() if t is not None}
        files.update({f"comm_extend/{t.path.name}": t.sha256 for t in ext_tables.values() if t is not None})
    families = fit_frames(frames, spec, p2p, inter, scale, p2p_scale, comm_extend)
    if not families:
        raise CostModelError(f"{data_dir}: nothing to fit")
    source = {
        "data": _display_path(data_dir),
        "network": _display_path(Path(network_dir)) if network_dir is not None else None,
        "nccl_logs": _display_path(Path(nccl_logs)) if nccl_logs is not None else None,
        "nccl_logs_gpu": nccl_logs_gpu if nccl_logs is not None else None,
        "network_gpu": network_gpu if network_dir is not None and network_gpu is not None else None,
        "comm_extend": _display_path(Path(comm_extend_dir)) if comm_extend_dir is not None else None,
        "files_sha256": files,
        "tool": TOOL_VERSION,
        "python": platform.python_version(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "profile_meta": meta,
    }
    return Calibration(gpu=spec.name, families=families, source=source, engine=_engine_entry(data_dir, meta, spec, files))


def _engine_entry(data_dir: Path, meta: dict[str, Any], spec: GPUSpec, files: dict[str, str]) -> EngineOverhead | None:
    """The engine overhead ``profile --engine-model`` left in ``profile_meta.json`` (None when
    the folder has none). It was fitted against the operators of this same folder for the
    device named in its source, so a fit for another device would pair it with the wrong
    operators: that is refused."""
    entry = meta.get("engine")
    if entry is None:
        return None
    engine = EngineOverhead.from_json(entry, str(data_dir / "profile_meta.json"))
    measured_for = engine.source.get("gpu")
    if measured_for is not None and measured_for != spec.name:
        raise CostModelError(
            f"{data_dir}: the engine overhead was fitted against {measured_for!r} operators; fit with --gpu {measured_for}"
        )
    csv_path = data_dir / "engine.csv"
    if csv_path.is_file():
        files["engine.csv"] = cdata.sha256_of(csv_path)
    return engine


def _display_path(p: Path) -> str:
    """The folder as a user would cite it: from its ``calibration`` ancestor when it has one
    (``calibration/aiconfigurator/a100_sxm``), else as given."""
    parts = p.resolve().parts
    if "calibration" in parts:
        i = len(parts) - 1 - parts[::-1].index("calibration")
        return "/".join(parts[i:])
    return str(p)
