"""The rollout DP: which TP degrees, how many instances of each, and which context range each serves.

A *layout* (``BucketLayout``) is one or two buckets ordered by context range, each with one TP
degree (increasing: longer contexts get more GPUs per instance; two buckets of one TP run as one
under work-conserving routing, see ``layouts``) and an interior bound taken from
``WorkloadStats.boundary_candidates`` (quantiles of recent final lengths). The load model follows
the router the plan runs with: the short bucket's work spills onto the long bucket's instances
when it is the bottleneck (``spill_load``), and a two-bucket layout is chosen only when it beats
the best one-bucket layout by ``HETERO_MARGIN``. A plan from a length prior (no history) has one
bucket and the TP of least worst-case slowdown over the prior's scenarios (``_regrets``).

Model of a bucket ``b`` of TP ``t`` with ``m`` instances (``WorkloadStats`` gives, for the
bucket's context range, the decode tokens ``T``, their KV-context sum ``S``, the prefill tokens
``P``, and the tail trajectory's decode tokens ``tail`` and prefill tokens ``tail_P``):

* continuous batching runs an instance for ``I = max(tail, T / (m * Bcap))`` iterations (``tail``:
  the most any tail trajectory generates in the range): the tail
  trajectory is in one iteration per token it generates, and no iteration holds more than
  ``Bcap = min(max_running_seqs(t), kv_capacity(t) / mean context)`` sequences;
* its average batch is then ``B = clip(T / (m * I), 1, Bcap)`` and one iteration costs
  ``iter = base(t, B) + slope(t, B) * B * S / T`` (``decode_coeffs``, interpolated in B);
* the bucket's busy time is ``load_b(m) = I * iter + P * prefill(t, m) / m``, where
  ``prefill(t, m)`` (``prefill_rates``) prices the step's prompts as the batch they are admitted in
  (``min(n/m, Bcap)`` to an instance at once, the simulator's one batched prefill) and tool returns
  at ``prefill_per_token(t)`` (a 512-token chunk alone), weighted by their tokens;
* the tail spends ``tail_b(m) = tail * iter(B_tail) + tail_P * prefill(t, m)`` in it: it
  shares its instance's batches, so its tokens cost that batch's iteration time, not batch 1's;
  its instance runs the tail plus its share of the others' tokens, so
  ``B_tail = clip(1 + f (T - tail) / (m * tail), 1, Bcap)`` (the average instance's ``B`` left the
  tail's own tokens out of that share: where the tail was most of an instance's work it decoded
  alone, and more instances stopped helping long before they did in replay); ``f`` is the part of
  its life it decodes (not in tool calls), and the same part of the others' prefill on its
  instance, ``f (P - tail_P) prefill(t, m) / m``, runs in its iterations too (chunked
  prefill; Search-R1's retrieved passages make that most of the work);
* in the first bucket the tail also pays the step's start (``_start_s``): every trajectory is
  queued at once, so its first turn of ``first`` tokens decodes beside everyone's first turn,
  ``B1 = clip(1 + (min(n/m, Bcap) - 1) * overlap / first, 1, Bcap)`` (``overlap``: the mean of
  min(a first turn, the tail's)), at ``first * (iter(B1) - iter(B_tail))`` more, after the prompts
  admitted with it, ``(1 - f) (min(n/m, Bcap) - 1) * mean prompt * prefill_per_token(t)`` (the
  part of their prefill the lifetime share ``f`` did not charge).

The rollout makespan of counts ``m`` is

    makespan = max( max_b load_b(m_b),  max_k [tail_tool_s[k] + sum_b tail_b^k(m_b)] )

over the tail trajectories ``k`` (the longest, the one with the most tool time, and the one that
generates most): a tail
passes through the buckets one after the other, with its tool calls in between. More
instances never hurt (one could idle), so ``load_b`` and ``tail_b`` are used as running minima
over ``m``; both are then non-increasing, so for a fixed count of the first bucket the best count
of the second is the largest that packs. The DP is exact: for each budget ``G`` and layout it
enumerates the first bucket's count (vectorized) with the second's largest packable count.
Rollout owns the first ``G`` GPUs (full nodes then at most one partial node); TP groups never
cross a node; for two TP degrees that divide each other and the node size, the largest packable
count has a closed form (``max_second_count``), checked against an exhaustive packer in the tests.
A layout is infeasible when a bucket's upper bound (the tail's length for the last bucket)
exceeds the KV capacity of its TP. Results are memoized per ``(statistics digest, G)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from libra.planner.costs import DecodeTable
from libra.planner.packing import place
from libra.planner.plan import Bucket, Plan, RolloutInstance
from libra.planner.stats import WorkloadStats

DEFAULT_MAX_BUCKETS = 2
#: A two-bucket layout is chosen only when its predicted makespan beats the best one-bucket
#: layout's by more than this: the load model's error against replay is 15-20%, and two buckets
#: add migrations and a split of the batch the model does not charge. (At 0.05, two-bucket plans
#: predicted 5-10% faster replayed 10-25% slower on generated Search-R1 steps: 16 A800, Qwen3-8B,
#: K=1, 28.7 s per step against 25.6 s for one bucket, SIMULATED; the short bucket's instances fill
#: before work spills to the long one, which the pooled ``spill_load`` does not see.)
HETERO_MARGIN = 0.15


#: Evictions of KV parked in tool calls (``kv_pressure``), as a function of the pressure
#: ``rho`` = the KV an instance's trajectories hold at once over its KV capacity: their
#: turn-averaged contexts (``WorkloadStats.resident_ctx``) times the share of those in flight
#: together at the peak (``WorkloadStats.inflight_ratio``, on ``stats.inflight_peak``'s nominal
#: clock): none up to ``KV_PRESSURE_FREE``, then a share
#: ``1 - exp(-(rho - KV_PRESSURE_FREE) / KV_PRESSURE_SCALE)`` of the tool returns finds its KV
#: evicted (LRU, before any running sequence is preempted: ``sim.instance``) and prefills its
#: whole context again. Least-squares fit on replays of the bundled SWE trace (windows 0:5, 5:10,
#: 10:14) at 16 fixed layouts of Qwen3-8B, 14B and 32B on H100 and A100, K = 0, 1 and 2 (60 steps,
#: mean |error| of the evicted share 0.058), checked on a trace it was not fitted on, MCPMark's
#: Llama-3.1-70B steps on 42 B200 at four layouts (13 steps: 0.007, max 0.053; SIMULATED;
#: experiments/kv_pressure.py). Why the in-flight share: the pressure of the turn-averaged
#: contexts alone, fitted on SWE (free up to 1.45, scale 0.65), held SWE's heavy tail, whose short
#: trajectories end before the long ones peak (in flight at once: 0.64 of the sum), but not
#: MCPMark's trajectories of 17 turns that all run the whole step (1.0-1.1): two of its steps on
#: three TP-4 instances were at 1.14, where it charged nothing, and replayed 40% of their returns
#: evicted and a 1,475 s rollout against the model's 705 s (the check's error 0.061, max 0.41).
#: Why eviction at all: the DP capped the decode batch by the KV of the mean context but never
#: charged the parked KV, and ranked five TP-4 instances of Qwen3-32B for two SWE steps in flight
#: (async, K = 1) at 637 s; they thrashed for 1,982 s against 938 s for three TP-8 instances
#: (held_out_25 swe-bundled-w/h100-48-32b/K1, 0.734x).
KV_PRESSURE_FREE = 1.05
KV_PRESSURE_SCALE = 0.39
#: The engines' rule for a trajectory's KV during a tool call (``sim.rollout``'s ``kv_mode``).
TOOL_KV_MODES: tuple[str, ...] = ("keep", "release")


def kv_pressure(rho: np.ndarray | float, free: float = KV_PRESSURE_FREE, scale: float = KV_PRESSURE_SCALE) -> np.ndarray:
    """The share of tool returns whose parked KV is evicted at pressure ``rho`` (see
    ``KV_PRESSURE_FREE``); ``free`` and ``scale`` other than the fitted ones only for the fit
    itself (``experiments/kv_pressure.py``)."""
    over = np.maximum(np.asarray(rho, np.float64) - free, 0.0)
    return 1.0 - np.exp(-over / scale)


@dataclass(frozen=True)
class BucketLayout:
    """TP per bucket and the ``len(tps) - 1`` interior context bounds between them."""

    tps: tuple[int, ...]
    bounds: tuple[int, ...]


def plan_layout(plan: Plan) -> tuple[BucketLayout, list[int]]:
    """A plan's rollout as the DP sees it: its layout (TP per bucket, interior bounds) and the
    instance count per bucket."""
    layout = BucketLayout(tuple(b.tp for b in plan.buckets), tuple(int(b.max_context) for b in plan.buckets[:-1] if b.max_context is not None))
    return layout, [sum(1 for i in plan.instances if i.bucket == b.index) for b in plan.buckets]


@dataclass(frozen=True)
class RolloutChoice:
    """The DP's answer for one GPU budget."""

    n_gpus: int
    layout: BucketLayout
    counts: tuple[int, ...]
    makespan_s: float
    load_s: float
    critical_path_s: float
    bucket_times_s: tuple[float, ...]
    instances: tuple[RolloutInstance, ...]
    buckets: tuple[Bucket, ...]
    #: the step's work at full batches (``RolloutDP.saturated_s``): the engines' pace when
    #: generation is continuous (async), where the next step's prompts fill a tail's free slots
    throughput_s: float = float("nan")


