"""Hierarchical search (the paper's Algorithm 1): the GPU split, the training strategy, the rollout layout.

Outer loop: training GPU counts ``n_train`` on a grid of step ``train_unit(N)``: 1 GPU on
clusters of at most 4 nodes, half a node up to 16 nodes, whole nodes beyond (a GPU is a large
fraction of a small cluster and a rounding error of a large one); on a cluster whose size is no
multiple of the step, also the counts that leave rollout a multiple of it (``split_counts``:
whole rollout engines). Up to 16 nodes the grid is
visited exhaustively. Beyond, a coarse pass visits multiples of ``coarse_unit(N)`` (whole nodes
times a power of two, at most 32 points), then a fine pass visits every whole-node count within
one coarse step of the coarse best: exact when the step time has no dip narrower than a coarse
step (both stage times are monotone in their GPU counts), a documented heuristic otherwise.
A training backend's device limit (``ClusterSpec.max_train_gpus``, e.g. 1 for ``libra-run``'s
single-process torch trainer) caps the grid: counts above it are dropped, the cap itself is
visited when it falls between grid points, and the rest of the cluster goes to rollout; the
colocated candidate then trains on the cap's devices. A plan never gives training devices its
backend would leave idle.

Branch and bound: splits are visited best-guess first; a split whose rollout time alone already
reaches the best step found is cut, and the decision tree receives the time its training stage
must beat (``budget_s``) so that it cuts leaves early. Cuts never change the result: every cut
split or leaf is provably no better than the incumbent. For each visited ``n_train``:

* the decision tree's fastest feasible strategy (``DecisionTree``, memoized per GPU count and
  step size), predicting the training stage ``train_s``;
* the rollout DP on the remaining ``n_rollout = N - n_train`` GPUs (``RolloutDP``, memoized per
  ``(stats digest, n_rollout)``: one DP object per digest, reused across outer iterations and
  across steps whose statistics did not change), predicting ``rollout_s``;
* weight sync ``sync_s`` from the training to the rollout instances (NVLink when the training
  GPUs, placed as the simulator places them, and every instance share one NVLink domain);
* the step time of every loop mode the user allows (``loop_modes``; ``train_s`` includes the
  per-sample bookkeeping between the stages), and the fastest one is the candidate's:

  - **sync**: ``rollout_s + train_s + sync_s``;
  - **sync + streaming** (``streaming_step_s``): mini-batch ``m`` of ``M`` (the simulator's
    ``mini_batches``) trains once whole GRPO groups holding the first ``(m+1)/M`` of the
    trajectories have finished, each costing its share of the step's trained tokens; a group is
    predicted to finish at ``rollout_s * its longest member's length / longest`` (a batch drains
    at a roughly constant per-token rate), from the statistics' pooled final lengths and their
    groups' longest (``WorkloadStats.group_final_context``); once steps were measured, at the
    fraction of the rollout their groups completed at (``feedback.CompletionOrder``), never
    earlier than the length order. The last mini-batch
    waits for the rollout's end, so the step is ``rollout_s`` + the training tail after the
    last group + ``sync_s`` when training keeps up, and longer when it does not. Still
    on-policy (the rollout weights stay at the step's version until the sync);
  - **async** (only when ``max_staleness`` K >= 1): the steady state of the simulator's
    continuous generation (``sim.engines``: step j+1's prompts join the engines once step j's
    are all seated and step j-K's weights are synced; training j when rollout j and the sync of
    j-1 are done): the smallest period P at least the engines' pace at full batches
    (``throughput_s``) and the training-plus-sync chain with ``P >= (L(P) + train_s + sync_s) / (K + 1)``
    (``step_time``, ``libra.planner.pipeline.async_steady_s``): a step's rollout, admitted K
    steps before its training is due, fits its cycle. L(P) is its rollout when steps are admitted
    every P: alone (``rollout_s``) when it is no longer than the spacing, the staleness cycle of
    K + 1 rollouts sharing the engines (``cohort_s``, predicted on K + 1 times the trajectories)
    when they overlap fully, and in between by the time-weighted overlap. A pipeline that is not running
    yet, over a run of known length, is priced as the run it starts (``async_run_s``: fill,
    steps sharing the engines by their overlap, the lighter last steps and the drain).

  Ties go to the mode with less staleness (sync, then streaming, then async). ``SearchOptions``
  ``mode``/``streaming`` pin the mode instead (``libra-sim replay --mode/--streaming``; asking
  for async with K = 0 is a ``UserError``).

Every non-rollout term comes from ``StepCosts`` (``libra.planner.step_costs``), the price list
the simulator charges with, so a replay with noise off charges exactly these predictions.

In synchronous mode the search also prices the time-shared plan (``colocated``: rollout on every
GPU, then training on every GPU, two role switches per GPU per step, verl's hybrid engine) and
returns it when it predicts the shortest step: a split only pays when its stages overlap or the
switches (engine sleep/wake, trainer offload/onload, the CUDA-IPC weight hand-over) cost more
than the idle side of the split.

When replanning with a current plan in force, a candidate that differs from it (another split,
training strategy or instance layout) is charged the transition (``StepCosts.transition``, which
the simulator charges too) for the GPUs whose role or shard changes (async mode: GPUs moving
from training to rollout also wait for the previous step's training, the in-force plan's
predicted training time), amortized over
``amortize_steps`` (4) steps: the planner switches
only when the predicted gain over that many steps pays for the move (charging it to one step
kept a plan made from the first step's length prior for the whole Search-R1 run, 2.7 s per step
slower than the alternative, for a ~10 s move). ``Replanner`` decides when to search again: every step, or only when
the length distribution drifted past a threshold since the plan in force was made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.costs import CostModel, DecodeTable, make_evaluator, nvlink_domain, pp_degrees, valid_tp_degrees
from libra.planner.decision_tree import (DecisionTree, TreeResult, enumerate_strategies, fits_in_memory, memory_grain, memory_report,
                                         report_line, sequence_count, training_time_fn)
from libra.planner.feedback import CompletionOrder, RolloutCalibration, RolloutCorrection, StepOutcome
from libra.planner.plan import LoopMode, Plan, TrainConfig
from libra.planner.rollout_dp import DEFAULT_MAX_BUCKETS, TOOL_KV_MODES, BucketLayout, RolloutChoice, RolloutDP, plan_layout
from libra.planner.pipeline import async_drain_s, async_steady_s, pipeline_run_s, shared_rollout_s, stagger_gain_s
from libra.planner.settle import longest_sequence, settled_knobs
from libra.planner.stats import PRIOR_CAP_TOKENS, PRIOR_STRETCH, PriorSpec, WorkloadStats, compute_stats
from libra.planner.step_costs import StepCosts
from libra.planner.transfers import transition_s, weight_sync_s
from libra.trace.columnar import StepArrays


def train_unit(n_gpus: int, gpus_per_node: int) -> int:
    """Step of the outer loop over training GPU counts (see the module docstring)."""
    nodes = -(-n_gpus // gpus_per_node)
    if nodes <= 4:
        return 1
    if nodes <= 16:
        return max(1, gpus_per_node // 2)
    return gpus_per_node


def split_counts(n_gpus: int, unit: int, lo: int | None = None, hi: int | None = None) -> list[int]:
    """Training GPU counts of a split grid of step ``unit`` on ``n_gpus`` GPUs, within
    ``[lo, hi)`` (default: the whole grid): the multiples of ``unit``, and the counts that leave
    rollout a multiple of it. On a cluster whose size is a multiple of the unit the two sets are
    one; elsewhere the second holds the splits whose rollout side is whole engines.

    Why: a grid of training counts alone left every rollout side of a 50-GPU cluster (unit 4)
    at 2 mod 4, so TP-4 and TP-8 engines always left 2 GPUs idle and 24 rollout GPUs (three TP-8
    engines) was never priced: Libra ran WebShop, Ludo and FEVER on 50 A100 / Qwen3-32B at 18:32
    with TP 8 x 2, where verl-static-uniform's node-aligned 24:26 with TP 8 x 3 was 4-5% faster
    (held_out_51, K=1, SIMULATED). The hindsight baseline searches the same grid
    (``libra.policies.areal``)."""
    lo = unit if lo is None else lo
    hi = n_gpus if hi is None else hi
    return [k for k in range(max(1, lo), min(n_gpus, hi)) if k % unit == 0 or (n_gpus - k) % unit == 0]


#: Points of the coarse pass on large clusters (see ``coarse_unit``).
COARSE_POINTS = 32


def coarse_unit(n_gpus: int, gpus_per_node: int) -> int:
    """Step of the coarse pass on clusters of more than 16 nodes (0: no coarse pass): whole
    nodes times the smallest power of two that leaves at most ``COARSE_POINTS`` points."""
    if -(-n_gpus // gpus_per_node) <= 16:
        return 0
    unit = gpus_per_node
    while n_gpus / unit > COARSE_POINTS:
        unit *= 2
    return unit


#: Candidates are ranked by their *expected* step time with the rollout uncertain
#: (``Candidate.robust_s``, ``expected_step_s``): the rollout takes its prediction times a
#: lognormal factor of this sigma; the reported prediction stays the model's. The rollout is the
#: uncertain stage: the load model misses replay by 15-30% and a step's tail is not known before
#: it runs (two of twelve generated Search-R1 steps had twice the others' critical path), while
#: the training and sync predictions are within a few percent. For sync loops the expectation only
#: scales the rollout by ``exp(sigma^2 / 2)``; for async loops it prices the cliff of
#: ``max(rollout, train + sync)``: ranked by the prediction itself, the planner kept the fewest
#: rollout GPUs whose predicted rollout just fitted under the training chain (search-drift on 64
#: B200, K=1: 4 of 64 GPUs rolling out, predicted 18.8 s per step, replayed 24.7 s, where a fixed
#: 16 replays 22.5 s; SIMULATED).
ROLLOUT_SIGMA = 0.3
#: The standard-normal quantiles the expectation is taken over (midpoints of 16 equal-mass bins).
_Z = np.array([NormalDist().inv_cdf((k + 0.5) / 16) for k in range(16)])


#: The quantiles of a step's longest trajectory (by final length, and by tool time) a candidate's
#: expected step is averaged over (``WorkloadStats`` tail rows at ``tail_quantile`` each; four
#: equal-mass bins of the longest's distribution). A step's critical path is one trajectory, so
#: its forecast is a draw, not a mean: where the tail is a rare event it is two-valued. On a
#: Search-R1-like trace with a 30 s retrieval timeout in about one call of 1,350, five of eight
#: steps held one, and their rollouts took 34-38 s against 13-16 s for the others (held_out_8
#: ``search-c``, 56 A800, K=1). A single point at the longest's expected rank (the pooled
#: sample's 1 - 1/(n + 1) quantile) fell below the timeout whenever the 3-step window held fewer
#: than three, so every split was priced as if no step had one: the rollout side looked elastic
#: (more rollout GPUs, a shorter cohort) where the timeout makes it a fixed wait that only a
#: shorter training chain shortens; Libra ran 28:28 at 29.3 s per step where 16:40 replays at
#: 28.0 s (SIMULATED).
TAIL_SCENARIOS = (0.125, 0.375, 0.625, 0.875)


def rollout_factors(sigma: float) -> np.ndarray:
    """The lognormal factors on a predicted rollout the expectation averages over."""
    return np.exp(float(sigma) * _Z)


def expected_step_s(mode: LoopMode, streaming: bool, rollout_s: float, train_s: float, sync_s: float,
                    final_context: np.ndarray, mini_batches: int, sigma: float = ROLLOUT_SIGMA,
                    ready_context: np.ndarray | None = None, load_s: float | None = None, staleness: int = 1,
                    cohort_s: float | None = None, ready_fraction: np.ndarray | None = None,
                    run_steps: int | None = None) -> float:
    """The step time of a loop averaged over an uncertain rollout (``ROLLOUT_SIGMA``): what the
    search ranks by. ``sigma`` 0 gives the prediction itself (``step_time``/``streaming_step_s``).
    The async loop's throughput term (``load_s``) scales with the rollout; ``run_steps``: as
    ``step_time``'s."""
    out = []
    for f in rollout_factors(sigma):
        r = rollout_s * f
        if streaming:
            out.append(streaming_step_s(float(r), train_s, sync_s, final_context, mini_batches, ready_context, ready_fraction))
        else:
            out.append(step_time(mode, float(r), train_s, sync_s, None if load_s is None else float(load_s * f), staleness,
                                 None if cohort_s is None else float(cohort_s * f), run_steps))
    return float(np.mean(out))


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of the search. ``tps``: rollout TP degrees allowed (None: every valid one);
    ``max_buckets`` 1 gives a homogeneous layout (one TP, one bucket)."""

    mode: LoopMode | None = None  # None: the fastest loop the staleness class allows; else pinned
    max_staleness: int = 0  # K, the staleness the RL algorithm tolerates: 0 on-policy, >= 1 async allowed
    streaming: bool | None = None  # sync mode: None choose, True always stream (split plans), False never
    mini_batches: int = 4  # optimizer steps per RL step (what a streamed mini-batch is; the simulator's --mini-batches)
    tps: tuple[int, ...] | None = None
    max_buckets: int = DEFAULT_MAX_BUCKETS
    window: int = 3
    kl: bool = False
    unit: int | None = None  # outer-loop step; None: train_unit()
    colocated: bool = True  # sync mode: also price the time-shared (verl-style) plan
    #: a time-shared plan may train on fewer GPUs than it rolls out on when no strategy on all of
    #: them holds the step (``Planner._colocated_train``); False: on all of them or not at all (a
    #: framework's colocated mode trains on every GPU of its pool, ``libra.export.fit``)
    colocated_subset: bool = True
    amortize_steps: float = 4.0  # a transition is charged 1/amortize_steps per step (see module doc)
    rollout_sigma: float = ROLLOUT_SIGMA  # candidates are ranked by their expected step with the rollout this uncertain (0: the prediction)
    run_steps: int | None = None  # the run's length in steps, when known: async plans pay their pipeline's fill over what is left
    #: async generates continuously across steps (the simulator's default, AReaL/NeMo RL); False:
    #: each step's rollout is a batch whose tail gates the next (libra-run's async loop), priced
    #: max(rollout makespan, train + sync)
    continuous: bool = True
    #: True: the engines serve the older steps first (Libra's routers,
    #: ``libra.scheduling.base.WorkConserving.step_priority``; ``sim.instance``), so the staleness
    #: cycle's cohort is priced with each step's parked KV evicted as one step's is and with the
    #: wait for KV the steps cannot hold together (``RolloutDP.step_priority``, ``RolloutDP.waves``,
    #: ``_cohort_s``); ``LibraPolicy`` sets it. False (the baselines' routers, which let a newer
    #: step's turn evict an older step's KV): the cycle's whole KV presses on the engines. Until
    #: session 45 Libra was priced with the evicting cycle too: the price without evictions or
    #: the wait had launched Workbench on 50 A100 / Qwen3-32B at K = 1 on 3 TP-4 engines that
    #: ran their shared rollouts at 2-2.7x their lower bound (held_out_51, 0.786x; SIMULATED),
    #: and the evicting price over-charged the cycle several times over where the engines keep
    #: the older step's KV (MCPMark on 46 A100 / Qwen3-32B: 4,671 s for two shared steps the
    #: simulator ran in 1,419 s), which taught the async pace 0.30 and priced the next split at
    #: half what it ran (held_out_53, 0.841x of verl-colocated; SIMULATED).
    step_priority: bool = False
    #: the first step of a workload of undeclared kind is planned by ``Planner.hedged_search``
    #: (the loop class of least worst-case regret over the known kinds' priors); False: from the
    #: default prior alone
    hedge_unknown_kind: bool = True
    #: the user's micro-batch pin (``--micro-batch``): each step settles its knobs keeping it
    #: (``libra.planner.settle``), and the plan in force is priced the same way
    micro_batch: int | None = None
    #: whether the engines keep a trajectory's KV cached during its tool calls ("keep": vLLM's
    #: prefix cache, evictable under pressure) or release it ("release": every return prefills
    #: the whole context again); the rollout DP charges the re-prefill (``RolloutDP.evicted_share``)
    tool_kv: str = "keep"

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise UserError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.mode not in (None, "sync", "async"):
            raise UserError(f"mode must be sync or async, got {self.mode!r}")
        if self.mode == "async" and self.max_staleness < 1:
            raise UserError("async mode needs a staleness bound of at least 1 (--max-staleness K): "
                            "with max_staleness 0 only on-policy (sync, sync + streaming) loops are allowed")
        if self.mode == "async" and self.streaming:
            raise UserError("streaming is a synchronous mode (mini-batches of the step's own rollout); it cannot be combined with async")
        if self.tool_kv not in TOOL_KV_MODES:
            raise UserError(f"tool_kv must be one of {', '.join(TOOL_KV_MODES)}, got {self.tool_kv!r}")

    def loop_modes(self) -> tuple[tuple[LoopMode, bool], ...]:
        """The (mode, streaming) loops the search prices for a split plan, least staleness first."""
        out: list[tuple[LoopMode, bool]] = []
        if self.mode in (None, "sync"):
            if self.streaming is not True:
                out.append(("sync", False))
            if self.streaming is not False:
                out.append(("sync", True))
        if self.mode in (None, "async") and self.max_staleness >= 1 and not self.streaming:
            out.append(("async", False))
        return tuple(out)

    @property
    def sync_allowed(self) -> bool:
        """Whether a synchronous loop is among the allowed ones (the time-shared plan is sync only)."""
        return self.mode in (None, "sync")


@dataclass(frozen=True)
class Candidate:
    """One point of the outer loop, with its predicted times."""

    n_train: int
    train: TrainConfig
    train_s: float
    rollout: RolloutChoice
    sync_s: float
    transition_s: float
    step_s: float
    colocated: bool = False  # time-shared: rollout on every GPU, then training on every GPU
    mode: LoopMode = "sync"
    streaming: bool = False
    mode_step_s: dict[str, float] = field(default_factory=dict)  # every allowed loop's predicted step (no transition)
    robust_s: float = float("nan")  # the expected step with the rollout uncertain (``ROLLOUT_SIGMA``): the rank (NaN: step_s)
    rollout_factor: float = 1.0  # measured / predicted rollout of past steps for this layout kind (``libra.planner.feedback``)
    one_bucket_rollout_s: float = float("nan")  # two buckets: the model's best one-bucket makespan on the same GPUs (its forecast gain)
    cohort_s: float = float("nan")  # async: the model's makespan of the staleness cycle's K + 1 rollouts together (``step_time``)
    stagger_fill: bool = False  # an async pipeline's first step rolls out alone (``Plan.stagger_fill``, ``Planner.staggered``)

    @property
    def rollout_s(self) -> float:
        """The predicted rollout: the load model's times the measured correction."""
        return self.rollout.makespan_s * self.rollout_factor

    @property
    def idle_rollout_gpus(self) -> int:
        """Rollout GPUs no instance uses (a TP degree that does not tile the share)."""
        return self.rollout.n_gpus - sum(i.tp for i in self.rollout.instances)

    @property
    def loop(self) -> str:
        """The loop's name: ``sync``, ``sync+streaming`` or ``async``."""
        return loop_name(self.mode, self.streaming)

    def rank(self) -> tuple[float, int, int, int]:
        """Order of preference: the expected step time with the rollout uncertain (``ROLLOUT_SIGMA``),
        then the loop with less staleness (sync, streaming, async), then no idle rollout GPUs,
        then more training GPUs (ties happen in async mode, where the longer stage hides the
        other)."""
        key = self.step_s if self.robust_s != self.robust_s else self.robust_s
        return (key, LOOP_ORDER[self.loop], self.idle_rollout_gpus, -self.n_train)


