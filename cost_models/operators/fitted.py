"""Operator timings fitted on measured data, with roofline-shaped extrapolation beyond it.

Inside the measured range every family interpolates its table (``cost_models.calibration.fit``):
the measurements themselves, made monotone in the size axes. Outside, each family extends the
table in a way that is monotone BY CONSTRUCTION (a simulator must never see more work take less
time), following the roofline's asymptotic shape:

- below the smallest measured size a shape takes the time of the smallest measured one (a
  smaller kernel can always be padded to it; below the grid, kernels are launch-bound anyway);
- GEMM above the grid: time linear in each of m, n, k beyond its largest measured value (the
  largest measured GEMMs are compute-saturated, where the roofline is linear in each);
- prefill above the grid: linear in batch and heads, quadratic in the (equivalent) length.
  Cached tokens c enter through the equivalent length ``s'`` whose causal prefill has as many
  query-key pairs, ``s'(s'+1)/2 = s(c + (s+1)/2)``, and the result is never below the roofline
  time of streaming the whole KV (``b * (c + s)`` tokens) once, as a decode step would;
- decode attention: ``A(b, h, kv) + C(b, h, kv) * total_kv`` (affine in total_kv by
  construction); beyond the grid A and C follow the roofline's intercept and per-token parts;
- MoE: each measured shape's token table spans the family's token axis (counts it was not
  measured at follow the other shapes' measured curves, see ``fit.fill_by_shape_curvature``);
  a model shape that was not measured gets its own token table, built from the nearest
  measured shape (log distance over hidden, inter/tp, topk, experts/ep) times the roofline ratio
  of the two shapes at each token count, then made monotone; beyond the table's token range
  (either end), the roofline ratio in tokens (below it the expert-weight bytes shrink as fewer
  experts are hit, so clamping would overstate a one-token call);
- collectives: beyond the measured GPU counts and sizes, the measured time plus the roofline's
  extra time (``t(clamped) + roof(x) - roof(clamped)``), which is non-decreasing in bytes;
  inter-node collectives other than all-reduce (not measured) get a table derived from the
  all-reduce one by the roofline ratio of the two operations, made monotone; inter-node p2p and ``memory_bound_s`` have no data
  and are the roofline.

Scalar calls take a pure-Python path with per-shape caches (the planner evaluates decode steps
millions of times): a cached evaluation costs about a microsecond.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cost_models.calibration.grid import LogGrid, make_monotone
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
        if "all_reduce" in self._inter:  # no inter-node data for the others: derive, monotone
            ar = self._inter["all_reduce"]
            nn, bb = np.meshgrid(*ar.axes, indexing="ij")
            for op in ("all_gather", "reduce_scatter", "alltoall"):
                if op not in self._inter:
                    shift = np.log(self.roof.collective_s(op, bb, nn, True)) - np.log(
                        self.roof.collective_s("all_reduce", bb, nn, True))
                    self._inter[op] = LogGrid(ar.axes, make_monotone(ar.values + shift, (1,)))
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
    def _scaled(grid: LogGrid, coords: tuple[Any, ...], powers: tuple[float, ...]) -> Any:
        """exp(table(clamped coords)) * prod over axes of max(1, x / largest measured) ** power:
        clamped below the grid, power-law above it; monotone in every coordinate."""
        if all(isinstance(c, float) for c in coords):
            val = math.exp(grid.scalar(*coords))
            for c, hi, pw in zip(coords, grid._hi, powers):
                if c > hi and pw:
                    val *= (c / hi) ** pw
            return val
        val = np.exp(grid(*coords))
        for c, hi, pw in zip(coords, grid._hi, powers):
            if pw:
                val = val * np.maximum(1.0, np.asarray(c) / hi) ** pw
        return val

    # ---- compute kernels -------------------------------------------------------------------
    def gemm_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
        if self._gemm is None:
            return self.roof.gemm_s(m, n, k)
        m, n, k = as_float(m, n, k)
        if isinstance(m, float):
            key = (m, n, k)
            hit = self._c_gemm.get(key)
            if hit is None:
                hit = self._scaled(self._gemm, key, (1.0, 1.0, 1.0))
                _bounded_put(self._c_gemm, key, hit)
            return np.float64(hit)  # type: ignore[return-value]
        return finish(self._scaled(self._gemm, (m, n, k), (1.0, 1.0, 1.0)))

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
        t = self._scaled(grid, (b, s_eq, h, kv), (1.0, 2.0, 1.0, 0.0))
        stream = self.roof.attn_decode_s(b, b * (c + s), h, kv)
        if isinstance(t, float):
            return max(t, float(stream))
        return np.maximum(t, stream)

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
        if np.ndim(intercept) == 0:
            return float(intercept), float(slope)
        return intercept, slope

    def decode_coefficients(self, batch: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike) -> tuple[Any, Any]:
        """(intercept s, slope s per KV token) of ``attn_decode_s`` for a fixed batch: what a
        simulator integrating decode time in closed form needs."""
        if self._dec_a is None:
            return self.roof.decode_coefficients(batch, n_heads, n_kv_heads)
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
        """The measured shape nearest to ``key`` (itself when measured)."""
        if key in self._moe:
            return key
        assert self._moe_feats is not None
        f = np.array(self._moe_features(*key))
        return self._moe_keys[int(np.argmin(np.sum((self._moe_feats - f) ** 2, axis=1)))]

    def _moe_table(self, key: tuple[float, ...]) -> LogGrid:
        """The token table of ``key``: measured, or derived from the nearest measured shape by
        the roofline ratio at each token count and made monotone (cached per shape)."""
        grid = self._moe.get(key)
        if grid is not None:
            return grid
        ref = self._moe_shape(key)
        base = self._moe[ref]
        x = base.axes[0]
        vals = base.values + np.log(self.roof.moe_s(x, *key)) - np.log(self.roof.moe_s(x, *ref))
        grid = LogGrid([x], make_monotone(vals, (0,)))
        if len(self._moe) < _CACHE_LIMIT:
            self._moe[key] = grid
        return grid

    def _moe_eval(self, x: Any, key: tuple[float, ...]) -> Any:
        grid = self._moe_table(key)
        lo, hi = grid._lo[0], grid._hi[0]
        if isinstance(x, float):
            val = math.exp(grid.scalar(x))
            if x > hi or x < lo:
                edge = hi if x > hi else lo
                val *= float(self.roof.moe_s(x, *key)) / float(self.roof.moe_s(edge, *key))
            return val
        val = np.exp(grid(x))
        outside = (x > hi) | (x < lo)
        if np.any(outside):
            edge = np.where(x > hi, hi, lo)
            val = np.where(outside, val * self.roof.moe_s(x, *key) / self.roof.moe_s(edge, *key), val)
        return val

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
                hit = self._moe_eval(vals[0], vals[1:])
                _bounded_put(self._c_moe, vals, hit)
            return np.float64(hit)  # type: ignore[return-value]
        arrs = np.broadcast_arrays(*vals)
        shape = arrs[0].shape
        flat = [a.ravel() for a in arrs]
        shapes = np.column_stack(flat[1:])
        out = np.empty(flat[0].shape)
        uniq, inv = np.unique(shapes, axis=0, return_inverse=True)
        for u, row in enumerate(uniq):
            sel = inv.ravel() == u
            out[sel] = self._moe_eval(flat[0][sel], tuple(float(v) for v in row))
        return out.reshape(shape)

    def memory_bound_s(self, nbytes: ArrayLike) -> np.ndarray:
        """No elementwise-kernel data in the calibration sets: the roofline (aiconfigurator's
        0.8 bandwidth factor and 3 us constant)."""
        return self.roof.memory_bound_s(nbytes)

    # ---- communication ---------------------------------------------------------------------
    def collective_s(self, op: str, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """Any collective (all_reduce, all_gather, reduce_scatter, alltoall); roofline where
        nothing was measured."""
        grid = (self._inter if inter_node else self._intra).get(op)
        if grid is None:
            return self.roof.collective_s(op, nbytes, n_gpus, inter_node)
        b, n = as_float(nbytes, n_gpus)
        roof = self.roof
        if isinstance(b, float):
            if n <= 1.0:
                return np.float64(0.0)  # type: ignore[return-value]
            val = math.exp(grid.scalar(n, b))
            if not grid.inside(n, b):
                cn, cb = (min(max(v, lo), hi) for v, lo, hi in zip((n, b), grid._lo, grid._hi))
                extra = float(roof.collective_s(op, b, n, inter_node)) - float(roof.collective_s(op, cb, cn, inter_node))
                val = max(val + extra, 0.5 * val)
            return np.float64(val)  # type: ignore[return-value]
        n_safe = np.maximum(n, 2.0)
        val = np.exp(grid(n_safe, b))
        cn, cb = grid.clip(n_safe, b)
        extra = roof.collective_s(op, b, n_safe, inter_node) - roof.collective_s(op, cb, cn, inter_node)
        val = np.maximum(val + extra, 0.5 * val)
        return np.where(np.broadcast_to(n, np.shape(val)) <= 1.0, 0.0, val)

    def allreduce_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        return self.collective_s("all_reduce", nbytes, n_gpus, inter_node)

    def allgather_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        return self.collective_s("all_gather", nbytes, n_gpus, inter_node)

    def p2p_s(self, nbytes: ArrayLike, inter_node: bool = False) -> np.ndarray:
        if inter_node or self._p2p_intra is None:
            return self.roof.p2p_s(nbytes, inter_node)
        (b,) = as_float(nbytes)
        grid = self._p2p_intra
        hi = grid._hi[0]
        if isinstance(b, float):
            val = math.exp(grid.scalar(b))
            if b > hi:
                val *= float(self.roof.p2p_s(b)) / float(self.roof.p2p_s(hi))
            return np.float64(val)  # type: ignore[return-value]
        val = np.exp(grid(b))
        return finish(np.where(b > hi, val * self.roof.p2p_s(b) / self.roof.p2p_s(hi), val))
