"""Roofline operator timings from datasheet constants alone.

Why it exists: it is the model of last resort (a GPU or a shape with no measurement) and the
shape the fitted models extrapolate with beyond their measured grid. Every operator is
``max(flops / (peak_flops * COMPUTE_EFF), bytes / (hbm_bw * MEM_EFF)) + LAUNCH_S``; collectives
are ``alpha + bus_bytes / (link_bw * LINK_EFF)`` with the ring algorithm's bus-byte factors.

The efficiencies are the only non-datasheet numbers and are documented in
docs/cost-model-operators.md: ``MEM_EFF = 0.8`` and ``LAUNCH_S = 3 us`` are aiconfigurator's
empirical constants (shared/calibration/aiconfigurator/*/system.yaml), ``COMPUTE_EFF = 0.7`` is
what large cuBLAS bf16 GEMMs reach on A100/H100 in that same data, and ``COMM_ALPHA_S = 10 us``
is aiconfigurator's ``p2p_latency``.

All methods accept scalars or NumPy arrays (broadcast together). Scalar arguments take a pure
Python path (a NumPy round trip costs microseconds the planner cannot afford) and return a
``np.float64``; array arguments return an ``np.ndarray`` of the broadcast shape.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cost_models.hardware import GPUSpec, get_gpu

HEAD_DIM = 128  # every attention row of the calibration data has head_dim 128
DTYPE_BYTES = 2  # bf16
COMPUTE_EFF = 0.7
MEM_EFF = 0.8
LAUNCH_S = 3e-6
COMM_ALPHA_S = 10e-6
LINK_EFF = 0.8

_SCALARS = (int, float, np.integer, np.floating)


def is_scalar(*values: Any) -> bool:
    """True when every value is a plain number (the fast pure-Python path applies)."""
    for v in values:
        if not isinstance(v, _SCALARS):
            return False
    return True


def vmax(a: Any, b: Any) -> Any:
    """Elementwise maximum that stays pure Python on floats."""
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a >= b else b
    return np.maximum(a, b)


def vmin(a: Any, b: Any) -> Any:
    """Elementwise minimum that stays pure Python on floats."""
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a <= b else b
    return np.minimum(a, b)


def as_float(*values: ArrayLike) -> tuple[Any, ...]:
    """Scalars as Python floats, anything else as float64 arrays (not yet broadcast)."""
    if is_scalar(*values):
        return tuple(float(v) for v in values)
    return tuple(np.asarray(v, dtype=np.float64) for v in values)


def finish(t: Any) -> np.ndarray:
    """Return type of every operator: np.float64 for scalar inputs, else a float64 array."""
    if isinstance(t, float):
        return np.float64(t)  # type: ignore[return-value]
    return np.asarray(t, dtype=np.float64)


def ring_factor(op: str, n: Any) -> Any:
    """Bus-byte factor of the ring algorithm: all-reduce moves 2(n-1)/n of the buffer per GPU,
    all-gather / reduce-scatter (n-1)/n of the output, alltoall (n-1)/n."""
    base = (n - 1.0) / n
    return 2.0 * base if op == "all_reduce" else base


class RooflineOperators:
    """Datasheet-only ``OperatorSet`` (see module docstring for the formulas)."""

    def __init__(self, gpu: GPUSpec | str) -> None:
        self.spec = get_gpu(gpu)
        self.gpu = self.spec.name
        self._flops = self.spec.bf16_flops * COMPUTE_EFF
        self._bw = self.spec.hbm_bw * MEM_EFF

    def __repr__(self) -> str:
        return f"RooflineOperators(gpu={self.gpu!r})"

    # ---- compute kernels -------------------------------------------------------------------
    def _roof(self, flops: Any, nbytes: Any) -> Any:
        return vmax(flops / self._flops, nbytes / self._bw) + LAUNCH_S

    def gemm_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
        """A bf16 (m x k) @ (k x n) matmul: 2mnk FLOPs, reads A and B, writes C."""
        m, n, k = as_float(m, n, k)
        return finish(self._roof(2.0 * m * n * k, DTYPE_BYTES * (m * k + k * n + m * n)))

    def attn_prefill_s(
        self,
        batch: ArrayLike,
        new_tokens: ArrayLike,
        cached_tokens: ArrayLike,
        n_heads: ArrayLike,
        n_kv_heads: ArrayLike,
    ) -> np.ndarray:
        """Causal flash attention: each new token attends to the cache plus the new tokens before
        it (QK^T and PV: 4 * head_dim FLOPs per query-key pair); reads Q, K, V, writes O."""
        b, s, c, h, kv = as_float(batch, new_tokens, cached_tokens, n_heads, n_kv_heads)
        pairs = s * (c + (s + 1.0) / 2.0)
        flops = 4.0 * HEAD_DIM * b * h * pairs
        nbytes = DTYPE_BYTES * HEAD_DIM * b * (2.0 * h * s + 2.0 * kv * (c + s))
        return finish(self._roof(flops, nbytes))

    def attn_decode_s(
        self, batch: ArrayLike, total_kv_tokens: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike
    ) -> np.ndarray:
        """One decode step: streams K and V of every cached token once. Written as
        ``launch + q/o traffic + total_kv * max(byte time, flop time) per token`` so it is affine
        in ``total_kv_tokens`` as the contract requires."""
        b, t, h, kv = as_float(batch, total_kv_tokens, n_heads, n_kv_heads)
        per_tok = vmax(2.0 * DTYPE_BYTES * HEAD_DIM * kv / self._bw, 4.0 * HEAD_DIM * h / self._flops)
        fixed = 2.0 * DTYPE_BYTES * HEAD_DIM * b * h / self._bw
        return finish(LAUNCH_S + fixed + t * per_tok)

    def decode_coefficients(self, batch: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike) -> tuple[Any, Any]:
        """(intercept s, slope s per KV token) of ``attn_decode_s`` for a fixed batch."""
        b, h, kv = as_float(batch, n_heads, n_kv_heads)
        per_tok = vmax(2.0 * DTYPE_BYTES * HEAD_DIM * kv / self._bw, 4.0 * HEAD_DIM * h / self._flops)
        return LAUNCH_S + 2.0 * DTYPE_BYTES * HEAD_DIM * b * h / self._bw, per_tok

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
        """Fused MoE on one GPU of a TP x EP group: the GPU holds n_experts/ep experts with
        inter/tp columns each, receives tokens*topk/ep routed tokens (balanced routing), and
        reads the weights of every local expert that at least one token hits (expected
        count under uniform routing)."""
        x, hd, it, k, e, tp_, ep_ = as_float(tokens, hidden, inter, topk, n_experts, tp, ep)
        routed = x * k / ep_
        inter_s = it / tp_
        flops = 2.0 * 3.0 * routed * hd * inter_s  # gate, up and down projections
        local = e / ep_
        if isinstance(x, float):
            hit = local * (1.0 - math.exp(-x * k / e))
        else:
            hit = local * (1.0 - np.exp(-x * k / e))
        nbytes = DTYPE_BYTES * (3.0 * hit * hd * inter_s + routed * (2.0 * hd + 2.0 * inter_s))
        return finish(self._roof(flops, nbytes))

    def memory_bound_s(self, nbytes: ArrayLike) -> np.ndarray:
        """An elementwise kernel streaming ``nbytes`` through HBM."""
        (b,) = as_float(nbytes)
        return finish(b / self._bw + LAUNCH_S)

    # ---- communication ---------------------------------------------------------------------
    def _link_bw(self, inter_node: bool) -> float:
        return (self.spec.inter_node_bw if inter_node else self.spec.intra_node_bw) * LINK_EFF

    def collective_bw(self, n: Any, inter_node: bool) -> Any:
        """Bus bandwidth (B/s) of a collective over ``n`` GPUs. Within an NVLink domain (a node
        on HGX boards, a rack on GB200 NVL72; ``inter_node=False``): the GPU's NVLink. Across
        domains NCCL runs one ring per NIC, so a domain contributes all its NICs: with the group
        spread evenly over at least two domains, min(n/2, nvlink_domain) NICs per domain,
        capped by NVLink."""
        if not inter_node:
            return self.spec.intra_node_bw * LINK_EFF
        local = vmin(vmax(n / 2.0, 1.0), float(self.spec.nvlink_domain))
        return vmin(self.spec.intra_node_bw, local * self.spec.inter_node_bw) * LINK_EFF

    def collective_s(self, op: str, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """Ring collective ``op`` (all_reduce, all_gather, reduce_scatter, alltoall):
        ``alpha * log2(n) + ring_factor * nbytes / bus_bw``; 0 for one GPU."""
        b, n = as_float(nbytes, n_gpus)
        if isinstance(n, float):
            if n <= 1.0:
                return np.float64(0.0)  # type: ignore[return-value]
            bw = self.collective_bw(n, inter_node)
            return np.float64(COMM_ALPHA_S * math.log2(n) + ring_factor(op, n) * b / bw)  # type: ignore[return-value]
        n_safe = np.maximum(n, 2.0)
        t = COMM_ALPHA_S * np.log2(n_safe) + ring_factor(op, n_safe) * b / self.collective_bw(n_safe, inter_node)
        return np.where(n <= 1.0, 0.0, t)

    def _collective(self, op: str, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool) -> np.ndarray:
        return self.collective_s(op, nbytes, n_gpus, inter_node)

    def allreduce_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """Ring all-reduce: 2(n-1)/n of the buffer over each GPU's link."""
        return self._collective("all_reduce", nbytes, n_gpus, inter_node)

    def allgather_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """Ring all-gather of an ``nbytes`` output: (n-1)/n of it over each GPU's link."""
        return self._collective("all_gather", nbytes, n_gpus, inter_node)

    def p2p_s(self, nbytes: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """One send/recv between two GPUs."""
        (b,) = as_float(nbytes)
        return finish(COMM_ALPHA_S + b / self._link_bw(inter_node))