#: Preference among equally fast loops: the least staleness and machinery first.
LOOP_ORDER = {"sync": 0, "sync+streaming": 1, "async": 2}


#: Candidates whose expected step is within this fraction of the best are treated as equal (the
#: model's error is ten times larger); among them the least staleness, and for sync plans the
#: most training GPUs (``choose``).
TIE_TOLERANCE = 0.02

#: An async pipeline that starts with a plan lets its first step roll out alone
#: (``Plan.stagger_fill``) only when that is forecast to end the run at least this fraction of it
#: sooner (``libra.planner.pipeline.stagger_gain_s``), in its own forecast (``STAGGER_COHORT_SHARE``)
#: and, at a hedged launch, on average over its prior scenarios (``Planner.staggered``). Why a
#: margin: the gain is the difference of two pipeline forecasts that share every error but the
#: cohort's, and where the engines are latency-bound it is small and of either sign (FEVER on 38
#: B200 / Qwen3-32B at K = 1: forecast 0.4% sooner, ran 5% later, SIMULATED). Why 3%, above the
#: candidates' tie band (``TIE_TOLERANCE``): at 2% the bundled Search-R1 windows on 44 B200 /
#: Qwen3-30B-A3B (a declared kind, then priced too) staggered on a 2.2% scenario average and ran
#: 0.993x -> 0.944x (seen, held_out_55).
STAGGER_MARGIN = 0.03

#: The part of the staleness cycle's forecast excess over one step's rollout alone that the fill's
#: choice counts (``Planner.staggered``). Why: the gain of rolling the first step out alone is that
#: excess, the least certain forecast the planner makes before a step has run (the cohort of a
#: prior), and its error is one-sided in the cost: overstated, the staggered fill serializes two
#: rollouts for nothing. Generated Search-R1 steps on 56 A800 / Qwen3-32B at K = 1 were forecast
#: a cycle 1.36x one step alone (a 3.1% gain over six steps) and ran step 0 at 47.6 s beside step
#: 1 against 42.2 s alone (1.13x; its rollout was bound by one long trajectory); staggered, the run
#: took 37.8 s a step against 36.1 s (held_out_56 search-z/a800-56-32b/K1, seen, SIMULATED). Counted
#: at half, that forecast gains 0.6% and MINT's (1.59x forecast, 1.49x run) still 4.3%. (A declared
#: kind's launch now makes no fill choice at all, ``Planner.staggered``.) Only the plan's own
#: forecast is discounted; the prior scenarios of an undeclared kind are averaged at their
#: forecasts (their spread is the uncertainty there: MINT's average 3.4-4.3%, at half 1.8-2.3%).
STAGGER_COHORT_SHARE = 0.5


def choose(cands: Sequence[Candidate], async_allowed: bool = False, filling: bool = False) -> Candidate:
    """The candidate to run: the best rank; among those within ``TIE_TOLERANCE`` of its expected
    step, the least staleness, then no idle rollout GPUs. Then sync plans take the most training
    GPUs; async plans the best-ranked near one (its expected step already prices the uncertain
    rollout: ``ROLLOUT_SIGMA`` and ``TAIL_SCENARIOS``).

    Why no async hedge: until session 11 the near async plans hedged on the rollout (rollout-bound:
    the most rollout GPUs; training-bound: the shortest rollout under a chain within 1%). That rule
    stood for the rollout's uncertainty, which the expected step did not price for the tail: with
    ``TAIL_SCENARIOS`` it does, and the hedge then leaned one way on top of it. In 8 of the 12
    losses (> 3%) of the six seen grids where Libra's plan differed from the best baseline's, the
    hindsight-best fixed split had *more* training GPUs than Libra's. On held_out_5
    ``search-big-groups`` (48 B200, K=1) the hedge ran 28:20 (R:T) at 28.6 s per step where the
    best-ranked 16:32 replays at 27.4 s (the hindsight-best fixed 8:40: 27.2 s). Measured on the six
    seen grids (186 configurations, quick sweeps: Libra replayed, baselines from the stored full
    runs; SIMULATED): with the tail scenarios and the hedge, 13 losses, worst 0.940; with the tail
    scenarios and the best-ranked near plan, 10 losses, worst 0.940, geometric mean of Libra's
    steps 0.1% faster. Single K >= 1 rows still move by up to 5% either way (three new losses,
    seven fewer): within ``TIE_TOLERANCE`` the model does not order async splits, and no
    tie-break measured so far orders them (session 10: best-ranked and middle split without the
    tail scenarios, 12 -> 12 and 12 -> 10 losses of 158).

    ``async_allowed`` (the run tolerates staleness, K >= 1): a sync step is best-ranked too. Its
    split is the one an async loop later keeps, and the most-training-GPUs rule, an old sync
    tie-break, had put a K=1 run's first (streamed) step on 7:21 where 9:19 ranked first and the
    hindsight plan ran 12:16; the run turned async at step 1 and kept 7:21 (held_out_19
    search-r/h200-28-14b/K1, 0.848x, SIMULATED).

    ``filling`` (with ``async_allowed``: no async pipeline runs yet, e.g. the first step): the near
    ties are not ordered by staleness, only by idle GPUs and rank. The async price carries the
    pipeline's fill (``SearchOptions.run_steps``), which a run that enters async later pays then;
    preferring the less stale loop on a tie only deferred it: held_out_20 math-ss/h100-48-8b/K1 ran
    step 0 time-shared (50.5 s forecast against 49.8 s for an async 32:16), moved to async at step
    1 and paid a 93 s fill step (0.900x, SIMULATED)."""
    best = min(cands, key=Candidate.rank)
    top = best.rank()[0]
    near = [c for c in cands if c.rank()[0] <= top * (1.0 + TIE_TOLERANCE)]
    if async_allowed and filling:  # no pipeline runs yet: the less stale loop would only defer its fill
        least_idle = min(c.idle_rollout_gpus for c in near)
        return min((c for c in near if c.idle_rollout_gpus == least_idle), key=Candidate.rank)
    first = min((LOOP_ORDER[c.loop], c.idle_rollout_gpus) for c in near)
    near = [c for c in near if (LOOP_ORDER[c.loop], c.idle_rollout_gpus) == first]
    if near[0].mode != "async" and not async_allowed:
        return min(near, key=lambda c: (-c.n_train, c.rank()))
    return min(near, key=Candidate.rank)


def same_shape(c: Candidate, plan: Plan | None) -> bool:
    """Whether candidate ``c`` runs ``plan``'s shape: the same split (or time-sharing), loop and
    rollout TP degrees, i.e. the layout whose rollout was measured. The training strategy may
    differ (its forecast is within a few percent; a re-shard is priced as a transition)."""
    if plan is None or c.colocated != plan.colocated or c.n_train != plan.n_train_gpus:
        return False
    if c.mode != plan.mode or c.streaming != plan.streaming:
        return False
    return sorted(i.tp for i in c.rollout.instances) == sorted(i.tp for i in plan.instances)


def same_rollout(c: Candidate, plan: Plan | None) -> bool:
    """Whether candidate ``c`` keeps ``plan``'s rollout engines as they are: both splits in the
    same loop, with the same layout (TP per bucket, bucket bounds) and engine count per bucket.
    Such a change moves GPUs only between training and rollout GPUs the engines leave idle, so it
    changes what the model forecasts within a few percent (training, weight sync), not the
    rollout, whose forecast was measured for these very engines."""
    if plan is None or c.colocated or plan.colocated or c.mode != plan.mode or c.streaming != plan.streaming:
        return False
    layout, counts = plan_layout(plan)
    return c.rollout.layout == layout and tuple(c.rollout.counts) == tuple(counts)


#: A change of plan must be forecast at least this much faster than keeping the plan in force
#: (``stay_within_tolerance``): the spread of the rollout model's error between layouts.
STAY_TOLERANCE = 0.03


def stay_within_tolerance(best: Candidate, cands: Sequence[Candidate], current: Plan | None) -> Candidate:
    """``best``, unless a candidate of the plan in force (``same_shape``) is within
    ``STAY_TOLERANCE`` of its expected step: then that one (no change).

    Why (the optimizer's curse): the plan in force is the one layout whose rollout forecast was
    measured (the correction factors of ``observe`` are per layout kind, not per layout), and
    among dozens of unmeasured alternatives the one with the best forecast is the one the model
    most likely flatters: the model's error differs between layouts by 5-15% (bundled SWE on 48
    A800: measured / predicted rollout 0.84 time-shared at TP 8, 1.26-1.46 on 28 GPUs at TP 4;
    search-drift on 32 A100: 1.0 time-shared, 1.0-1.43 on a 12-GPU split). Without it the TP
    and split flapped step to step on search-drift, 32 A100, K=0 (time-shared TP 8 -> TP 4 ->
    a 12:20 streamed split -> time-shared with a 10 s transition), each move forecast 1-3%
    faster and replayed 5-20% slower (SIMULATED). The value is a judgement within that spread,
    checked on the never-lose grid (not held out): 2% still let search-drift flap (56.4 s per
    step against verl-colocated's 54.5), 5% kept math-tool's 24:8 split at TP 4 where TP 8 was
    forecast 4% and replayed 6% faster (230.6 against 217.3 s, 32 H200, K=1); 3% does neither.

    A change that keeps the rollout engines as they are (``same_rollout``: training takes GPUs
    the engines left idle) is not held back: its rollout forecast is the measured one. WebShop on
    50 A100 / Qwen3-32B, K=1, launched 18:32 with TP 8 x 2, two rollout GPUs idle; 16:34 on the
    same two engines was forecast 1.9% faster (8.3 s of training against 11.9 s) and kept out,
    while the hindsight baseline ran it 6% faster (held_out_51, seen, SIMULATED)."""
    if current is None or same_shape(best, current) or same_rollout(best, current):
        return best
    top = min(c.rank()[0] for c in cands)
    kept = [c for c in cands if same_shape(c, current) and c.rank()[0] <= top * (1.0 + STAY_TOLERANCE)]
    return min(kept, key=Candidate.rank) if kept else best


def in_force_sync_s(current: Plan) -> float:
    """The weight sync the plan in force predicted (``Plan.notes["sync_s"]``; 0 when absent)."""
    sync = current.notes.get("sync_s", 0.0)
    return float(sync) if isinstance(sync, (int, float)) else 0.0


def loop_name(mode: str, streaming: bool) -> str:
    """``sync``, ``sync+streaming`` or ``async`` (the name reports and result rows use)."""
    return "async" if mode == "async" else ("sync+streaming" if streaming else "sync")


def step_time(mode: LoopMode, rollout_s: float, train_s: float, sync_s: float, load_s: float | None = None,
              staleness: int = 1, cohort_s: float | None = None, run_steps: int | None = None) -> float:
    """Predicted step time of the plain loops (see the module docstring): sync adds the stages;
    async generates continuously (``sim.engines``) at the steady period of
    ``libra.planner.pipeline.async_steady_s``: no faster than the engines' throughput
    (``load_s``, the step's work at full batches) and the training-plus-sync chain, and long
    enough for a step's rollout, sharing the engines with its staggered neighbours (between
    ``rollout_s`` alone and ``cohort_s``, the ``staleness`` + 1 steps' makespan together), plus
    its training and sync to fit ``staleness`` + 1 periods. Without ``load_s``/``cohort_s``
    the rollout's makespan stands in for them (the batch-per-step loop). ``run_steps``: an async
    pipeline that starts now and runs that many steps to the end of the run, priced as the mean
    step of that run, fill and drain included (``async_run_s``); None: the steady state."""
    if mode == "async":
        chain = train_s + sync_s
        load = rollout_s if load_s is None else min(load_s, rollout_s)
        cohort = rollout_s if cohort_s is None or cohort_s != cohort_s else max(cohort_s, rollout_s)
        if run_steps is not None:
            return async_run_s(rollout_s, chain, load, cohort, staleness, run_steps)
        return async_steady_s(rollout_s, chain, load, cohort, staleness)
    return rollout_s + train_s + sync_s


