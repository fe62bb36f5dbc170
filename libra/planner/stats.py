"""Step statistics the planner plans from: observed data only, never the upcoming step's future.

From the last ``window`` completed steps (``history``) and the upcoming step's prompt lengths,
``WorkloadStats`` builds the numbers the rollout DP needs, on a fixed grid of context cells:

* ``decode_tokens[k]``: tokens generated while a trajectory's context was in cell ``k``;
* ``decode_ctx_sum[k]``: the sum of the context length over those tokens (the KV each decode
  step reads, so ``slope * ctx_sum`` is their attention/KV cost);
* ``prefill_tokens[k]``: prompt and tool-return tokens prefilled at a context in cell ``k``;
* ``reach[k]``: trajectories whose context passes through cell ``k`` (the concurrency a bucket
  covering the cell sees);
* the same three per-cell arrays for the *tail trajectories* (rows): the history trajectory whose
  final length is the ``1 - 1/(n+1)`` quantile (``higher`` method: an observed value) of the
  pooled final lengths (what the
  upcoming step's longest trajectory is expected to look like), and the one whose total tool
  latency is that quantile of pooled tool time (a short trajectory stuck in a 30 s
  tool timeout can be the critical path), and the one whose generated tokens are that quantile
  of pooled generation (where tool returns make most of the context, the longest trajectory
  is not the one that decodes longest; measured steps only, ``generation_tail``); plus each
  one's total tool latency.

Everything is scaled to the upcoming step's trajectory count (``len(prompt_tokens)``): history
steps are averaged per trajectory. When there is no history (first step, or ``libra-sim plan``
without a trace) ``prior_step`` supplies a length prior from what is known before any step has
run (``PriorSpec``: the declared limits, the workload kind, the step's own prompts), and
``scenarios`` holds the same prior stretched shorter and longer, so the rollout DP can pick a
layout that is safe whichever is true (``rollout_dp``: least worst-case regret).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn

#: Tool latency used where a trace says null and no history latency of that tool exists (s).
DEFAULT_TOOL_LATENCY_S = 2.0
#: Steps of history pooled into the statistics (most recent last).
DEFAULT_WINDOW = 3
#: The largest tail index ``tail_index`` reports (a Pareto tail of index 1: a mean that barely
#: exists); a handful of runaway samples must not extrapolate without bound.
TAIL_INDEX_MAX = 1.0


def cell_edges(max_context: int, first: int = 256) -> np.ndarray:
    """Context grid: 0, then ``first * 2**(k/2)`` up to past ``max_context`` (half-octave cells).

    Half octaves keep the grid short (about 20 cells up to 256K) while bucket bounds, which come
    from quantiles snapped to the grid, stay within ~41% of any requested value.
    """
    edges = [0]
    e = float(first)
    while edges[-1] <= max_context:
        edges.append(int(round(e)))
        e *= 2**0.5
    return np.asarray(edges, np.int64)


def _overlap(lo: np.ndarray, hi: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token counts and context sums of segments [lo, hi) falling into each grid cell.

    Returns ``(count[s, k], ctx_sum[s, k])``; a token at context c (0-based position) reads c
    tokens of KV, so a run of positions a..b-1 sums to (a+b-1)*(b-a)/2.
    """
    a = np.maximum(lo[:, None], edges[None, :-1])
    b = np.minimum(hi[:, None], edges[None, 1:])
    n = np.clip(b - a, 0, None).astype(np.float64)
    s = np.where(n > 0, (a + b - 1).astype(np.float64) * n / 2.0, 0.0)
    return n, s


