"""Settling a step's training knobs once its batch is in hand.

A plan fixes the training *layout* before the rollout starts: how many GPUs train, TP x PP x DP,
EP, the ZeRO stage. Changing any of those moves parameter and optimizer shards between GPUs (a
re-shard, ``StepCosts.transition``). Two choices are not part of the layout: the micro-batch size
and activation recompute. Real trainers set them per step from the batch they got (verl's
``use_dynamic_bsz`` packs micro-batches up to a token budget; AReaL's ``mb_spec`` does the same;
activation checkpointing is a flag on the wrapped modules), and nothing is moved between GPUs.

So the plan's knobs are a forecast: the planner sizes them for the batch it predicts, and for the
first step that is a length prior (an undeclared workload's prior reaches 64K tokens). When the
training starts, the step's rollout is over (not streamed) and its sequences are known; the backend
then asks the policy to settle the knobs (``Policy.settle_training``), and this module picks the
fastest micro-batch and recompute for that batch within the plan's layout, holding in memory the
longest sequence seen so far (and the declared limit when a strategy holds it, the planner's rule,
``DecisionTree.memory_length``).

Why: held_out_10's worst row (FireAct HotpotQA, Qwen3-32B on 48 B200, K=1) trained every step at
micro-batch 1 with recompute, the first plan's sizing for the 64K prior, 6.6 s per step; the same
ZeRO-3 TP 2 x DP 12 layout at micro-batch 4 takes 1.8 s for the trace's 4K-token sequences
(SIMULATED). The planner kept the knobs because any change of strategy was charged as a re-shard.

A streamed step starts training before its batch is complete, so it runs the plan's knobs.
Settling each streamed mini-batch for its own trajectories was tried and dropped: the simulator
charges a streamed mini-batch as its token share of the whole step's training, so knobs ranked on
a mini-batch's lengths (its first ones short) disagreed with that charge (the bundled Search-R1
trace on 32 H200 at K=0: 96.0 -> 98.3 s per step, SIMULATED). It needs a per-mini-batch charge in
the simulator and the planner's streaming price alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from libra.planner.decision_tree import DecisionTree, enumerate_strategies, fits_in_memory, memory_grain, sequence_count, training_time_fn
from libra.planner.plan import TrainConfig, same_layout
from libra.trace.columnar import StepArrays


def longest_sequence(seen: Sequence[StepArrays]) -> int:
    """The longest trajectory (prompt, generated and tool tokens) among ``seen`` steps."""
    return max((int(s.total_tokens.max()) for s in seen if s.n), default=0)


def best_knobs(tree: DecisionTree, train: TrainConfig, tokens: int, seq: int, memory: int,
               micro_batch: int | None = None) -> tuple[TrainConfig, float]:
    """The fastest strategy with ``train``'s layout (micro-batch and recompute re-chosen) for a
    batch of ``tokens`` in sequences of mean length ``seq``, holding ``memory`` tokens, and its
    time (``StepCosts.train_s``, the simulator's charge). ``train`` itself, timed, on ties and
    when no strategy of its layout fits (``settle_training`` then moves the layout,
    ``memory_relayout``; the simulator refuses a training that runs out of memory);
    ``micro_batch``: a user's pin, kept as given. ``train`` is kept over a slower strategy
    even where it does not hold ``memory`` (a provisional layout, priced before any training,
    ``Planner._kept``); ``settle_training`` checks what it returns.

    Both sides use it: the backend settling a step about to train (``settle_training``) and the
    planner pricing the plan in force for the next step (``Planner._search``), so that the
    planner forecasts the knobs the simulator will run."""
    timer = training_time_fn(tree.costs, tokens, seq, tree.kl)
    res = enumerate_strategies(tree.ev, train.n_gpus, sequence_count(tokens, seq), memory, tree.gpus_per_node, timer, bound=False)
    best, best_s = train, float(timer(train))
    for t, cfg in res.ranked:
        if not same_layout(cfg, train) or (micro_batch is not None and cfg.micro_batch != micro_batch):
            continue
        if t < best_s:
            best, best_s = cfg, float(t)
        break  # ranked fastest first
    return best, best_s


def settle_training(tree: DecisionTree, train: TrainConfig, batch: StepArrays, seen: Sequence[StepArrays],
                    declared_context: int | None, cap_gpus: int, micro_batch: int | None = None) -> TrainConfig:
    """The fastest strategy with ``train``'s layout for ``batch`` (the step about to train),
    holding the longest of ``seen`` (the steps whose rollouts are over, ``batch`` among them) in
    memory, or the declared context limit when a strategy on ``cap_gpus`` holds it
    (``best_knobs``).
    """
    if not batch.n:
        return train
    tokens, seq, memory = batch_shape(tree, batch, seen, declared_context, cap_gpus)
    return settled_knobs(tree, train, tokens, seq, memory, int(batch.total_tokens.max()), micro_batch)[0]


def settled_knobs(tree: DecisionTree, train: TrainConfig, tokens: int, seq: int, memory: int, longest: int,
                  micro_batch: int | None = None) -> tuple[TrainConfig, float]:
    """The strategy a batch of ``tokens`` / ``seq`` whose longest sequence is ``longest`` trains
    with on ``train``'s GPUs, and its time: ``best_knobs`` (holding ``memory``) when that holds
    ``longest``, what the simulator checks (a plan made before any training may carry knobs
    sized below ``memory``, ``Planner._kept``; those still train a batch they hold), else
    ``memory_relayout``. The settle and the planner's price of staying (``Planner.kept_knobs``)
    both use it, so the planner forecasts what the simulator runs."""
    cfg, t = best_knobs(tree, train, tokens, seq, memory, micro_batch)
    if fits_in_memory(tree.ev, cfg, longest):
        return cfg, t
    new = memory_relayout(tree, cfg, longest, tokens, seq, memory, micro_batch)
    return new, float(training_time_fn(tree.costs, tokens, seq, tree.kl)(new))


def streamed_micro_batch(tree: DecisionTree, train: TrainConfig, longest: int, micro_batch: int | None = None) -> TrainConfig | None:
    """The strategy a streamed step trains a mini-batch holding a ``longest``-token sequence with:
    ``train`` when it holds that sequence, else ``train`` with the largest smaller micro-batch
    that does, else with activation recompute at the largest micro-batch that does (its layout
    unchanged, so no re-shard); None when not even a micro-batch of one sequence with recompute
    does (the simulator then refuses the step).

    Why: a streamed step starts training before its batch is complete, in its plan's strategy,
    sized to hold twice the longest sequence seen (``libra.planner.search.STREAM_MEMORY_HEADROOM``).
    A step that brings a longer one failed: WebShop on 80 H100 / Qwen3-30B-A3B, K=0, step 1, a
    4,748-token sequence after a step whose longest was under half that, TP 4 x DP 14 ZeRO-3 at
    micro-batch 4, 80.4 GB of 80 GB per GPU (held_out_33, SIMULATED). A trainer that forms its
    micro-batches by a token budget (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``)
    trains the mini-batch holding that sequence in smaller micro-batches instead; micro-batch 1
    held it at 31.6 GB. The layout is set when the trainer is built; the micro-batch changes
    first, then activation recompute for the mini-batches still to train, at the largest
    micro-batch that holds the sequence: the per-step knobs ``same_layout`` leaves free, as a
    complete batch's settle sets them. Hugging Face models read their gradient-checkpointing
    flag at each forward and Megatron reads its recompute config there too, so it can change
    between mini-batches with no re-shard. WebShop on 50 B200 / Llama-3.1-70B (K=0, step 1, the
    same 4,748-token sequence) failed at micro-batch 1, 189.8 GB of 180 GB per GPU on TP 2 x DP 16
    ZeRO-2; recompute held it in 121.4 GB (held_out_42, SIMULATED), where the baselines ran."""
    # a user's micro-batch pin (``micro_batch``) is kept: only recompute may change then
    sizes = [int(train.micro_batch)] if micro_batch is not None else range(int(train.micro_batch), 0, -1)
    for recompute in dict.fromkeys((train.recompute, True)):
        for mb in sizes:
            cfg = replace(train, micro_batch=mb, recompute=recompute)
            if fits_in_memory(tree.ev, cfg, longest):
                return cfg
    return None


def streamed_relayout(tree: DecisionTree, train: TrainConfig, longest: int, seen: Sequence[StepArrays],
                      micro_batch: int | None = None) -> TrainConfig | None:
    """The strategy a streamed step trains with when it brings a ``longest``-token sequence:
    ``streamed_micro_batch`` (the plan's layout, smaller micro-batches or recompute: no re-shard)
    when that holds it, else the fastest other layout on the plan's training GPUs that holds it,
    ranked on the shape of the last complete step of ``seen`` (the batch still streams, so its own
    shape is not known yet); None when no strategy on those GPUs holds it.

    Why: a streamed step starts training before its batch is complete, so its layout was sized
    for the sequences seen before. COPRA on 42 H100 / Qwen3-32B (K=0) brought a 45,943-token
    sequence at step 1 that its plan's TP 2 x DP 16 (ZeRO-3) held at no micro-batch even with
    recompute (81.8 GB of 80 GB), and the run stopped where verl-colocated ran; TP 4 x DP 8 on the
    same 32 GPUs holds it in 68.1 GB (held_out_44, SIMULATED). A real trainer stops at the
    mini-batch boundary (an optimizer step has just run, so only weights and optimizer state
    move), re-shards onto the layout that holds the sequence and trains on: the backend charges
    that re-shard as any layout change (``StepCosts.lend_s``), and the step's training at the new
    layout. The next plan sees the sequence and sizes its layout for it."""
    same = streamed_micro_batch(tree, train, longest, micro_batch)
    if same is not None:
        return same
    last = seen[-1] if seen else None
    if last is not None and last.n:
        tokens, seq = max(1, int(last.total_tokens.sum())), max(1, int(round(float(last.total_tokens.mean()))))
    else:
        tokens, seq = max(1, int(longest)), max(1, int(longest))
    # the complete batch's re-lay (``memory_relayout``), on the shape known while the batch streams
    cfg = memory_relayout(tree, train, longest, tokens, seq, memory_grain(max(int(longest), 1)), micro_batch)
    return cfg if fits_in_memory(tree.ev, cfg, longest) else None


def memory_relayout(tree: DecisionTree, train: TrainConfig, longest: int, tokens: int, seq: int, memory: int,
                    micro_batch: int | None = None) -> TrainConfig:
    """A strategy on ``train``'s GPUs for a batch whose ``longest`` sequence ``train``'s layout
    cannot hold: the fastest that holds ``memory`` (the longest sequence seen, or the declared
    limit), else the fastest that holds ``longest``; ``train`` itself when none does (the
    simulator then refuses the step: a real trainer runs out of memory).

    Why: a plan sizes its layout for the sequences seen when it was made; a later batch may bring
    a longer one (a plan made before it, at K >= 1; a step longer than any before). With no
    strategy of the layout holding it, the settle kept the layout and the simulator, which charged
    no out-of-memory, trained 49.8K-token sequences of Llama-3.1-70B on 72 H100 where no strategy
    of that layout holds them (held_out_31 sweagent-rep/h100-120-l70b, SIMULATED). A real
    trainer re-shards onto a layout that holds them (the backend charges the re-shard) or fails.
    Same-layout knobs come first (no re-shard), then any layout on the same GPUs; a user's
    micro-batch pin is kept where a strategy holding the sequence allows it."""
    longest = memory_grain(max(int(longest), 1))
    ranked = holding_strategies(tree, train.n_gpus, tokens, seq, (memory, min(memory, longest)), micro_batch)
    same = [cfg for _, cfg in ranked if same_layout(cfg, train)]
    return same[0] if same else ranked[0][1] if ranked else train


def holding_strategies(tree: DecisionTree, n_gpus: int, tokens: int, seq: int, needs: Sequence[int],
                       micro_batch: int | None = None) -> list[tuple[float, TrainConfig]]:
    """The strategies on ``n_gpus`` GPUs that hold the first of ``needs`` (sequence lengths,
    most demanding first) any of them holds, with their training times, fastest first; those at
    the user's ``micro_batch`` pin when any is. Empty when none holds even the last need. What
    ``memory_relayout`` (on the plan's GPUs) and ``outgrown_training`` (on other counts) pick from."""
    timer = training_time_fn(tree.costs, tokens, seq, tree.kl)
    for need in dict.fromkeys(needs):
        res = enumerate_strategies(tree.ev, n_gpus, sequence_count(tokens, seq), need, tree.gpus_per_node, timer, bound=False)
        fitting = [(float(t), cfg) for t, cfg in res.ranked]  # fastest first
        if fitting:
            return [x for x in fitting if micro_batch is None or x[1].micro_batch == micro_batch] or fitting
    return []


def outgrown_training(tree: DecisionTree, train: TrainConfig, batch: StepArrays, seen: Sequence[StepArrays],
                      declared_context: int | None, cap_gpus: int, micro_batch: int | None = None,
                      rollout_idle: bool = False, rollout_tp: int = 1) -> TrainConfig | None:
    """A strategy for ``batch`` on another GPU count than ``train``'s, for a batch whose longest
    sequence no strategy on ``train``'s GPUs holds. While a rollout runs beside the training (an
    async loop): the fastest on fewer of its GPUs that holds it (nothing waits: the trainer already
    has those GPUs), else the fastest on the fewest more GPUs, up to ``cap_gpus``, that holds it
    (the backend takes the extra ones from rollout once they are free). With the rollout idle
    (``rollout_idle``: a synchronous loop, whose rollout is over when its training starts), the
    fastest on any count up to ``cap_gpus``, a count above ``train``'s priced with the extra GPUs'
    return to rollout (``StepCosts.return_s`` at ``rollout_tp``, what the backend charges before
    the next rollout may use them). Each holds the longest sequence seen (``batch_shape``) where a
    strategy on its count does, else the batch's own. None when no count up to ``cap_gpus`` holds
    the batch.

    Why: a plan is made before the batch it trains exists (at K >= 1 the next step's rollout
    already runs), and a step may bring a longer sequence than any before; the GPU counts that
    hold a long sequence are sparse (TP 8 wants a multiple of 8: 89,978 tokens of Qwen3-14B on
    A800s fit 16, 24 or 28 GPUs but not 20), so a plan's count may hold none while a nearby one
    does. A real trainer that runs out of memory stops the run (the simulator refuses it); a
    resource manager can re-shard onto the GPUs the batch needs, and pays for the re-shard, the
    wait for the GPUs and their return to rollout."""
    if not batch.n:
        return None
    tokens, seq, memory = batch_shape(tree, batch, seen, declared_context, cap_gpus)
    needs = (memory, max(1, int(batch.total_tokens.max())))

    def fastest(n: int) -> tuple[float, TrainConfig] | None:
        ranked = holding_strategies(tree, n, tokens, seq, needs, micro_batch)
        return ranked[0] if ranked else None

    fewer = [hit for n in range(train.n_gpus - 1, 0, -1) if (hit := fastest(n)) is not None]
    more = (hit for n in range(train.n_gpus + 1, cap_gpus + 1) if (hit := fastest(n)) is not None)
    if rollout_idle:  # every count, the extra GPUs' return to rollout added to a larger one's time
        priced = fewer + [(t + tree.costs.return_s(cfg, rollout_tp), cfg) for t, cfg in more]
    else:  # fewer of its own first; else the fewest more (the first count above that holds it)
        priced = fewer or [hit for hit in [next(more, None)] if hit is not None]
    return min(priced, key=lambda x: (x[0], x[1].n_gpus))[1] if priced else None


def batch_shape(tree: DecisionTree, batch: StepArrays, seen: Sequence[StepArrays], declared_context: int | None,
                cap_gpus: int) -> tuple[int, int, int]:
    """(tokens, mean sequence length, memory length) a complete batch trains with: the memory
    holds the longest of ``seen`` and ``batch`` (rounded up to 256, the planner's rounding,
    ``Planner.train_shape``), or the declared limit when a strategy on ``cap_gpus`` holds it."""
    total = batch.total_tokens
    tokens = max(1, int(total.sum()))
    seq = max(1, int(round(float(total.mean()))))
    longest = max(longest_sequence(seen), int(total.max()))
    longest = memory_grain(max(longest, 1))
    return tokens, seq, tree.memory_length(cap_gpus, tokens, seq, longest, declared_context)


def first_layout(tree: DecisionTree, settled: TrainConfig, batch: StepArrays, seen: Sequence[StepArrays],
                 declared_context: int | None, cap_gpus: int, steps_paid_over: float,
                 micro_batch: int | None = None, run_price: Callable[[TrainConfig, float, float], float] | None = None,
                 spare_gpus: int = 0) -> TrainConfig:
    """The run's first training may also change the *layout* on its GPUs: ``settled`` (the plan's
    layout with its knobs settled for ``batch``, ``settle_training``), or the fastest strategy on
    the same GPU count when its gain over ``settled``, paid over ``steps_paid_over`` steps (the
    planner's ``amortize_over``: the plan is kept while it holds), beats the re-shard it costs
    (``StepCosts.build_s``: each GPU loads the new strategy's bf16 weight shard, as no optimizer step has run; the simulator's charge for a
    layout change, ``sim.loop``).

    The gain is the *run's*: ``run_price(strategy, its training seconds, re-shard seconds)`` is
    the time of the ``steps_paid_over`` steps with that training (``LibraPolicy`` passes
    ``pipeline_run_s`` of the plan's loop with the step's measured rollout and each strategy's
    weight sync); without it, the steps' training time plus the re-shard. Why the run: a
    rollout-bound async pipeline hides its training in the steady state, and a first version
    counting the training time re-laid for a 4.4 s re-shard that saved nothing (held_out_15
    fireact-multi/h100-24-14b/K1: 18.7 s first step against the hindsight plan's 13.7 s, 0.861x,
    SIMULATED); a second, pricing the steady-state step, missed that a short run pays its fill
    (``pipeline_run_s``).

    Why only the first: before it no optimizer step has run, and the layout was sized for a
    length prior, not for measured sequences (an undeclared workload's prior reaches 64K tokens:
    ZeRO-3 at TP 2 without expert parallelism on Qwen3-30B-A3B, 3.2 s of training a step where
    the layout chosen for the trace's 4K-token sequences takes 0.75 s; held_out_12 FireAct
    multitask, 48 H100, K=1, SIMULATED). At K >= 1 the second step was planned before the first
    ran, so two steps of a short log trained in the prior's layout. Later layouts are the
    planner's, priced as transitions like any other change. A time-shared plan's first training
    may re-lay too (``LibraPolicy`` prices its chain with the colocated switches, which depend
    on the layout); a streamed one cannot, as it trains before its batch is complete.

    ``spare_gpus``: GPUs of a split's rollout side that no engine runs on (the rollout layout
    did not fill them); the first training may lay over up to that many more GPUs, priced the
    same way (the re-build, weights only, and the run with that training). Why: a launch sized
    for the length prior's 64K tokens holds training to the counts whose layouts hold them (24,
    28, 32 or 36 of 42 H100 for Llama-3.1-70B), and two TP-8 engines on the other 18 left two
    GPUs running nothing for the run; the move to the hindsight 16:26 on the same engines cost a
    re-shard after the first update that four steps did not pay back (held_out_54
    fever-react/h100-42-l70b/K1, 0.914x of areal-static-optimal, SIMULATED)."""
    if not batch.n:
        return settled
    tokens, seq, memory = batch_shape(tree, batch, seen, declared_context, cap_gpus)
    timer = training_time_fn(tree.costs, tokens, seq, tree.kl)
    steps = max(1, int(round(float(steps_paid_over))))

    def price(cfg: TrainConfig, train_s: float, reshard_s: float) -> float:
        if run_price is not None:
            return float(run_price(cfg, train_s, reshard_s))
        return steps * train_s + reshard_s

    # staying costs no re-shard, and is no option when the layout cannot hold the batch (a launch
    # layout sized for a shorter prior, ``Planner._launch_layout``; the simulator refuses it)
    holds = fits_in_memory(tree.ev, settled, memory)
    best, best_s = settled, (price(settled, float(timer(settled)), 0.0) if holds else float("inf"))
    for n in range(settled.n_gpus, min(settled.n_gpus + max(0, int(spare_gpus)), cap_gpus) + 1):
        res = enumerate_strategies(tree.ev, n, sequence_count(tokens, seq), memory, tree.gpus_per_node, timer, bound=False)
        for t, cfg in res.ranked:
            if (micro_batch is not None and cfg.micro_batch != micro_batch) or same_layout(cfg, settled):
                continue
            paid = price(cfg, float(t), tree.costs.build_s(cfg))
            if paid < best_s or (paid == best_s and cfg.n_gpus < best.n_gpus):
                best, best_s = cfg, paid
    return best
