"""Rollout (inference engine) timing: decode and prefill iterations of a TP group, composed from
operator timings.

Why the affine form matters: the simulator never steps token by token. Between two changes of a
batch's membership every running sequence grows by one token per iteration, so the batch's total
KV context grows linearly, and with ``decode_s = base(tp, B) + per_kv(tp, B) * context`` the time
of ``n`` iterations is a closed-form arithmetic series. ``decode_coeffs`` exposes exactly those two
numbers and ``decode_s`` is computed from them, so the identity holds bit for bit.

Per decode iteration of ``B`` sequences holding ``C`` KV tokens together, on one GPU of a TP group
(formulas and constants in docs/cost-model.md):
  layers x [ QKV GEMM (m=B, n=(q + 2 kv)/tp) + O GEMM + MLP GEMMs (or ``moe_s``)
             + decode attention(B, C) + elementwise (2 RMSNorms, residuals, rotary, SwiGLU)
             + 2 TP all-reduces of B x hidden x 2 bytes ]
  + embedding + final norm + LM head GEMM (vocab/tp) + logits gather + sampler
  times the engine profile's ``kernel_scale``,
  + the engine profile's overhead(tp, B) (scheduler, input preparation, TP fan-out, collective
    latency floors, launch gaps; ``cost_models.engines``).
Only the attention term depends on C, and the operator contract makes it affine in C.
Tables of (base, slope) per batch size 0..N are built per TP on first use (one vectorized pass),
so a scalar evaluation is two list lookups and a multiply-add.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cost_models.engines.profile import EngineProfile
from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec
from cost_models.memory import DTYPE_BYTES, check_tp, kv_heads_per_gpu
from cost_models.models import ModelSpec
from cost_models.operators.base import OperatorSet

# vLLM V1 per-iteration CPU work not hidden behind the GPU (scheduling, input tensors, sampler
# launch, output processing). Published vLLM V1 profiles put it at ~1 ms per step plus a few
# microseconds per running request; these are assumptions a calibration's ``engine`` entry
# (``libra-calibrate profile --engine-model``) replaces.
ENGINE_STEP_S = 1.0e-3
ENGINE_PER_SEQ_S = 5.0e-6
OPERATOR_HEAD_DIM = 128  # the operator set's attention is for head_dim 128; other head dims scale heads
_SLOPE_REF_TOKENS = 1.0e6  # KV size used to read the attention slope off the operator
_MIN_TABLE = 512  # first table covers batch 0..511; grows by doubling


class RolloutTimer:
    """Decode/prefill iteration times of one (GPU, model) pair for any TP degree."""

    def __init__(
        self,
        ops: OperatorSet,
        gpu: GPUSpec,
        model: ModelSpec,
        engine_step_s: float = ENGINE_STEP_S,
        engine_per_seq_s: float = ENGINE_PER_SEQ_S,
        profile: EngineProfile | None = None,
    ) -> None:
        """``profile`` (``cost_models.engines``) is the engine's per-iteration model: its
        ``kernel_scale`` multiplies the operator sum and its ``overhead_s(tp, B)`` is added to
        every decode and prefill iteration. Without one, ``engine_step_s + engine_per_seq_s * B``
        is the overhead (the two-term form of a calibration's engine entry). Neither depends on
        the context, so decode stays affine in it."""
        if engine_step_s < 0 or engine_per_seq_s < 0:
            raise CostModelError(
                f"engine overhead must be >= 0, got step {engine_step_s} s, per sequence {engine_per_seq_s} s"
            )
        if profile is None:
            profile = EngineProfile.from_overhead(engine_step_s, engine_per_seq_s, name="constants")
        self.ops = ops
        self.gpu = gpu
        self.model = model
        self.profile = profile
        self.engine_step_s = float(profile.step_s)
        self.engine_per_seq_s = float(profile.per_seq_s)
        self._scale = float(profile.kernel_scale)
        # tp -> (base array, slope array, base list, slope list); index = batch size
        self._tables: dict[int, tuple[np.ndarray, np.ndarray, list[float], list[float]]] = {}
        self._checked: set[int] = set()  # TP degrees already validated

    # ---- per-iteration building blocks (vectorized over token counts) ------------------------
    def _check_tp(self, tp: int) -> None:
        if tp in self._checked:
            return
        check_tp(self.model, tp, self.gpu, rollout=True)  # the one TP rule: NVLink domain, engine cap
        self._checked.add(tp)

    def _dense_part(self, tp: int, m: Any) -> Any:
        """Everything of one block except attention, for ``m`` tokens in the iteration."""
        md, ops = self.model, self.ops
        h = float(md.hidden)
        kvh = kv_heads_per_gpu(md, tp)
        q = md.q_dim / tp
        t = ops.gemm_s(m, q + 2 * kvh * md.head_dim, h) + ops.gemm_s(m, h, q)
        elem = (6 * h + 2 * (q + kvh * md.head_dim)) * DTYPE_BYTES * m  # norms, residuals, rotary
        if md.is_moe:
            t = t + ops.moe_s(m, h, md.moe_intermediate, md.experts_per_token, md.n_experts, tp, 1)
            if md.shared_expert_intermediate:
                si = md.shared_expert_intermediate / tp
                t = t + ops.gemm_s(m, 2 * si, h) + ops.gemm_s(m, h, si)
                elem = elem + 3 * si * DTYPE_BYTES * m
        else:
            it = md.intermediate / tp
            t = t + ops.gemm_s(m, 2 * it, h) + ops.gemm_s(m, h, it)
            elem = elem + 3 * it * DTYPE_BYTES * m  # SwiGLU reads gate and up, writes product
        t = t + ops.memory_bound_s(elem)
        t = t + 2 * ops.allreduce_s(m * h * DTYPE_BYTES, tp, False)
        return t  # type: ignore[no-any-return]

    def _ends(self, tp: int, tokens: Any, seqs: Any) -> Any:
        """Embedding lookup for ``tokens``, final norm, LM head and sampling for ``seqs`` rows
        (kernels only; the engine's overhead is ``_overhead``)."""
        md, ops = self.model, self.ops
        h = float(md.hidden)
        t = ops.memory_bound_s(2 * tokens * h * DTYPE_BYTES)  # embedding gather (read + write)
        t = t + ops.memory_bound_s(2 * seqs * h * DTYPE_BYTES)  # final RMSNorm of sampled rows
        t = t + ops.gemm_s(seqs, md.vocab / tp, h)
        t = t + ops.allgather_s(seqs * md.vocab * DTYPE_BYTES, tp, False)  # vocab-parallel logits
        t = t + ops.memory_bound_s(3 * seqs * md.vocab * 4)  # fp32 softmax / top-p / sample
        return t  # type: ignore[no-any-return]

    def _overhead(self, tp: Any, seqs: Any, prefill: bool) -> Any:
        """The engine profile's per-iteration seconds (no context dependence)."""
        return self.profile.overhead_s(tp, seqs, self.model.n_layers, prefill)

    def _heads(self, tp: int) -> tuple[float, float]:
        """Per-GPU (query heads, KV heads) in units of 128-dim heads, for the operator set."""
        scale = self.model.head_dim / OPERATOR_HEAD_DIM
        return self.model.n_heads / tp * scale, kv_heads_per_gpu(self.model, tp) * scale

    # ---- decode ------------------------------------------------------------------------------------
    def _build(self, tp: int, n: int) -> tuple[np.ndarray, np.ndarray, list[float], list[float]]:
        self._check_tp(tp)
        b = np.arange(n, dtype=np.float64)
        bb = np.maximum(b, 1.0)  # batch 0 is filled with zeros below
        qh, kvh = self._heads(tp)
        coeffs = getattr(self.ops, "decode_coefficients", None)  # optional: exact (intercept, slope)
        if coeffs is not None:
            a0, per_kv = (np.broadcast_to(np.asarray(x, dtype=np.float64), bb.shape) for x in coeffs(bb, qh, kvh))
        else:  # read the slope off two points; exact up to rounding for an affine operator
            a0 = np.asarray(self.ops.attn_decode_s(bb, 0.0, qh, kvh), dtype=np.float64)
            a1 = np.asarray(self.ops.attn_decode_s(bb, _SLOPE_REF_TOKENS, qh, kvh), dtype=np.float64)
            per_kv = (a1 - a0) / _SLOPE_REF_TOKENS
        L = self.model.n_layers
        dense = np.asarray(self._dense_part(tp, bb), dtype=np.float64)
        kernels = L * (dense + a0) + np.asarray(self._ends(tp, bb, bb), dtype=np.float64)
        base = self._scale * kernels + np.asarray(self._overhead(tp, bb, False), dtype=np.float64)
        slope = self._scale * (L * per_kv)
        base[0] = 0.0
        slope[0] = 0.0
        tab = (base, slope, base.tolist(), slope.tolist())
        self._tables[tp] = tab
        return tab

    def _table(self, tp: int, max_batch: int) -> tuple[np.ndarray, np.ndarray, list[float], list[float]]:
        tab = self._tables.get(tp)
        if tab is None or max_batch >= len(tab[2]):
            n = _MIN_TABLE if tab is None else len(tab[2])
            while n <= max_batch:
                n *= 2
            tab = self._build(tp, n)
        return tab

    def decode_coeffs(self, tp: ArrayLike, batch: ArrayLike) -> tuple[Any, Any]:
        """``(base_s, per_kv_token_s)`` with ``decode_s(tp, B, C) == base_s + per_kv_token_s * C``.
        Scalars give floats; arrays (broadcast) give arrays. Batch 0 gives (0, 0)."""
        if isinstance(tp, (int, np.integer)) and isinstance(batch, (int, np.integer)):
            bi = int(batch)
            if bi < 0:
                raise CostModelError(f"batch must be >= 0, got {bi}")
            tab = self._tables.get(int(tp))
            if tab is None or bi >= len(tab[2]):
                tab = self._table(int(tp), bi)
            return tab[2][bi], tab[3][bi]
        tp_a, b_a = np.broadcast_arrays(np.asarray(tp), np.asarray(batch))
        b_i = b_a.astype(np.int64)
        if b_i.size and b_i.min() < 0:
            raise CostModelError("batch must be >= 0")
        base = np.empty(b_i.shape, dtype=np.float64)
        slope = np.empty(b_i.shape, dtype=np.float64)
        tp_i = tp_a.astype(np.int64)
        for t in np.unique(tp_i):
            mask = tp_i == t
            tab = self._table(int(t), int(b_i[mask].max()))
            base[mask] = tab[0][b_i[mask]]
            slope[mask] = tab[1][b_i[mask]]
        return base, slope

    def decode_s(self, tp: ArrayLike, batch: ArrayLike, total_context: ArrayLike) -> Any:
        """Seconds of one decode iteration of ``batch`` sequences holding ``total_context`` KV
        tokens together (sum over the batch), on a TP group of ``tp`` GPUs."""
        if (
            isinstance(tp, (int, np.integer))
            and isinstance(batch, (int, np.integer))
            and isinstance(total_context, (int, float, np.integer, np.floating))
        ):
            tab = self._tables.get(int(tp))
            bi = int(batch)
            if tab is None or bi >= len(tab[2]) or bi < 0:
                base, slope = self.decode_coeffs(int(tp), bi)
                return base + slope * float(total_context)
            return tab[2][bi] + tab[3][bi] * float(total_context)
        base, slope = self.decode_coeffs(tp, batch)
        return base + slope * np.asarray(total_context, dtype=np.float64)

    # ---- prefill ----------------------------------------------------------------------------------
    def prefill_s(
        self, tp: ArrayLike, new_tokens: ArrayLike, cached_tokens: ArrayLike = 0, batch: ArrayLike = 1
    ) -> Any:
        """Seconds of one forward pass over ``batch`` sequences each adding ``new_tokens`` to
        ``cached_tokens`` already in their KV cache (prefix-cache hits or earlier turns), sampling
        one token per sequence. 0 when there are no new tokens. Chunking long prompts into
        ``max_num_batched_tokens`` pieces is the caller's choice (call once per chunk)."""
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in (tp, new_tokens, cached_tokens, batch)):
            return self._prefill_scalar(int(tp), float(new_tokens), float(cached_tokens), float(batch))
        tp_a, s_a, c_a, b_a = np.broadcast_arrays(
            np.asarray(tp), np.asarray(new_tokens, dtype=np.float64),
            np.asarray(cached_tokens, dtype=np.float64), np.asarray(batch, dtype=np.float64),
        )
        if (s_a < 0).any() or (c_a < 0).any() or (b_a < 0).any():
            raise CostModelError("new_tokens, cached_tokens and batch must be >= 0")
        out = np.zeros(s_a.shape, dtype=np.float64)
        tp_i = tp_a.astype(np.int64)
        L = self.model.n_layers
        for t in np.unique(tp_i):
            t = int(t)
            self._check_tp(t)
            mask = (tp_i == t) & (s_a > 0) & (b_a > 0)
            if not mask.any():
                continue
            s, c, b = s_a[mask], c_a[mask], b_a[mask]
            m = b * s
            qh, kvh = self._heads(t)
            attn = np.asarray(self.ops.attn_prefill_s(b, s, c, qh, kvh), dtype=np.float64)
            dense = np.asarray(self._dense_part(t, m), dtype=np.float64)
            kernels = L * (dense + attn) + np.asarray(self._ends(t, m, b), dtype=np.float64)
            out[mask] = self._scale * kernels + np.asarray(self._overhead(t, b, True), dtype=np.float64)
        return out

    def _prefill_scalar(self, tp: int, s: float, c: float, b: float) -> float:
        """The same formula on Python scalars: the operator sets' scalar paths avoid NumPy's
        per-call overhead, which dominates one small evaluation."""
        if s < 0 or c < 0 or b < 0:
            raise CostModelError("new_tokens, cached_tokens and batch must be >= 0")
        if s == 0 or b == 0:
            return 0.0
        if tp not in self._checked:
            self._check_tp(tp)
        qh, kvh = self._heads(tp)
        m = b * s
        attn = float(self.ops.attn_prefill_s(b, s, c, qh, kvh))
        kernels = self.model.n_layers * (float(self._dense_part(tp, m)) + attn) + float(self._ends(tp, m, b))
        return float(self._scale * kernels + self.profile.overhead_s(tp, b, self.model.n_layers, True))
