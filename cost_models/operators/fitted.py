"""Operator timings fitted on measured data, with the roofline beyond the measured range.

Every family evaluates the same way: the query is mapped to the coordinates of its table
(``cost_models.calibration.fit``), the table is interpolated at the coordinates clamped to the
measured range, and the result is multiplied by ``roofline(query) / roofline(clamped query)``.
Inside the grid that ratio is 1 (pure interpolation of measurements); outside, the time follows
the roofline's shape, scaled to match the measurements at the boundary.

Family-specific mappings:

- attention prefill with ``cached_tokens`` c: the table (measured with an empty cache) is read at
  the equivalent length s' whose causal prefill has as many query-key pairs,
  ``s'(s'+1)/2 = s(c + (s+1)/2)``, and the roofline ratio corrects for the extra KV bytes read;
- decode attention: ``A(b, h, kv) + C(b, h, kv) * total_kv``, affine in total_kv by construction;
- MoE: the measured model shape nearest to the query (log distance over hidden, inter/tp, topk,
  experts/ep) is used and rescaled by the roofline ratio between the two shapes;
- collectives with no measurement (e.g. inter-node all-gather) take the measured all-reduce
  times the roofline ratio between the two operations; inter-node p2p and ``memory_bound_s``
  have no data and are the roofline.

Scalar calls take a pure-Python path with per-shape caches (the planner evaluates decode steps
millions of times): a cached decode evaluation costs well under a microsecond.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cost_models.calibration.grid import LogGrid
from cost_models.calibration.store import Calibration
from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.operators.roofline import RooflineOperators, as_float, finish, is_scalar

_CACHE_LIMIT = 200_000


def _bounded_put(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def rescale_link(grid: LogGrid, alpha_by_n: dict[str, list[float]], factor: float) -> LogGrid:
    """The same collective on a link ``1/factor`` as fast: ``alpha + (t - alpha) * factor``
    with each GPU count's fitted alpha (axis 0 of ``grid`` is the GPU count)."""
    if factor == 1.0:
        return grid
    alphas = np.array([alpha_by_n.get(str(int(n)), [0.0])[0] for n in grid.axes[0]])
    shape = [-1] + [1] * (grid.values.ndim - 1)
    t = np.exp(grid.values)
    a = np.minimum(alphas.reshape(shape), t)
    return LogGrid(grid.axes, np.log(a + (t - a) * factor))


def equivalent_length(s: Any, c: Any) -> Any:
    """Prefill length with as many causal query-key pairs as ``s`` new tokens on ``c`` cached."""
    pairs = s * (c + (s + 1.0) / 2.0)
    if isinstance(pairs, float):
        return (-1.0 + math.sqrt(1.0 + 8.0 * pairs)) / 2.0
    return (-1.0 + np.sqrt(1.0 + 8.0 * pairs)) / 2.0