@dataclass(frozen=True)
class WorkloadStats:
    """The planner's digest of recent steps (see the module docstring)."""

    n_trajectories: int
    edges: np.ndarray
    decode_tokens: np.ndarray
    decode_ctx_sum: np.ndarray
    prefill_tokens: np.ndarray
    reach: np.ndarray
    tail_decode_tokens: np.ndarray  # [tails, cells]
    tail_decode_ctx_sum: np.ndarray  # [tails, cells]
    tail_prefill_tokens: np.ndarray  # [tails, cells]
    tail_tool_s: np.ndarray  # [tails]
    tail_context: int  # the longest tail's final context
    final_context: np.ndarray  # pooled final lengths (history), sorted
    #: for each entry of ``final_context``, the final length of the longest trajectory of its GRPO
    #: group: when its group, and so its training data, is complete (the streamed loop trains on
    #: whole groups; ``streaming_step_s``); a trajectory without a group (the prior) is its own.
    group_final_context: np.ndarray
    mean_total_tokens: float
    mean_turns: float
    tool_latency_median_s: dict[str, float]
    digest: str
    from_prior: bool = False
    #: planned from a prior: the same prior stretched shorter and longer (``PRIOR_STRETCH``), each
    #: digested like this one; the rollout DP chooses what is safe under all of them
    scenarios: tuple[WorkloadStats, ...] = ()
    #: the step's start (``RolloutDP.raw_times``): every trajectory of a step is queued at once,
    #: so each tail's first turn decodes beside everyone's first turn, after their prompts'
    #: prefill. Per tail: its first turn's generated tokens, and the mean over the pooled
    #: trajectories of min(their first turn, the tail's): how many of them still decode, on
    #: average, while it does. Empty: no start term (the DP's model before it).
    tail_first_decode: np.ndarray = field(default_factory=lambda: np.zeros(0))
    first_decode_overlap: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean_prompt_tokens: float = 0.0
    #: the KV parked during tool calls (``RolloutDP.raw_times``, ``kv_pressure``): per cell, the
    #: trajectories' turn-averaged contexts (each trajectory's mean over its turns of the context
    #: at the end of the turn's generation, where a tool call parks it, split over the cells those
    #: turns end in); their sum over a bucket's cells, per instance, times ``inflight_ratio`` is
    #: the KV its trajectories hold at once
    resident_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: how much of ``resident_ctx`` is in flight at once at the peak: the largest sum of the
    #: contexts the trajectories hold at one moment (``inflight_peak``, on a nominal clock), over
    #: the sum of their turn-averaged contexts, pooled over the steps (1: not measured). The KV
    #: pressure ``kv_pressure`` is priced from is ``resident_ctx`` times this (``RolloutDP.evicted_share``)
    inflight_ratio: float = 1.0
    #: per cell, the contexts at the tool calls (by the context at the call): what is prefilled
    #: again when a returning trajectory's parked KV was evicted; per tail trajectory, its own
    return_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tail_return_ctx: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    #: the part of ``prefill_tokens`` that is the upcoming prompts, per cell, and how many prompts:
    #: they are prefilled together at the step's start, and priced as the simulator batches them
    #: (``RolloutDP.prefill_rates``). Empty: one rate per TP.
    prompt_prefill: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prompt_count: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n_cells(self) -> int:
        return len(self.edges) - 1

    def boundary_candidates(self, quantiles: Sequence[float] = (0.5, 0.75, 0.9, 0.97)) -> tuple[int, ...]:
        """Candidate bucket bounds: quantiles of the final context length snapped to grid edges.

        Interior edges only (not 0, not past the last cell), deduplicated, ascending.
        """
        if not len(self.final_context):
            return ()
        qs = np.quantile(self.final_context, quantiles)
        out = set()
        for q in qs:
            k = int(np.argmin(np.abs(self.edges[1:-1] - q))) + 1 if len(self.edges) > 2 else None
            if k is not None:
                out.add(int(self.edges[k]))
        return tuple(sorted(out))

    def cell_index(self, context: int) -> int:
        """Grid cell holding ``context`` (edges[k] <= context < edges[k+1]); the last cell is open."""
        return int(min(np.searchsorted(self.edges, context, side="right") - 1, self.n_cells - 1))

    def drift(self, other: WorkloadStats) -> float:
        """How far this step's length distribution moved from ``other``'s: the mean absolute
        difference of log final-length quantiles (q = 0.1 .. 0.9 and 0.99). 0.1 ~ 10% longer."""
        if not len(self.final_context) or not len(other.final_context):
            return float("inf")
        qs = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
        a = np.log(np.maximum(np.quantile(self.final_context, qs), 1))
        b = np.log(np.maximum(np.quantile(other.final_context, qs), 1))
        return float(np.mean(np.abs(a - b)))


def _latencies(step: StepArrays) -> np.ndarray:
    """Per-turn tool latency with nulls filled by that tool's median in the step (or default)."""
    lat = step.tool_latency_s.copy()
    has_tool = step.tool_code >= 0
    lat[~has_tool] = 0.0
    nan = np.isnan(lat) & has_tool
    if nan.any():
        for code in np.unique(step.tool_code[nan]):
            known = lat[(step.tool_code == code) & ~np.isnan(lat)]
            lat[nan & (step.tool_code == code)] = float(np.median(known)) if len(known) else DEFAULT_TOOL_LATENCY_S
    return lat


#: The nominal decode time per generated token of the clock ``inflight_peak`` lays a step's
#: trajectories out on (a turn takes its generated tokens at this pace plus its tool latency).
#: Why a clock and not the turn-averaged contexts alone: whether parked KV is evicted depends on
#: how much of it is held *at once*, and trajectories that end early or wait on long tools do not
#: hold theirs beside the long ones. Against the simulator's peak KV of a step's rollout with KV
#: to spare (per-step layouts at TP 8 of the bundled SWE, Search-R1 and math traces and five
#: converted logs, 24 steps; SIMULATED), the peak on this clock was 0.99x on average (coefficient
#: of variation 0.17), the turn-averaged sum 0.88x (0.29): 0.70x on SWE, whose fit set the
#: eviction threshold, and 1.21x on MCPMark, whose two-step cohort on three TP-4 instances of
#: Llama-3.1-70B the model priced at 705 s and the simulator ran in 1,475 s (about 40% of the tool
#: returns evicted where the model charged none). The pace only orders the turns in time: where
#: tool time dominates another pace moves the peak little; where generation dominates it is a
#: nominal guess (on the math trace the simulator's peak is 0.72x of this clock's). These ratios,
#: the fit and the check were measured before 17ba8fbf stopped a trajectory counting two of its own
#: contexts at a turn boundary (peaks 0.1-1% lower on those traces, 7-20% on Terminal-Bench's); the
#: fit rerun after it (session 40) is unchanged (1.05 / 0.39; SWE error 0.058, MCPMark 0.004).
INFLIGHT_DECODE_S_PER_TOKEN = 0.02


def inflight_peak(step: StepArrays, latencies: np.ndarray | None = None) -> float:
    """The largest sum of contexts held at one moment by ``step``'s trajectories, all started
    together, each turn taking ``INFLIGHT_DECODE_S_PER_TOKEN`` per generated token plus its tool
    latency (``_latencies``: nulls filled) and holding, for its whole duration, the context it
    reaches at the end of its generation (where a tool call parks it). 0 for an empty step."""
    if not step.n or not len(step.gen_tokens):
        return 0.0
    off = step.turn_offsets
    nt = np.diff(off)
    per = step.gen_tokens + step.tool_tokens
    cs = np.cumsum(per) - per
    first = np.repeat(cs[off[:-1]], nt)
    held = (step.prompt_tokens[np.repeat(np.arange(step.n), nt)] + cs - first + step.gen_tokens).astype(np.float64)
    lat = _latencies(step) if latencies is None else latencies
    dur = step.gen_tokens * INFLIGHT_DECODE_S_PER_TOKEN + lat
    end = np.cumsum(dur)
    begin = end - dur
    begin = begin - np.repeat(begin[off[:-1]], nt)  # each trajectory's own clock, from 0
    # one event per turn start (the change of the trajectory's held context) and one per
    # trajectory end: half the events of a start and an end per turn, the same sums
    starts = off[:-1][nt > 0]
    lasts = off[1:][nt > 0] - 1
    delta = held - np.concatenate([[0.0], held[:-1]])
    delta[starts] = held[starts]
    t = np.concatenate([begin, begin[lasts] + dur[lasts]])
    d = np.concatenate([delta, -held[lasts]])
    order = np.lexsort((d, t))  # at one instant, what shrinks goes first
    return float(np.max(np.cumsum(d[order])))


