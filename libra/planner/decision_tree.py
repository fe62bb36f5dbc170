"""The decision tree for training: every valid parallel strategy for ``n`` GPUs, pruned, ranked.

Levels, top to bottom (each level's choices depend only on the levels above it):

1. **TP** (tensor parallel): 1..NVLink domain. Kept if it divides ``n`` and passes the cost
   model's one TP rule (``cost_models.memory.tp_rule``): inside one NVLink domain and dividing
   it (the node on HGX boards; 72 GPUs on GB200 NVL72, where a group spans trays), dividing the
   attention heads, and dividing the KV heads or being a multiple of them (KV heads are then
   replicated, as the cost model does).
2. **PP** (pipeline): ``cost_models.memory.pp_degrees`` (the layer count's divisors and the powers
   of two; uneven stages as Megatron allows, the heaviest charged) with ``TP * PP`` dividing ``n``.
3. **DP** = ``n / (TP * PP)``: determined, no choice.
4. **EP** (MoE only, else 1): divides the expert count and ``TP x DP`` (Megatron's MoE parallel
   folding with ETP = 1: the MoE layers re-fold a stage's TP x DP ranks as EP x expert-DP,
   ``cost_models.memory.ep_rule``), so TP 2 with EP 8 runs on 32 GPUs at any PP.
5. **Micro-batch** in ``MICRO_BATCHES``: kept if the step has at least ``DP * micro_batch``
   sequences (else some DP rank would get no data).
6. **Recompute** off/on and **ZeRO stage** 1/2/3, with *dominance pruning* on recompute only:
   recompute is tried only when nothing fits without it (it adds a forward pass and saves
   nothing else). Every fitting ZeRO stage is ranked: which is fastest depends on the cost
   model's communication and optimizer-step terms (with this project's model ZeRO-3 can beat
   ZeRO-1 through a smaller optimizer step; the brute-force test caught an earlier "lowest stage
   wins" rule). With DP = 1 ZeRO shards nothing, so only stage 1 is listed.

Every leaf is checked against the memory model (``train_memory(strategy, seq_len).fits``, at the
LONGEST sequence the step is expected to train on) and the cost model's own validation; each
pruned leaf keeps its reason. Survivors are ranked by predicted time of one RL training stage:
the old-policy log-prob forward pass plus one optimizer step over the step's tokens
(``forward_s + train_iter_s``, at the MEAN sequence length), plus a reference-model forward when
a KL term is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libra.planner.costs import CostModel, nvlink_domain, pp_degrees, tp_rule, valid_ep_degrees
from libra.planner.plan import TrainConfig
from libra.planner.step_costs import StepCosts

MICRO_BATCHES: tuple[int, ...] = (1, 2, 4)
ZERO_STAGES: tuple[int, ...] = (1, 2, 3)


@dataclass(frozen=True)
class Pruned:
    """A strategy (or a whole subtree, when ``config`` is partial) cut from the tree, and why."""

    what: str
    reason: str


@dataclass
class TreeResult:
    """The ranked survivors (fastest first) and everything pruned on the way."""

    n_gpus: int
    ranked: list[tuple[float, TrainConfig]] = field(default_factory=list)
    pruned: list[Pruned] = field(default_factory=list)
    budget_s: float = float("inf")  # leaves no faster than this were cut (see enumerate_strategies)

    @property
    def best(self) -> TrainConfig | None:
        return self.ranked[0][1] if self.ranked else None

    @property
    def best_time_s(self) -> float:
        return self.ranked[0][0] if self.ranked else float("inf")

    def why_none(self) -> str:
        """One line saying why nothing fits (the most informative memory reason)."""
        mem = [p.reason for p in self.pruned if p.reason.startswith("memory")]
        if mem:
            return mem[-1]
        return self.pruned[-1].reason if self.pruned else f"no strategy for {self.n_gpus} GPUs"


#: Memory lengths (tokens) are checked in steps of at most this many: the strategy memos are
#: keyed by them, so nearby sequences share one entry.
MEMORY_GRAIN = 256
#: ... and of at most 1/2**MEMORY_GRAIN_BITS of the length itself (``memory_grain``).
MEMORY_GRAIN_BITS = 4


def memory_grain(tokens: float) -> int:
    """``tokens`` rounded up to the sequence length a memory check is made at (every caller
    rounds the same way, so their memo keys meet): a whole ``MEMORY_GRAIN`` (256 tokens), or for
    sequences under 4K tokens the power of two that is at most 1/16 of the length (at least 16).

    Why relative below 4K: the simulator checks a training's memory at the batch's longest
    sequence itself, and rounding a 575-token sequence up to 768 (a third more activations)
    ruled out the strategies without recompute that hold it: ToRA GSM8K on 30 H200 /
    Llama-3.1-70B trained with recompute on, 19.0 s against 16.7 s a step, where the hindsight
    baseline ran without (held_out_51, K=1, SIMULATED)."""
    n = max(1, math.ceil(tokens))
    grain = min(MEMORY_GRAIN, max(16, 1 << max(0, n.bit_length() - 1 - MEMORY_GRAIN_BITS)))
    return int(-(-n // grain) * grain)


def sequence_count(tokens: int, seq_len: int) -> int:
    """How many sequences a step of ``tokens`` tokens at mean length ``seq_len`` trains on, at
    least one (the DP x micro-batch rule's input): ``tokens / (seq_len - 1/2)`` floored, which is
    the exact count when ``seq_len`` is ``tokens / n`` rounded to a whole token (as
    ``Planner.train_shape`` and ``libra.planner.settle.batch_shape`` round it; exact while
    ``tokens > n**2``), and the floor of a fractional mean count otherwise.

    Why not the plain floor: the rounded mean lands ``tokens / seq_len`` just under the count as
    often as just over it, and with three trajectories a step (ToolBench DFSDT on 30 H200 /
    Llama-3.1-70B, K=0, held_out_51) 38,912 tokens at a mean of 12,971 counted two: the rule cut
    every DP-3 strategy, the only ones on 30 GPUs that hold the log's 44,924-token sequence, and
    the planner stopped the run where verl-colocated trained it at TP 2 x PP 5 x DP 3. Why not
    rounded: a forecast of 21.6 sequences a step then fed DP 22, and the steps with 21 left a
    rank without data (verl-colocated on OpenHands CodeAct, 44 H100 / Llama-3.1-70B, trained at
    TP 2 x DP 22 in 8.4 s a step where TP 4 x DP 11 takes 6.2 s; held_out_52, SIMULATED)."""
    if seq_len <= 1:
        return max(1, int(tokens))
    return max(1, int(tokens / (seq_len - 0.5)))


def _describe(tp: int, pp: int, dp: int, ep: int = 1, zero: int | None = None, mb: int | None = None, rc: bool | None = None) -> str:
    s = f"tp={tp} pp={pp} dp={dp} ep={ep}"
    if mb is not None:
        s += f" mb={mb}"
    if zero is not None:
        s += f" zero={zero}"
    if rc is not None:
        s += f" recompute={rc}"
    return s


def enumerate_strategies(
    ev: CostModel,
    n_gpus: int,
    sequences: int,
    seq_len_memory: int,
    gpus_per_node: int,
    time_fn: Callable[[TrainConfig], float] | None = None,
    dominance: bool = True,
    budget_s: float = float("inf"),
    bound: bool = True,
) -> TreeResult:
    """Walk the tree for ``n_gpus`` training GPUs (see the module docstring).

    ``sequences``: how many sequences the step trains on (limits DP x micro-batch);
    ``seq_len_memory``: the longest sequence, for the memory check; ``time_fn`` ranks survivors
    (None: survivors are listed unranked with time 0). ``dominance=False`` also lists fitting
    recompute leaves whose no-recompute twin fits (tests check the rule against the cost model).

    Branch and bound (``bound``, when ``time_fn`` has a ``lower`` method, as ``TrainTimer``
    does): a leaf whose lower bound (its optimizer step alone, without the log-prob forward) is
    no better than the best leaf so far or than ``budget_s`` (what the outer search can still
    use) is cut without its full evaluation. The best leaf under the budget is exact: it is never
    cut. ``ranked`` then holds the fully evaluated leaves only.
    """
    model = ev.model
    res = TreeResult(n_gpus, budget_s=budget_s)
    if n_gpus < 1:
        res.pruned.append(Pruned(f"{n_gpus} GPUs", "training needs at least one GPU"))
        return res
    nodes: list[tuple[int, int, int, int]] = []
    domain = nvlink_domain(ev.gpu, gpus_per_node)
    for tp in range(1, domain + 1):
        if n_gpus % tp:
            continue
        why = tp_rule(model, tp, domain)
        if why is not None:
            res.pruned.append(Pruned(f"tp={tp}", f"rule: {why}"))
            continue
        for pp in pp_degrees(model):
            if (n_gpus // tp) % pp:
                continue
            dp = n_gpus // (tp * pp)
            eps = valid_ep_degrees(model, tp, dp) if model.n_experts else [1]
            nodes.extend((tp, pp, dp, ep) for ep in eps)
    # visit the least model-parallel shapes first: usually the fastest when they fit, so the
    # bound is tight early (the order never changes the result, only how much is cut)
    for tp, pp, dp, ep in sorted(nodes, key=lambda x: (x[0] * x[1], x[0], -x[3])):
        _walk_leaves(ev, res, tp, pp, dp, ep, sequences, seq_len_memory, time_fn, dominance, bound)
    res.ranked.sort(key=lambda x: (x[0], x[1].tp * x[1].pp, x[1].zero_stage, x[1].micro_batch))
    return res


def _walk_leaves(
    ev: CostModel,
    res: TreeResult,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    sequences: int,
    seq_len_memory: int,
    time_fn: Callable[[TrainConfig], float] | None,
    dominance: bool,
    bound: bool = True,
) -> None:
    """Levels 5-6 under one (TP, PP, DP, EP) node.

    Memory is monotone (more ZeRO sharding, recompute and a smaller micro-batch each need less),
    so the most frugal leaf (top ZeRO stage, recompute, micro-batch 1) is checked first: if it
    does not fit, the whole subtree is pruned at once; and once a micro-batch fits nowhere,
    larger micro-batches are pruned too.
    """
    zeros = ZERO_STAGES if dp > 1 else (1,)
    frugal = TrainConfig(tp=tp, pp=pp, dp=dp, ep=ep, zero_stage=zeros[-1], micro_batch=1, recompute=True)
    try:
        frugal_rep = memory_report(ev, frugal, seq_len_memory, suggest=False)
    except ValueError as exc:  # CostModelError: the cost model rejects the shape
        res.pruned.append(Pruned(_describe(tp, pp, dp, ep), f"rule: {exc}"))
        return
    if not bool(getattr(frugal_rep, "fits", frugal_rep)):
        res.pruned.append(
            Pruned(_describe(tp, pp, dp, ep), f"memory: even the most frugal leaf does not fit: {report_line(frugal_rep, str(frugal))}")
        )
        return
    cache = {frugal: frugal_rep}

    def report(cfg: TrainConfig) -> Any:
        if cfg not in cache:
            cache[cfg] = memory_report(ev, cfg, seq_len_memory, suggest=False)
        return cache[cfg]

    def ok(cfg: TrainConfig) -> bool:
        r = report(cfg)
        return bool(getattr(r, "fits", r))

    for mb in MICRO_BATCHES:
        if sequences < dp * mb:
            res.pruned.append(Pruned(_describe(tp, pp, dp, ep, mb=mb), f"rule: {sequences} sequences cannot feed DP {dp} x micro-batch {mb}"))
            continue
        found = False
        for rc in (False, True):
            if found and dominance:
                res.pruned.append(Pruned(_describe(tp, pp, dp, ep, mb=mb, rc=rc), "dominated: fits without recompute"))
                break
            top = TrainConfig(tp=tp, pp=pp, dp=dp, ep=ep, zero_stage=zeros[-1], micro_batch=mb, recompute=rc)
            if not ok(top):  # the most sharded stage does not fit: no stage of this branch does
                desc = _describe(tp, pp, dp, ep, mb=mb, rc=rc)
                res.pruned.append(Pruned(desc, f"memory: not even at ZeRO-{zeros[-1]}: {report_line(report(top), desc)}"))
                continue
            for zero in zeros:
                cfg = TrainConfig(tp=tp, pp=pp, dp=dp, ep=ep, zero_stage=zero, micro_batch=mb, recompute=rc)
                desc = _describe(tp, pp, dp, ep, zero, mb, rc)
                if not ok(cfg):
                    res.pruned.append(Pruned(desc, f"memory: {report_line(report(cfg), desc)}"))
                    continue
                found = True
                if time_fn is None:
                    res.ranked.append((0.0, cfg))
                    continue
                lower = getattr(time_fn, "lower", None)
                if lower is not None and bound:
                    cut = min(res.budget_s, res.best_time_s)
                    lb = float(lower(cfg))
                    if lb >= cut:
                        res.pruned.append(Pruned(desc, f"bound: its optimizer step alone ({lb:.3g} s) is no faster than {cut:.3g} s"))
                        continue
                res.ranked.append((float(time_fn(cfg)), cfg))
                if res.ranked[-1][0] < res.ranked[0][0]:
                    res.ranked.insert(0, res.ranked.pop())
        if not found:
            for bigger in MICRO_BATCHES:
                if bigger > mb:
                    res.pruned.append(Pruned(_describe(tp, pp, dp, ep, mb=bigger), f"memory: micro-batch {mb} already fits nowhere"))
            return


def memory_report(ev: CostModel, cfg: TrainConfig, seq_len: int, suggest: bool = False) -> Any:
    """The cost model's memory report for ``cfg``; without the (costly) "what would fit"
    suggestions unless asked, since the tree checks hundreds of leaves."""
    from libra.planner.costs import to_strategy

    try:
        return ev.train_memory(to_strategy(cfg), seq_len, suggest=suggest)
    except TypeError:  # an evaluator without the ``suggest`` switch
        return ev.train_memory(to_strategy(cfg), seq_len)


def fits_in_memory(ev: CostModel, cfg: TrainConfig, seq_len: int) -> bool:
    """Whether ``cfg`` trains a ``seq_len``-token sequence within each GPU's memory: the check
    every leaf of the tree passes, the one the settle (``libra.planner.settle``), the search's
    streaming guard and the simulator's refusal of an out-of-memory training all ask."""
    return bool(getattr(memory_report(ev, cfg, max(1, int(seq_len))), "fits", True))


def report_line(rep: Any, fallback: str) -> str:
    """One line for a memory report: its summary if it has one."""
    summary = getattr(rep, "summary", None)
    if callable(summary):
        return str(summary())
    return str(getattr(rep, "why", "") or fallback + " does not fit")


class TrainTimer:
    """Predicted training-stage time of a strategy: ``StepCosts.train_stage_s`` (the old-policy
    log-prob forward, the reference model's with a KL term, and one optimizer step over the
    step's tokens), the formula the simulator charges too. ``lower`` is the optimizer step
    alone: a lower bound used for branch and bound."""

    def __init__(self, ev: CostModel | StepCosts, tokens: int, seq_len: int, kl: bool = False) -> None:
        self.costs = ev if isinstance(ev, StepCosts) else StepCosts(ev)
        self.ev, self.tokens, self.seq_len, self.kl = self.costs.ev, tokens, seq_len, kl
        self._seen: set[TrainConfig] = set()
        self.calls = 0

    def lower(self, cfg: TrainConfig) -> float:
        if cfg not in self._seen:
            self._seen.add(cfg)
            self.calls += 1
        return self.costs.update_s(cfg, self.tokens, self.seq_len)

    def __call__(self, cfg: TrainConfig) -> float:
        self.calls += 1
        return self.costs.train_s(cfg, self.tokens, self.seq_len, self.kl)


def training_time_fn(ev: CostModel | StepCosts, tokens: int, seq_len: int, kl: bool = False) -> TrainTimer:
    """The training-stage timer (see ``TrainTimer``)."""
    return TrainTimer(ev, tokens, seq_len, kl)


class DecisionTree:
    """Memoized tree walks: one per (GPU count, tokens, sequence lengths)."""

    def __init__(self, ev: CostModel | StepCosts, gpus_per_node: int, kl: bool = False) -> None:
        self.costs = ev if isinstance(ev, StepCosts) else StepCosts(ev, gpus_per_node)
        self.ev = self.costs.ev
        self.gpus_per_node = gpus_per_node
        self.kl = kl
        self._cache: dict[tuple[int, int, int, int], TreeResult] = {}
        self._full: dict[tuple[int, int, int, int], TreeResult] = {}
        self.hits = 0
        self.misses = 0

    def memory_length(self, n_gpus: int, tokens: int, seq_len: int, seen: int, declared: int | None) -> int:
        """The sequence length a training strategy must hold in memory: the workload's declared
        context limit when one is declared and some strategy on ``n_gpus`` holds it, else the
        longest sequence ``seen`` (measured, or the prior's tail).

        Why: a sequence as long as the declared limit may come in any step, and a real trainer
        sized for shorter ones runs out of memory on it (verl sizes its token budget per GPU
        from max_prompt_length + max_response_length); the simulator charged no OOM until session 23, so a plan
        sized below the limit ran strategies no real run could (verl-static-uniform trained a
        never-lose SWE trace with TP 1, no recompute, checked at its prior's 7K-token sequences,
        where the trace's reached 16K: 130 s per step against 157 s for a strategy that holds
        16K, SIMULATED). When nothing holds the limit on ``n_gpus`` the seen length stands (the
        run then depends on its sequences staying shorter, as a real one would)."""
        if declared is None or declared <= seen:
            return seen
        cap = memory_grain(declared)
        return cap if self.best(n_gpus, tokens, seq_len, cap).best is not None else seen

    def every_leaf(self, n_gpus: int, tokens: int, seq_len: int, seq_len_memory: int) -> TreeResult:
        """Every fitting, undominated leaf fully evaluated and ranked by training time (no
        branch and bound; memoized): for a choice that adds a cost depending on the strategy to
        its training time (a time-shared plan's stage switches, ``Planner._colocated``), where
        the bound would cut a leaf that is slower to train but cheaper to switch."""
        key = (n_gpus, tokens, seq_len, seq_len_memory)
        hit = self._full.get(key)
        if hit is None:
            hit = self._full[key] = self._walk(n_gpus, tokens, seq_len, seq_len_memory, bound=False)
        return hit

    def _walk(self, n_gpus: int, tokens: int, seq_len: int, seq_len_memory: int, budget_s: float = float("inf"),
              bound: bool = True) -> TreeResult:
        """One walk of the tree for a step of ``tokens`` tokens (``enumerate_strategies``)."""
        sequences = sequence_count(tokens, seq_len)
        return enumerate_strategies(self.ev, n_gpus, sequences, seq_len_memory, self.gpus_per_node,
                                    training_time_fn(self.costs, tokens, seq_len, self.kl), budget_s=budget_s, bound=bound)

    def best(self, n_gpus: int, tokens: int, seq_len: int, seq_len_memory: int, budget_s: float = float("inf")) -> TreeResult:
        """The tree for ``n_gpus`` for a step of ``tokens`` tokens; leaves no faster than
        ``budget_s`` may be cut. A memoized walk is reused when it is exact for this budget: its
        best beat its own budget, or its budget was at least as large."""
        key = (n_gpus, tokens, seq_len, seq_len_memory)
        hit = self._cache.get(key)
        if hit is not None and (hit.budget_s >= budget_s or hit.best_time_s < hit.budget_s):
            self.hits += 1
            return hit
        self.misses += 1
        res = self._walk(n_gpus, tokens, seq_len, seq_len_memory, budget_s=budget_s)
        self._cache[key] = res
        return res
