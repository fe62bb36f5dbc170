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
0.856x, SIMULATED). When the rollout is much longer than the chain, the staggered model tends
to the wave model (the admissions bunch up and the steps overlap fully).
"""

from __future__ import annotations

#: Fixed-point iterations for a rollout's length under overlap in ``pipeline_run_s`` (monotone).
_FIXED_POINT_ITERATIONS = 24
#: Bisection steps for the steady state's period (at most; it stops at a relative 1e-6).
_BISECTION_STEPS = 40


def shared_rollout_s(rollout_s: float, cohort_s: float, staleness: int, overlap: float) -> float:
    """A step's rollout when ``overlap`` other steps' rollouts share the engines with it on
    average (time-weighted, in units of its own length): ``rollout_s`` alone, ``cohort_s`` (at
    least ``rollout_s``) with K = ``staleness`` others throughout, linear in between (the wave
    model's ``rollout_s + (cohort_s - rollout_s) (m - 1) / K`` for m steps admitted together)."""
    k = max(1, int(staleness))
    extra = max(0.0, cohort_s - rollout_s)
    return rollout_s + extra * min(1.0, max(0.0, overlap) / k)


def _staggered_length(rollout_s: float, cohort_s: float, staleness: int, spacing_s: float) -> float:
    """The steady rollout length L of steps admitted every ``spacing_s``: each overlaps its
    i-th neighbour on either side by max(0, L - i x spacing) (i = 1..K: at most K others are in
    flight), and L is ``shared_rollout_s`` of that overlap: the least fixed point at or above
    ``rollout_s`` (where iterating from the rollout alone converges).

    Solved in closed form: with m neighbours on each side overlapping (m x spacing < L), the
    overlap is 2 (m L - spacing m (m + 1) / 2) / L, so L solves
    L^2 - (R + 2 D m / K) L + (D / K) spacing m (m + 1) = 0 (R the rollout alone, D the cohort's
    extra), a root valid when it lies in m's range; the full cohort when the overlap reaches K."""
    k = max(1, int(staleness))
    extra = max(0.0, cohort_s - rollout_s)
    if extra <= 0.0 or rollout_s <= spacing_s:
        return rollout_s
    cohort = rollout_s + extra
    found: list[float] = []
    for m in range(1, k + 1):
        low = m * spacing_s
        high = (m + 1) * spacing_s if m < k else float("inf")
        b = rollout_s + 2.0 * extra * m / k
        c = extra / k * spacing_s * m * (m + 1)
        disc = b * b - 4.0 * c
        if disc < 0.0:
            continue
        for root in ((b - disc ** 0.5) / 2.0, (b + disc ** 0.5) / 2.0):
            if low < root <= high and rollout_s <= root <= cohort:
                found.append(root)
    return min(found) if found else cohort


def async_steady_s(rollout_s: float, chain_s: float, load_s: float, cohort_s: float, staleness: int) -> float:
    """The steady period of the async pipeline: the smallest P at least the engines' pace
    (``load_s``) and the training-plus-sync chain (``chain_s``) at which a step's rollout,
    admitted K = ``staleness`` steps before its training is due, fits its cycle:
    ``P >= (L(P) + chain_s) / (K + 1)``, with L(P) the rollout of steps admitted every P
    (``_staggered_length``). L falls as P grows, so the smallest such P is found by bisection
    between the rollout alone (``rollout_s``) and the full cohort (``cohort_s``: the wave
    model's price, never exceeded)."""
    k = max(1, int(staleness))
    cohort = max(cohort_s, rollout_s)
    low = max(load_s, chain_s, (rollout_s + chain_s) / (k + 1))
    high = max(load_s, chain_s, (cohort + chain_s) / (k + 1))
    if high - low <= 1e-9 * max(1.0, high):
        return high

    def short(period: float) -> float:
        """How far ``period`` falls short of what its cycle needs (<= 0: it holds)."""
        return (_staggered_length(rollout_s, cohort, k, period) + chain_s) / (k + 1) - period

    if short(low) <= 0.0:
        return low
    lo, hi = low, high
    for _ in range(_BISECTION_STEPS):
        if hi - lo <= 1e-6 * hi:
            break
        mid = 0.5 * (lo + hi)
        if short(mid) <= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def pipeline_run_s(mode: str, staleness: int, rollout_s: float, chain_s: float, steps: int, first_extra_s: float = 0.0,
                   cohort_s: float | None = None, load_s: float = 0.0) -> float:
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
    fireact-hotpotqa/b200-24-8b/K1, SIMULATED)."""
    n = max(1, int(steps))
    if mode != "async":
        return n * (rollout_s + chain_s) + first_extra_s
    k = max(1, int(staleness))
    cohort = rollout_s if cohort_s is None else max(cohort_s, rollout_s)
    admit = [0.0] * n
    end = [0.0] * n
    done = [0.0] * n
    prev_done = 0.0
    busy_start, busy_count, busy_end = 0.0, 0, 0.0
    for j in range(n):
        admit[j] = 0.0 if j <= k else done[j - 1 - k]
        if j == 0 or admit[j] >= busy_end:  # the engines drained: a new busy period
            busy_start, busy_count = admit[j], 0
        # the next K steps' admissions are known: each waits for a sync of a step before this one
        later = [0.0 if i <= k else done[i - 1 - k] for i in range(j + 1, min(n, j + k + 1))]
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
    return done[-1]