def group_max(step: StepArrays, values: np.ndarray) -> np.ndarray:
    """Per trajectory, the largest of ``values`` (aligned with the step's trajectories) over its
    GRPO group (a trajectory without a group is its own): a group is complete with its last
    member, whether measured by length or by finish time."""
    out = np.array(values, copy=True)
    codes: dict[str, int] = {}
    member = np.fromiter((g is not None for g in step.groups), bool, len(step.groups))
    if not member.any():
        return out
    # one pass over the group names, then one scatter-max: a loop of per-group maxima was most
    # of a launch search's time (the prior pools hold thousands of groups; ``Planner.search``)
    code = np.fromiter((codes.setdefault(g, len(codes)) for g in step.groups if g is not None), np.int64, int(member.sum()))
    vals = out[member]
    top = np.full(len(codes), vals.min(), dtype=out.dtype)
    np.maximum.at(top, code, vals)
    out[member] = top[code]
    return out


def group_longest(step: StepArrays) -> np.ndarray:
    """Per trajectory, the final length of the longest trajectory of its GRPO group: when its
    group's data is complete, in the length order."""
    return group_max(step, step.total_tokens.astype(np.int64))


def tail_index(values: np.ndarray) -> float:
    """The Hill estimate of a sample's tail index (``xi``: 0 for an exponential-like tail, 1/alpha
    for a Pareto tail of index alpha) over its top ``max(5, sqrt(m))`` values, clipped to
    ``[0, TAIL_INDEX_MAX]``; 0 when the sample is too small to estimate it."""
    x = np.sort(np.asarray(values, np.float64))[::-1]
    m = len(x)
    k = min(max(5, int(np.ceil(np.sqrt(m)))), m - 1)
    if k < 5 or x[k] <= 0:
        return 0.0
    return float(np.clip(np.mean(np.log(x[:k] / x[k])), 0.0, TAIL_INDEX_MAX))


def beyond_window_stretch(u: float, n: int, m: int, xi: float) -> float:
    """How much longer than the longest of ``m`` observed trajectories the longest of the next
    ``n`` is at its ``u`` quantile, for a tail of index ``xi``: the maxima of ``n`` and ``m``
    draws are Frechet with scales ``n**xi`` and ``m**xi``, so ``P(M_n / M_m <= r) =
    m r**(1/xi) / (m r**(1/xi) + n)`` and ``r(u) = (u n / ((1 - u) m)) ** xi``; at least 1 (below
    ``m / (m + n)`` the observed pool answers the quantile itself)."""
    if xi <= 0.0 or n <= 0 or m <= 0 or u <= m / (m + n):
        return 1.0
    return max(1.0, float((u * n / ((1.0 - u) * m)) ** xi))


def compute_stats(
    history: Sequence[StepArrays],
    prompt_tokens: np.ndarray | None,
    window: int = DEFAULT_WINDOW,
    edges: np.ndarray | None = None,
    prior_cap: int | None = None,
    prior: PriorSpec | None = None,
    tail_of: int | None = None,
    tail_quantile: float | None = None,
    generation_tail: bool = True,
) -> WorkloadStats:
    """Digest the last ``window`` steps of ``history`` for an upcoming step with ``prompt_tokens``.

    Empty history falls back to ``prior_step`` (flagged ``from_prior``, with its ``scenarios``).
    Per-cell arrays are per-trajectory means times the upcoming trajectory count, so they predict
    the next step's totals; the upcoming prompts replace the history's prompt prefill. ``prior``:
    what is known before any step ran (``PriorSpec.of(cluster)``); ``prior_cap``: a hard context
    limit (``ClusterSpec.max_context``), used when ``prior`` is not given. ``tail_of``: the
    trajectory count whose expected longest the tail rows stand for (default: the upcoming
    count; the async staleness cycle's K + 1 steps pass one step's count, ``Planner.search``).
    ``tail_quantile``: which quantile of that longest the tail rows stand for: the pooled
    trajectories at the per-trajectory quantile ``tail_quantile ** (1 / n)`` (the longest of
    ``n`` draws is below it with probability ``tail_quantile``); None: ``1 - 1/(n + 1)``, the
    longest's expected rank (about its 37th percentile). ``Planner.search`` prices a step over
    several (``TAIL_SCENARIOS``).
    """
    if not history:
        spec = prior if prior is not None else PriorSpec(max_context=prior_cap)
        key = (_array_key(prompt_tokens), window, _array_key(edges), spec, tail_of, tail_quantile)
        hit = _PRIOR_STATS.get(key)
        if hit is None:
            hit = _prior_stats(prompt_tokens, window, edges, spec, tail_of, tail_quantile)
            if len(_PRIOR_STATS) >= PRIOR_STATS_CACHE:
                _PRIOR_STATS.pop(next(iter(_PRIOR_STATS)))  # the oldest
            _PRIOR_STATS[key] = hit
        return hit
    return _measured_stats(history, prompt_tokens, window, edges, prior_cap, prior, tail_of, tail_quantile, generation_tail)