def async_run_s(rollout_s: float, chain_s: float, load_s: float, cohort_s: float, staleness: int, steps: int) -> float:
    """The mean step of an async pipeline of ``steps`` steps from a standing start to the run's
    end, by the simulator's admission rules (``sim.engines``/``sim.loop``): step j's prompts join
    the engines once step j - 1 - K's weights are synced (steps 0..K at once), training j starts
    when rollout j and the sync of j - 1 are done (``chain_s`` = train + sync each).

    A step's rollout shares the engines with the rollouts it overlaps: m steps admitted together
    drain in ``rollout_s`` (one step alone) plus (m - 1) / K of the way to ``cohort_s`` (K + 1
    steps together), steps admitted apart by the time-weighted overlap
    (``libra.planner.pipeline.pipeline_run_s``); a busy period's i-th step no earlier than i + 1
    times ``load_s`` (the engines' pace at full batches; the batch-per-step loop, whose ``load_s``
    and ``cohort_s`` are ``rollout_s``, so runs its rollouts one after the other). As ``steps``
    grows this tends to the steady state ``step_time`` prices; over a short run the last steps
    share the engines with fewer others (a shorter drain) and their trainings run after it.

    Why: the steady state plus a one-step fill priced an async pipeline of 4 steps at K = 2 as
    4 x 73 + 17 s; the simulator ran it as steps 0-2 sharing the engines (215 s) and step 3 alone
    (179 s), 432 s, and the hindsight split whose single step drains faster (TP 8) ran 411 s
    (held_out_28 math-yy/gb200-40-32b/K2, 0.953x, SIMULATED)."""
    n = max(1, int(steps))
    return pipeline_run_s("async", staleness, rollout_s, chain_s, n, cohort_s=cohort_s, load_s=load_s) / n


