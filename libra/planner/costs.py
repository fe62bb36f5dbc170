"""The planner's view of the cost evaluator, and cached tables over it.

The policy core predicts with ``cost_models.CostEvaluator`` and nothing else. ``CostModel`` is the
subset of that facade the planner, the routers and the pool call; it is a Protocol so tests can
pass a small, clearly-labelled test double and so this module never imports the evaluator at
import time (``libra`` must import fast and the evaluator loads catalogs/calibration).

Why tables: the rollout DP evaluates a bucket's time for every instance count at once. The
decode cost is affine in total context for a fixed (TP, batch) (``decode_coeffs``), so one table
of (base, slope) per TP over batch 1..max_running_seqs turns every bucket-time evaluation into
NumPy indexing instead of thousands of evaluator calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.plan import TrainConfig


class CostModel(Protocol):
    """What the policy core calls on ``cost_models.CostEvaluator`` (same names and meaning)."""

    model: Any  # ModelSpec: n_layers, n_heads, n_kv_heads, n_experts, params_total, ...
    gpu: Any  # GPUSpec: memory_bytes, gpus_per_node, ...

    def decode_coeffs(self, tp: Any, batch: Any) -> tuple[Any, Any]: ...

    def prefill_s(self, tp: Any, new_tokens: Any, cached_tokens: Any = 0, batch: Any = 1) -> Any: ...

    def kv_capacity_tokens(self, tp: int) -> int: ...

    def max_running_seqs(self, tp: int) -> int: ...

    def train_iter_s(self, strategy: Any, tokens: int, seq_len: int) -> float: ...

    def forward_s(self, strategy: Any, tokens: int, seq_len: int) -> float: ...

    def train_memory(self, strategy: Any, seq_len: int) -> Any: ...

    def kv_migration_s(self, tokens: Any, tp_src: Any, tp_dst: Any, same_node: bool = True) -> Any: ...

    def weight_sync_s(self, n_train_gpus: Any = None, train_tp: Any = None, train_pp: Any = None,
                      rollout_tps: Any = (), same_node: bool = False, mode: Any = "broadcast", strategy: Any = None) -> float: ...

    def role_change_s(self, to: str, rollout_tp: int = 1, strategy: Any = None, offload_previous: bool = True) -> float: ...

    def trainer_build_s(self, strategy: Any = None) -> float: ...

    def stage_switch_s(self, to: str, rollout_tp: int = 1, strategy: Any = None) -> float: ...

    def step_fixed_s(self, n_samples: int) -> float: ...


def make_evaluator(cluster: ClusterSpec) -> CostModel:
    """The real cost evaluator for a cluster (imported lazily: see the module docstring)."""
    try:
        from cost_models import CostEvaluator
    except ImportError as exc:  # pragma: no cover - only before the evaluator lands
        raise UserError(f"the cost evaluator is not available ({exc}); install the project with its cost_models package") from exc
    # cluster.engine: the inference-engine profile (None: the evaluator's default); an unknown
    # name is the evaluator's one-line CostModelError listing the valid ones
    return CostEvaluator(gpu=cluster.gpu, model=cluster.model, gpus_per_node=cluster.gpus_per_node, engine=cluster.engine)


def to_strategy(cfg: TrainConfig) -> Any:
    """``libra``'s TrainConfig as the evaluator's TrainStrategy: the same type
    (``libra.planner.plan.TrainConfig`` is ``cost_models.strategy.TrainStrategy``), so this is the
    identity; it stays so callers need not know that."""
    return cfg


def nvlink_domain(gpu: Any, gpus_per_node: int) -> int:
    """GPUs per NVLink domain for ``gpu`` (a ``GPUSpec``) on hosts of ``gpus_per_node``.

    The domain is what TP groups, rollout instances and "same node" transfers are about; the
    node stays the host. A spec whose domain is its node (HGX boards) follows the cluster's node
    size, as ``GPUSpec.with_gpus_per_node`` does; a larger fabric (GB200 NVL72: 72) is kept.
    Objects without the field (test doubles) have one domain per node."""
    dom = getattr(gpu, "nvlink_domain", None)
    if not isinstance(dom, int) or dom == getattr(gpu, "gpus_per_node", dom):
        return int(gpus_per_node)
    return dom


def valid_tp_degrees(model: Any, gpus_per_node: int, nvlink_domain: int | None = None, rollout: bool = True) -> tuple[int, ...]:
    """TP degrees a rollout instance (``rollout``) or a training group may use.

    The rule is ``cost_models.memory.tp_rule`` (delegated, never restated): TP divides the
    attention heads, divides the KV heads or is a multiple of them (KV heads are then
    replicated), stays inside one NVLink domain (``nvlink_domain``, default the node) and
    divides it, so instances pack the domain without holes; a rollout engine stops at
    ``ROLLOUT_MAX_TP`` (8)."""
    from cost_models.memory import tp_degrees

    return tuple(tp_degrees(model, int(nvlink_domain or gpus_per_node), rollout=rollout))


def tp_rule(model: Any, tp: int, nvlink_domain: int, rollout: bool = False) -> str | None:
    """Why ``tp`` is invalid (None: valid): ``cost_models.memory.tp_rule``, for the tree's pruning reasons."""
    from cost_models.memory import tp_rule as rule

    return rule(model, tp, nvlink_domain, rollout)


def pp_degrees(model: Any) -> list[int]:
    """PP degrees the training tree enumerates (``cost_models.memory.pp_degrees``: the layer
    count's divisors and the powers of two; uneven stages are allowed, as in Megatron)."""
    from cost_models.memory import pp_degrees as _pp

    return _pp(model)


