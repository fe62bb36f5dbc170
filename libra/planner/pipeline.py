"""The asynchronous pipeline's timing model: how long steps take when rollouts of up to K + 1
steps share the engines (the simulator's continuous generation, ``sim.engines``/``sim.loop``).

The simulator's gate: step j's prompts join the engines once step j - 1 - K's weights are
synced (steps 0..K at once); training j starts when rollout j and the sync of j - 1 are done;
training is serial. What a step's rollout costs depends on how much of it shares the engines
with other steps' rollouts: alone it drains in ``rollout_s`` (the load model's makespan of one
step), and fully overlapped by K others (the K + 1 steps of a staleness cycle admitted
together) in ``cohort_s`` (the load model's makespan of K + 1 steps' trajectories at once).

``shared_rollout_s`` interpolates between the two by the *time-weighted overlap*: the other
steps' rollout time inside this one's, in units of this one's length. Steps admitted together
(the first K + 1 of a run) overlap fully and drain in ``cohort_s`` together, the waves the
simulator shows when the rollout is much longer than the training chain; steps admitted one
training apart overlap only by what the rollout exceeds that spacing.

Why not whole waves everywhere: the wave model (every cycle of K + 1 rollouts drains together,
then the first one's training and sync) priced a split whose rollout (29.9 s) and chain
(29.9 s) were equal at (43.6 + 29.9) / 2 = 36.8 s a step, where the simulator, admitting each
step one training after the previous, ran it at 30.1 s; the planner kept a split 27% slower
for three steps (held_out_33 medagentbench/a800-60-32b/K1, 12:48 against Libra's 24:36,
0.856x, SIMULATED). When the rollout is much longer than the chain, the recurrence tends to the
wave model (the admissions bunch up and the steps overlap fully), and where the overlap feeds
itself (a cohort much slower than one step alone) it never leaves the fill's waves
(``async_steady_s``).
"""

from __future__ import annotations

#: Fixed-point iterations for a rollout's length under overlap in ``gate_completions`` (monotone).
_FIXED_POINT_ITERATIONS = 24
#: Cycles (K + 1 steps each) of warm-up, then of measure, for the steady period in
#: ``async_steady_s``: on 3,000 random pipelines the mean over cycles 8-16 is within 2.2% of
#: that over cycles 40-80 (within 1% on all but 3)
_STEADY_WINDOW = 8


def shared_rollout_s(rollout_s: float, cohort_s: float, staleness: int, overlap: float) -> float:
    """A step's rollout when ``overlap`` other steps' rollouts share the engines with it on
    average (time-weighted, in units of its own length): ``rollout_s`` alone, ``cohort_s`` (at
    least ``rollout_s``) with K = ``staleness`` others throughout, linear in between (the wave
    model's ``rollout_s + (cohort_s - rollout_s) (m - 1) / K`` for m steps admitted together)."""
    k = max(1, int(staleness))
    extra = max(0.0, cohort_s - rollout_s)
    return rollout_s + extra * min(1.0, max(0.0, overlap) / k)


def async_steady_s(rollout_s: float, chain_s: float, load_s: float, cohort_s: float, staleness: int) -> float:
    """The steady period of the async pipeline: the mean step, once the fill has passed, of the
    simulator's gate recurrence from a standing start (``gate_completions``: steps 0..K admitted
    together, each later step once the step K + 1 before it synced, training serial), over
    ``_STEADY_WINDOW`` x (K + 1) steps after as many of warm-up. Its pattern repeats every
    K + 1 steps (the cycle), so the window holds whole cycles. It lies between
    max(``load_s``, ``chain_s``, (``rollout_s`` + ``chain_s``) / (K + 1)) (the engines' pace,
    the training-plus-sync chain, a rollout alone per cycle) and the same with ``cohort_s`` (whole
    waves: the K + 1 steps together).

    Why the recurrence and not the staggered equilibrium it replaced (the least period P at which
    a step admitted every P, overlapping its neighbours by L - P, fits its cycle): that
    equilibrium does not exist where the chain is shorter than the rollout alone and the
    cohort's extra is large. The overlap lengthens the rollout, which lengthens the overlap
    (d L / d L > 1), so the only period it found, P = the rollout alone, is a knife edge: at any
    shorter one the steps overlap into waves. The pipeline starts in the waves (steps 0..K admitted
    together) and stays there. MCPMark on 52 A800 / Qwen3-32B, K=1, at 12:40 on TP 4 x 3: the
    rollout alone 1,570 s, two steps together 5,729 s, chain 962 s. The equilibrium priced
    1,564 s a step; the recurrence gives 2,939 s (waves: 4,915 s then 962 s). The replay ran
    5,518 s then 897 s, and Libra, priced on the knife edge, moved there from a layout the
    recurrence prices at its chain (held_out_49 mcpmark-64k/a800-52-32b/K1, 0.639x, SIMULATED).
    On 3,000 random pipelines the equilibrium was more than 1% off the recurrence's long run on
    22% of them, by up to 2.5x, always below it; on the rest the two agree."""
    k = max(1, int(staleness))
    warm = _STEADY_WINDOW * (k + 1)
    done = gate_completions(k, rollout_s, chain_s, 2 * warm + k, cohort_s=cohort_s, load_s=load_s)
    return (done[2 * warm - 1] - done[warm - 1]) / warm