#: how many prior digests ``compute_stats`` keeps: a hedged launch search digests the same prior
#: scenario, with the same prompts and tail quantile, for several loop classes and staleness
#: cycles (200 digests, 120 distinct, for 24 H100 / Qwen3-8B at K=1; each about 100 KB)
PRIOR_STATS_CACHE = 256
_PRIOR_STATS: dict[tuple[object, ...], WorkloadStats] = {}


def clear_prior_digests() -> None:
    """Forget the prior digests ``compute_stats`` keeps: a benchmark timing a cold launch search
    (``benchmarks/hedged_launch.py``), a test of the digest itself."""
    _PRIOR_STATS.clear()


def _array_key(a: np.ndarray | None) -> tuple[str, bytes] | None:
    """A hashable key of an array's contents (None for None)."""
    if a is None:
        return None
    arr = np.ascontiguousarray(a)
    return (arr.dtype.str, arr.tobytes())


def _prior_stats(prompt_tokens: np.ndarray | None, window: int, edges: np.ndarray | None, spec: PriorSpec,
                 tail_of: int | None, tail_quantile: float | None) -> WorkloadStats:
    """``compute_stats`` of an empty history: the prior's digest (see there)."""
    n = len(prompt_tokens) if prompt_tokens is not None and len(prompt_tokens) else 256
    # one pool per tail count, drawn large enough to resolve the tail quantiles (``PRIOR_POOL``)
    n = max(n, PRIOR_POOL * (tail_of if tail_of is not None else n))
    prompts = np.resize(np.asarray(prompt_tokens, np.int64), n) if prompt_tokens is not None and len(prompt_tokens) else None
    drawn = list(_prior_pool(n, None if prompts is None else prompts.tobytes(), spec))
    grid = edges if edges is not None else cell_edges(max(int(d.total_tokens.max()) for d in drawn))
    # a prior's tails are its longest and its most tool-bound draws only: its generator draws
    # generation with length, so the generation tail adds nothing it measured, and where it
    # differs it over-states the critical path of Search-R1-like steps (``dp_fidelity``:
    # 0.95x) and moved the bundled Search-R1 trace's first split at K=1 to one it kept for
    # 50 steps, 42.6 -> 43.8 s a step against 42.3 s for the hindsight split (SIMULATED)
    nominal = compute_stats(drawn[:1], prompt_tokens, window, grid, tail_of=tail_of, tail_quantile=tail_quantile,
                            generation_tail=False)
    scen = tuple(compute_stats([d], prompt_tokens, window, grid, tail_of=tail_of, tail_quantile=tail_quantile,
                               generation_tail=False) for d in drawn[1:])
    if not _declared_kind(spec):
        # the default prior (no declared kind) is a guess, 20-67x too long on the short agent
        # logs held out so far; the KV its long trajectories would park is not charged
        # (``RolloutDP.evicted_share``): charged, it gave an InterCode-SQL K=1 run's first
        # steps four more rollout GPUs than the hindsight plan, 0.963 -> 0.894 (held_out_25
        # intercode-sql/b200-24-30b/K1, SIMULATED)
        nominal = dataclasses.replace(nominal, resident_ctx=np.zeros(0))
        scen = tuple(dataclasses.replace(sc, resident_ctx=np.zeros(0)) for sc in scen)
    h = hashlib.sha1(nominal.digest.encode())
    for sc in scen:
        h.update(sc.digest.encode())
    return dataclasses.replace(nominal, from_prior=True, scenarios=scen, digest=h.hexdigest()[:16])