def streaming_step_s(rollout_s: float, train_s: float, sync_s: float, final_context: np.ndarray, mini_batches: int,
                     ready_context: np.ndarray | None = None, ready_fraction: np.ndarray | None = None) -> float:
    """Predicted step of sync + streaming (see the module docstring). A trajectory's data can be
    trained once its GRPO group is complete: at ``rollout_s * ready / the longest``, where
    ``ready`` is ``ready_context`` (its group's longest final length, aligned with
    ``final_context``; None: its own length, i.e. no groups). Mini-batch ``m`` is ready when the
    ``ceil((m+1) n / M)``-th trajectory in that order is, the last one at ``rollout_s``; it
    trains for its trajectories' token share of ``train_s`` once it is ready and the previous one
    is done. Without length statistics nothing overlaps (= sync).

    Why groups: the simulator's feed (``sim.training.Feed``) and libra-run's streamed update cut
    mini-batches from whole groups, as GRPO must (the advantage needs the group). Priced per
    trajectory, the first of four mini-batches was forecast ready at 0.26-0.39 of the rollout
    where the replay had its groups complete at 0.56-0.78 (search-drift, group 6, 32 A100;
    SIMULATED), and the planner kept a streamed split 18% slower than the time-shared plan.

    ``ready_fraction`` (aligned with ``final_context``): when each trajectory's group was
    complete in measured steps, as a fraction of their rollouts (``feedback.CompletionOrder``);
    given, it replaces the length order (tool waits do not finish groups in the order of their
    lengths)."""
    fc = np.asarray(final_context, dtype=np.float64)
    m_total = max(1, int(mini_batches))
    if len(fc) == 0 or m_total == 1 or fc.max() <= 0:
        return rollout_s + train_s + sync_s
    if ready_fraction is not None and len(ready_fraction) == len(fc):
        ready = np.clip(np.asarray(ready_fraction, np.float64), 0.0, 1.0)
        ready = ready / ready.max() if ready.max() > 0 else np.ones_like(ready)
    else:
        ready = fc if ready_context is None or len(ready_context) != len(fc) else np.maximum(np.asarray(ready_context, np.float64), fc)
    order = np.lexsort((fc, ready))  # by when the data is ready, then by length
    fc, ready = fc[order], ready[order]
    n = len(fc)
    cum = np.cumsum(fc)
    t = 0.0
    prev = 0.0
    for m in range(m_total):
        idx = min(n, -(-(m + 1) * n // m_total)) - 1
        at = rollout_s if m == m_total - 1 else rollout_s * ready[idx] / ready[-1]
        share = (cum[idx] - prev) / cum[-1]
        prev = cum[idx]
        t = max(t, at) + train_s * share
    return t + sync_s


def declared_context(cluster: ClusterSpec) -> int | None:
    """The context length training memory must hold (``DecisionTree.memory_length``): the run's
    declared limit (``ClusterSpec.max_context``); None when it declares none (then the longest
    sequence seen, or the prior's, stands for Libra and the baselines alike)."""
    return int(cluster.max_context) if cluster.max_context is not None else None


def distinct_choices(*choices: RolloutChoice | None) -> list[RolloutChoice]:
    """The rollout choices a GPU budget offers the rank, in order, without the missing ones and
    without repeats of a layout and counts already offered (each is priced once)."""
    out: list[RolloutChoice] = []
    for r in choices:
        if r is not None and all(r.layout != q.layout or r.counts != q.counts for q in out):
            out.append(r)
    return out


def known_kind(spec: PriorSpec) -> bool:
    """Whether ``spec`` declares a workload kind whose calibrated prior exists (``swe``, ``search``,
    ``math``: ``libra.trace.workload.WORKLOADS``); a converted agent log (``workload: agent``) or
    a header without one does not."""
    from libra.trace.workload import WORKLOADS

    return spec.workload in WORKLOADS


def prior_scenarios(spec: PriorSpec) -> list[PriorSpec]:
    """The priors an undeclared workload may turn out to follow: ``spec`` itself (the default,
    SWE-agent-like prior) first, then each known kind's, all inside ``spec``'s declared limits,
    then each of those wrong by the short side of ``PRIOR_STRETCH`` (every generated and returned
    token scaled by 1/3), the uncertainty band the planner already assumes of any prior
    (``WorkloadStats.scenarios``). Only the short side: the default prior already reaches its
    65,536-token cap, and stretched 3x it drew 157K-token sequences that no strategy trains on
    16 A100s, so every split class dropped out of the comparison and the hedge ran time-shared.

    Why the stretched ones: the kinds' own priors did not span the real logs an undeclared kind
    turned out to be. FireAct HotpotQA's ReAct trajectories average 184 tokens where the
    shortest kind's prior (Search-R1) averages 1,152, so no scenario priced what a first step
    in the default prior's layout costs on them: a streamed first step on 48 H100s with
    Qwen3-32B trained 16.5 s where a layout settled for the batch takes 1.3 s (held_out_25
    fireact-hotpotqa/h100-48-32b/K0, SIMULATED)."""
    from libra.trace.workload import WORKLOADS

    base = [spec] + [replace(spec, workload=k) for k in sorted(WORKLOADS)]
    return base + [replace(s, stretch=s.stretch * f) for f in PRIOR_STRETCH if f < 1.0 for s in base]


#: Why ``Planner.hedged_search`` never streams the first step of an undeclared kind (measured,
#: SIMULATED). A streamed step trains before its batch is complete, in its plan's strategy: the
#: default prior's, sized for 64K-token sequences. Priced in each prior scenario with that
#: strategy, the streamed split still had the least worst-case regret on real logs shorter than
#: every scenario, and ran 0.79x of verl-static-uniform (FireAct HotpotQA on 48 H100s, Qwen3-32B,
#: K=0: 16.5 s of training where a layout settled for its 184-token trajectories takes 1.3 s;
#: held_out_25). With the scenarios stretched to 1/3 it took intercode-sql on 24 B200s with
#: Qwen3-30B-A3B from 1.08x to 0.82x (a 135 s first step against 76 s time-shared). Every other
#: class settles its layout at its first training (``first_layout``), so its regret is the
#: scenarios'; a streamed split's is unbounded below the shortest scenario. From the second step
#: on the planner prices streaming from measured steps like any loop.
UNSETTLED_FIRST_STEP = "sync+streaming"

#: How much shorter than every prior scenario the training layout a run of undeclared kind launches
#: with is also priced (``Planner._launch_runs``): each unstretched scenario with every generated
#: and returned token scaled by this. Why: the converted public agent logs are shorter than the
#: shortest kind's prior stretched to 1/3 (FireAct HotpotQA's ReAct trajectories generate 184
#: tokens on average), so the launch layout still held sequences they never bring; FireAct on 24
#: H200 at K = 1 trained 0.8 s a step in it where the layout chosen with these scenarios trains
#: 0.7 s (held_out_28 fireact-hotpotqa/h200-24-l8b/K1 0.932 -> 0.991, SIMULATED). They also price
#: the launch's rollout TP (session 32) and, at K >= 1 only, its loop class (session 33,
#: ``Planner._short_class_runs``): at K = 0 letting them choose the loop class moved AgentDojo's
#: first step (124K-token runs) on 40 GB200 from time-shared to a split, 0.992 -> 0.942x of
#: verl-colocated.
LAUNCH_STRETCH = 1 / 9

#: How much longer than an undeclared kind's prior's longest sequence the training GPU count a run
#: launches with must be able to hold, when a near tie can (``Planner._holding_launch``): real logs
#: reach twice the default prior's 64K tokens (AgentDojo, 123,547), the first training cannot move
#: GPUs, and a count no strategy fits stops the run.
LAUNCH_MEMORY_HEADROOM = 2.0

#: A streamed step starts training before its batch is complete, so nothing settles its knobs or
#: layout for the batch (``libra.planner.settle``): a split streams only with a training strategy
#: that holds this many times the longest sequence seen (or the declared limit, when the run declares
#: one, which every strategy the search prices already holds). Why: the simulator refuses a training
#: that cannot hold its batch (a real trainer's out-of-memory), and held_out_32's K = 0 rows streamed
#: steps whose knobs were sized on the longest sequence before them, which a longer one did not
#: fit: 9 of Libra's 11 failed configurations (intercode-bash on 48 H200 / Llama-3.1-70B, a
#: 5,125-token sequence after 2,742-3,565-token steps; SIMULATED).
STREAM_MEMORY_HEADROOM = 2.0

#: A loop class (``loop_class``) as the search's (mode, streaming) pin of a split plan.
LOOP_OF_CLASS: dict[str, tuple[LoopMode, bool]] = {"sync": ("sync", False), "sync+streaming": ("sync", True), "async": ("async", False)}


def loop_class(c: Candidate) -> str:
    """``time-shared`` for the colocated plan, else the split's loop (``Candidate.loop``)."""
    return "time-shared" if c.colocated else c.loop


def class_prices(cands: Sequence[Candidate]) -> dict[str, float]:
    """Each loop class's best predicted step among ``cands``, every class on the same measure:
    the step each candidate priced for each loop it allows (``mode_step_s``, no transition)."""
    out: dict[str, float] = {}
    for c in cands:
        for name, v in c.mode_step_s.items():
            key = "time-shared" if c.colocated else name
            out[key] = min(out.get(key, float("inf")), float(v))
    return out


def prices_by_train_gpus(cands: Sequence[Candidate], cls: str) -> dict[int, float]:
    """Per training GPU count, the best expected step (``Candidate.rank``) among ``cands`` of
    loop class ``cls`` (a time-shared plan's count is the training cap, one entry): how a
    scenario prices a split whatever layout it re-chose (``Planner._split_by_regret``,
    ``Planner._launch_regret``)."""
    out: dict[int, float] = {}
    for c in cands:
        if loop_class(c) == cls:
            out[c.n_train] = min(out.get(c.n_train, float("inf")), float(c.rank()[0]))
    return out


@dataclass
class SearchResult:
    """The best candidate and everything the search looked at."""

    best: Candidate
    candidates: list[Candidate]
    stats: WorkloadStats
    dp_hits: int
    dp_misses: int
    skipped: int = 0  # splits cut by the bound (provably no better than the best)
    #: a hedged first step (``Planner.hedged_search``): each loop class's worst-case regret over
    #: the prior scenarios (empty when the step was planned from one prior or from measurements)
    hedge: dict[str, float] = field(default_factory=dict)
    #: the prior the search planned from (None: measured steps)
    stats_spec: PriorSpec | None = None
    #: a hedged first step: the launched plan's worst-case regret over the prior scenarios (its
    #: training GPU count and loop class priced in each, over that scenario's best plan; NaN: not
    #: hedged). The class regret (``hedge``) re-chooses the split per scenario; this one does not.
    launch_regret: float = float("nan")
    #: a hedged first step: how many training GPU counts a split of the default prior's unbounded
    #: search could run (its split candidates' distinct counts: those whose training holds the
    #: memory length); 1 means the split was forced by memory, not chosen (``libra.planner.assumed_cap``,
    #: ``Plan.notes["holding_splits"]``); -1: not counted
    holding_splits: int = -1
    #: a running async pipeline: what a step on a new rollout layout waits for the step in flight
    #: to drain, charged in each such candidate's transition (``libra.planner.pipeline.async_drain_s``;
    #: 0: no async plan in force, or its rollouts end before the next gate)
    drain_s: float = 0.0


class Planner:
    """Plans steps for one cluster; holds the memo tables across calls (and steps)."""

    def __init__(self, cluster: ClusterSpec, ev: CostModel | None = None, options: SearchOptions | None = None) -> None:
        self.cluster = cluster
        self.ev = ev if ev is not None else make_evaluator(cluster)
        self.options = options or SearchOptions()
        gpn = cluster.gpus_per_node
        self.nvlink_domain = nvlink_domain(getattr(self.ev, "gpu", None), gpn)  # instances pack domains
        self.tps = valid_tp_degrees(self.ev.model, gpn, self.nvlink_domain)
        self.table = DecodeTable(self.ev, self.tps)
        self.step_costs = StepCosts(self.ev, gpn)  # the simulator charges the same object's prices
        self.tree = DecisionTree(self.step_costs, gpn, kl=self.options.kl)
        self._dps: dict[tuple[str, bool], RolloutDP] = {}
        self._seq_max_seen = 0  # the longest training sequence of any measured step planned from (``search``)
        self.calibration = RolloutCalibration()  # measured / predicted rollouts of the steps run (``observe``)
        self.completion = CompletionOrder(self.options.window)  # when measured steps' groups completed (``observe``)

    def amortize_over(self, done: int) -> float:
        """Steps a plan change is paid over: ``amortize_steps``, or fewer when a run of known
        length (``run_steps``) has fewer left (``done`` steps completed): a re-shard for a small
        gain two steps before the end never pays back (search-r1, 5 steps on 32 H200: two
        training re-shards in the last three steps cost 14 s, SIMULATED)."""
        if self.options.run_steps is None:
            return self.options.amortize_steps
        return float(max(1, min(self.options.amortize_steps, int(self.options.run_steps) - done)))

    # ---- feedback from steps run -------------------------------------------------------------
    def _hindsight_dp(self, plan: Plan, stats: WorkloadStats, max_buckets: int, steps: int = 1) -> RolloutDP:
        return RolloutDP(stats, self.table, self.cluster.gpus_per_node, plan.n_rollout_gpus, self.tps, max_buckets, self.nvlink_domain,
                         self.options.tool_kv, step_priority=self.options.step_priority, steps=steps)

    def hindsight_rollout_s(self, plan: Plan, step: StepArrays, stats: WorkloadStats | None = None) -> float:
        """What the load model predicts for ``plan``'s rollout layout fed ``step``'s own
        trajectories (hindsight; ``stats``: their statistics, when already computed): compared
        with the measured time, it isolates the model's error from the step's own length
        (``libra.planner.feedback``). NaN when the layout cannot be evaluated (no instance in a
        bucket)."""
        if not plan.buckets or not plan.instances or not step.n:
            return float("nan")
        layout, counts = plan_layout(plan)
        if min(counts) < 1:
            return float("nan")
        stats = stats if stats is not None else compute_stats([step], step.prompt_tokens, window=1)
        return float(self._hindsight_dp(plan, stats, max(1, len(plan.buckets))).evaluate(layout, counts)[0])

    def hindsight_cycle_s(self, plan: Plan, step: StepArrays, alone_s: float | None = None) -> float:
        """The model's staleness-cycle makespan (``_cohort_s``: K + 1 steps sharing the engines)
        of ``plan``'s layout fed ``step``'s own trajectories K + 1 times over, its tail one step's
        (as the search prices it); what a step that shared its engines is compared with
        (``RolloutCalibration.pipelined_factor``). NaN when the layout cannot be evaluated.
        ``alone_s``: ``hindsight_rollout_s`` of the same step when the caller has it (the floor
        of a cycle that waits for KV, ``RolloutDP.waves``); computed here otherwise."""
        if not plan.buckets or not plan.instances or not step.n:
            return float("nan")
        layout, counts = plan_layout(plan)
        if min(counts) < 1:
            return float("nan")
        k = max(1, int(plan.max_staleness or self.options.max_staleness))
        stats = compute_stats([step], np.tile(step.prompt_tokens, k + 1), window=1, tail_of=step.n)
        dp = self._hindsight_dp(plan, stats, max(1, len(plan.buckets)), steps=k + 1)
        if not dp.feasible(layout):
            return float("nan")
        cycle = float(dp.evaluate(layout, counts)[0])
        waves = dp.waves(layout, counts)
        if waves > 1.0:  # as ``_cohort_s`` prices it: at least the rollout alone, once per wave
            alone = self.hindsight_rollout_s(plan, step) if alone_s is None else alone_s
            if np.isfinite(alone):
                cycle = max(cycle, alone * waves)
        return cycle

    def hindsight_shared_s(self, outcome: StepOutcome) -> float:
        """The model's rollout of a step that shared its engines, fed its own trajectories: the
        rollout alone (``hindsight_rollout_s``) and the staleness cycle (``hindsight_cycle_s``)
        mixed by the overlap the backend measured (``libra.planner.pipeline.shared_rollout_s``),
        as the async price mixes them; the whole cycle when the backend measured no overlap.
        What an overlapped step's measured rollout is compared with (``pipelined_factor``)."""
        plan, step = outcome.plan, outcome.trajectories
        alone = self.hindsight_rollout_s(plan, step)  # the mix's and the cycle's floor: predicted once
        cycle = self.hindsight_cycle_s(plan, step, alone)
        if outcome.overlap is None or not np.isfinite(cycle) or not np.isfinite(alone):
            return cycle
        k = max(1, int(plan.max_staleness or self.options.max_staleness))
        return shared_rollout_s(alone, cycle, k, float(outcome.overlap))

    def observe(self, outcome: StepOutcome) -> float | None:
        """Learn from a step the backend ran: its measured rollout over the hindsight prediction,
        kept per layout kind; later searches scale their rollout predictions by it. Returns the
        ratio kept (None: unusable, e.g. no rollout measured, or one that shared its engines with
        another step's, ``StepOutcome.overlapped``)."""
        self.completion.record(outcome)
        if outcome.overlapped:
            if outcome.plan.mode == "async" and self.options.continuous:
                self.calibration.record_pipelined(float(outcome.rollout_s), self.hindsight_shared_s(outcome))
            return None
        plan, step = outcome.plan, outcome.trajectories
        stats = compute_stats([step], step.prompt_tokens, window=1) if step.n else None
        pred = self.hindsight_rollout_s(plan, step, stats)
        kept = self.calibration.record(len(plan.buckets), float(outcome.rollout_s), pred)
        one_fc, two_fc = plan.notes.get("one_bucket_model_rollout_s"), plan.notes.get("model_rollout_s")
        if len(plan.buckets) == 2 and isinstance(one_fc, float) and isinstance(two_fc, float) and stats is not None:
            # did the split pay? the best one bucket on the same GPUs, in hindsight and as one
            # bucket's measured factor says it would have run, against the split's measured rollout
            one_hs = self._hindsight_dp(plan, stats, 1).best_one_bucket_s(plan.n_rollout_gpus)
            realized = one_hs * self.calibration.factor(1) / float(outcome.rollout_s) if outcome.rollout_s > 0 else float("nan")
            self.calibration.record_split(one_fc / two_fc if two_fc > 0 else float("nan"), realized)
        return kept

    # ---- pieces --------------------------------------------------------------------------------
    def rollout_dp(self, stats: WorkloadStats, step_priority: bool = False, steps: int = 1) -> RolloutDP:
        """The memoized rollout DP for a statistics digest. ``steps``: the statistics are that
        many steps' sharing the engines (the staleness cycle); ``step_priority``: under a router
        that serves the older steps first, whose parked KV is never evicted for a newer step's
        turn (``RolloutDP.step_priority``, ``RolloutDP.waves``)."""
        key = (stats.digest, step_priority, steps)
        dp = self._dps.get(key)
        if dp is None:
            dp = RolloutDP(stats, self.table, self.cluster.gpus_per_node, self.cluster.n_gpus,
                           tps=self.options.tps, max_buckets=self.options.max_buckets, nvlink_domain=self.nvlink_domain,
                           tool_kv=self.options.tool_kv, step_priority=step_priority, steps=steps)
            if len(self._dps) > 48:  # keep the memo bounded over a long run (a search uses up to 10: ``TAIL_SCENARIOS``)
                self._dps.pop(next(iter(self._dps)))
            self._dps[key] = dp
        return dp

    def train_shape(self, stats: WorkloadStats) -> tuple[int, int, int]:
        """(tokens, mean seq len, longest seq len) the training stage is predicted for, rounded
        so memo keys repeat across similar steps: tokens up to 1/64 of a power of two, the mean
        length as those tokens over the step's trajectories (so that ``tokens / seq`` is the
        number of sequences the ranks share: training time steps with it, ``ceil(per rank /
        micro-batch)`` rounds, and a mean rounded to 128 on its own had counted 263 sequences
        in a 256-trajectory step, a whole extra round of micro-batches at 32 GPUs), the longest
        up to 256 (memory is checked conservatively)."""
        n = max(1, int(stats.n_trajectories))
        tokens = max(1, int(n * stats.mean_total_tokens))
        q = 1 << max(0, tokens.bit_length() - 6)
        tokens = -(-tokens // q) * q
        seq = max(1, int(round(tokens / n)))
        seq_max = max(seq, memory_grain(max(stats.tail_context, 1)))
        return tokens, seq, seq_max

    def train_memory_length(self, tokens: int, seq: int, seen: int) -> int:
        """The sequence length every training strategy the search prices must hold in memory:
        the run's declared context limit (``declared_context``) when a strategy on the most
        training GPUs holds it, else the longest ``seen`` (``DecisionTree.memory_length``)."""
        return self.tree.memory_length(self.cluster.train_gpu_cap, tokens, seq, seen, declared_context(self.cluster))

    def max_split_train(self) -> int:
        """The most GPUs a split may give training: all but one (rollout needs a GPU), and no
        more than the training backend can use (``ClusterSpec.max_train_gpus``)."""
        return min(self.cluster.n_gpus - 1, self.cluster.train_gpu_cap)

    def n_train_grid(self) -> list[int]:
        """Training GPU counts the outer loop visits: the split grid of the unit
        (``split_counts``: multiples of it, and counts leaving rollout a multiple of it) up to
        ``max_split_train()``, plus that cap itself when the backend's limit falls between grid
        points (a 1-device trainer on a 48-GPU cluster still gets its split: 47:1)."""
        n = self.cluster.n_gpus
        unit = self.options.unit or train_unit(n, self.cluster.gpus_per_node)
        return self._capped(split_counts(n, unit))

    def _capped(self, grid: list[int]) -> list[int]:
        """``grid`` without the counts the training backend cannot use; when the backend's limit
        cut some, its largest usable count is added (the split that gives rollout the most)."""
        top = self.max_split_train()
        kept = [k for k in grid if k <= top]
        if top >= 1 and top < self.cluster.n_gpus - 1 and top not in kept and len(kept) < len(grid):
            kept.append(top)
        return kept

    # ---- the search ----------------------------------------------------------------------------
    def search(self, history: Sequence[StepArrays], prompt_tokens: np.ndarray | None, current: Plan | None = None,
               rollouts_in_flight: int | None = None) -> SearchResult:
        """Run the hierarchical search; raises UserError when nothing fits (saying what would).

        The first step of a workload whose kind nobody declared is planned by ``hedged_search``
        (the loop that is safe whichever known kind it turns out to be); every other search
        plans from the declared prior or the measured steps alone. ``rollouts_in_flight``: how
        many steps already planned have not ended their rollout (what a running async pipeline
        must drain before a new layout starts, ``SearchResult.drain_s``); None: unknown."""
        spec = PriorSpec.of(self.cluster)
        if not history and self.options.hedge_unknown_kind and not known_kind(spec):
            return self.hedged_search(prompt_tokens, current, spec)
        res = self._search(history, prompt_tokens, current, spec, in_flight=rollouts_in_flight)
        if not history:
            # a declared kind's one prior: no fill choice (``staggered``, "Why not from a declared prior")
            return res
        return replace(res, best=self.staggered(res.best, current, len(history)))

    def fill_steps(self, done: int) -> int:
        """The steps an async pipeline started after ``done`` steps is priced over when choosing
        how it fills (``staggered``): what is left of a run of known length, else
        ``amortize_steps`` (at least K + 2: the fill and a step after it)."""
        k = max(1, int(self.options.max_staleness))
        if self.options.run_steps is not None:
            return max(1, int(self.options.run_steps) - int(done))
        return max(k + 2, int(math.ceil(self.options.amortize_steps)))

    def stagger_gain(self, c: Candidate, steps: int, cohort_share: float = 1.0) -> float:
        """The fraction of its run an async candidate's pipeline, started now, ends sooner when
        its first step rolls out alone (``stagger_gain_s`` on the candidate's own forecasts: its
        rollout, the staleness cycle and the engines' pace as ``step_time`` prices them, and its
        training plus sync); NaN where it does not apply (not async, time-shared, streamed,
        batch-per-step generation). ``cohort_share``: the part of the cycle's forecast excess over
        one step alone that is counted (``STAGGER_COHORT_SHARE``)."""
        if c.mode != "async" or c.colocated or c.streaming or not self.options.continuous:
            return float("nan")
        pipe = self.calibration.correction().pipelined
        ro = c.rollout.makespan_s * c.rollout_factor * pipe
        if not ro > 0:
            return float("nan")
        load = min(c.rollout.throughput_s * c.rollout_factor * pipe, ro)
        cohort = c.cohort_s * c.rollout_factor * pipe if c.cohort_s == c.cohort_s else ro
        cohort = ro + max(0.0, cohort - ro) * cohort_share
        k = max(1, int(self.options.max_staleness))
        chain = c.train_s + c.sync_s
        together = pipeline_run_s("async", k, ro, chain, steps, cohort_s=max(cohort, ro), load_s=load)
        if not together > 0:
            return float("nan")
        return stagger_gain_s(k, ro, chain, steps, max(cohort, ro), load) / together

    def staggered(self, best: Candidate, current: Plan | None, done: int,
                  scenarios: Sequence[SearchResult] = ()) -> Candidate:
        """``best``, its first async step rolling out alone (``Candidate.stagger_fill``) when the
        pipeline starts with it (no async plan in force) and that ends the run at least
        ``STAGGER_MARGIN`` sooner, with the cycle's excess counted at ``STAGGER_COHORT_SHARE``;
        at a hedged launch, also on average over its prior scenarios ``scenarios`` (each prior
        once, the first search of it that priced an async split with ``best``'s training GPU
        count, that search's best such candidate). Its predicted step then is the staggered run's
        mean step. ``Planner.search`` asks it of plans made from measured steps and of a hedged
        launch only.

        Why the scenarios too: the choice turns on whether the engines are throughput-bound (the
        cohort near K + 1 times one step alone), which the default prior's long steps say more
        often than the real logs a run of undeclared kind turns out to be. The mean, not the
        worst case, as for the launch split (``_split_by_regret``): MINT's 1,136 trajectories a
        step on 56 A800 gain 4-11% in the unstretched scenarios and 1-4% in the shortest, 4.3% on
        average; a few hundred short ReAct trajectories gain under 1% in the default prior
        already (FEVER on 38 B200: 0.4%).

        Why not from a declared kind's prior: whether step 0 alone is throughput- or tail-bound
        turns on its tool-call chains, which one kind's prior fixes (its stretched scenarios scale
        tokens, not tool latencies) and which the search prior underestimates on the bundled
        Search-R1 trace: forecast 16.5 s rollouts the engines' throughput bounds on 44 B200 /
        Qwen3-30B-A3B, run 36-40 s on chains of tool calls (one step alone 35.7 s, beside the next
        37.5 s). Staggered on that prior and on it stretched to 1/3 and 1/9 (mean gain 4.5%), the
        never-lose grid's search-bundled/h100-32-14b/K1 went 44.8 -> 47.0 s a step, its one loss
        (0.955x, SIMULATED, session 47); held_out_56's search-z on 56 A800 1.000x -> 0.954x at a
        looser margin. An undeclared kind's scenarios span the kinds' tool structures."""
        if best.stagger_fill or (current is not None and current.mode == "async"):
            return best
        steps = self.fill_steps(done)
        if not self.stagger_gain(best, steps, STAGGER_COHORT_SHARE) >= STAGGER_MARGIN:
            return best
        seen: set[PriorSpec | None] = set()
        gains: list[float] = []
        for r in scenarios:
            if r.stats_spec in seen:
                continue
            same = [c for c in r.candidates if c.mode == "async" and not c.colocated and not c.streaming and c.n_train == best.n_train]
            if not same:
                continue
            g = self.stagger_gain(min(same, key=Candidate.rank), steps)
            if g == g:
                seen.add(r.stats_spec)
                gains.append(g)
        if gains and not sum(gains) / len(gains) >= STAGGER_MARGIN:
            return best
        # priced on the forecast itself (the discount decides, it is not what the run will take)
        saved = self.stagger_gain(best, steps) * (best.step_s - best.transition_s / self.amortize_over(done))
        robust = best.robust_s - saved if best.robust_s == best.robust_s else best.robust_s
        return replace(best, stagger_fill=True, step_s=best.step_s - saved, robust_s=robust)

    def hedged_search(self, prompt_tokens: np.ndarray | None, current: Plan | None, spec: PriorSpec) -> SearchResult:
        """The first step's plan when the workload's kind is unknown: the loop class (time-shared,
        or a split running sync, sync + streaming or async) of least worst-case regret over the
        prior scenarios (``prior_scenarios``: the default prior and each known kind's prior,
        inside the declared limits; at a launch that may go asynchronous, also each unstretched
        one stretched to ``LAUNCH_STRETCH``, ``_short_class_runs``), then the default prior's best
        plan of that class.

        A class's price in a scenario is that scenario's best candidate of the class (its split,
        strategy and layout re-chosen for it), its regret the price over the scenario's best.
        Why: an undeclared prior is a guess, and its errors are not small: a real ReAct log
        (FireAct HotpotQA, 16 A100, Qwen3-14B, K=1) was forecast from the SWE-like default at
        350 s of rollout and ran 5.9 s; the default prior chose the time-shared loop (two
        engine/trainer switches, 12.8 s a step) where every short-rollout scenario wants an
        async split, and the run paid that step plus a move to async (0.53x of a fixed async
        split, SIMULATED, held_out_3). What the first step can know is the limits, the prompts
        and the cluster; the kind stays a hedge until a step has run."""
        scenarios = prior_scenarios(spec)
        # every class priced in every scenario: no branch-and-bound cut (``bound=False``)
        runs = [self._search((), prompt_tokens, current, scenarios[0], bound=False)]  # what fits nothing here is the user's error
        for s in scenarios[1:]:
            try:
                runs.append(self._search((), prompt_tokens, current, s, bound=False))
            except UserError:  # a kind this cluster cannot run at all is no scenario to hedge against
                continue
        # a streamed first step is no candidate: it would train the default prior's strategy and
        # knobs unsettled (nothing settles a streamed job; every other class settles its layout at
        # its first training, ``first_layout``), and for a kind nobody declared no scenario bounds
        # what that costs (``UNSETTLED_FIRST_STEP``)
        short = self._short_class_runs(runs, prompt_tokens, current)
        prices = [{c: v for c, v in class_prices(r.candidates).items() if c != UNSETTLED_FIRST_STEP} for r in runs + short]
        classes = [c for c in prices[0] if all(c in p for p in prices)]
        nominal = runs[0]
        # the training GPU counts a split could run at all here (unbounded search: every count
        # whose training holds the memory length priced one candidate)
        holding = len({c.n_train for c in nominal.candidates if not c.colocated})
        if not classes:
            return replace(nominal, holding_splits=holding)
        regret = {c: max(p[c] / min(p.values()) for p in prices) for c in classes}
        pick = min(classes, key=lambda c: (regret[c], prices[0][c]))
        # the picked class's regret over the prior scenarios alone (``runs``, what
        # ``_launch_regret`` prices the launch in): the launch's when no scenario priced it
        pick_regret = max(p[pick] / min(p.values()) for p in prices[:len(runs)])
        split_runs = self._class_runs(pick, runs, prompt_tokens, current)
        if pick == loop_class(nominal.best):
            # an async pick's splits as the pinned search priced them (every split, not only
            # those whose best loop is async)
            pinned_nominal = split_runs[0] if pick == "async" and split_runs and split_runs[0].stats_spec == nominal.stats_spec else None
            cands = pinned_nominal.candidates if pinned_nominal is not None else nominal.candidates
            best = self._split_by_regret(nominal.best, cands, split_runs, current)
            launch_runs = self._launch_runs(best, runs, prompt_tokens, current, short)
            best, cands = self._launch_rollout_tp(best, cands, launch_runs, prompt_tokens, current, spec)
            best = self._holding_launch(best, cands, nominal.stats, current)
            best = self._launch_layout(best, launch_runs, current)
            best = self.staggered(best, current, 0, list(split_runs) + list(runs) + list(short))
            return replace(nominal, best=best, candidates=list(nominal.candidates) + [c for c in cands if c not in nominal.candidates],
                           hedge=regret, launch_regret=self._launch_regret(best, runs, pick_regret), holding_splits=holding)
        # the default prior's candidates hold each split's best loop only: the picked loop is
        # priced on every split by the same search with that loop pinned
        if pick == "time-shared":
            of_class = [c for c in nominal.candidates if c.colocated]
        else:
            if pick == "async" and split_runs and split_runs[0].stats_spec == spec:
                pinned = split_runs[0]  # the same search, made for the regret (``_class_runs``)
            else:
                pinned = self._pinned_search(pick, prompt_tokens, current, spec)
            of_class = [c for c in pinned.candidates if loop_class(c) == pick]
        if not of_class:
            return replace(nominal, hedge=regret, holding_splits=holding)
        filling = current is None or current.mode != "async"
        best = self._split_by_regret(stay_within_tolerance(choose(of_class, self.options.max_staleness >= 1, filling), of_class, current),
                                     of_class, split_runs, current)
        launch_runs = self._launch_runs(best, runs, prompt_tokens, current, short)
        best, of_class = self._launch_rollout_tp(best, of_class, launch_runs, prompt_tokens, current, spec)
        best = self._holding_launch(best, of_class, nominal.stats, current)
        best = self._launch_layout(best, launch_runs, current)
        best = self.staggered(best, current, 0, list(split_runs) + list(runs) + list(short))
        return replace(nominal, best=best, candidates=list(nominal.candidates) + [c for c in of_class if c not in nominal.candidates],
                       hedge=regret, launch_regret=self._launch_regret(best, runs, pick_regret), holding_splits=holding)

    def _short_class_runs(self, runs: Sequence[SearchResult], prompt_tokens: np.ndarray | None,
                          current: Plan | None) -> list[SearchResult]:
        """At the launch of a run that may go asynchronous (K >= 1, no plan in force), each
        unstretched prior scenario of ``runs`` stretched to ``LAUNCH_STRETCH``, for the loop
        class's regret (``hedged_search``); none otherwise. Why: a time-shared launch that the
        first measured steps move to a split pays the move inside the pipeline's fill, and the
        scenarios it was chosen over were all longer than the logs that did this: ToRA GSM8K on
        46 H200 / Llama-3.1-70B launched time-shared and moved to 18:28 at step 2, 0.786x of
        areal-static-optimal's 14:32 (held_out_41's worst row; held_out_36's worst, 0.800x, is
        the same on 40 H200; SIMULATED). At K = 0 the same scenarios moved AgentDojo's first step
        from time-shared to a synchronous split (0.992 -> 0.942x of verl-colocated on 40 GB200,
        session 20), so only where an async split can overlap what a short step leaves idle."""
        if current is not None or self.options.max_staleness < 1:
            return []
        return self._stretched_runs(runs, prompt_tokens, current, bound=False)

    def _stretched_runs(self, runs: Sequence[SearchResult], prompt_tokens: np.ndarray | None, current: Plan | None,
                        bound: bool) -> list[SearchResult]:
        """Each unstretched scenario of ``runs`` searched again stretched to ``LAUNCH_STRETCH``
        (one the cluster cannot run at all is left out)."""
        out: list[SearchResult] = []
        for r in runs:
            if r.stats_spec is None or r.stats_spec.stretch != 1.0:
                continue
            try:
                out.append(self._search((), prompt_tokens, current, replace(r.stats_spec, stretch=LAUNCH_STRETCH), bound=bound))
            except UserError:
                continue
        return out

    def _class_runs(self, cls: str, runs: Sequence[SearchResult], prompt_tokens: np.ndarray | None,
                    current: Plan | None) -> list[SearchResult]:
        """The prior scenarios ``runs`` searched again with the loop pinned to ``cls``, when its
        splits are chosen by their regret over the scenarios (``_split_by_regret``: an async
        class); ``runs`` for any other class. Why: a search keeps each split's best loop only, so
        a scenario whose short steps run a split synchronously priced no async candidate there,
        and the regret was taken over the splits every scenario happened to price async (on 44
        B200 with Qwen3-32B, the search scenario priced 8, 12, 16, 20 and 36 training GPUs, and
        the least regret among those was 36, 22% behind the default prior's best; SIMULATED)."""
        if cls != "async":
            return list(runs)
        out: list[SearchResult] = []
        for r in runs:
            if r.stats_spec is None:
                continue
            try:
                out.append(self._pinned_search(cls, prompt_tokens, current, r.stats_spec, bound=False))
            except UserError:
                continue
        return out

    def _pinned_search(self, cls: str, prompt_tokens: np.ndarray | None, current: Plan | None, spec: PriorSpec,
                       bound: bool = True) -> SearchResult:
        """``_search`` from the prior ``spec`` with the loop pinned to the split class ``cls``
        (``LOOP_OF_CLASS``): every split priced with that loop, not only where it is the split's
        best. The planner's options are restored afterwards, also when the search raises."""
        mode, streaming = LOOP_OF_CLASS[cls]
        saved = self.options
        try:
            self.options = replace(saved, mode=mode, streaming=streaming if mode == "sync" else None, colocated=False)
            return self._search((), prompt_tokens, current, spec, bound=bound)
        finally:
            self.options = saved

    def launch_tp_regrets(self, n_rollout_gpus: int, runs: Sequence[SearchResult], hold: int = 0) -> dict[int, float]:
        """Per rollout TP degree, the mean log-regret of one bucket of that degree on
        ``n_rollout_gpus`` GPUs over the scenarios ``runs``: in each, the load model's makespan of
        that layout (instances packed in NVLink domains, as the DP packs them) over the
        scenario's fastest degree. Only degrees whose KV holds every scenario's longest context
        (``RolloutDP.feasible``) and ``hold`` tokens in one instance; empty when fewer than two
        do or a scenario has no statistics."""
        dps = [self.rollout_dp(r.stats) for r in runs if r.stats is not None]
        if not dps or len(dps) != len(runs):
            return {}
        prices: dict[int, list[float]] = {}
        for t in dps[0].tps:
            m = dps[0].instances_on(int(n_rollout_gpus), t)
            layout = BucketLayout((t,), ())
            if m < 1 or self.table.kv_capacity.get(t, 0) < hold or not all(dp.feasible(layout) for dp in dps):
                continue
            prices[t] = [float(dp.evaluate(layout, [m])[0]) for dp in dps]
        if len(prices) < 2:
            return {}
        tops = [min(p[i] for p in prices.values()) for i in range(len(dps))]
        return {t: sum(math.log(v / top) for v, top in zip(p, tops)) / len(dps) for t, p in prices.items() if all(top > 0 for top in tops)}

    def _launch_rollout_tp(self, best: Candidate, cands: Sequence[Candidate], runs: Sequence[SearchResult],
                           prompt_tokens: np.ndarray | None, current: Plan | None, spec: PriorSpec) -> tuple[Candidate, list[Candidate]]:
        """``best`` and ``cands``, or, for an async launch split of one bucket, the same split with
        the rollout TP of least mean log-regret over the prior scenarios ``runs`` (``_launch_runs``:
        the default prior, each kind's, each stretched to 1/3 and, unstretched ones, to
        ``LAUNCH_STRETCH``; ``launch_tp_regrets``) and ``cands`` of that TP, re-priced by the
        default prior's search with the loop pinned to async and the rollout to that degree. Only
        at launch (no plan in force).

        Why: each scenario re-chooses its own layout for a split (``_split_by_regret``), so the
        launched layout, the default prior's, was never priced in the short scenarios, and no
        scenario was as short as the public logs a run of undeclared kind turned out to be.
        held_out_36-40's K = 1 log losses launched a larger rollout TP than the hindsight split in
        10 of 14 rows on held_out_40 (Reflexion on 38 A100 / Qwen3-8B: TP 8 x 2 where the
        hindsight split runs TP 2 x 5, 0.932x, SIMULATED). Sessions 28 and 30 chose the TP by the
        worst case and by the mean over the scenarios without ``LAUNCH_STRETCH``: every scenario
        then wanted TP 8 for a 70B model where a short log wants TP 4.

        A degree must also hold in one instance what the run may bring (``hold``): its declared
        context limit, or with none ``LAUNCH_MEMORY_HEADROOM`` times the default prior's cap
        (``PRIOR_CAP_TOKENS``; the prior's drawn longest depends on the prompts, 39,424 tokens for
        Terminal-Bench's, whose runs reach 94,543). The scenarios stop at the prior's 64K tokens
        where real logs reach twice that: without it Qwen3-30B-A3B on 44 H100 launched TP 1
        (84,752 KV tokens an instance) and stopped on the 89-95K-token browser and terminal logs
        that the default prior's TP 4 had held (held_out_38, seen, SIMULATED). When the default
        prior's own degree does not hold it, the launch keeps that degree (not seen)."""
        if current is not None or best.colocated or best.mode != "async" or len(best.rollout.layout.tps) != 1:
            return best, list(cands)
        limit = declared_context(self.cluster)  # what the run may bring, where no scenario reaches
        hold = int(limit) if limit is not None else int(PRIOR_CAP_TOKENS * LAUNCH_MEMORY_HEADROOM)
        regrets = self.launch_tp_regrets(best.rollout.n_gpus, runs, hold)
        now = best.rollout.layout.tps[0]
        if now not in regrets:
            return best, list(cands)
        pick = min(regrets, key=lambda t: (round(regrets[t], 6), t != now, t))
        if pick == now:
            return best, list(cands)
        saved, saved_dps = self.options, self._dps  # the DP memo is keyed by statistics, not by the TPs it searched
        try:
            self.options, self._dps = replace(saved, tps=(pick,)), {}
            pinned = self._pinned_search("async", prompt_tokens, current, spec, bound=False)
        except UserError:
            return best, list(cands)
        finally:
            self.options, self._dps = saved, saved_dps
        same = [c for c in pinned.candidates if loop_class(c) == "async" and c.n_train == best.n_train]
        if not same:
            return best, list(cands)
        return min(same, key=Candidate.rank), [c for c in pinned.candidates if loop_class(c) == "async"]

    def _holding_launch(self, best: Candidate, cands: Sequence[Candidate], stats: WorkloadStats, current: Plan | None) -> Candidate:
        """``best``, or, when its training GPU count has no strategy that holds
        ``LAUNCH_MEMORY_HEADROOM`` times the prior's longest sequence, the candidate of its loop
        class within ``TIE_TOLERANCE`` of it whose count has one, the nearest split first. Only at
        the launch of a run of undeclared kind and no declared context limit (a declared limit is
        what every strategy the search prices already holds), and only for a split (a time-shared
        plan trains on every GPU).

        Why: the run's first training happens on the launch split (moving GPUs is a transition,
        and the first training cannot wait for one), and an undeclared kind's prior stops at
        64K tokens where real logs reach twice that. AgentDojo's 123,547-token run on 28 B200
        with Qwen3-14B at K=1 launched 11:17, and no strategy on 17 GPUs holds it (on 16 or 18
        one does: tensor and context parallelism want even counts), so the run stopped at step
        0's training (held_out_34's post-run replay on session 24's code, SIMULATED). A near
        tie costs at most the tie band; a run that stops costs everything."""
        if current is not None or best.colocated or declared_context(self.cluster) is not None:
            return best
        tokens, seq, seq_max = self.train_shape(stats)
        need = memory_grain(int(seq_max * LAUNCH_MEMORY_HEADROOM))
        memo: dict[int, bool] = {}

        def holds(n: int) -> bool:
            if n not in memo:
                memo[n] = self.tree.best(n, tokens, seq, need).best is not None
            return memo[n]

        if holds(best.n_train):
            return best
        top = best.rank()[0]
        cls = loop_class(best)
        near = [c for c in cands if not c.colocated and loop_class(c) == cls and c.rank()[0] <= top * (1.0 + TIE_TOLERANCE)
                and c.n_train != best.n_train and holds(c.n_train)]
        # the nearest such split: ``best`` may be the scenarios' pick (``_split_by_regret``)
        return min(near, key=lambda c: (abs(c.n_train - best.n_train), c.rank())) if near else best

    @staticmethod
    def _launch_regret(best: Candidate, runs: Sequence[SearchResult], class_regret: float = float("nan")) -> float:
        """``best``'s worst-case regret over the prior scenarios ``runs``: in each, the best price
        of a candidate with its training GPU count and loop class (a time-shared plan: the
        scenario's time-shared plan) over the scenario's best candidate; scenarios that priced no
        such candidate are skipped. When none did, ``class_regret``: its loop class's worst-case
        regret over the same scenarios (each class on the step it prices for every loop a split
        allows, ``class_prices``), the class's best in each scenario standing in for the launch's
        own price (NaN when that is unknown too). The two measures differ (``rank``, the expected
        step with transitions, against the loop's step without), so it is an estimate, not a
        bound.

        Why not NaN there: a scenario's candidates hold each split's best loop only, so a launch
        whose class is not that loop at its split is priced in no scenario, and NaN was read as
        1.0 (``assumed_cap._regret``). On 52 H100 with Llama-3.1-70B at an assumed 32,768 tokens
        the hedge picked the sync class (regret 1.63) and launched 8:44 sync, a split every
        scenario runs async; it was taken as within ``assumed_cap.HEDGE_REGRET_CAP`` and FEVER ran
        0.848x of the best static split (held_out_48, K=1, SIMULATED). Only the unpriced case:
        as a floor everywhere (the two measures differ: ``rank`` against the loop's step without
        transition) it moved launches the scenarios price within the cap (36 H100 / Qwen3-32B's
        time-shared launch on 32 training GPUs, 1.63 on the class measure)."""
        cls = loop_class(best)
        ratios = [mine / top for r in runs if r.candidates
                  for top in [min(float(c.rank()[0]) for c in r.candidates)]
                  for mine in [prices_by_train_gpus(r.candidates, cls).get(best.n_train)]
                  if mine is not None and top > 0]
        return max(ratios) if ratios else float(class_regret)

    def _launch_runs(self, best: Candidate, runs: Sequence[SearchResult], prompt_tokens: np.ndarray | None,
                     current: Plan | None, short: Sequence[SearchResult] = ()) -> list[SearchResult]:
        """The prior scenarios ``runs`` and, when ``_launch_layout`` will use them, each unstretched
        one (the default prior and each known kind's) stretched to ``LAUNCH_STRETCH``: the training
        layout a run of undeclared kind launches with is also priced on much shorter steps than
        any kind's prior, where the split is not (``LAUNCH_STRETCH``). ``short``: those searches
        when the loop class was already priced on them (``_short_class_runs``, a K >= 1 launch)."""
        if current is not None or best.streaming or not runs:
            return list(runs)
        # the same scenarios, already searched for the loop class at a K >= 1 launch
        return list(runs) + (list(short) or self._stretched_runs(runs, prompt_tokens, current, bound=True))

    def _launch_layout(self, best: Candidate, runs: Sequence[SearchResult], current: Plan | None) -> Candidate:
        """The training layout a run of undeclared kind launches with: ``best``'s, or the strategy
        on its training GPUs of least worst-case cost over the prior scenarios ``runs``, where the
        run's first training may re-build it (``libra.planner.settle.first_layout``).

        In a scenario, a strategy that holds the scenario's longest sequence costs its extra
        training time over the scenario's fastest strategy, at most the re-build to that one
        paid over the steps a change is amortized over (``build_s / amortize_over(0)``); one that
        does not hold it costs that re-build (the first training must move, ``first_layout``).
        Each cost is relative to the scenario's predicted step. Only for a plan whose first
        training settles its layout (a split or a time-shared plan, not streamed: a streamed step
        trains with its plan's knobs) and at launch (no plan in force).

        Why: the default prior reaches 64K tokens, so the launch layout held sequences no short
        log brings (ZeRO-3, or TP 4, where ZeRO-1 at TP 1 trains the trace's 1K-token sequences
        2x faster), and a 3-5-step run of short steps could not pay the re-build out of a chain
        it pays twice (held_out_17 fireact-multi/b200-24-8b/K1: 0.80 s against 0.36 s a step,
        a 1.74 s re-build; SIMULATED). The costs are asymmetric: a layout too small for a long
        scenario costs one re-build, a fraction of a percent of its long steps; a layout sized
        for the long scenario costs a short one its training speed at every step."""
        if current is not None or best.streaming or not runs:
            return best
        n = best.n_train
        amortize = self.amortize_over(0)
        pin = self.options.micro_batch
        rows: list[tuple[dict[TrainConfig, float], float, float, float]] = []
        for r in runs:
            tokens, seq, seq_max = self.train_shape(r.stats)
            memory = self.train_memory_length(tokens, seq, seq_max)
            timer = training_time_fn(self.step_costs, tokens, seq, self.tree.kl)
            res = enumerate_strategies(self.ev, n, sequence_count(tokens, seq), memory, self.cluster.gpus_per_node, timer, bound=False)
            fits = {cfg: float(t) for t, cfg in res.ranked if pin is None or cfg.micro_batch == pin}
            step = float(r.best.rank()[0])
            if not fits or not step > 0:
                return best
            cfg_best, t_best = min(fits.items(), key=lambda kv: (kv[1], repr(kv[0])))
            rows.append((fits, t_best, self.step_costs.build_s(cfg_best) / amortize, step))
        options = {cfg for fits, _, _, _ in rows for cfg in fits}

        def worst(cfg: TrainConfig) -> float:
            return max(min(fits.get(cfg, float("inf")) - t_best, move) / step for fits, t_best, move, step in rows)

        if best.train not in options:
            return best
        pick = min(options, key=lambda cfg: (round(worst(cfg), 6), cfg != best.train, repr(cfg)))
        if worst(pick) >= worst(best.train) - 1e-6:
            return best
        return replace(best, train=pick)

    @staticmethod
    def _split_by_regret(best: Candidate, cands: Sequence[Candidate], runs: Sequence[SearchResult],
                         current: Plan | None) -> Candidate:
        """``best`` (the default prior's choice), or, for an async plan, the split the prior
        scenarios agree on: among the candidates of ``best``'s loop class (``cands``, every split
        the default prior priced with that loop), the one of least mean log-regret over the
        scenarios ``runs`` (in each, the split's own best candidate of that class over the
        scenario's best of the class), then of least worst-case regret. Only splits every scenario
        priced are compared, so ``runs`` are searched with the loop pinned (``_class_runs``). The
        plan in force is kept when it is one of them.

        Why: an undeclared kind's default prior is one guess (SWE-like, 64K tokens) and its
        best split gives rollout the GPUs of long steps; the real logs a run turns out to be are
        mostly shorter than every scenario, and a K = 1 run keeps its launch split for its first
        two steps, which on a 4-5-step log is the run. FireAct HotpotQA on 28 H100 / Qwen3-14B
        launched the default's 16:12, 0.880x of the hindsight split 12:16 that every scenario
        prices within 2% of its best (held_out_37, SIMULATED). History: the worst-case regret
        over all splits (session 13) sent tau2 retail on 32 H200 to 0.771x; the tie-break among
        near ties only (session 14) moved few launches; the mean log-regret over the splits every
        unpinned scenario happened to price async (session 22) left out the splits a short
        scenario runs synchronously, and in session 30 launched WebArena on 44 B200 at 8:36
        (0.851x, where 12:32 was missing from the search scenario). The mean, not the worst case: one scenario far from the run (the search prior
        on a 128K-token log) should not decide alone. Sync loops keep ``choose``'s rule (the most
        training GPUs among ties): the scenarios' pick overrode it on four seen K=0 rows of
        Qwen3-30B-A3B (fireact-hotpotqa/a100-48-30b/K0 1.079 -> 0.921x, SIMULATED)."""
        if best.colocated or best.mode != "async":  # sync splits go to ``choose``'s rule
            return best
        cls = loop_class(best)
        near = [c for c in cands if not c.colocated and loop_class(c) == cls and c.idle_rollout_gpus == best.idle_rollout_gpus]
        if len({c.n_train for c in near}) < 2:
            return best
        if current is not None and any(same_shape(c, current) for c in near):
            return best
        tables = [t for t in (prices_by_train_gpus(r.candidates, cls) for r in runs) if t]
        scored = [c for c in near if all(c.n_train in t for t in tables)]
        if not scored or not tables:
            return best

        def mean_log(c: Candidate) -> float:
            return sum(math.log(t[c.n_train] / min(t.values())) for t in tables) / len(tables)

        def worst(c: Candidate) -> float:
            return max(t[c.n_train] / min(t.values()) for t in tables)

        return min(scored, key=lambda c: (round(mean_log(c), 6), worst(c), c.rank()))

    def _search(self, history: Sequence[StepArrays], prompt_tokens: np.ndarray | None, current: Plan | None,
                spec: PriorSpec, bound: bool = True, in_flight: int | None = None) -> SearchResult:
        """The search proper, planning the first step from the prior ``spec``. ``bound`` False:
        no split and no time-shared plan is cut by the incumbent (``hedged_search`` compares loop
        classes, whose prices must not come from splits cut by another class's incumbent).
        ``in_flight``: as ``search``'s ``rollouts_in_flight``."""
        stats = compute_stats(history, prompt_tokens, window=self.options.window, prior=spec)
        dp = self.rollout_dp(stats)
        # async: the staleness cycle's K + 1 steps share the engines (``step_time``); their
        # rollout together is predicted on the same statistics at K + 1 times the trajectories
        k_async = self.options.max_staleness
        dp_cohort: RolloutDP | None = None
        prompts = prompt_tokens if prompt_tokens is not None else (history[-1].prompt_tokens if history else None)
        continuous = self.options.continuous
        if continuous and any(m == "async" for m, _ in self.options.loop_modes()) and prompts is not None and len(prompts):
            # the cycle's tail is one step's expected longest (``tail_of``), as every other loop's
            # price has it: the longest of (K + 1) n is a quantile beyond what a 3-step window
            # resolves (its one runaway sample moved the cycle 20.9 -> 39.7 s in one step, and
            # Libra left async for a streamed loop that replayed 43 s: search-drift, 48 H200, K=1)
            dp_cohort = self.rollout_dp(compute_stats(history, np.tile(np.asarray(prompts), k_async + 1), window=self.options.window,
                                                      prior=spec, tail_of=len(prompts)), self.options.step_priority, k_async + 1)
        # the same statistics with the tail rows at each of ``TAIL_SCENARIOS``: the expected step
        # is averaged over where the step's longest trajectory may fall
        tail_dps = [self.rollout_dp(compute_stats(history, prompt_tokens, window=self.options.window, prior=spec, tail_quantile=u))
                    for u in TAIL_SCENARIOS]
        tail_cohort_dps = [] if dp_cohort is None or prompts is None else [
            self.rollout_dp(compute_stats(history, np.tile(np.asarray(prompts), k_async + 1), window=self.options.window, prior=spec,
                                          tail_of=len(prompts), tail_quantile=u), self.options.step_priority, k_async + 1)
            for u in TAIL_SCENARIOS]
        tail_memo: dict[int, np.ndarray] = {}

        def tails_of(ro: RolloutChoice) -> np.ndarray:
            """``ro``'s makespan per tail scenario, once per rollout choice (the bound and the price
            both need it)."""
            if id(ro) not in tail_memo:
                tail_memo[id(ro)] = self._tail_makespans(tail_dps, ro, ro.makespan_s)
            return tail_memo[id(ro)]

        hits0, miss0 = dp.hits, dp.misses
        tokens, seq, seq_max = self.train_shape(stats)
        if not stats.from_prior:
            # memory is checked at the longest sequence measured so far, not the window's: the
            # window's maximum moves with the tail of a few steps, and the training strategy
            # flipped with it (ZeRO-1 -> ZeRO-2 -> ZeRO-1 in three search-r1 steps on 32 H200,
            # a re-shard each way, 14 s, SIMULATED); a sequence that long was seen, so it can recur.
            # The longest measured sequence too, not only the forecast's tail (the trajectory of
            # the longest critical path, which need not be the longest): the settle holds it
            # (``libra.planner.settle.batch_shape``), and a plan kept while its training GPUs
            # held none of it trained nothing the next time it came (SWE-agent on 36 H100 /
            # Qwen3-32B, K=1: a 49,809-token run at step 1, 16:20 kept at step 2, SIMULATED)
            seq_max = max(seq_max, self._seq_max_seen, memory_grain(longest_sequence(history)))
            self._seq_max_seen = seq_max
        # and at the longest context the run may bring (its declared limit) when some strategy
        # holds it: the baselines are held to the same
        seq_max = self.train_memory_length(tokens, seq, seq_max)
        fixed = self.step_costs.step_fixed_s(stats.n_trajectories)  # reward/advantage/data bookkeeping
        # the in-force split's training, re-priced on these statistics: what GPUs leaving training
        # wait before they serve rollout (``transition_s``); from a prior, the plan's own
        # prediction stands
        in_force_train_s: float | None = None
        if current is not None and not current.colocated and current.train is not None and not stats.from_prior:
            in_force = self.kept_knobs(current.train, tokens, seq, seq_max)[1] + fixed
            in_force_train_s = in_force if np.isfinite(in_force) else None
        cands: list[Candidate] = []
        N = self.cluster.n_gpus
        state = {"incumbent": float("inf"), "skipped": 0, "last_tree": None}
        visited: set[int] = set()
        loops = self.options.loop_modes()
        overlap = any(m == "async" or st for m, st in loops)  # a loop where training may hide under the rollout
        finals = stats.final_context
        ready = stats.group_final_context  # when each trajectory's group is complete (streamed mini-batches)
        # once steps were measured, when their groups completed (``CompletionOrder``), with
        # their own lengths for the mini-batches' token shares; from a prior, the length order
        measured = None if stats.from_prior else self.completion.arrays()
        ready_fraction = None
        if measured is not None:
            finals, ready_fraction = measured
            ready = None
        sigma = self.options.rollout_sigma
        factors = rollout_factors(sigma)
        correction = self.calibration.correction()  # measured factors per layout kind; how far splits' gains were overstated
        # an async pipeline not yet running is priced as the run it starts: its steps left from a
        # standing start, fill and drain included (``async_run_s``), when the run's length is
        # known. Once it runs, it is priced at its steady state.
        filling = current is None or current.mode != "async"
        amortize = self.amortize_over(len(history))
        left = None if self.options.run_steps is None or not filling else max(1, int(self.options.run_steps) - len(history))

        limit = declared_context(self.cluster)
        longest = max(seq_max, longest_sequence(history))  # the forecast's tail, or a sequence measured
        stream_memory = memory_grain(int(longest * STREAM_MEMORY_HEADROOM))
        stream_memory = max(seq_max, min(stream_memory, limit) if limit else stream_memory)
        stream_memo: dict[TrainConfig, bool] = {}

        def stream_holds(cfg: TrainConfig) -> bool:
            """Whether ``cfg`` may train a streamed step (``STREAM_MEMORY_HEADROOM``)."""
            hit = stream_memo.get(cfg)
            if hit is None:
                hit = stream_memo[cfg] = fits_in_memory(self.ev, cfg, stream_memory)
            return hit

        # the plan in force, re-predicted on these statistics, when it can be kept as it is
        # (``_kept``), and its training with the knobs the step will settle (``kept_knobs``)
        kept = self._kept(current, dp, seq_max, provisional=not history)
        kept_train = self.kept_knobs(current.train, tokens, seq, seq_max) if kept is not None and current is not None else None
        # a running async pipeline: what a step on a new rollout layout waits for the previous
        # step's rollout to end, once (``libra.planner.pipeline.async_drain_s``), priced on the
        # pipeline in force (its layout re-predicted, its training re-priced, whether or not that
        # training still holds the longest sequence: the step in flight runs it either way); the
        # simulator starts a new layout's engines only then. Nothing to wait for when every step
        # planned so far has ended its rollout (the step after the fill, when the gate opens only
        # once the cycle's rollouts drained)
        drain_s = 0.0
        if (continuous and dp_cohort is not None and current is not None and current.mode == "async" and not current.colocated
                and in_force_train_s is not None and in_flight != 0):
            in_force_ro = kept if kept is not None else self._in_force_rollout(current, dp)
            if in_force_ro is not None and in_force_ro.counts:
                k_corr = correction.factor(len(in_force_ro.layout.tps)) * correction.pipelined
                k_roll = in_force_ro.makespan_s * k_corr
                k_cohort = self._cohort_s(dp_cohort, in_force_ro) * k_corr
                k_chain = in_force_train_s + in_force_sync_s(current)
                drain_s = async_drain_s(k_roll, k_chain, min(in_force_ro.throughput_s * k_corr, k_roll),
                                        k_cohort if k_cohort == k_cohort else k_roll, k_async, None if in_flight is None else True)
        in_force_instances = tuple(current.instances) if current is not None else ()

        def price(n_train: int, cfg: TrainConfig, train_time_s: float, ro: RolloutChoice) -> Candidate | None:
            """The best allowed loop for training ``cfg`` on ``n_train`` GPUs and rollout ``ro``."""
            corr = correction.factor(len(ro.layout.tps))
            ro_s = ro.makespan_s * corr  # the model's prediction times what past steps measured against it
            # async continuous generation: the engines' pace at full batches (None: the batch loop,
            # whose makespan stands in, ``step_time``), the staleness cycle and the rollout alone
            # (what a shared rollout is mixed from, ``libra.planner.pipeline``), all times what
            # async steps measured against the model's shared rollout (``pipelined_factor``)
            pipe = correction.pipelined
            load_s = ro.throughput_s * corr * pipe if continuous else None
            k = k_async
            waves = self._waves(dp_cohort, ro)  # the cycle's floor in KV waves, for its price and its tails'
            cohort_raw = self._cohort_s(dp_cohort, ro, waves) if dp_cohort is not None else None
            cohort_s = cohort_raw * corr * pipe if cohort_raw is not None else None
            tails_s = tails_of(ro) * corr  # the rollout per tail scenario
            tails_cohort = (np.maximum(self._tail_makespans(tail_cohort_dps, ro, cohort_raw), tails_of(ro) * waves)
                            * corr * pipe if cohort_raw is not None and tail_cohort_dps
                            else np.full(len(tails_s), np.nan if cohort_s is None else cohort_s))
            # a two-bucket layout must win clearly against every one-bucket plan, not only those
            # on its own GPU budget (the DP's rule): ranked with its rollout that much slower
            split_margin = correction.margin(len(ro.layout.tps))
            sync = weight_sync_s(self.step_costs, self.cluster, n_train, cfg, ro.instances)
            train_s = train_time_s + fixed
            best_c: Candidate | None = None
            per_loop: dict[str, float] = {}
            for mode, streaming in loops:
                if streaming and not stream_holds(cfg):
                    continue  # nothing settles a streamed step: its knobs must hold a longer batch
                shared = pipe if mode == "async" and continuous else 1.0
                if streaming:
                    base = streaming_step_s(ro_s, train_s, sync, finals, self.options.mini_batches, ready, ready_fraction)
                else:
                    base = step_time(mode, ro_s * shared, train_s, sync, load_s, k, cohort_s, left)
                robust = float(np.mean([
                    expected_step_s(mode, streaming, float(r) * split_margin * shared, train_s, sync, finals, self.options.mini_batches, sigma,
                                    ready, None if load_s is None else load_s * split_margin, k,
                                    None if cohort_s is None else float(co) * split_margin, ready_fraction, left)
                    for r, co in zip(tails_s, tails_cohort)]))
                per_loop[loop_name(mode, streaming)] = float(base)
                # leaving async for a sync loop costs no wait of its own: the sync step starts when
                # the in-force step has synced, the time an async step would have waited for it
                # too (``Planner.search`` prices both loops from that step's end; docs/policy-core.md)
                trans = transition_s(self.step_costs, self.cluster, current, n_train, cfg, ro.instances, mode, in_force_train_s)
                if mode == "async" and drain_s > 0.0 and tuple(ro.instances) != in_force_instances:
                    trans += drain_s
                st = base + trans / amortize
                c = Candidate(n_train, cfg, train_s, ro, sync, trans, st, mode=mode, streaming=streaming, mode_step_s=per_loop,
                              robust_s=float(robust) + trans / amortize, rollout_factor=corr,
                              cohort_s=float("nan") if cohort_s is None else cohort_s / corr / pipe)
                if best_c is None or c.rank() < best_c.rank():
                    best_c = c
            return best_c

        def visit(grid: list[int]) -> None:
            visited.update(grid)
            # per budget, the layout best on the nominal statistics and the one best on average
            # over the tail scenarios (``RolloutDP.best(tails=...)``), both priced: the nominal one
            # may run async continuous generation at a better pace, the other holds a tail the
            # window has not shown at a higher TP
            rollout = {n: dp.best(N - n, correction.dp_scale) for n in grid}
            hedged = {n: dp.best(N - n, correction.dp_scale, tails=tail_dps) for n in grid}
            # async: and the layout best for the staleness cycle's K + 1 steps in flight together,
            # where it differs (``cycle_layout_offered``)
            cycle = {n: self._on_step(dp, dp_cohort.best(N - n, correction.dp_scale)) for n in grid
                     if dp_cohort is not None and rollout[n] is not None and self.cycle_layout_offered(dp_cohort, rollout[n])}
            for n_train in self._visit_order([n for n, r in rollout.items() if r is not None], rollout, tokens, seq, seq_max):
                choices = distinct_choices(rollout[n_train], hedged[n_train], cycle.get(n_train))
                best_n: Candidate | None = None
                for ro in choices:
                    incumbent = state["incumbent"] if bound else float("inf")  # the best rank key so far (expected step time)
                    # every loop's expected step is at least that
                    ro_robust = float(min(ro.makespan_s, tails_of(ro).mean()) * correction.factor(len(ro.layout.tps)) * factors.mean())
                    if continuous and any(m == "async" for m, _ in loops):  # async generates continuously: throughput, or the pipeline's share
                        k_floor = max(1, self.options.max_staleness) + 1
                        ro_robust = min(ro_robust, max(ro_robust * ro.throughput_s / ro.makespan_s if ro.makespan_s > 0 else 0.0, ro_robust / k_floor)
                                        * min(1.0, correction.pipelined))
                    # bound: what the training stage may still take for this split to beat the incumbent
                    budget = incumbent - (0.0 if overlap else ro_robust) - fixed
                    if budget <= 0 or ro_robust >= incumbent:
                        state["skipped"] += 1
                        continue
                    tree = self.tree.best(n_train, tokens, seq, seq_max, budget_s=budget)
                    state["last_tree"] = tree
                    if tree.best is None:
                        state["skipped"] += tree.budget_s != float("inf")
                        continue
                    best_c = price(n_train, tree.best, tree.best_time_s, ro)
                    if best_c is not None and (best_n is None or best_c.rank() < best_n.rank()):
                        best_n = best_c
                if best_n is not None:
                    cands.append(best_n)
                    state["incumbent"] = min(float(state["incumbent"]), best_n.rank()[0])

        # the plan in force, kept as it is (its training strategy and its instances, no
        # transition), is always a candidate while it still fits: the tree's best strategy for
        # the same split may differ from it by a hair, and a search that only offered that one
        # priced "stay" as a re-shard (30B-A3B on 64 B200: 6.7 s, where moving elsewhere cost 3.9 s
        # and was taken for a 1% forecast gain, SIMULATED)
        # (``kept``, above) with its micro-batch and recompute re-chosen for the forecast batch
        # (``kept_train``): each step settles them for its own batch (``libra.planner.settle``),
        # so staying is priced as the simulator will run it, not with a prior's knobs (held_out_13
        # FireAct HotpotQA, 40 B200, K=0: the kept split was priced at 6.5 s of training that ran
        # 1.9 s settled, and Libra moved, paying a 3.6 s re-shard, SIMULATED)
        if kept is not None and current is not None and current.colocated:
            if self.options.sync_allowed and self.options.colocated and self.options.streaming is not True:
                assert kept_train is not None
                c = self._colocated(dp, tokens, seq, seq_max, current, float("inf"), fixed, correction, amortize,
                                    keep=(kept, kept_train[0]), tail_dps=tail_dps)
                if c is not None:
                    cands.append(c)
            kept = None
        if kept is not None:
            assert current is not None and kept_train is not None
            c = price(current.n_train_gpus, kept_train[0], kept_train[1], kept)
            if c is not None:
                cands.append(c)
                state["incumbent"] = min(float(state["incumbent"]), c.rank()[0])

        coarse = self.options.unit is None and coarse_unit(N, self.cluster.gpus_per_node)
        if coarse:
            visit(self._capped(split_counts(N, coarse)))
            fine = train_unit(N, self.cluster.gpus_per_node)
            if cands:
                centre = min(cands, key=Candidate.rank).n_train
                visit([k for k in self._capped(split_counts(N, fine, centre - coarse + 1, centre + coarse)) if k not in visited])
        else:
            visit(self.n_train_grid())
        if self.options.sync_allowed and self.options.colocated and self.options.streaming is not True:
            # the time-shared plan on the nominal best layout and, where it differs, on the tail
            # scenarios' (as ``visit``)
            layouts = distinct_choices(dp.best(N, correction.dp_scale), dp.best(N, correction.dp_scale, tails=tail_dps))
            cos = [self._colocated(dp, tokens, seq, seq_max, current, float(state["incumbent"]) if bound else float("inf"),
                                   fixed, correction, amortize, tail_dps=tail_dps, rollout=r)
                   for r in layouts]
            co = min((c for c in cos if c is not None), key=Candidate.rank, default=None)
            if co is not None:
                cands.append(co)
        skipped = int(state["skipped"])
        last_tree = state["last_tree"]
        if not cands:
            raise UserError(self._why_nothing_fits(stats, seq_max, last_tree))
        best = stay_within_tolerance(choose(cands, self.options.max_staleness >= 1, filling), cands, current)
        if len(best.rollout.layout.tps) > 1:  # its forecast gain, checked after the step ran (``observe``)
            best = replace(best, one_bucket_rollout_s=dp.best_one_bucket_s(best.rollout.n_gpus))
        return SearchResult(best, cands, stats, dp.hits - hits0, dp.misses - miss0, skipped, stats_spec=None if history else spec,
                            drain_s=drain_s)

    def kept_knobs(self, train: TrainConfig, tokens: int, seq: int, memory: int) -> tuple[TrainConfig, float]:
        """The plan in force's training ``train`` with the micro-batch and recompute the step
        will settle for a batch of ``tokens`` / ``seq`` holding ``memory`` tokens
        (``libra.planner.settle.settled_knobs``: ``best_knobs``, or a strategy holding the forecast
        batch's longest sequence, ``memory``, when those knobs cannot; the user's
        ``micro_batch`` pin kept), and its time."""
        return settled_knobs(self.tree, train, tokens, seq, memory, memory, self.options.micro_batch)

    def tree_time(self, cfg: TrainConfig, tokens: int, seq: int) -> float:
        """The training stage of ``cfg``, exactly as the decision tree times its leaves."""
        return float(training_time_fn(self.step_costs, tokens, seq, self.options.kl)(cfg))

    def cycle_layout_offered(self, dp_cohort: RolloutDP, one_step: RolloutChoice) -> bool:
        """Whether an async budget is also priced with the rollout layout best for the staleness
        cycle (``dp_cohort``: K + 1 steps' trajectories at once), beside ``one_step`` (the layout
        best for one step alone). Always at K = 1; at K >= 2 only where ``one_step`` does not hold
        the cycle's parked KV (``RolloutDP.evicts``, tool KV kept).

        Why: the async price mixes the rollout alone and the cycle (``libra.planner.pipeline``),
        but a budget offered only one step's best layout never prices the layout the overlap
        wants. At K = 1 two steps share the engines most of the time, and the one-step layout
        (larger instances, a shorter lone critical path) lost to more, smaller instances:
        InterCode SQL on 44 B200 / Qwen3-32B ran 0.886x of the hindsight split (24:20 at TP 4 x 6;
        TP 2 x 12 replays 68.7 s a step against 76.3), MINT on 68 GB200 0.919x, Terminal-Bench on
        96 A800 0.814x (held_out_36, SIMULATED). Offered at every budget at K = 1 these ran
        0.984x, 0.999x and 0.988x; the K = 1 rows of held_out_34/35/36 replayed lost 10/12/14
        times before and 9/9/12 after (27 of 315 rows moved: 17 up, 10 down, the worst
        reflexion-hotpotqa/b200-28-14b/K1 0.956 -> 0.904x; never_loses: one row moved, 1.227x ->
        1.218x). Nearly all of it is the launch's layout: offered only once steps were measured,
        24 of the 27 rows ran as before. At K = 2 the cycle is three steps
        fully overlapped, which a staggered pipeline reaches only in its fill; offered there too,
        5 of the 6 K = 2 rows it changed ran slower (search-ee/b200-44-32b/K2 0.983 -> 0.929x:
        12 TP-1 instances for 16 TP-2; math-d/b200-76-l8b/K2 0.986 -> 0.943x), the small
        instances the load model over-rates at high concurrency. Where the one-step layout
        evicts the cycle's parked KV the cycle's layout is offered at every K (it is what holds
        them)."""
        if self.options.max_staleness <= 1:
            return True
        return self.options.tool_kv == "keep" and dp_cohort.evicts(one_step.layout, one_step.counts)

    @staticmethod
    def _on_step(dp: RolloutDP, ro: RolloutChoice | None) -> RolloutChoice | None:
        """``ro`` (chosen on other statistics: the staleness cycle's) predicted on ``dp``'s, one
        step's; None when there is no choice or ``dp`` cannot hold its layout."""
        if ro is None or not dp.feasible(ro.layout):
            return None
        return dp.choice_for(ro.layout, list(ro.counts), ro.instances, ro.buckets, ro.n_gpus)

    @staticmethod
    def _cohort_s(dp: RolloutDP, ro: RolloutChoice, waves: float | None = None) -> float:
        """The model's makespan of ``ro``'s layout running the staleness cycle's K + 1 steps at
        once (``dp`` holds their statistics); NaN when the layout cannot hold them. Under step
        priority at least ``ro``'s rollout alone times the waves the cycle's parked KV needs
        (``RolloutDP.waves``; ``waves``: that number when the caller has it): the newer step's
        turns wait for the KV the older one frees."""
        if not ro.counts or min(ro.counts) < 1 or not dp.feasible(ro.layout):
            return float("nan")
        cycle = dp.choice_for(ro.layout, list(ro.counts), ro.instances, ro.buckets, ro.n_gpus).makespan_s
        return max(cycle, ro.makespan_s * (Planner._waves(dp, ro) if waves is None else waves))

    @staticmethod
    def _waves(dp: RolloutDP | None, ro: RolloutChoice) -> float:
        """``RolloutDP.waves`` of ``ro``'s layout on the cycle's DP (1 without one or counts)."""
        if dp is None or not ro.counts or min(ro.counts) < 1:
            return 1.0
        return dp.waves(ro.layout, list(ro.counts))

    @staticmethod
    def _tail_makespans(dps: Sequence[RolloutDP], ro: RolloutChoice, nominal: float) -> np.ndarray:
        """``ro``'s layout and counts re-predicted on each tail scenario's statistics
        (``TAIL_SCENARIOS``); ``nominal`` where there are no scenarios or no counts. A scenario
        whose tail does not fit the layout's KV (its rows ask a context the layout cannot hold:
        a prior stretched long, a runaway extrapolated beyond the window) is priced at least at
        ``nominal``: not holding the tail never makes the layout faster."""
        if not dps:
            return np.asarray([nominal], np.float64)
        if not ro.counts or min(ro.counts) < 1:
            return np.full(len(dps), nominal, np.float64)
        return np.asarray([d.scenario_makespan(ro.layout, ro.counts, nominal) for d in dps], np.float64)

    def _kept(self, current: Plan | None, dp: RolloutDP, seq_max: int, provisional: bool = False) -> RolloutChoice | None:
        """The in-force plan's rollout, re-predicted on the new statistics, when the plan can be
        kept as it is: a plan (split or time-shared on the whole cluster) whose training still
        fits in memory at ``seq_max`` and whose layout still holds the expected contexts; else None.
        ``provisional``: nothing has trained yet (no step measured), so the run's first training
        settles the layout for its batch (``first_layout``, which moves a layout that does not
        hold it) and the prior's memory is not checked (``_launch_layout``)."""
        if current is None or not current.instances or not current.buckets:
            return None
        if current.n_train_gpus < 1:
            return None
        if not current.colocated and current.n_rollout_gpus + current.n_train_gpus != self.cluster.n_gpus:
            return None
        if current.colocated and (current.n_rollout_gpus != self.cluster.n_gpus or current.n_train_gpus > self.cluster.train_gpu_cap):
            return None
        if current.n_train_gpus > self.cluster.train_gpu_cap:
            return None
        if not provisional or current.colocated or current.streaming:
            # the layout must hold it, not the plan's knobs: micro-batch and recompute move
            # nothing and each step settles them for its batch (``kept_knobs`` re-chooses them
            # below), so a layout whose lightest knobs hold ``seq_max`` can be kept. Checking the
            # plan's own knobs dropped the plan in force whenever a longer sequence came, and the
            # search had to move: FireAct multitask on 36 H100 / Qwen3-32B, K=1, left 12:24
            # (TP 4 x PP 2 x DP 3 at micro-batch 4, 1,536 tokens) for 8:28 at a 4.7 s re-shard,
            # 0.92x of areal-static-optimal (held_out_35, SIMULATED). A streamed step runs its
            # plan's knobs (nothing settles it): those must hold it.
            held = current.train if current.streaming else replace(
                current.train, micro_batch=self.options.micro_batch or 1, recompute=True)
            try:
                rep = memory_report(self.ev, held, seq_max)
            except ValueError:
                return None
            if not bool(getattr(rep, "fits", rep)):
                return None
        return self._in_force_rollout(current, dp)

    @staticmethod
    def _in_force_rollout(current: Plan, dp: RolloutDP) -> RolloutChoice | None:
        """``current``'s rollout layout re-predicted on ``dp``'s statistics, whether or not its
        training still fits (``_kept`` checks that); None when the layout cannot hold them."""
        if not current.instances or not current.buckets:
            return None
        layout, counts = plan_layout(current)
        if len(layout.bounds) != len(layout.tps) - 1 or min(counts) < 1 or not dp.feasible(layout):
            return None
        return dp.choice_for(layout, counts, current.instances, current.buckets, current.n_rollout_gpus)

    def _colocated(self, dp: RolloutDP, tokens: int, seq: int, seq_max: int, current: Plan | None, incumbent: float,
                   fixed: float = 0.0, correction: RolloutCorrection | None = None, amortize: float | None = None,
                   keep: tuple[RolloutChoice, TrainConfig] | None = None, tail_dps: Sequence[RolloutDP] = (),
                   rollout: RolloutChoice | None = None) -> Candidate | None:
        """The time-shared candidate (synchronous mode): rollout on all N GPUs, then training on
        all N (or on as many as the training backend can use, ``ClusterSpec.train_gpu_cap``; the
        rest wait), each GPU switching stage twice per step and the weights handed over through
        CUDA IPC (``StepCosts.colocated_overhead_s``: engine sleep + trainer onload, trainer
        offload + engine wake at the largest instance TP, the IPC sync), plus the per-sample
        bookkeeping ``fixed``. ``keep``: the in-force time-shared plan's rollout and training
        strategy, priced as they are (the candidate of not changing). ``rollout``: the rollout
        layout to price (the search passes the DP's nominal best and its best over the tail
        scenarios ``tail_dps``); None: the DP's nominal best. Leaving an async split for it costs
        its transition only (no wait for the in-force training: the search's leave-async note)."""
        N = self.cluster.n_gpus
        amortize = self.options.amortize_steps if amortize is None else amortize
        correction = correction or RolloutCorrection()
        ro = keep[0] if keep is not None else rollout if rollout is not None else dp.best(N, correction.dp_scale)
        if ro is None:
            return None
        corr = correction.factor(len(ro.layout.tps))
        ro_s = ro.makespan_s * corr
        tails_s = self._tail_makespans(tail_dps, ro, ro.makespan_s) * corr  # the expected rollout over ``TAIL_SCENARIOS``
        ro_robust = float(tails_s.mean() * correction.margin(len(ro.layout.tps)) * rollout_factors(self.options.rollout_sigma).mean())
        if ro_robust >= incumbent:
            return None
        if keep is not None:
            cfg, train_time = keep[1], self.tree_time(keep[1], tokens, seq)
            n_train = cfg.n_gpus
            switch = self.step_costs.colocated_overhead_s(cfg, ro.instances)
        else:
            # the strategy with the least training time plus stage switches: the switches move
            # the training state on and off every GPU, so they depend on the strategy (ZeRO-2
            # against ZeRO-3 for Qwen3-30B-A3B on 32 B200: 4.8 s of training and 41.9 s of
            # switches against 5.8 s and 24.7 s; ranked by training time alone the time-shared
            # plan was priced 16 s a step too slow and a streamed split won the first step of
            # the bundled math trace's steps 30-34, 148 s a step against 137 s, SIMULATED)
            n_train, tree = self._colocated_train(tokens, seq, seq_max)
            if tree is None:
                return None
            priced = [(t + self.step_costs.colocated_overhead_s(c, ro.instances), t, c) for t, c in tree.ranked]
            total, train_time, cfg = min(priced, key=lambda x: x[0])
            switch = total - train_time
        trans = transition_s(self.step_costs, self.cluster, current, n_train, cfg, ro.instances)
        train_s = train_time + fixed
        base = ro_s + train_s + switch
        st = base + trans / amortize
        return Candidate(n_train, cfg, train_s, ro, switch, trans, st, colocated=True, mode_step_s={"sync": base},
                         robust_s=ro_robust + train_s + switch + trans / amortize, rollout_factor=corr)

    def _colocated_train(self, tokens: int, seq: int, seq_max: int) -> tuple[int, TreeResult | None]:
        """The GPU count a time-shared plan trains on, and its decision tree: every GPU the
        training backend can use (``ClusterSpec.train_gpu_cap``) when a strategy there holds
        ``seq_max``, else the most GPUs below it, on the split grid's counts, where one does (the
        rest roll out with the others and wait through the training; their engines get the
        weights pushed, ``StepCosts.colocated_sync_s``). None: no count holds it.

        Why: a count that factors badly holds less than a smaller one. On 44 A800s no Qwen3-32B
        strategy on all 44 (TP at most 4 there) holds the 64K-token sequences of an undeclared
        kind's default prior, while 40 (TP 8 x DP 5) and the splits' 32 do; the time-shared class
        then had no price in that scenario, dropped out of the launch hedge, and the launch ran
        an async split that the measured steps moved to time-shared at step 2 (InterCode SQL and
        MINT, K = 1: 0.934x and 0.944x of verl-colocated, held_out_39, SIMULATED)."""
        cap = self.cluster.train_gpu_cap
        tree = self.tree.every_leaf(cap, tokens, seq, seq_max)
        if tree.best is not None or not self.options.colocated_subset:
            return cap, (tree if tree.best is not None else None)
        # which counts hold it, from the bounded walk the split loop has mostly memoized already;
        # the full walk (every leaf, for the switch-aware pick) only for the count taken
        for n in sorted((k for k in self.n_train_grid() if k < cap), reverse=True):
            if self.tree.best(n, tokens, seq, seq_max).best is not None:
                return n, self.tree.every_leaf(n, tokens, seq, seq_max)
        return cap, None

    def _visit_order(self, grid: list[int], rollout: dict[int, RolloutChoice | None], tokens: int, seq: int, seq_max: int) -> list[int]:
        """Splits in the order the outer loop visits them: a good incumbent early makes the
        bound cut more. The middle split first, then by predicted rollout time plus a training
        time extrapolated as inversely proportional to the GPU count from the middle split."""
        if not grid:
            return []
        mid = grid[len(grid) // 2]
        probe = self.tree.best(mid, tokens, seq, seq_max)
        t_mid = probe.best_time_s if probe.best is not None else 0.0
        if t_mid == float("inf"):
            t_mid = 0.0

        def guess(n: int) -> float:
            r = rollout[n]
            rs = r.makespan_s if r is not None else float("inf")
            ts = t_mid * mid / n
            return max(rs, ts) if overlap else rs + ts

        overlap = any(m == "async" or st for m, st in self.options.loop_modes())

        return [mid] + sorted((n for n in grid if n != mid), key=lambda n: (guess(n), n))

    def plan(self, history: Sequence[StepArrays], prompt_tokens: np.ndarray | None, current: Plan | None = None) -> Plan:
        """The next step's plan (see ``search``), with its predictions."""
        res = self.search(history, prompt_tokens, current)
        return self.to_plan(res)

    def to_plan(self, res: SearchResult) -> Plan:
        """A ``Plan`` from a search result (predictions and the search's summary in ``notes``)."""
        c = res.best
        return Plan(
            n_rollout_gpus=self.cluster.n_gpus if c.colocated else self.cluster.n_gpus - c.n_train,
            n_train_gpus=c.n_train,
            colocated=c.colocated,
            train=c.train,
            instances=c.rollout.instances,
            buckets=c.rollout.buckets,
            mode=c.mode,
            max_staleness=self.options.max_staleness if c.mode == "async" else 0,
            streaming=c.streaming,
            predicted_rollout_s=c.rollout_s,
            predicted_train_s=c.train_s,
            predicted_step_s=c.step_s,
            stagger_fill=c.stagger_fill,
            notes={
                "planner": "libra",
                "model_rollout_s": c.rollout.makespan_s,  # the load model's, before the measured correction
                **({"one_bucket_model_rollout_s": float(c.one_bucket_rollout_s)} if c.one_bucket_rollout_s == c.one_bucket_rollout_s else {}),
                "rollout_factor": c.rollout_factor,
                **self.calibration.summary(),
                "rollout_load_s": c.rollout.load_s,
                "rollout_throughput_s": c.rollout.throughput_s,
                "rollout_cohort_s": c.cohort_s,
                "rollout_critical_path_s": c.rollout.critical_path_s,
                "bucket_times_s": list(c.rollout.bucket_times_s),
                "sync_s": c.sync_s,  # weight push; for a colocated plan, the two stage switches + the IPC sync
                "transition_s": c.transition_s,
                "loop": c.loop,
                "staleness_class": self.options.max_staleness,
                "loop_step_s": dict(c.mode_step_s),  # every allowed loop's predicted step for this split
                "stats_digest": res.stats.digest,
                "from_prior": res.stats.from_prior,
                "candidates": len(res.candidates),
                "splits_cut_by_bound": res.skipped,
                "dp_memo_hits": res.dp_hits,
                # a hedged first step: the launched plan's worst-case regret over the prior
                # scenarios (``SearchResult.launch_regret``; ``LibraPolicy`` and ``libra-sim plan`` read it, ``libra.planner.assumed_cap``)
                **({"hedge_regret": float(res.launch_regret)} if res.launch_regret == res.launch_regret else {}),
                # and how many training GPU counts a split could run there (1: forced by memory)
                **({"holding_splits": int(res.holding_splits)} if res.holding_splits >= 0 else {}),
            },
        )

    def _why_nothing_fits(self, stats: WorkloadStats, seq_max: int, tree: TreeResult | None) -> str:
        n = self.cluster.n_gpus
        name = f"{self.cluster.model} on {n} x {self.cluster.gpu}"
        if not self.table.usable_tps:
            return f"{name}: the model's weights do not fit a rollout instance even at TP {max(self.tps)}; use a GPU with more memory or a smaller model"
        if n < 2:
            return f"{name}: a split cluster needs at least 2 GPUs (one for rollout, one for training)"
        biggest = max(self.n_train_grid(), default=0)
        if biggest:
            tp = max(t for t in self.tps if t <= biggest)
            pp = max(p for p in pp_degrees(self.ev.model) if tp * p <= biggest)
            dp = max(1, biggest // (tp * pp))
            cfg = TrainConfig(tp=tp, pp=pp, dp=dp, zero_stage=3 if dp > 1 else 1, recompute=True)
            try:
                rep = memory_report(self.ev, cfg, seq_max, suggest=True)
                if not getattr(rep, "fits", True):
                    line = report_line(rep, str(cfg))
                    if "no strategy" in line:  # no GPU count helps: activations grow with seq alone
                        return (f"{name}: training sequences of {seq_max} tokens fit no TP/PP/DP strategy ({line}); "
                                f"plan from a trace with shorter sequences (--trace), or use a GPU with more memory "
                                f"(context parallelism is not modelled)")
                    if self.cluster.train_gpu_cap < n:
                        return self._cap_too_small(name, stats, biggest, line)
                    return f"{name}: training does not fit on {biggest} GPUs ({line}); use more GPUs or a bigger GPU"
            except ValueError:
                pass
        kv = max(self.table.kv_capacity.values())
        if stats.tail_context > kv:
            return (f"{name}: the longest expected trajectory ({stats.tail_context} tokens) exceeds any rollout instance's KV cache "
                    f"({kv} tokens at the best TP); use a GPU with more memory")
        why = tree.why_none() if tree is not None else "no candidate"
        if self.cluster.train_gpu_cap < n:
            return self._cap_too_small(name, stats, biggest, why)
        return f"{name}: no split fits ({why}); use more GPUs or a bigger GPU"

    def _cap_too_small(self, name: str, stats: WorkloadStats, cap: int, why: str) -> str:
        """The message when the training backend's device limit is what makes nothing fit: the
        smallest training GPU count above it that has a fitting strategy (what would work)."""
        tokens, seq, seq_max = self.train_shape(stats)
        n = self.cluster.n_gpus
        unit = self.options.unit or train_unit(n, self.cluster.gpus_per_node)
        for k in sorted({*split_counts(n, unit), n}):
            if k <= cap:
                continue
            best = self.tree.best(k, tokens, seq, seq_max).best
            if best is not None:
                return (f"{name}: training fits no strategy on the {cap} device(s) the training backend can use "
                        f"(max_train_gpus {self.cluster.max_train_gpus}: {why}); it needs {k} (e.g. tp={best.tp} pp={best.pp} "
                        f"dp={best.dp} zero={best.zero_stage}): use a backend that runs {k} devices (libra-run --trainer deepspeed) "
                        f"or raise the limit (libra-sim --max-train-gpus {k})")
        return (f"{name}: training fits no strategy on the {cap} device(s) the training backend can use "
                f"(max_train_gpus {self.cluster.max_train_gpus}: {why}), nor on all {n}; use more GPUs or a bigger GPU")


@dataclass
class Replanner:
    """When to search again. ``policy`` "every-step" searches every step (the transition charge
    keeps the plan stable unless a change pays); "drift" searches only when the length
    distribution moved by more than ``threshold`` (``WorkloadStats.drift``) since the plan in
    force was made, or when the prompt count changed."""

    planner: Planner
    policy: str = "every-step"
    threshold: float = 0.15
    current: Plan | None = None
    _stats: WorkloadStats | None = field(default=None, repr=False)
    replans: int = 0
    #: steps planned so far (one plan per step): those whose rollout has not ended are the
    #: steps planned less the completed steps the history holds (``Planner.search``'s
    #: ``rollouts_in_flight``)
    planned: int = 0

    def plan(self, history: Sequence[StepArrays], prompt_tokens: np.ndarray | None) -> Plan:
        """The plan for the next step: the current one, or a new search (see the class doc).

        A plan asked for before any step's rollout has finished (at K >= 1 the next step is
        planned while the first rolls out), while a plan made from the prior is in force, is that
        plan: nothing has been measured since, and a second search of the same prior chose
        differently only where the first plan's launch-time choices (``Planner._launch_layout``)
        do not apply, which then cost a transition for nothing. Seen: FireAct HotpotQA on 64 A800
        with Qwen3-30B-A3B, K=1 (held_out_29): the launch layout trained step 0 in 0.73 s; step
        1's plan, from the same prior, moved to the prior's layout (3.3 s re-shard, then 2.0 s a
        step against the hindsight split's 1.0 s; 0.933x, SIMULATED). Unless the step brings fewer
        prompts than the plan's training has data-parallel ranks (it could not feed them)."""
        current = self.current
        in_flight = max(0, self.planned - len(history))
        self.planned += 1
        # a plan kept for the next step keeps everything but the fill's choice: only the
        # pipeline's first step rolls out alone (``Plan.stagger_fill``); copied, the next one
        # would hold the step after it too, beyond the staleness gate the fill was priced with
        if (not history and current is not None and current.notes.get("from_prior")
                and (prompt_tokens is None or len(prompt_tokens) >= current.train.dp)):
            return replace(current, stagger_fill=False, notes={**current.notes, "replanned": False})
        if self.current is not None and self.policy == "drift" and self._stats is not None:
            stats = compute_stats(history, prompt_tokens, window=self.planner.options.window, prior=PriorSpec.of(self.planner.cluster))
            if stats.n_trajectories == self._stats.n_trajectories and stats.drift(self._stats) <= self.threshold:
                return replace(self.current, stagger_fill=False, notes={**self.current.notes, "replanned": False})
        res = self.planner.search(history, prompt_tokens, self.current, rollouts_in_flight=in_flight)
        self._stats = res.stats
        self.replans += 1
        plan = self.planner.to_plan(res)
        plan = replace(plan, notes={**plan.notes, "replanned": True})
        self.current = plan
        return plan