def pipeline_run_s(mode: str, staleness: int, rollout_s: float, chain_s: float, steps: int, first_extra_s: float = 0.0,
                   cohort_s: float | None = None, load_s: float = 0.0, stagger: bool = False) -> float:
    """The time ``steps`` steps take from a standing start when each rollout takes ``rollout_s``
    and each step's training plus weight sync ``chain_s`` (``first_extra_s`` more in the first
    step's training, e.g. a re-shard). Sync: each step adds both. Async with staleness ``K``
    (the simulator's gate: step n's rollout starts when step n - K - 1 has synced, and training
    is serial): ``end(n) = max(end(n-1), rollout end(n)) + chain``.

    ``cohort_s`` (continuous generation, ``search.async_run_s``): a rollout that shares the
    engines with other steps' rollouts takes ``shared_rollout_s`` of its time-weighted overlap
    (the steps admitted together at the start overlap fully: K + 1 of them drain in
    ``cohort_s``); and the steps of one busy period of the engines (admitted before the previous
    rollouts drained) end no earlier than one ``load_s`` (the engines' pace at full batches)
    after another (the batch-per-step loop, whose ``load_s`` and ``cohort_s`` are ``rollout_s``,
    runs its rollouts one after the other). None: every rollout takes ``rollout_s`` alone.

    Why the recurrence and not the steady state ``max(rollout, chain)``: a short run pays its
    fill. On a 3-step FireAct log at K=1 the rollout (4.4 s) was longer than the chain (2.8 s),
    so the steady state priced a faster training at nothing, yet three steps pay the chain twice
    (``2 R + 2 C``; 14.8 s against 11.9 s for a baseline training 0.56 s a step; held_out_17
    fireact-hotpotqa/b200-24-8b/K1, SIMULATED).

    ``stagger``: the pipeline's first step rolls out alone, the rest of its fill (steps 1..K)
    joining the engines when that rollout ends (``Plan.stagger_fill``)."""
    n = max(1, int(steps))
    if mode != "async":
        return n * (rollout_s + chain_s) + first_extra_s
    return gate_completions(staleness, rollout_s, chain_s, n, first_extra_s, cohort_s, load_s, stagger)[-1]


def async_drain_s(rollout_s: float, chain_s: float, load_s: float, cohort_s: float, staleness: int,
                  in_flight: bool | None = None) -> float:
    """What a step whose plan changes the rollout layout of a running async pipeline waits, once:
    the simulator starts it on new engines only after the previous step's rollout ended
    (``sim.loop``: a new layout runs "after the old rollout's tail"), where staying it would have
    joined the engines at its gate. Priced as the steady pipeline's mean, over a cycle, of how
    long the previous step's rollout still runs at a step's gate (``gate_completions``, the
    window of ``async_steady_s``); 0 where the rollouts end before the next gate opens.
    ``in_flight``: whether the previous step's rollout is known to be still running (True: the
    mean over the gates where it runs; False: 0, nothing to wait for); None, unknown: the mean
    over every gate.

    Why: unpriced, the move cost only the re-shard. tb-mini-swe on 36 B200 / Qwen3-8B, K = 1
    (held_out_49, SIMULATED): Libra moved from 20:16 at TP 4 x 5 to 16:20 at TP 8 x 2 at step 3,
    priced 1.3 s of transition; step 3 waited out step 2's rollout and took 330 s where the
    hindsight split, on the same rollouts, took 88.5 s (0.799x of it over the run)."""
    if in_flight is False:
        return 0.0
    k = max(1, int(staleness))
    warm = _STEADY_WINDOW * (k + 1)
    admit, end, _ = _gate(k, rollout_s, chain_s, 2 * warm + k, 0.0, cohort_s, load_s)
    waits = [max(0.0, end[j - 1] - admit[j]) for j in range(warm, 2 * warm)]
    if in_flight:
        running = [w for w in waits if w > 0.0]
        return sum(running) / len(running) if running else 0.0
    return sum(waits) / warm