def _measured_stats(history: Sequence[StepArrays], prompt_tokens: np.ndarray | None, window: int, edges: np.ndarray | None,
                    prior_cap: int | None, prior: PriorSpec | None, tail_of: int | None, tail_quantile: float | None,
                    generation_tail: bool) -> WorkloadStats:
    """``compute_stats`` of measured steps (see there)."""
    from_prior = False
    steps = list(history[-window:])
    n_next = int(len(prompt_tokens)) if prompt_tokens is not None and len(prompt_tokens) else int(np.mean([s.n for s in steps]))
    finals = np.concatenate([s.total_tokens for s in steps]).astype(np.int64)
    group_finals = np.concatenate([group_longest(s) for s in steps]).astype(np.int64)
    n_tail = tail_of if tail_of is not None else n_next
    tail_q = 1.0 - 1.0 / (n_tail + 1) if tail_quantile is None else float(tail_quantile) ** (1.0 / max(1, n_tail))
    # beyond what the window resolves: a quantile of the next step's longest above the pool's own
    # longest is extrapolated (``beyond_window_stretch``) from the tail index of the trajectories'
    # generated tokens; the length tail row is then the pool's longest generation, generating that
    # much more (inside the declared limits)
    spec = prior if prior is not None else PriorSpec(max_context=prior_cap)
    gen_totals = [np.add.reduceat(s.gen_tokens, s.turn_offsets[:-1]) if s.n and len(s.gen_tokens) else np.zeros(s.n, np.int64) for s in steps]
    pooled_gen = np.concatenate(gen_totals) if gen_totals else np.zeros(0)
    n_pool = int(sum(s.n for s in steps))
    stretch = beyond_window_stretch(tail_q ** n_tail, n_tail, n_pool, tail_index(pooled_gen)) if len(pooled_gen) else 1.0
    runaway: tuple[StepArrays, int, np.ndarray] | None = None  # (its step, its index, its stretched generation)
    top = int(finals.max()) if len(finals) else 4096
    if stretch > 1.0:
        si = max((k for k in range(len(steps)) if steps[k].n), key=lambda k: int(gen_totals[k].max()))
        s0, i0 = steps[si], int(np.argmax(gen_totals[si]))
        a0, b0 = int(s0.turn_offsets[i0]), int(s0.turn_offsets[i0 + 1])
        g0 = _stretched_generation(s0.gen_tokens[a0:b0], s0.tool_tokens[a0:b0], int(s0.prompt_tokens[i0]), stretch, spec)
        runaway = (s0, i0, g0)
        top = max(top, int(s0.total_tokens[i0]) + int(g0.sum() - s0.gen_tokens[a0:b0].sum()))
    if edges is None:
        edges = cell_edges(top)
    n_cells = len(edges) - 1

    dec = np.zeros(n_cells)
    ctx = np.zeros(n_cells)
    pre = np.zeros(n_cells)
    reach = np.zeros(n_cells)
    resident = np.zeros(n_cells)
    ret_ctx = np.zeros(n_cells)
    prompt_pre = np.zeros(n_cells)
    prompt_n = np.zeros(n_cells)
    n_hist = 0
    tool_lat: dict[str, list[np.ndarray]] = {}
    tool_sums = [np.add.reduceat(_latencies(s), s.turn_offsets[:-1]) if s.n and len(s.gen_tokens) else np.zeros(s.n) for s in steps]
    pooled_tools = np.concatenate(tool_sums) if tool_sums else np.zeros(0)
    targets = (
        float(np.quantile(finals, tail_q, method="higher")) if len(finals) else 0.0,
        float(np.quantile(pooled_tools, tail_q, method="higher")) if len(pooled_tools) else 0.0,
        float(np.quantile(pooled_gen, tail_q, method="higher")) if len(pooled_gen) else 0.0,
    )
    tail_best: list[tuple[float, StepArrays, int] | None] = [None, None, None]
    turns_total = 0
    peak_sum = 0.0
    for si, s in enumerate(steps):
        if not s.n:
            continue
        n_hist += s.n
        per_turn = s.gen_tokens + s.tool_tokens
        # context at the start of each turn: prompt + everything before it in the trajectory
        traj_of_turn = np.repeat(np.arange(s.n), s.n_turns)
        csum = np.cumsum(per_turn) - per_turn
        first = s.turn_offsets[:-1]
        start_of_traj = np.repeat(csum[first] if len(csum) else np.zeros(0, np.int64), s.n_turns)
        ctx0 = s.prompt_tokens[traj_of_turn] + (csum - start_of_traj)
        n_, s_ = _overlap(ctx0, ctx0 + s.gen_tokens, edges)
        dec += n_.sum(0)
        ctx += s_.sum(0)
        # tool returns are prefilled at the context reached after the generation
        tool_at = ctx0 + s.gen_tokens
        has_ret = s.tool_tokens > 0
        np.add.at(pre, np.clip(np.searchsorted(edges, tool_at[has_ret], side="right") - 1, 0, n_cells - 1), s.tool_tokens[has_ret])
        # the KV a trajectory holds while its tool runs, and what a return re-prefills if evicted
        call_cell = np.clip(np.searchsorted(edges, tool_at, side="right") - 1, 0, n_cells - 1)
        calls = s.tool_code >= 0
        np.add.at(ret_ctx, call_cell[calls], tool_at[calls].astype(np.float64))
        np.add.at(resident, call_cell, tool_at / np.maximum(s.n_turns[traj_of_turn], 1).astype(np.float64))
        tot = s.total_tokens
        lo_cell = np.clip(np.searchsorted(edges, s.prompt_tokens, side="right") - 1, 0, n_cells - 1)
        hi_cell = np.clip(np.searchsorted(edges, np.maximum(tot - 1, s.prompt_tokens), side="right") - 1, 0, n_cells - 1)
        np.add.at(reach, lo_cell, 1)
        np.add.at(reach, np.minimum(hi_cell + 1, n_cells - 1), np.where(hi_cell + 1 <= n_cells - 1, -1, 0))
        turns_total += int(s.n_turns.sum())
        lat = _latencies(s)
        peak_sum += inflight_peak(s, lat)
        for code, name in enumerate(s.tool_names):
            sel = s.tool_code == code
            tool_lat.setdefault(name, []).append(lat[sel])
        # the tail trajectories: closest to the tail quantile of final length, of tool time, and
        # of generated tokens (the critical path is decode and tool time: where tool returns
        # are most of the context, the longest trajectory generates little. InterCode-SQL, 56
        # A800, TP 1: the length tail generated 145 tokens, the step's slowest trajectory 4,215,
        # and the hindsight makespan was predicted at 54.6 s against 134.1 s simulated)
        for k, crit in enumerate((tot.astype(np.float64), tool_sums[si], gen_totals[si].astype(np.float64))[:3 if generation_tail else 2]):
            i = int(np.argmin(np.abs(crit - targets[k])))
            gap = abs(float(crit[i]) - targets[k])
            cur = tail_best[k]
            if cur is None or gap < cur[0]:
                tail_best[k] = (gap, s, i)
    reach = np.cumsum(reach)
    inflight = peak_sum / float(resident.sum()) if resident.sum() > 0 else 1.0
    scale = n_next / max(n_hist, 1)
    dec *= scale
    ctx *= scale
    pre *= scale
    reach *= scale
    resident *= scale
    ret_ctx *= scale
    # prompt prefill: the upcoming step's own prompts (known now), in cell 0 .. their length cells
    if prompt_tokens is not None and len(prompt_tokens):
        pcell = np.clip(np.searchsorted(edges, np.asarray(prompt_tokens) - 1, side="right") - 1, 0, n_cells - 1)
        np.add.at(pre, pcell, np.asarray(prompt_tokens, float))
        np.add.at(prompt_pre, pcell, np.asarray(prompt_tokens, float))
        np.add.at(prompt_n, pcell, 1.0)

    if runaway is not None:
        tail_best[0] = (0.0, runaway[0], runaway[1])
    chosen: list[tuple[StepArrays, int]] = []
    for t in tail_best:
        if t is not None and all(t[1] is not c[0] or t[2] != c[1] for c in chosen):
            chosen.append((t[1], t[2]))
    k_tails = max(1, len(chosen))
    tdec = np.zeros((k_tails, n_cells))
    tctx = np.zeros((k_tails, n_cells))
    tpre = np.zeros((k_tails, n_cells))
    tail_tool = np.zeros(k_tails)
    tail_ret = np.zeros((k_tails, n_cells))
    tail_first = np.zeros(k_tails)
    first_overlap = np.zeros(k_tails)
    firsts = np.concatenate([s.gen_tokens[s.turn_offsets[:-1]] for s in steps if s.n and len(s.gen_tokens)]).astype(np.float64) \
        if any(s.n and len(s.gen_tokens) for s in steps) else np.zeros(0)
    tail_ctx = 0
    for k, (s, i) in enumerate(chosen):
        a, b = int(s.turn_offsets[i]), int(s.turn_offsets[i + 1])
        gen = s.gen_tokens[a:b]
        if k == 0 and runaway is not None:
            gen = runaway[2]
        if len(gen):
            tail_first[k] = float(gen[0])
            first_overlap[k] = float(np.minimum(firsts, gen[0]).mean()) if len(firsts) else 0.0
        ret = s.tool_tokens[a:b]
        starts = s.prompt_tokens[i] + np.concatenate([[0], np.cumsum(gen + ret)[:-1]])
        n_, s_ = _overlap(starts, starts + gen, edges)
        tdec[k], tctx[k] = n_.sum(0), s_.sum(0)
        np.add.at(tpre[k], np.clip(np.searchsorted(edges, starts + gen, side="right") - 1, 0, n_cells - 1), ret)
        tpre[k, 0] += s.prompt_tokens[i]
        tail_tool[k] = float(_latencies(s)[a:b].sum())
        called = s.tool_code[a:b] >= 0
        at = (starts + gen)[called]
        np.add.at(tail_ret[k], np.clip(np.searchsorted(edges, at, side="right") - 1, 0, n_cells - 1), at.astype(np.float64))
        tail_ctx = max(tail_ctx, int(s.prompt_tokens[i] + gen.sum() + ret.sum()))

    medians = {k: float(np.median(np.concatenate(v))) if sum(len(x) for x in v) else DEFAULT_TOOL_LATENCY_S for k, v in tool_lat.items()}
    h = hashlib.sha1()
    for arr in (edges, np.round(dec), np.round(ctx, -3), np.round(pre), np.round(reach), tdec, tctx, tpre,
                np.round(resident), np.round(ret_ctx, -3), tail_ret, np.round(prompt_pre), prompt_n):
        h.update(np.ascontiguousarray(arr, np.float64).tobytes())
    h.update(np.round(tail_tool, 3).tobytes())
    prompt_mean = float(np.mean(prompt_tokens)) if prompt_tokens is not None and len(prompt_tokens) else \
        float(np.mean(np.concatenate([s.prompt_tokens for s in steps]))) if n_hist else 0.0
    h.update(np.round(np.concatenate([tail_first, first_overlap, [prompt_mean]]), 3).tobytes())
    h.update(f"{n_next} {inflight:.3f}".encode())
    by_length = np.argsort(finals, kind="stable")
    return WorkloadStats(
        n_trajectories=n_next,
        edges=edges,
        decode_tokens=dec,
        decode_ctx_sum=ctx,
        prefill_tokens=pre,
        reach=reach,
        tail_decode_tokens=tdec,
        tail_decode_ctx_sum=tctx,
        tail_prefill_tokens=tpre,
        tail_tool_s=tail_tool,
        tail_context=tail_ctx,
        final_context=finals[by_length],
        group_final_context=group_finals[by_length],
        mean_total_tokens=float(finals.mean()) if len(finals) else 0.0,
        mean_turns=turns_total / max(n_hist, 1),
        tool_latency_median_s=medians,
        digest=h.hexdigest()[:16],
        from_prior=from_prior,
        tail_first_decode=tail_first,
        first_decode_overlap=first_overlap,
        mean_prompt_tokens=prompt_mean,
        resident_ctx=resident,
        inflight_ratio=inflight,
        return_ctx=ret_ctx,
        tail_return_ctx=tail_ret,
        prompt_prefill=prompt_pre,
        prompt_count=prompt_n,
    )