def valid_ep_degrees(model: Any, tp: int, dp: int) -> list[int]:
    """EP degrees for ``tp x dp`` ranks per pipeline stage under Megatron's MoE parallel folding
    (ETP = 1, CP = 1: EP divides ``tp * dp`` and the experts); ``[1]`` for a dense model
    (``cost_models.memory.valid_eps``)."""
    from cost_models.memory import valid_eps

    return valid_eps(model, tp, dp)


def cost_key(x: float) -> int:
    """``x`` rounded to 1/8 of an octave (exact below 16): the memo key of a cost call, shared by
    the simulator's prefill charge (``RolloutCosts.prefill_batch_s``) and the planner's prefill
    rate (``DecodeTable.prefill_rate``), so both read the evaluator at the same arguments."""
    if x < 16:
        return int(round(x))
    e = math.floor(math.log2(x))
    step = 2.0 ** (e - 3)
    return int(round(x / step) * step)


def prefill_key(tp: int, new: float, cached: float, k: int) -> tuple[int, int, int, int]:
    """The evaluator arguments ``(tp, new, cached, batch)`` of ``k`` sequences prefilled together
    with mean ``new`` tokens on mean ``cached`` ones, as ``RolloutCosts.prefill_batch_s`` rounds
    them (``cost_key``; the batch exact up to 16)."""
    return (tp, cost_key(new), cost_key(cached), cost_key(k) if k > 16 else int(k))


def prefill_at(ev: Any, key: tuple[int, int, int, int]) -> float:
    """The evaluator's prefill seconds at a ``prefill_key``: the one call behind the simulator's
    charge (``RolloutCosts.prefill_batch_s``) and the planner's rate (``DecodeTable.prefill_rate``)."""
    tp, new, cached, k = key
    return float(ev.prefill_s(tp, max(1, new), cached, k))


@dataclass
class DecodeTable:
    """Per-TP decode coefficients for batch 1..max_running_seqs, and per-token prefill cost.

    ``base[tp][b-1] + slope[tp][b-1] * total_context`` is one decode iteration at batch ``b``.
    ``prefill_per_token[tp]`` is the cost of one prompt/tool-return token, measured as a
    ``chunk``-token prefill on top of ``cached`` tokens divided by ``chunk`` (prefill is nearly
    linear in new tokens at the chunk sizes vLLM schedules).
    """

    ev: CostModel
    tps: tuple[int, ...]
    chunk: int = 512
    cached: int = 4096
    base: dict[int, np.ndarray] = field(default_factory=dict)
    slope: dict[int, np.ndarray] = field(default_factory=dict)
    max_seqs: dict[int, int] = field(default_factory=dict)
    kv_capacity: dict[int, int] = field(default_factory=dict)
    prefill_per_token: dict[int, float] = field(default_factory=dict)
    _prefill: dict[tuple[int, int, int, int], float] = field(default_factory=dict, repr=False)

    def prefill_rate(self, tp: int, new: float, cached: float, k: int) -> float:
        """Seconds per new token when ``k`` sequences of mean ``new`` tokens on mean ``cached``
        ones are prefilled together: what the simulator charges such a batch
        (``RolloutCosts.prefill_batch_s``, the same rounded evaluator call) over its tokens.

        Why not one rate per TP for the step's prompts (``prefill_per_token``, a 512-token chunk
        alone): the simulator prefills the prompts admitted together as one batch, and prefill is
        far from linear in the batch at high TP. Llama-3.1-70B on B200 at TP 8 prefills a batch of
        4K-token prompts at 25-28 us a token against 48 us for the lone chunk (TP 1: 123 against
        127); Qwen3-30B-A3B on H200 at 16-27 against 58. The rollout DP (``RolloutDP.
        prefill_rates``) fed MedAgentBench's first step (32 B200, 16 rollout GPUs, the step's own
        trajectories, noise off) predicted 1.32x the simulator at TP 8, 1.16x at TP 4 and 0.93x
        at TP 1, so it ranked TP 1-2 above the TP 4-8 the simulator runs fastest; with the
        prompts at their batch's rate 1.01x, 1.00x and 0.92x, in the simulator's order
        (SIMULATED). Tool returns keep the
        lone chunk's rate: they arrive a few at a time, and a return of 60 tokens alone costs 3-6x
        the chunk's rate per token, so pricing them alone over-predicted InterCode-SQL at TP 8 by
        28% where the chunk's rate is within 5%."""
        key = prefill_key(tp, new, cached, k)
        v = self._prefill.get(key)
        if v is None:
            v = self._prefill[key] = prefill_at(self.ev, key)
        return v / max(1.0, float(key[1]) * float(key[3]))

    def __post_init__(self) -> None:
        for tp in self.tps:
            cap = int(self.ev.kv_capacity_tokens(tp))
            self.kv_capacity[tp] = cap
            if cap <= 0:
                continue  # weights do not fit at this TP: not a rollout candidate
            n = max(1, int(self.ev.max_running_seqs(tp)))
            self.max_seqs[tp] = n
            b = np.arange(1, n + 1)
            base, slope = self.ev.decode_coeffs(np.full(n, tp), b)
            self.base[tp] = np.broadcast_to(np.asarray(base, float), (n,)).copy()
            self.slope[tp] = np.broadcast_to(np.asarray(slope, float), (n,)).copy()
            self.prefill_per_token[tp] = float(self.ev.prefill_s(tp, self.chunk, self.cached, 1)) / self.chunk

    @property
    def usable_tps(self) -> tuple[int, ...]:
        """TP degrees at which the weights fit and some KV cache is left."""
        return tuple(tp for tp in self.tps if self.kv_capacity[tp] > 0)
