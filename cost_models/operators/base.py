"""The operator-level timing interface the compositions (rollout, training) are built on.

An ``OperatorSet`` answers "how long does this kernel take on one GPU" for the few operator
families an LLM step is made of. Every method is vectorized: arguments may be scalars or NumPy
arrays (broadcast together) and the result has their broadcast shape. Times are SECONDS.

Two implementations exist: a roofline (datasheet constants only, used where no data exists) and a
fitted one (parameters fitted on ``shared/calibration`` data, roofline outside the measured range,
see docs/cost-model.md).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike


class OperatorSet(Protocol):
    """Per-GPU operator timings (seconds), vectorized."""

    gpu: str  # catalog name of the GPU these timings are for

    def gemm_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
        """A bf16 (m x k) @ (k x n) matmul."""
        ...

    def attn_prefill_s(
        self, batch: ArrayLike, new_tokens: ArrayLike, cached_tokens: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike
    ) -> np.ndarray:
        """One layer of causal (flash) attention for ``batch`` sequences each adding ``new_tokens``
        to ``cached_tokens`` already in the KV cache. Heads are per GPU shard."""
        ...

    def attn_decode_s(
        self, batch: ArrayLike, total_kv_tokens: ArrayLike, n_heads: ArrayLike, n_kv_heads: ArrayLike
    ) -> np.ndarray:
        """One layer, one decode step, for ``batch`` sequences holding ``total_kv_tokens`` KV
        tokens together. MUST be affine in ``total_kv_tokens`` for a fixed batch (the simulator
        integrates decode time in closed form). Heads are per GPU shard."""
        ...

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
        """One fused MoE layer (routing, expert GEMMs) on one GPU of a TP x EP group."""
        ...

    def allreduce_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """An all-reduce of ``nbytes`` among ``n_gpus`` GPUs (0 when ``n_gpus`` is 1)."""
        ...

    def allgather_s(self, nbytes: ArrayLike, n_gpus: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """An all-gather whose OUTPUT is ``nbytes`` per GPU; reduce-scatter costs the same."""
        ...

    def p2p_s(self, nbytes: ArrayLike, inter_node: bool = False) -> np.ndarray:
        """A point-to-point send/recv of ``nbytes`` between two GPUs."""
        ...

    def memory_bound_s(self, nbytes: ArrayLike) -> np.ndarray:
        """An elementwise kernel streaming ``nbytes`` through HBM (norms, rotary, activations)."""
        ...