#: The default length prior (documented in docs/policy-core.md): an SWE-agent-like step whose
#: final context is lognormal with median 8K tokens and sigma 0.8 (p99 ~ 52K, ~6x the median),
#: capped at 64K; turns grow with length (one tool call per ~1.2K tokens), tool returns are 40%
#: of each turn's tokens, tool latency 2 s. Used only when no history exists.
PRIOR_MEDIAN_TOKENS = 8192
PRIOR_SIGMA = 0.8
PRIOR_CAP_TOKENS = 65536
PRIOR_PROMPT_TOKENS = 1024


#: How wrong a first-step prior may be, as factors on every trajectory's generated and returned
#: tokens (the declared limits still hold): the rollout DP keeps the layout whose worst-case
#: slowdown against the best layout of each case is least.
PRIOR_STRETCH: tuple[float, ...] = (1 / 3, 3.0)

#: The prior's trajectories are drawn this many times the tail count (``compute_stats``'s
#: ``tail_of``, else the step's own count), the step's prompts repeated; the per-cell arrays are
#: scaled back to the step's count, so only the tail rows see the larger pool. Why: a tail row
#: stands for the ``u ** (1 / n)`` quantile of the pool (``tail_quantile``), which a pool of n draws
#: resolves only up to its maximum: at ``TAIL_SCENARIOS``' 0.625 and 0.875 with 448 prompts the
#: quantile lies beyond 1 - 1/448, so a one-step pool answered with its own maximum while the
#: async staleness cycle's pool, drawn for (K + 1) x 448 prompts, answered with the maximum of
#: twice the draws. The search priced one step's rollout without the search prior's retrieval
#: timeout (16.5 s at every tail) and the async cycle with it (37-39 s), ranked the first step
#: sync + streaming (24.2 s against 25.4 s) and ran it 26.2 s before moving to async, where a
#: fixed async split ran the first two steps in 55 s against Libra's 70 s (held_out_19
#: search-r/h200-28-14b/K1, 0.876x, SIMULATED). With 8 draws per tail trajectory (1 / (1 - 0.875)),
#: both stand for the same quantiles, as they already do after a step has run (one history pool).
PRIOR_POOL = 8


