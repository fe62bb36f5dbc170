"""The rollout DP: which TP degrees, how many instances of each, and which context range each serves.

A *layout* (``BucketLayout``) is a list of buckets ordered by context range, each with one TP
degree (non-decreasing: longer contexts get equal or more GPUs per instance) and interior context
bounds taken from ``WorkloadStats.boundary_candidates`` (quantiles of recent final lengths). For a
layout and instance counts ``m_b`` the predicted rollout makespan is

    makespan = max( max_b  time_b(m_b),  critical_path )

* ``time_b(m)`` is bucket ``b``'s load: the work recent steps put in its context range (decode
  tokens ``T_b``, their KV-context sum ``S_b``, prefill tokens ``P_b``; ``WorkloadStats``) spread
  evenly over ``m`` instances of TP ``t_b``. Each instance runs at a typical batch
  ``B = clip(ceil(N_b / m), 1, min(max_running_seqs(t_b), kv_capacity(t_b) / mean context))``
  with ``N_b`` the trajectories that pass through the range, so
  ``time_b(m) = T_b / (m B) * base(t_b, B) + slope(t_b, B) * S_b / m + P_b * prefill_per_token(t_b) / m``
  (``decode_coeffs``: one decode iteration costs ``base + slope * total_context``). More instances
  never hurt: the planner may leave one idle, so ``time_b`` is taken as its running minimum.
* ``critical_path`` is the long tail: the expected longest trajectory (``WorkloadStats`` tail) run
  at batch 1 on each bucket's TP over the part of its context inside that bucket, plus its own
  prefill and tool latencies. Higher TP shortens it; lower TP gives more throughput per GPU. The
  layout search trades the two.

A layout is infeasible when a bucket's upper bound (or, for the last bucket, the tail's context)
does not fit the KV cache of its TP, or when its weights do not fit at all.

The search for a GPU budget ``G`` is a min-max allocation solved exactly: for each candidate load
level ``L`` (every value some ``time_b`` takes) the minimal counts are ``m_b(L) = min{m: time_b(m)
<= L}`` and the GPUs needed ``need(L) = sum_b t_b m_b(L)``; the best load for ``G`` is the smallest
``L`` with ``need(L) <= G`` *whose minimal counts pack on the nodes* (``packing.fits``: TP groups
never cross a node; removing instances keeps a packing valid, so the minimal counts are the right
test). One vectorized pass gives ``need`` for every level and hence the curve for every budget at
once; queries per budget are then a search plus a few packing checks, memoized by
``(stats digest, G)``. Leftover GPUs go to the busiest buckets.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libra.planner.costs import DecodeTable
from libra.planner.packing import fits, node_capacities, pack
from libra.planner.plan import Bucket, RolloutInstance
from libra.planner.stats import WorkloadStats

DEFAULT_MAX_BUCKETS = 3


@dataclass(frozen=True)
class BucketLayout:
    """TP per bucket and the ``len(tps) - 1`` interior context bounds between them."""

    tps: tuple[int, ...]
    bounds: tuple[int, ...]


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


@dataclass
class _Curve:
    layout: BucketLayout
    tau: list[np.ndarray]  # per bucket, running-min time for m = 1..M_b
    levels: np.ndarray  # sorted candidate load levels
    need: np.ndarray  # GPUs needed per level (non-increasing)
    crit: float


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
    ) -> None:
        self.stats = stats
        self.table = table
        self.gpus_per_node = gpus_per_node
        self.max_gpus = max_gpus
        self.tps = tuple(t for t in (tps or table.usable_tps) if t in table.usable_tps)
        self.max_buckets = max_buckets
        self._curves: list[_Curve] | None = None
        self._memo: dict[int, RolloutChoice | None] = {}
        self.hits = 0
        self.misses = 0

    # ---- the model -------------------------------------------------------------------------
    def layouts(self) -> list[BucketLayout]:
        """Every layout considered: 1..max_buckets buckets, non-decreasing TP, candidate bounds."""
        cands = self.stats.boundary_candidates()
        out = []
        for k in range(1, self.max_buckets + 1):
            for bounds in itertools.combinations(cands, k - 1):
                for tps in itertools.combinations_with_replacement(self.tps, k):
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

    def bucket_times(self, layout: BucketLayout, b: int, m: np.ndarray) -> np.ndarray:
        """``time_b(m)`` for an array of instance counts (not yet running-minimized)."""
        s, t = self.stats, layout.tps[b]
        lo, hi = self._cell_ranges(layout)[b]
        T = float(s.decode_tokens[lo:hi].sum())
        S = float(s.decode_ctx_sum[lo:hi].sum())
        P = float(s.prefill_tokens[lo:hi].sum())
        N = float(s.reach[lo:hi].max()) if hi > lo else 0.0
        m = np.asarray(m, np.float64)
        if T <= 0 and P <= 0:
            return np.zeros_like(m)
        ctx_avg = S / T if T > 0 else 1.0
        bmax = max(1, min(self.table.max_seqs[t], int(self.table.kv_capacity[t] // max(ctx_avg, 1.0))))
        B = np.clip(np.ceil(N / m), 1, bmax).astype(np.int64)
        base = self.table.base[t][B - 1]
        slope = self.table.slope[t][B - 1]
        return T / (m * B) * base + slope * S / m + P * self.table.prefill_per_token[t] / m

    def critical_path(self, layout: BucketLayout) -> float:
        """The tail trajectory's own time at batch 1 on its buckets' TPs, plus its tools."""
        s = self.stats
        total = s.tail_tool_s
        for b, (lo, hi) in enumerate(self._cell_ranges(layout)):
            t = layout.tps[b]
            total += float(s.tail_decode_tokens[lo:hi].sum()) * self.table.base[t][0]
            total += float(s.tail_decode_ctx_sum[lo:hi].sum()) * self.table.slope[t][0]
            total += float(s.tail_prefill_tokens[lo:hi].sum()) * self.table.prefill_per_token[t]
        return total

    def evaluate(self, layout: BucketLayout, counts: Sequence[int]) -> tuple[float, float, tuple[float, ...]]:
        """``(makespan, load, per-bucket times)`` of a layout with given counts (brute-force API)."""
        times = []
        for b, m in enumerate(counts):
            ms = np.arange(1, m + 1, dtype=np.float64)
            times.append(float(np.min(self.bucket_times(layout, b, ms))))
        load = max(times)
        return max(load, self.critical_path(layout)), load, tuple(times)

    # ---- the search --------------------------------------------------------------------------
    def _build(self) -> list[_Curve]:
        curves = []
        for layout in self.layouts():
            if not self.feasible(layout):
                continue
            taus = []
            ok = True
            for b, t in enumerate(layout.tps):
                M = self.max_gpus // t
                if M < 1:
                    ok = False
                    break
                taus.append(np.minimum.accumulate(self.bucket_times(layout, b, np.arange(1, M + 1, dtype=np.float64))))
            if not ok or sum(layout.tps) > self.max_gpus:
                continue
            levels = np.unique(np.concatenate(taus))
            need = np.zeros(len(levels), np.int64)
            for t, tau in zip(layout.tps, taus):
                idx = np.searchsorted(-tau, -levels, side="left")  # first m-1 with tau <= level
                need += np.where(idx < len(tau), (idx + 1) * t, 1 << 40)
            curves.append(_Curve(layout, taus, levels, need, self.critical_path(layout)))
        return curves

    def _counts_at(self, curve: _Curve, i: int) -> tuple[int, ...]:
        lvl = curve.levels[i]
        return tuple(int(np.searchsorted(-tau, -lvl, side="left")) + 1 for tau in curve.tau)

    def _best_for(self, curve: _Curve, G: int) -> tuple[float, int] | None:
        """(makespan, level index) of a layout under budget G, packing-aware; None if none fits."""
        i = int(np.searchsorted(-curve.need, -G, side="left"))
        while i < len(curve.levels):
            counts = self._counts_at(curve, i)
            sizes = [t for t, m in zip(curve.layout.tps, counts) for _ in range(m)]
            if fits(G, self.gpus_per_node, sizes):
                return max(float(curve.levels[i]), curve.crit), i
            i += 1
        return None

    def lower_bound(self, curve: _Curve, G: int) -> float:
        """The layout's makespan under G ignoring node packing (a lower bound on the real one)."""
        i = int(np.searchsorted(-curve.need, -G, side="left"))
        return max(float(curve.levels[i]), curve.crit) if i < len(curve.levels) else float("inf")

    def best(self, G: int) -> RolloutChoice | None:
        """The best layout and allocation on ``G`` rollout GPUs (None: nothing fits)."""
        if G in self._memo:
            self.hits += 1
            return self._memo[G]
        self.misses += 1
        if self._curves is None:
            self._curves = self._build()
        order = sorted(self._curves, key=lambda c: (self.lower_bound(c, G), len(c.layout.tps), c.layout.tps, c.layout.bounds))
        best: tuple[float, _Curve, int] | None = None
        for c in order:
            if best is not None and self.lower_bound(c, G) >= best[0]:
                break
            r = self._best_for(c, G)
            if r is not None and (best is None or r[0] < best[0]):
                best = (r[0], c, r[1])
        choice = None if best is None else self._materialize(best[1], best[2], G)
        self._memo[G] = choice
        return choice

    def _materialize(self, curve: _Curve, i: int, G: int) -> RolloutChoice:
        layout = curve.layout
        counts = list(self._counts_at(curve, i))

        def t_of(b: int) -> float:
            return float(curve.tau[b][counts[b] - 1])

        # leftover GPUs: one more instance to the bucket with the highest time that still packs
        used = sum(t * m for t, m in zip(layout.tps, counts))
        while True:
            order = sorted(range(len(counts)), key=lambda b: -t_of(b))
            placed = False
            for b in order:
                t = layout.tps[b]
                if used + t > G or counts[b] >= len(curve.tau[b]):
                    continue
                trial = counts.copy()
                trial[b] += 1
                if fits(G, self.gpus_per_node, [tt for tt, m in zip(layout.tps, trial) for _ in range(m)]):
                    counts, used, placed = trial, used + t, True
                    break
            if not placed:
                break
        sizes = [t for t, m in zip(layout.tps, counts) for _ in range(m)]
        bucket_of = [b for b, m in enumerate(counts) for _ in range(m)]
        where = pack(node_capacities(G, self.gpus_per_node), sizes)
        assert where is not None
        instances = tuple(
            RolloutInstance(id=k, tp=sizes[k], bucket=bucket_of[k], node=where[k][0], first_gpu=where[k][1]) for k in range(len(sizes))
        )
        lows = (0,) + layout.bounds
        highs: tuple[int | None, ...] = layout.bounds + (None,)
        buckets = tuple(Bucket(index=b, tp=t, min_context=lows[b], max_context=highs[b]) for b, t in enumerate(layout.tps))
        times = tuple(t_of(b) for b in range(len(counts)))
        load = max(times)
        return RolloutChoice(
            n_gpus=G,
            layout=layout,
            counts=tuple(counts),
            makespan_s=max(load, curve.crit),
            load_s=load,
            critical_path_s=curve.crit,
            bucket_times_s=times,
            instances=instances,
            buckets=buckets,
        )