@dataclass
class _Curves:
    """Per bucket, ``load_b`` and ``tail_b`` (running minima) for m = 1..M_b."""

    layout: BucketLayout
    load: list[np.ndarray]  # per bucket [M_b]
    tail: list[np.ndarray]  # per bucket [tails, M_b]


def max_second_count(G: int, gpn: int, t1: int, m1: np.ndarray, t2: int) -> np.ndarray:
    """Largest count of TP-``t2`` instances that packs on the first ``G`` GPUs next to ``m1``
    TP-``t1`` instances (``t1`` divides ``t2``, both divide ``gpn``); -1 where ``m1`` alone does
    not pack.

    Exact: big instances go to full nodes first (the partial node can only take what fits its
    remainder), every full node's leftover is a multiple of ``t2`` hence of ``t1``, so the small
    instances fit iff they fit the full nodes' leftover plus the partial node's leftover rounded
    down to a multiple of ``t1``.
    """
    F, r = divmod(G, gpn)
    per_full = gpn // t2
    k = np.arange(F * per_full + r // t2 + 1)  # candidate counts of big instances
    in_full = np.minimum(k, F * per_full)
    in_part = k - in_full
    room = (F * gpn - in_full * t2) + ((r - in_part * t2) // t1) * t1  # non-increasing in k
    need = np.asarray(m1) * t1
    # largest k with room[k] >= need: room is non-increasing, search on its negation
    idx = np.searchsorted(-room, -need, side="right") - 1
    return idx


class RolloutDP:
    """Rollout layouts and allocations for one ``WorkloadStats``; memoized per GPU budget."""

    def __init__(
        self,
        stats: WorkloadStats,
        table: DecodeTable,
        gpus_per_node: int,
        max_gpus: int,
        tps: Sequence[int] | None = None,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        nvlink_domain: int | None = None,
        tool_kv: str = "keep",
        step_priority: bool = False,
        steps: int = 1,
    ) -> None:
        """``nvlink_domain``: GPUs per NVLink domain, the bin instances pack into (default
        ``gpus_per_node``; 72 on GB200 NVL72, whose 4-GPU nodes a TP-8 instance spans).
        ``tool_kv``: whether the engines keep a trajectory's KV through its tool calls ("keep",
        evictable: ``evicted_share``) or release it ("release": every return prefills its whole
        context again). ``steps``: how many steps' trajectories ``stats`` holds sharing the
        engines at once (an async staleness cycle: K + 1). ``step_priority``: those engines serve
        the older steps first (``sim.instance``: a newer step's turn waits for free KV instead of
        evicting an older step's), so each step's parked KV presses on them as one step's does
        (``evicted_share``) and the cycle runs in waves where the steps' KV does not fit together
        (``waves``)."""
        if not 1 <= max_buckets <= 2:
            raise ValueError(f"max_buckets must be 1 or 2, got {max_buckets}")
        if tool_kv not in TOOL_KV_MODES:
            raise ValueError(f"tool_kv must be one of {TOOL_KV_MODES}, got {tool_kv!r}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.tool_kv = tool_kv
        self.step_priority = step_priority
        self.steps = int(steps)
        self.stats = stats
        self.table = table
        self.gpus_per_node = gpus_per_node
        self.domain = int(nvlink_domain or gpus_per_node)
        self.max_gpus = max_gpus
        self.tps = tuple(t for t in (tps or table.usable_tps) if t in table.usable_tps)
        self.max_buckets = max_buckets
        self._curves: list[_Curves] | None = None
        self._memo: dict[tuple[Any, ...], RolloutChoice | None] = {}
        self._by_layout: dict[BucketLayout, _Curves] = {}
        self.hits = 0
        self.misses = 0
        # planned from a length prior: one bucket (bounds from a prior's quantiles are guesses),
        # and the TP whose worst slowdown over the prior's scenarios is least (``best``)
        self._scenarios: list[RolloutDP] = []
        if stats.scenarios:
            self.max_buckets = 1
            self._scenarios = [RolloutDP(sc, table, gpus_per_node, max_gpus, tps, 1, nvlink_domain, tool_kv) for sc in stats.scenarios]

    # ---- the model -------------------------------------------------------------------------
    def layouts(self) -> list[BucketLayout]:
        """Every layout considered: 1..max_buckets buckets, increasing TP, candidate bounds.

        Two buckets of the same TP are not considered: under work-conserving routing the short
        bucket's work spills onto the long one's instances, so they run as one bucket of that TP
        plus KV migrations at every floor move. (The DP charged the tail only its own bucket's
        batch and chose TP8 below 1K + TP8 above; replayed, it was 4.5% slower than one bucket
        and made hundreds of migrations.)"""
        cands = self.stats.boundary_candidates()
        out = []
        for k in range(1, self.max_buckets + 1):
            for bounds in itertools.combinations(cands, k - 1):
                for tps in itertools.combinations_with_replacement(self.tps, k):
                    if k == 2 and tps[0] == tps[1]:
                        continue  # one TP in two buckets runs as one pool plus useless floor moves (``layouts``)
                    out.append(BucketLayout(tuple(tps), tuple(bounds)))
        return out

    def _cell_ranges(self, layout: BucketLayout) -> list[tuple[int, int]]:
        edges = self.stats.edges
        idx = [0] + [int(np.searchsorted(edges, b)) for b in layout.bounds] + [len(edges) - 1]
        return [(idx[i], idx[i + 1]) for i in range(len(layout.tps))]

    def feasible(self, layout: BucketLayout) -> bool:
        """KV fits: each bucket's upper bound (the tail's context for the last) per instance."""
        for b, tp in enumerate(layout.tps):
            top = layout.bounds[b] if b < len(layout.bounds) else self.stats.tail_context
            if top > self.table.kv_capacity.get(tp, 0):
                return False
        return True

    def raw_times(self, layout: BucketLayout, b: int, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(load_b(m), tail_b(m))`` for an array of instance counts, before the running minimum;
        ``tail_b`` has one row per tail trajectory."""
        s, t = self.stats, layout.tps[b]
        lo, hi = self._cell_ranges(layout)[b]
        T = float(s.decode_tokens[lo:hi].sum())
        S = float(s.decode_ctx_sum[lo:hi].sum())
        P = float(s.prefill_tokens[lo:hi].sum())
        tail = s.tail_decode_tokens[:, lo:hi].sum(1)[:, None]  # [tails, 1]
        tail_p = s.tail_prefill_tokens[:, lo:hi].sum(1)[:, None]
        m = np.asarray(m, np.float64)
        # KV parked in tool calls that the instances cannot hold is evicted and prefilled again
        # at the return (``kv_pressure``): the bucket's and the tail's prefill grow by that share
        evicted = self.evicted_share(layout, b, m)
        ppt = self.prefill_rates(layout, b, m)  # seconds per prefilled token, per m
        if evicted.any():
            P = P + evicted * float(s.return_ctx[lo:hi].sum())
            tail_p = tail_p + evicted[None, :] * s.tail_return_ctx[:, lo:hi].sum(1)[:, None]
        if T <= 0:
            return P * ppt / m, np.broadcast_to(tail_p * ppt[None, :], (len(tail), len(m))).copy()
        ctx = S / T
        bcap = float(max(1, min(self.table.max_seqs[t], int(self.table.kv_capacity[t] // max(ctx, 1.0)))))
        iters = np.maximum(float(tail.max()), T / (m * bcap))
        B = np.clip(T / (m * iters), 1.0, bcap)
        grid = np.arange(1, len(self.table.base[t]) + 1, dtype=np.float64)

        def iteration_s(b: np.ndarray) -> np.ndarray:
            return np.interp(b, grid, self.table.base[t]) + np.interp(b, grid, self.table.slope[t]) * b * ctx

        # the tail's instance runs the tail plus its share of everyone else's tokens, spread over
        # the tail's lifetime, of which it decodes the part not spent in its tool calls: the batch
        # it decodes in is 1 + f (T - tail) / (m tail), f = decode / (decode + tool time), not the
        # average instance's T / (m I) (one fixed-point pass from f = 1)
        others = np.maximum(T - tail, 0.0) / (m[None, :] * np.maximum(tail, 1.0))  # [tails, m]
        tool = np.asarray(s.tail_tool_s, np.float64)[:, None]
        b_tail = np.clip(1.0 + others, 1.0, bcap)
        decode = tail * iteration_s(b_tail)
        share = decode / np.maximum(decode + tool, 1e-12)
        b_tail = np.clip(1.0 + share * others, 1.0, bcap)
        # and the others' prefill chunks run in the iterations it decodes in (chunked prefill)
        others_prefill = np.maximum(P - tail_p, 0.0) * ppt[None, :] / m[None, :]
        tail_s = tail * iteration_s(b_tail) + tail_p * ppt[None, :] + share * others_prefill
        if b == 0:
            tail_s = tail_s + self._start_s(t, m, bcap, share, b_tail, iteration_s)
        return iters * iteration_s(B) + P * ppt / m, tail_s

    def prefill_rates(self, layout: BucketLayout, b: int, m: np.ndarray) -> np.ndarray:
        """Seconds per prefilled token of bucket ``b`` on ``m`` instances (one per count). The
        step's prompts are admitted together, ``min(n/m, Bcap)`` to an instance, and the
        simulator prefills them as one batch (``RolloutCosts.prefill_batch_s``): they are priced
        at that batch's rate (``DecodeTable.prefill_rate``). Tool returns, and the contexts an
        eviction prefills again, keep the per-TP rate of a 512-token chunk
        (``DecodeTable.prefill_per_token``): they arrive a few at a time, and how many share an
        iteration depends on the instance's pace. The bucket's mix, weighted by tokens. Without
        the statistics' breakdown (``WorkloadStats.prompt_prefill`` empty) or prompts in the
        bucket: the per-TP rate alone."""
        s, t = self.stats, layout.tps[b]
        m = np.asarray(m, np.float64)
        flat = np.full(len(m), self.table.prefill_per_token[t])
        lo, hi = self._cell_ranges(layout)[b]
        P = float(s.prefill_tokens[lo:hi].sum())
        if not len(s.prompt_prefill) or P <= 0:
            return flat
        pp, npr = float(s.prompt_prefill[lo:hi].sum()), float(s.prompt_count[lo:hi].sum())
        if pp <= 0 or npr <= 0:
            return flat
        r_p = self._batch_rates(t, pp / npr, npr / np.maximum(m, 1.0))
        return (pp * r_p + (P - pp) * flat) / P

    def _batch_rates(self, t: int, mean_new: float, per_instance: np.ndarray) -> np.ndarray:
        """``DecodeTable.prefill_rate`` of prompts of ``mean_new`` tokens admitted together,
        ``per_instance`` of them (rounded, within 1 and ``Bcap``'s running-sequence cap)."""
        cap = float(self.table.max_seqs[t])
        ks = np.clip(np.rint(np.asarray(per_instance, np.float64)), 1.0, cap).astype(np.int64)
        uniq, inv = np.unique(ks, return_inverse=True)
        rates = np.array([self.table.prefill_rate(t, mean_new, 0.0, int(k)) for k in uniq])
        return rates[inv].reshape(ks.shape)

    def _resident_kv(self, layout: BucketLayout, b: int) -> tuple[float, float]:
        """Bucket ``b``'s parked KV held at once (its cells' ``resident_ctx`` times
        ``inflight_ratio``, over every step the statistics hold) and one instance's KV capacity."""
        s = self.stats
        lo, hi = self._cell_ranges(layout)[b]
        cap = float(self.table.kv_capacity.get(layout.tps[b], 0))
        return float(s.resident_ctx[lo:hi].sum()) * float(s.inflight_ratio), cap

    def evicted_share(self, layout: BucketLayout, b: int, m: np.ndarray) -> np.ndarray:
        """The share of bucket ``b``'s tool returns whose parked KV was evicted, per instance
        count ``m`` (``kv_pressure`` of the KV its trajectories hold in flight over an
        instance's KV capacity); zeros when the statistics carry no resident KV. Under step
        priority the pressure is one step's (the KV of ``steps`` steps over ``steps``): a newer
        step's turn takes only free KV, so it waits rather than evicting (``waves`` prices the
        wait), and each step's returns find their KV as a step alone does.

        Why one step's: the cycle's whole KV (two steps at K = 1) put MCPMark's two steps on two
        TP-8 instances of Qwen3-32B on 46 A100 at a pressure where 93% of the returns re-prefill,
        a 4,671 s cycle, where the simulator ran them in 1,419 s (0 and 272 evictions); the
        ratio taught the async pace 0.30 and the next layout was priced at half what it ran
        (held_out_53 mcpmark-64k/a100-46-32b/K1, SIMULATED)."""
        m = np.asarray(m, np.float64)
        if self.tool_kv == "release":
            return np.ones_like(m)
        if not len(self.stats.resident_ctx):
            return np.zeros_like(m)
        resident, cap = self._resident_kv(layout, b)
        if self.step_priority:
            resident /= self.steps
        if cap <= 0 or resident <= 0:
            return np.zeros_like(m)
        return kv_pressure(resident / m / cap)

    def waves(self, layout: BucketLayout, counts: Sequence[int]) -> float:
        """Under step priority, how many times over the ``steps`` steps' parked KV fills the
        instances' KV (the largest over the buckets, between 1 and ``steps``): a newer step's
        turns wait for what the older step frees, so the cycle takes at least that many times
        one step's rollout alone (``Planner._cohort_s``). 1 without step priority (the evicting
        price charges the overflow as re-prefill instead), for one step, or with tool KV released.

        Why: priced with no eviction and no wait (session 42's price), the cycle of Workbench's
        steps on three TP-4 instances of Qwen3-32B (50 A100, K = 1) looked cheap and the shared
        rollouts replayed at 2-2.7x their lower bound (held_out_51, SIMULATED); MCPMark's two
        steps on three TP-4 instances of Qwen3-32B (46 A100) hold 2.3-2.4 times the instances' KV and
        replayed 2,853 s and 3,106 s sharing the engines against 1,770 s and 1,311 s predicted
        alone (the wave-floored cycle at the measured overlap: 2,888 and 2,072 s; the evicting
        price 4,781 and 3,624 s; SIMULATED)."""
        if not self.step_priority or self.steps <= 1 or self.tool_kv == "release" or not len(self.stats.resident_ctx):
            return 1.0
        out = 1.0
        for b, m in enumerate(counts):
            resident, cap = self._resident_kv(layout, b)
            if cap > 0 and m >= 1:
                out = max(out, min(float(self.steps), resident / float(m) / cap))
        return out

    def evicts(self, layout: BucketLayout, counts: Sequence[int]) -> bool:
        """Whether ``layout`` with ``counts`` instances per bucket is predicted not to hold these
        statistics' parked KV: evicting some (``evicted_share`` above 0 in some bucket; always
        under "release"), or, under step priority, making the cycle wait for it (``waves``)."""
        return (any(float(self.evicted_share(layout, b, np.array([float(m)]))[0]) > 0.0 for b, m in enumerate(counts))
                or self.waves(layout, counts) > 1.0)

    def _start_s(self, t: int, m: np.ndarray, bcap: float, share: np.ndarray, b_tail: np.ndarray,
                 iteration_s: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """What the step's start adds to each tail's time in the first bucket: every trajectory
        is queued at once, so the tail's first turn waits for the prompts admitted with it (the
        part of their prefill ``share`` did not already charge) and decodes beside everyone's
        first turn, ``B1 = 1 + (n/m - 1) * overlap / first`` sequences (``overlap``: the mean of
        min(a first turn, the tail's), ``WorkloadStats.first_decode_overlap``), not at the
        lifetime's ``b_tail``.

        Why: the hindsight model (the step's own trajectories) under-predicted the simulator's
        rollouts more the more trajectories an instance ran at once: Search-R1's bundled trace on
        48 A800 at 40 per instance 1.03-1.06x, at 160 1.06-1.16x (SIMULATED), and the planner
        ranked layouts of fewer, fuller instances too well (16:32 at TP 2 over TP 1, which
        replays 1% slower; 20:28 over 16:32, 4% slower)."""
        s = self.stats
        first = np.asarray(s.tail_first_decode, np.float64)
        if len(first) != share.shape[0] or s.n_trajectories <= 0:
            return np.zeros_like(share)
        first = first[:, None]
        overlap = np.asarray(s.first_decode_overlap, np.float64)[:, None]
        per = np.minimum(s.n_trajectories / m[None, :], bcap)  # admitted together on the tail's instance
        b1 = np.clip(1.0 + (per - 1.0) * overlap / np.maximum(first, 1.0), 1.0, bcap)
        decode = first * np.maximum(iteration_s(b1) - iteration_s(b_tail), 0.0)
        rate: np.ndarray | float = self.table.prefill_per_token[t]
        if s.mean_prompt_tokens > 0 and len(s.prompt_prefill):
            rate = self._batch_rates(t, s.mean_prompt_tokens, per)  # the prompts admitted with it: one batch
        prompts = (1.0 - share) * np.maximum(per - 1.0, 0.0) * s.mean_prompt_tokens * rate
        return decode + prompts

    def curves(self, layout: BucketLayout, M: Sequence[int]) -> _Curves:
        """Running-minimum ``load_b`` and ``tail_b`` for m = 1..M[b]."""
        loads, tails = [], []
        for b in range(len(layout.tps)):
            load, tail = self.raw_times(layout, b, np.arange(1, M[b] + 1, dtype=np.float64))
            loads.append(np.minimum.accumulate(load))
            tails.append(np.minimum.accumulate(tail, axis=1))
        return _Curves(layout, loads, tails)

    def saturated_s(self, layout: BucketLayout, counts: Sequence[int]) -> float:
        """The busy time of the step's work with every instance at its full batch ``Bcap`` (no
        tail: continuous generation fills the slots a tail leaves with the next step's prompts):
        ``T / (m Bcap) * iter(Bcap) + P * prefill_per_token / m`` per bucket; two buckets pool as
        in ``spill_load`` (the short bucket's work spills onto the long one's instances)."""
        s = self.stats
        sat: list[float] = []
        for b, m in enumerate(counts):
            t = layout.tps[b]
            lo, hi = self._cell_ranges(layout)[b]
            T = float(s.decode_tokens[lo:hi].sum())
            S = float(s.decode_ctx_sum[lo:hi].sum())
            P = float(s.prefill_tokens[lo:hi].sum())
            mm = max(int(m), 1)
            x = P * float(self.prefill_rates(layout, b, np.array([float(mm)]))[0]) / mm
            if T > 0:
                ctx = S / T
                bcap = float(max(1, min(self.table.max_seqs[t], int(self.table.kv_capacity[t] // max(ctx, 1.0)))))
                grid = np.arange(1, len(self.table.base[t]) + 1, dtype=np.float64)
                it = float(np.interp(bcap, grid, self.table.base[t]) + np.interp(bcap, grid, self.table.slope[t]) * bcap * ctx)
                x += T / (mm * bcap) * it
            sat.append(x)
        if len(sat) == 2:
            g = [layout.tps[b] * max(int(m), 1) for b, m in enumerate(counts)]
            pooled = (sat[0] * g[0] + sat[1] * g[1]) / (g[0] + g[1])
            return max(sat[1], min(sat[0], pooled))
        return max(sat) if sat else 0.0

    def objective(self, c: _Curves, counts: Sequence[int]) -> tuple[float, float, float]:
        """``(makespan, max load, tail critical path)`` of counts under the curves ``c``."""
        if len(counts) == 2:
            load = float(self.spill_load(c, np.asarray([counts[0]]), np.asarray([counts[1]]))[0])
        else:
            load = max(float(c.load[b][m - 1]) for b, m in enumerate(counts))
        crit = float(np.max(self.stats.tail_tool_s + sum(c.tail[b][:, m - 1] for b, m in enumerate(counts))))
        return max(load, crit), load, crit

    def spill_load(self, c: _Curves, m1: np.ndarray, m2: np.ndarray) -> np.ndarray:
        """The busier bucket's time under work-conserving routing (``libra.scheduling.base``):
        work routed to the short bucket spills onto the long bucket's instances when the short
        one is the bottleneck (never the other way: a bucket's bound is an upper limit), so the
        two then finish together at their pooled GPU-seconds over their GPUs (per-GPU speed of
        the two TPs taken as equal): ``max(load_2, min(load_1, pooled))``. Charging each bucket
        only its own range's work (as before) predicted gains that replay, which spills, did
        not show."""
        t1, t2 = c.layout.tps
        l1, l2 = c.load[0][m1 - 1], c.load[1][m2 - 1]
        g1, g2 = m1 * t1, m2 * t2
        pooled = (l1 * g1 + l2 * g2) / (g1 + g2)
        return np.maximum(l2, np.minimum(l1, pooled))

    def evaluate(self, layout: BucketLayout, counts: Sequence[int]) -> tuple[float, float, float]:
        """``(makespan, max load, tail critical path)`` of a layout with given counts."""
        return self.objective(self.curves(layout, counts), counts)

    # ---- the search --------------------------------------------------------------------------
    def _all_curves(self) -> list[_Curves]:
        if self._curves is None:
            self._curves = []
            for layout in self.layouts():
                if not self.feasible(layout) or sum(layout.tps) > self.max_gpus:
                    continue
                self._curves.append(self.curves(layout, [self.max_gpus // t for t in layout.tps]))
        return self._curves

    def instances_on(self, G: int, t: int) -> int:
        """How many TP-``t`` instances ``G`` GPUs hold, packed so that none spans two NVLink
        domains (the one-bucket count every layout of that degree is priced with)."""
        gpn = self.domain
        return (G // gpn) * (gpn // t) + (G % gpn) // t

    def _best_counts(self, c: _Curves, G: int) -> tuple[float, tuple[int, ...]] | None:
        """The layout's best makespan and counts on ``G`` GPUs (None: it does not pack)."""
        gpn = self.domain  # instances pack NVLink domains
        tps = c.layout.tps
        tool = self.stats.tail_tool_s
        if len(tps) == 1:
            t = tps[0]
            m = self.instances_on(G, t)
            if m < 1:
                return None
            m = min(m, len(c.load[0]))
            return self.objective(c, (m,))[0], (m,)
        t1, t2 = tps
        if t2 % t1:  # TP degrees that do not divide each other: check each count by packing
            return self._best_counts_slow(c, G)
        m1 = np.arange(1, len(c.load[0]) + 1)
        m2 = max_second_count(G, gpn, t1, m1, t2)
        m2 = np.minimum(m2, len(c.load[1]))
        ok = m2 >= 1
        if not ok.any():
            return None
        m1, m2 = m1[ok], m2[ok]
        crit = np.max(tool[:, None] + c.tail[0][:, m1 - 1] + c.tail[1][:, m2 - 1], axis=0)
        obj = np.maximum(self.spill_load(c, m1, m2), crit)
        i = int(np.argmin(obj))
        return float(obj[i]), (int(m1[i]), int(m2[i]))

    def _best_counts_slow(self, c: _Curves, G: int) -> tuple[float, tuple[int, ...]] | None:
        from libra.planner.packing import fits

        t1, t2 = c.layout.tps
        best: tuple[float, tuple[int, ...]] | None = None
        for m1 in range(1, G // t1 + 1):
            m2 = 0
            while fits(G, self.domain, [t1] * m1 + [t2] * (m2 + 1)):
                m2 += 1
            if m2 >= 1:
                o = self.objective(c, (m1, min(m2, len(c.load[1]))))[0]
                if best is None or o < best[0]:
                    best = (o, (m1, min(m2, len(c.load[1]))))
        return best

    def choice_for(self, layout: BucketLayout, counts: Sequence[int], instances: tuple[RolloutInstance, ...],
                   buckets: tuple[Bucket, ...], G: int) -> RolloutChoice:
        """A given layout, counts and placement (the plan in force) as a ``RolloutChoice``,
        predicted on this DP's statistics."""
        c = self.curves(layout, counts)
        makespan, load, crit = self.objective(c, counts)
        times = tuple(float(c.load[b][m - 1]) for b, m in enumerate(counts))
        return RolloutChoice(n_gpus=G, layout=layout, counts=tuple(counts), makespan_s=makespan, load_s=load, critical_path_s=crit,
                             bucket_times_s=times, instances=instances, buckets=buckets,
                             throughput_s=min(load, self.saturated_s(layout, counts)))

    def best_one_bucket_s(self, G: int) -> float:
        """The model's makespan of the best one-bucket layout on ``G`` GPUs (inf: none packs):
        what a two-bucket layout's gain is measured against (``libra.planner.feedback``)."""
        times = [r[0] for c in self._all_curves() if len(c.layout.tps) == 1 for r in [self._best_counts(c, G)] if r is not None]
        return float(min(times)) if times else float("inf")

    def scenario_makespan(self, layout: BucketLayout, counts: Sequence[int], nominal: float) -> float:
        """The makespan of ``layout`` with ``counts`` on this DP's statistics (a tail scenario's,
        ``TAIL_SCENARIOS``): where its tail does not fit the layout's KV (a context it cannot
        hold), at least ``nominal``: not holding the tail never makes a layout faster."""
        c = self._curve_of(layout, counts)
        ms = self.objective(c, counts)[0]
        return ms if self.feasible(layout) else max(nominal, ms)

    def _curve_of(self, layout: BucketLayout, counts: Sequence[int]) -> _Curves:
        """``layout``'s curves, built once for every instance count the GPUs allow."""
        if layout not in self._by_layout:
            M = [max(self.max_gpus // t, int(k)) for t, k in zip(layout.tps, counts)]
            self._by_layout[layout] = self.curves(layout, M)
        return self._by_layout[layout]

    def best(self, G: int, kind_scale: tuple[float, float] = (1.0, 1.0), tails: Sequence[RolloutDP] = ()) -> RolloutChoice | None:
        """The best layout and allocation on ``G`` rollout GPUs (None: nothing fits).
        ``kind_scale``: what past steps measured against the model's rollout, for one-bucket and
        two-bucket layouts (``libra.planner.feedback``); layouts are compared on scaled times,
        the choice reports the model's own. ``tails``: the same step's statistics with the tail
        rows at each of the search's tail scenarios (``TAIL_SCENARIOS``); layouts are then
        compared on their mean makespan over them (each with the counts that are best on this
        DP's statistics), the expectation the search ranks candidates by: the nominal
        statistics alone chose TP 1 for a tool-bound step where TP 2-8 were as fast, and a
        generation longer than the window had seen took it 3x longer (InterCode CTF on 24
        A100, K=0, SIMULATED)."""
        memo_key = (G, float(kind_scale[0]), float(kind_scale[1]), tuple(t.stats.digest for t in tails))
        if memo_key in self._memo:
            self.hits += 1
            return self._memo[memo_key]
        self.misses += 1
        best: tuple[float, _Curves, tuple[int, ...], tuple[float, float]] | None = None
        regret = self._regrets(G) if self._scenarios else {}
        for c in self._all_curves():
            r = self._best_counts(c, G)
            if r is None:
                continue
            two = len(c.layout.tps) > 1
            expected = float(np.mean([t.scenario_makespan(c.layout, r[1], r[0]) for t in tails])) if tails else r[0]
            ms = expected * kind_scale[1 if two else 0] * ((1.0 + HETERO_MARGIN) if two else 1.0)  # a split must win clearly
            key = (regret.get(c.layout, 1.0), ms)
            if best is None or key < best[3]:
                best = (r[0], c, r[1], key)
        choice = None if best is None else self._materialize(best[1], best[2], G)
        self._memo[memo_key] = choice
        return choice

    def _regrets(self, G: int) -> dict[BucketLayout, float]:
        """Per layout, its worst slowdown on ``G`` GPUs against the best layout of each case:
        the nominal prior and each of its scenarios (a case where no layout fits is skipped, a
        layout that does not fit a case counts as infinitely slow there). The layout chosen from
        a prior is the one with the least: a prior wrong by ``PRIOR_STRETCH`` costs the least it
        can. (The nominal prior alone picked TP8 for a math step where TP4 was 1.24x faster.)"""
        cases = [self] + self._scenarios
        times: list[dict[BucketLayout, float]] = []
        for dp in cases:
            t: dict[BucketLayout, float] = {}
            for c in dp._all_curves():
                r = dp._best_counts(c, G)
                if r is not None:
                    t[c.layout] = r[0]
            if t:
                times.append(t)
        out: dict[BucketLayout, float] = {}
        for c in self._all_curves():
            worst = 1.0
            for t in times:
                top = min(t.values())
                worst = max(worst, t.get(c.layout, float("inf")) / max(top, 1e-12))
            out[c.layout] = worst
        return out

    def _materialize(self, c: _Curves, counts: tuple[int, ...], G: int) -> RolloutChoice:
        layout = c.layout
        sizes = [t for t, m in zip(layout.tps, counts) for _ in range(m)]
        bucket_of = [b for b, m in enumerate(counts) for _ in range(m)]
        where = place(G, self.gpus_per_node, sizes, self.domain)
        assert where is not None, (G, layout, counts)
        instances = tuple(
            RolloutInstance(id=k, tp=sizes[k], bucket=bucket_of[k], node=where[k][0], first_gpu=where[k][1]) for k in range(len(sizes))
        )
        lows = (0,) + layout.bounds
        highs: tuple[int | None, ...] = layout.bounds + (None,)
        buckets = tuple(Bucket(index=b, tp=t, min_context=lows[b], max_context=highs[b]) for b, t in enumerate(layout.tps))
        makespan, load, crit = self.objective(c, counts)
        times = tuple(float(c.load[b][m - 1]) for b, m in enumerate(counts))
        return RolloutChoice(
            n_gpus=G,
            layout=layout,
            counts=tuple(counts),
            makespan_s=makespan,
            load_s=load,
            critical_path_s=crit,
            bucket_times_s=times,
            instances=instances,
            buckets=buckets,
            throughput_s=min(load, self.saturated_s(layout, counts)),
        )