def _stretched_generation(gen: np.ndarray, returns: np.ndarray, prompt: int, stretch: float, spec: PriorSpec) -> np.ndarray:
    """A tail trajectory's per-turn generated tokens times ``stretch``, held inside the declared
    limits (context cap, generated-token budget): the extra is cut where a limit would end it."""
    out = np.round(np.asarray(gen, np.float64) * stretch).astype(np.int64)
    room = []
    if spec.max_context is not None:
        room.append(int(spec.max_context) - 1 - int(prompt) - int(np.sum(returns)))
    if spec.max_response_tokens is not None:
        room.append(int(spec.max_response_tokens))
    if room:
        cap = max(int(np.sum(gen)), min(room))  # never below what the trajectory did
        if out.sum() > cap:
            out = np.maximum(np.asarray(gen, np.int64), np.floor(out * (cap / max(out.sum(), 1))).astype(np.int64))
    return out


@dataclass(frozen=True)
class PriorSpec:
    """What is known about a workload before any of its steps has run: its declared limits (a
    trace header's ``max_context``/``max_response_tokens``/``max_turns``, a run's context cap)
    and its kind (``swe``, ``search``, ``math``: a trace header's ``workload``) when declared."""

    max_context: int | None = None
    max_response_tokens: int | None = None
    max_turns: int | None = None
    workload: str | None = None
    group_size: int | None = None  # GRPO samples per prompt: the prior's trajectories come in groups of it
    #: every generated and returned token of the prior scaled by this (``prior_step``): 1 is the
    #: prior itself; the first-step hedge also prices the prior wrong by ``PRIOR_STRETCH``
    #: (``libra.planner.search.prior_scenarios``)
    stretch: float = 1.0

    @classmethod
    def of(cls, cluster: Any) -> PriorSpec:
        """The prior a ``ClusterSpec`` declares (fields it lacks count as unknown)."""
        return cls(getattr(cluster, "max_context", None), getattr(cluster, "max_response_tokens", None),
                   getattr(cluster, "max_turns", None), getattr(cluster, "workload", None), getattr(cluster, "group_size", None))


def _declared_kind(spec: PriorSpec) -> bool:
    """Whether ``spec`` names a workload kind whose calibrated generator defaults the prior is
    drawn from (``_kind_step``), rather than the SWE-agent-like default guess."""
    from libra.trace.workload import WORKLOADS

    return spec.workload in WORKLOADS