class FittedOperators:
    """``OperatorSet`` from a ``Calibration`` (see module docstring)."""

    def __init__(self, spec: GPUSpec, calib: Calibration) -> None:
        self.spec = spec
        self.gpu = spec.name
        self.calibration_gpu = calib.gpu
        self.roof = RooflineOperators(spec)
        fam = calib.families
        self._gemm = LogGrid.from_json(fam["gemm"]["grid"]) if "gemm" in fam else None
        self._prefill = LogGrid.from_json(fam["attn_prefill"]["grid"]) if "attn_prefill" in fam else None
        self._dec_a = LogGrid.from_json(fam["attn_decode"]["A"]) if "attn_decode" in fam else None
        self._dec_c = LogGrid.from_json(fam["attn_decode"]["C"]) if "attn_decode" in fam else None
        self._moe: dict[tuple[float, ...], LogGrid] = {}
        for cfg in fam.get("moe", {}).get("configs", []):
            self._moe[tuple(float(v) for v in cfg["shape"])] = LogGrid.from_json(cfg["grid"])
        self._moe_keys = list(self._moe)
        self._moe_feats = np.array([self._moe_features(*k) for k in self._moe_keys]) if self._moe else None
        self._intra: dict[str, LogGrid] = {}
        self._inter: dict[str, LogGrid] = {}
        self._p2p_intra: LogGrid | None = None
        self._init_comm(fam.get("comm", {}), calib.gpu)
        self._c_gemm: dict[tuple[float, float, float], float] = {}
        self._c_dec: dict[tuple[float, float, float], tuple[float, float]] = {}
        self._c_pre: dict[tuple[float, ...], float] = {}
        self._c_moe: dict[tuple[float, ...], float] = {}

    @classmethod
    def from_calibration(cls, gpu: GPUSpec | str, calib: Calibration) -> FittedOperators:
        """Fitted timings for ``gpu`` from a calibration measured on ``calib.gpu`` (the same GPU,
        or one with identical compute such as a800 on a100 data: links are rescaled)."""
        spec = get_gpu(gpu)
        try:
            measured = get_gpu(calib.gpu)
        except CostModelError:
            measured = spec
        if measured.name != spec.name and (
            measured.bf16_flops != spec.bf16_flops or measured.hbm_bw != spec.hbm_bw
        ):
            raise CostModelError(
                f"calibration measured on {calib.gpu!r} cannot stand for {spec.name!r}: their compute "
                f"differs (fit one with `libra-calibrate fit --gpu {spec.name}`)"
            )
        return cls(spec, calib)

    def __repr__(self) -> str:
        return f"FittedOperators(gpu={self.gpu!r}, calibration_gpu={self.calibration_gpu!r})"

    def _init_comm(self, comm: dict[str, Any], measured_name: str) -> None:
        try:
            measured = get_gpu(measured_name)
        except CostModelError:
            measured = self.spec
        intra_factor = measured.intra_node_bw / self.spec.intra_node_bw
        inter_factor = measured.inter_node_bw / self.spec.inter_node_bw
        for op, entry in comm.get("intra", {}).items():
            self._intra[op] = rescale_link(LogGrid.from_json(entry["grid"]), entry["alpha_beta"], intra_factor)
        for op, entry in comm.get("inter", {}).items():
            if isinstance(entry, dict) and "grid" in entry:
                self._inter[op] = rescale_link(LogGrid.from_json(entry["grid"]), entry["alpha_beta"], inter_factor)
        p2p = comm.get("p2p", {}).get("intra")
        if p2p is not None:
            g = LogGrid.from_json(p2p["grid"])
            if intra_factor != 1.0:
                alpha = min(p2p["alpha_beta"][0], float(np.exp(g.values.min())))
                t = np.exp(g.values)
                g = LogGrid(g.axes, np.log(alpha + (t - alpha) * intra_factor))
            self._p2p_intra = g

    # ---- generic table evaluation ----------------------------------------------------------
    @staticmethod
    def _table(grid: LogGrid, roof: Any, coords: tuple[Any, ...], ref: tuple[Any, ...] | None = None) -> Any:
        """exp(table(clamped coords)) * roof(*ref_query) / roof(*ref_clamped); ``ref`` maps
        (query coords or clamped coords) to the roofline's arguments (default: the coords)."""
        if isinstance(coords[0], float) and all(isinstance(c, float) for c in coords):
            val = math.exp(grid.scalar(*coords))
            if grid.inside(*coords):
                return val
            clamped = tuple(min(max(c, lo), hi) for c, lo, hi in zip(coords, grid._lo, grid._hi))
            return val * float(roof(*coords)) / float(roof(*clamped))
        val = np.exp(grid(*coords))
        clamped = tuple(grid.clip(*coords))
        return val * roof(*coords) / roof(*clamped)

    # ---- compute kernels -------------------------------------------------------------------
    def gemm_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
        if self._gemm is None:
            return self.roof.gemm_s(m, n, k)
        m, n, k = as_float(m, n, k)
        if isinstance(m, float):
            key = (m, n, k)
            hit = self._c_gemm.get(key)
            if hit is None:
                hit = self._table(self._gemm, self.roof.gemm_s, key)
                _bounded_put(self._c_gemm, key, hit)
            return np.float64(hit)  # type: ignore[return-value]
        return finish(self._table(self._gemm, self.roof.gemm_s, (m, n, k)))

    def attn_prefill_s(
        self,
        batch: ArrayLike,
        new_tokens: ArrayLike,
        cached_tokens: ArrayLike,
        n_heads: ArrayLike,
        n_kv_heads: ArrayLike,
    ) -> np.ndarray:
        if self._prefill is None:
            return self.roof.attn_prefill_s(batch, new_tokens, cached_tokens, n_heads, n_kv_heads)
        b, s, c, h, kv = as_float(batch, new_tokens, cached_tokens, n_heads, n_kv_heads)
        if isinstance(b, float):
            key = (b, s, c, h, kv)
            hit = self._c_pre.get(key)
            if hit is None:
                hit = float(self._prefill_eval(b, s, c, h, kv))
                _bounded_put(self._c_pre, key, hit)
            return np.float64(hit)  # type: ignore[return-value]
        return finish(self._prefill_eval(b, s, c, h, kv))

    def _prefill_eval(self, b: Any, s: Any, c: Any, h: Any, kv: Any) -> Any:
        grid = self._prefill
        assert grid is not None
        s_eq = equivalent_length(s, c)
        if isinstance(b, float):
            val = math.exp(grid.scalar(b, s_eq, h, kv))
            cb, cs, ch, ckv = (min(max(v, lo), hi) for v, lo, hi in zip((b, s_eq, h, kv), grid._lo, grid._hi))
        else:
            val = np.exp(grid(b, s_eq, h, kv))
            cb, cs, ch, ckv = grid.clip(b, s_eq, h, kv)
        ratio = self.roof.attn_prefill_s(b, s, c, h, kv) / self.roof.attn_prefill_s(cb, cs, 0.0, ch, ckv)
        return val * ratio

    def _decode_params(self, b: Any, h: Any, kv: Any) -> tuple[Any, Any]:
        ga, gc = self._dec_a, self._dec_c
        assert ga is not None and gc is not None
        roof = self.roof
        if isinstance(b, float):
            a = math.exp(ga.scalar(h, kv, b))
            c = math.exp(gc.scalar(h, kv, b))
            if not ga.inside(h, kv, b):
                ch, ckv, cb = (min(max(v, lo), hi) for v, lo, hi in zip((h, kv, b), ga._lo, ga._hi))
                a0, c0 = self._roof_decode_parts(b, h, kv)
                a1, c1 = self._roof_decode_parts(cb, ch, ckv)
                a *= a0 / a1
                c *= c0 / c1
            return a, c
        a = np.exp(ga(h, kv, b))
        c = np.exp(gc(h, kv, b))
        ch, ckv, cb = ga.clip(h, kv, b)
        a0, c0 = self._roof_decode_parts(b, h, kv)
        a1, c1 = self._roof_decode_parts(cb, ch, ckv)
        return a * a0 / a1, c * c0 / c1

    def _roof_decode_parts(self, b: Any, h: Any, kv: Any) -> tuple[Any, Any]:
        intercept = self.roof.attn_decode_s(b, 0.0, h, kv)
        slope = self.roof.attn_decode_s(b, 1.0, h, kv) - intercept
        if isinstance(b, float):
            return float(intercept), float(slope)
        return intercept, slope

    def decode_coefficients(self, batch: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike) -> tuple[Any, Any]:
        """(intercept s, slope s per KV token) of ``attn_decode_s`` for a fixed batch: what a
        simulator integrating decode time in closed form needs."""
        if self._dec_a is None:
            return self._roof_decode_parts(*as_float(batch, n_heads, n_kv_heads))
        b, h, kv = as_float(batch, n_heads, n_kv_heads)
        if isinstance(b, float):
            key = (b, h, kv)
            hit = self._c_dec.get(key)
            if hit is None:
                hit = self._decode_params(b, h, kv)
                _bounded_put(self._c_dec, key, hit)
            return hit
        return self._decode_params(b, h, kv)

    def attn_decode_s(
        self, batch: ArrayLike, total_kv_tokens: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike
    ) -> np.ndarray:
        if self._dec_a is None:
            return self.roof.attn_decode_s(batch, total_kv_tokens, n_heads, n_kv_heads)
        if is_scalar(batch, total_kv_tokens, n_heads, n_kv_heads):
            key = (float(batch), float(n_heads), float(n_kv_heads))  # type: ignore[arg-type]
            hit = self._c_dec.get(key)
            if hit is None:
                hit = self._decode_params(key[0], key[1], key[2])
                _bounded_put(self._c_dec, key, hit)
            return np.float64(hit[0] + hit[1] * float(total_kv_tokens))  # type: ignore[arg-type,return-value]
        b, t, h, kv = as_float(batch, total_kv_tokens, n_heads, n_kv_heads)
        a, c = self._decode_params(b, h, kv)
        return finish(a + c * t)

    @staticmethod
    def _moe_features(hidden: float, inter: float, topk: float, experts: float, tp: float, ep: float) -> list[float]:
        return [math.log(hidden), math.log(inter / tp), math.log(topk), math.log(experts / ep), math.log(experts)]

    def _moe_shape(self, key: tuple[float, ...]) -> tuple[float, ...]:
        """The measured shape used for ``key``: itself if measured, else the nearest one."""
        if key in self._moe:
            return key
        assert self._moe_feats is not None
        f = np.array(self._moe_features(*key))
        return self._moe_keys[int(np.argmin(np.sum((self._moe_feats - f) ** 2, axis=1)))]

    def _moe_one(self, x: float, key: tuple[float, ...]) -> float:
        ref = self._moe_shape(key)
        grid = self._moe[ref]
        val = math.exp(grid.scalar(x))
        cx = min(max(x, grid._lo[0]), grid._hi[0])
        if cx == x and ref == key:
            return val
        return val * float(self.roof.moe_s(x, *key)) / float(self.roof.moe_s(cx, *ref))

    def moe_s(
        self,
        tokens: ArrayLike,
        hidden: ArrayLike,
        inter: ArrayLike,
        topk: ArrayLike,
        n_experts: ArrayLike,
        tp: ArrayLike,
        ep: ArrayLike,
    ) -> np.ndarray:
        if not self._moe:
            return self.roof.moe_s(tokens, hidden, inter, topk, n_experts, tp, ep)
        vals = as_float(tokens, hidden, inter, topk, n_experts, tp, ep)
        if isinstance(vals[0], float):
            hit = self._c_moe.get(vals)
            if hit is None:
                hit = self._moe_one(vals[0], vals[1:])
                _bounded_put(self._c_moe, vals, hit)
            return np.float64(hit)  # type: ignore[return-value]
        arrs = np.broadcast_arrays(*vals)
        shape = arrs[0].shape
        flat = [a.ravel() for a in arrs]
        shapes = np.column_stack(flat[1:])
        out = np.empty(flat[0].shape)
        uniq, inv = np.unique(shapes, axis=0, return_inverse=True)
        for u, row in enumerate(uniq):
            key = tuple(float(v) for v in row)
            ref = self._moe_shape(key)
            grid = self._moe[ref]
            sel = inv.ravel() == u
            x = flat[0][sel]
            cx = grid.clip(x)[0]
            out[sel] = np.exp(grid(x)) * self.roof.moe_s(x, *key) / self.roof.moe_s(cx, *ref)
        return out.reshape(shape)

    def memory_bound_s(self, nbytes: ArrayLike) -> np.ndarray:
        """No elementwise-kernel data in the calibration sets: the roofline (aiconfigurator's
        0.8 bandwidth factor and 3 us constant)."""
        return self.roof.memory_bound_s(nbytes)

    # ---- communication ---------------------------------------------------------------------
    def collective_s(self, op: str, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """Any measured collective (all_reduce, all_gather, reduce_scatter, alltoall)."""
        tables = self._inter if inter_node else self._intra
        grid = tables.get(op)
        base_op = op
        if grid is None and inter_node and "all_reduce" in tables:
            grid, base_op = tables["all_reduce"], "all_reduce"
        if grid is None:
            return self.roof.collective_s(op, nbytes, n_gpus, inter_node)
        b, n = as_float(nbytes, n_gpus)
        roof = self.roof

        def roof_base(nn: Any, bb: Any) -> Any:
            return roof.collective_s(base_op, bb, nn, inter_node)

        if isinstance(b, float):
            if n <= 1.0:
                return np.float64(0.0)  # type: ignore[return-value]
            t = self._table(grid, roof_base, (n, b))
            if base_op != op:
                t *= float(roof.collective_s(op, b, n, inter_node)) / float(roof_base(n, b))
            return np.float64(t)  # type: ignore[return-value]
        n_safe = np.maximum(n, 2.0)
        t = self._table(grid, roof_base, (n_safe, b))
        if base_op != op:
            t = t * roof.collective_s(op, b, n_safe, inter_node) / roof_base(n_safe, b)
        return np.where(np.broadcast_to(n, np.shape(t)) <= 1.0, 0.0, t)

    def allreduce_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        return self.collective_s("all_reduce", nbytes, n_gpus, inter_node)

    def allgather_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        return self.collective_s("all_gather", nbytes, n_gpus, inter_node)

    def p2p_s(self, nbytes: ArrayLike, inter_node: bool = False) -> np.ndarray:
        if inter_node or self._p2p_intra is None:
            return self.roof.p2p_s(nbytes, inter_node)
        (b,) = as_float(nbytes)
        roof = self.roof

        def roof_p2p(x: Any) -> Any:
            return roof.p2p_s(x, False)

        return finish(self._table(self._p2p_intra, roof_p2p, (b,)))