def gate_completions(staleness: int, rollout_s: float, chain_s: float, steps: int, first_extra_s: float = 0.0,
                     cohort_s: float | None = None, load_s: float = 0.0, stagger: bool = False) -> list[float]:
    """When each of ``steps`` async steps is synced, from a standing start, by the simulator's
    gate (``pipeline_run_s`` gives the arguments' meaning): the recurrence both the run's price
    and the steady period (``async_steady_s``) read."""
    return _gate(staleness, rollout_s, chain_s, steps, first_extra_s, cohort_s, load_s, stagger)[2]


def stagger_gain_s(staleness: int, rollout_s: float, chain_s: float, steps: int, cohort_s: float | None = None,
                   load_s: float = 0.0) -> float:
    """How much sooner ``steps`` async steps from a standing start end when the first one rolls
    out alone (``stagger``) than when the fill's K + 1 steps join the engines together; negative
    where staggering costs.

    Why the choice exists: admitted together, the fill's rollouts share the engines, so the first
    step's rollout drains at the cohort's pace and its training starts late, while the later
    steps of the fill wait for that training anyway (the gate). Where the engines are
    throughput-bound (the cohort near K + 1 times one step's rollout) the first step alone ends
    its rollout that much sooner and the next one's overlaps its training: MINT on 56 A800 /
    Qwen3-32B at K = 1 (1,136 trajectories a step on 768 seats) ran step 0's rollout in 223.5 s
    beside step 1 where steps alone took 150 s; staggered, the run took 199.9 s a step against
    217.6 s (verl-colocated 199.3 s; held_out_56 mint-10/a800-56-32b/K1, SIMULATED, a scratch
    patch of the simulator's gate). Where a rollout is latency-bound (few trajectories, tool
    waits) the cohort costs little more than one step, and staggering only serializes two
    rollouts: FEVER on 38 B200 ran 12.3 s a step staggered against 11.7 s together."""
    k = max(1, int(staleness))
    together = pipeline_run_s("async", k, rollout_s, chain_s, steps, cohort_s=cohort_s, load_s=load_s)
    alone = pipeline_run_s("async", k, rollout_s, chain_s, steps, cohort_s=cohort_s, load_s=load_s, stagger=True)
    return together - alone


def _gate(staleness: int, rollout_s: float, chain_s: float, steps: int, first_extra_s: float,
          cohort_s: float | None, load_s: float, stagger: bool = False) -> tuple[list[float], list[float], list[float]]:
    """``gate_completions``' recurrence: each step's admission, rollout end and sync.
    ``stagger``: steps 1..K are admitted when step 0's rollout ends (not with it)."""
    n = max(1, int(steps))
    k = max(1, int(staleness))
    cohort = rollout_s if cohort_s is None else max(cohort_s, rollout_s)
    admit = [0.0] * n
    end = [0.0] * n
    done = [0.0] * n
    prev_done = 0.0
    busy_start, busy_count, busy_end = 0.0, 0, 0.0
    for j in range(n):
        if j == 0:
            admit[j] = 0.0
        elif j <= k:
            admit[j] = end[0] if stagger else 0.0
        else:
            admit[j] = done[j - 1 - k]
        if j == 0 or admit[j] >= busy_end:  # the engines drained: a new busy period
            busy_start, busy_count = admit[j], 0
        # the next K steps' admissions are known: each waits for a sync of a step before this one
        # (staggered, the fill's wait for step 0's rollout: none overlaps it, each joins the next)
        later = [(end[0] if stagger else 0.0) if i <= k else done[i - 1 - k] for i in range(j + 1, min(n, j + k + 1))
                 if not (stagger and j == 0 and i <= k)]
        length = rollout_s
        for _ in range(_FIXED_POINT_ITERATIONS):
            stop = admit[j] + length
            inside = sum(max(0.0, min(end[i], stop) - admit[j]) for i in range(max(0, j - k), j))
            inside += sum(max(0.0, stop - a) for a in later)
            nxt = shared_rollout_s(rollout_s, cohort, k, inside / max(length, 1e-12))
            if abs(nxt - length) <= 1e-9 * max(1.0, length):
                length = nxt
                break
            length = nxt
        end[j] = max(admit[j] + length, busy_start + (busy_count + 1) * load_s)
        busy_count += 1
        busy_end = max(busy_end, end[j])
        done[j] = max(end[j], prev_done) + chain_s + (first_extra_s if j == 0 else 0.0)
        prev_done = done[j]
    return admit, end, done