def _kind_step(n: int, spec: PriorSpec, seed: int) -> StepArrays | None:
    """A step drawn from the declared workload kind's calibrated defaults (``libra.trace.workload``:
    published figures, not any trace's own parameters), inside the declared limits; None when
    the kind is unknown or the limits contradict its defaults."""
    from libra.errors import UserError
    from libra.trace.workload import WORKLOADS, generate_steps, make_params

    if spec.workload not in WORKLOADS:
        return None
    p = make_params(spec.workload)
    over: dict[str, Any] = {}
    if spec.max_context is not None:
        over["max_context"] = int(spec.max_context)
        if p.prompt_max >= spec.max_context:
            over["prompt_max"] = max(2, int(spec.max_context) // 2)
            over["prompt_min"] = min(p.prompt_min, over["prompt_max"] - 1)
            over["prompt_median"] = min(p.prompt_median, float(over["prompt_max"]) / 2)
    if spec.max_turns is not None:
        over["max_turns"] = int(spec.max_turns)
    g = spec.group_size if spec.group_size is not None and spec.group_size > 1 and n % spec.group_size == 0 else 1
    try:
        return next(iter(generate_steps(p.replace(**over) if over else p, 1, n, g, seed)))
    except UserError:
        return None


def _within(step: StepArrays, prompts: np.ndarray | None, spec: PriorSpec, stretch: float) -> StepArrays:
    """``step`` with the known ``prompts``, its generated and returned tokens scaled by
    ``stretch``, and every trajectory ended where a declared limit ends it (context cap,
    generated-token budget, turn limit): the turn that reaches one is cut and becomes the last."""
    n = step.n
    pr = np.asarray(prompts, np.int64)[:n] if prompts is not None and len(prompts) >= n else step.prompt_tokens.copy()
    gen = np.maximum(1, np.round(step.gen_tokens * stretch)).astype(np.int64)
    tool = np.round(step.tool_tokens * stretch).astype(np.int64)
    off = step.turn_offsets
    nt = np.diff(off)
    traj = np.repeat(np.arange(n), nt)
    k = np.arange(len(gen)) - np.repeat(off[:-1], nt)  # turn index within its trajectory
    per = gen + tool
    cs = np.cumsum(per) - per
    start = pr[traj] + cs - np.repeat(cs[off[:-1]] if len(cs) else np.zeros(0, np.int64), nt)
    gcs = np.cumsum(gen) - gen
    gstart = gcs - np.repeat(gcs[off[:-1]] if len(gcs) else np.zeros(0, np.int64), nt)
    cap = spec.max_context if spec.max_context is not None else 1 << 62
    budget = spec.max_response_tokens if spec.max_response_tokens is not None else 1 << 62
    turns = spec.max_turns if spec.max_turns is not None else 1 << 30
    keep = ((start < cap - 1) & (gstart < budget) & (k < turns)) | (k == 0)
    room = np.minimum(cap - 1 - start, budget - gstart)
    g2 = np.maximum(1, np.minimum(gen, room))
    t2 = np.minimum(tool, np.maximum(0, cap - 1 - start - g2))
    cut = (g2 < gen) | (t2 < tool)
    kept_n = np.bincount(traj[keep], minlength=n)
    new_off = np.concatenate([[0], np.cumsum(kept_n)]).astype(np.int64)
    last = np.zeros(len(gen), bool)
    idx = np.flatnonzero(keep)
    last_rows = idx[new_off[1:] - 1]
    ended = np.zeros(n, bool)
    ended[traj[keep & cut]] = True
    ended |= kept_n < nt  # turns dropped after a limit
    last[last_rows[ended]] = True
    code = step.tool_code.copy()
    outc = step.outcome_code.copy()
    code[last] = -1
    outc[last] = -1
    t2[last] = 0
    lat = step.tool_latency_s.copy()
    lat[last] = np.nan
    return dataclasses.replace(step, prompt_tokens=pr, turn_offsets=new_off, gen_tokens=g2[keep], tool_tokens=t2[keep],
                               tool_latency_s=lat[keep], tool_code=code[keep], outcome_code=outc[keep])


@functools.lru_cache(maxsize=16)
def _prior_pool(n: int, prompts: bytes | None, spec: PriorSpec) -> tuple[StepArrays, ...]:
    """The prior's draws for ``compute_stats``: the nominal step, then one per ``PRIOR_STRETCH``
    (``prompts``: the int64 prompt lengths as bytes, a hashable key). Memoized because one search
    asks for the same pool once per tail scenario and for the async cycle alike (the draws are
    seeded, so every ask gets the same steps): an undeclared kind's first search drew it 120
    times, 6.3 s against 1.8 s before ``PRIOR_POOL`` made each draw 8x larger."""
    arr = None if prompts is None else np.frombuffer(prompts, np.int64)
    return (prior_step(n, arr, spec, stretch=spec.stretch),) + tuple(prior_step(n, arr, spec, stretch=spec.stretch * f) for f in PRIOR_STRETCH)


def prior_step(n: int, prompt_tokens: np.ndarray | None = None, spec: PriorSpec | None = None, seed: int = 0,
               stretch: float = 1.0) -> StepArrays:
    """The first step's length prior: what is known, and a documented guess for the rest.

    The shape comes from the declared workload kind's calibrated generator defaults when
    ``spec.workload`` names one, else from the SWE-agent-like ``default_prior_step`` (scaled
    into a declared context cap); the step's own prompts replace the drawn ones; ``stretch``
    scales every generated and returned token (a prior that is wrong by that factor); the
    declared limits (``max_context``, ``max_response_tokens``, ``max_turns``) then end the
    trajectories that reach them, as the workload itself would."""
    spec = spec or PriorSpec()
    step = _kind_step(n, spec, seed)
    if step is None:
        step = default_prior_step(n, seed, cap=spec.max_context)
    g = spec.group_size
    if g is not None and g > 1 and not any(x is not None for x in step.groups):
        # GRPO lays a batch out as consecutive groups of one prompt's samples
        step = dataclasses.replace(step, groups=tuple(f"prior-g{i // g}" for i in range(step.n)))
    return _within(step, prompt_tokens, spec, stretch)


def default_prior_step(n: int = 256, seed: int = 0, cap: int | None = None) -> StepArrays:
    """A synthetic step drawn from the documented length prior (seeded, deterministic).

    ``cap``: a hard context limit of the workload (a run's ``max_context``) below the prior's own
    cap. The whole prior is then scaled by ``cap / PRIOR_CAP_TOKENS`` (lengths, prompt, tokens per
    tool call: the same shape, nothing above ``cap``), so a small-context run is not planned as an
    SWE-agent run of 8K-token trajectories."""
    rng = np.random.default_rng(seed)
    scale = min(1.0, cap / PRIOR_CAP_TOKENS) if cap is not None and cap > 0 else 1.0
    top = PRIOR_CAP_TOKENS * scale
    prompt = max(1, int(PRIOR_PROMPT_TOKENS * scale))
    per_call = max(1.0, 1200 * scale)
    finals = np.minimum(np.exp(np.log(PRIOR_MEDIAN_TOKENS * scale) + PRIOR_SIGMA * rng.standard_normal(n)), top)
    trajs = []
    for i, f in enumerate(finals):
        body = max(int(f) - prompt, max(1, int(64 * scale)))
        turns_n = max(1, int(round(body / per_call)))
        per = body // turns_n
        turns = []
        for k in range(turns_n):
            last = k == turns_n - 1
            gen = per if last else max(1, int(per * 0.6))
            turns.append(Turn(gen_tokens=gen, tool=None if last else "tool", tool_latency_s=None if last else 2.0,
                              tool_tokens=0 if last else max(0, per - gen), outcome=None if last else "ok"))
        trajs.append(Trajectory(id=f"prior-{i}", step=0, prompt_tokens=prompt, turns=tuple(turns)))
    return StepArrays.from_trajectories(0, trajs)
