"""A rollout instance's closed-form advance against a naive per-iteration loop, and its KV rules."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from sim.instance import Instance, InvariantViolation, QueueEntry, SimulationError
from sim.noise import Noise
from test_sim_support import fake_costs


def _instance(env: simpy.Environment, costs, finished: dict, tp: int = 1) -> Instance:  # type: ignore[no-untyped-def]
    def on_end(inst: Instance, traj: int, ctx: int, now: float) -> None:
        assert traj not in finished
        finished[traj] = (now, ctx)

    return Instance(env, 0, tp, 0, tuple(range(tp)), 0, costs, Noise(0, 0.0), on_end, lambda inst: None)


def naive(costs, tp: int, arrivals: list[tuple[float, int, int, int]]) -> dict[int, tuple[float, int]]:  # type: ignore[no-untyped-def]
    """Token by token: arrivals (time, traj, context, gen) join at the first iteration boundary
    after they arrive (or at once when idle); their prefill rides on that iteration."""
    pending = sorted(arrivals)
    t = 0.0
    running: dict[int, list[int]] = {}  # traj -> [ctx, remaining]
    out: dict[int, tuple[float, int]] = {}
    pre: list[tuple[int, int]] = []
    while pending or running:
        if not running and pending and pending[0][0] > t:
            t = pending[0][0]
        while pending and pending[0][0] <= t:
            _, traj, ctx, gen = pending.pop(0)
            running[traj] = [ctx, gen]
            pre.append((ctx, 0))
        for traj in [k for k, v in running.items() if v[1] == 0]:
            out[traj] = (t, running.pop(traj)[0])
        if not running:
            continue
        B = len(running)
        base, slope = costs.decode_coeffs(tp, B)
        C = sum(v[0] for v in running.values())
        dt = base + slope * C + (costs.prefill_batch_s(tp, pre) if pre else 0.0)
        pre = []
        t += dt
        for v in running.values():
            v[0] += 1
            v[1] -= 1
        for traj in [k for k, v in running.items() if v[1] == 0]:
            out[traj] = (t, running.pop(traj)[0])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_equals_naive_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = fake_costs(kv_tokens=10**9, max_seqs=1000)
    arrivals = [(0.0, i, int(rng.integers(10, 500)), int(rng.integers(1, 60))) for i in range(6)]
    # later arrivals at times that are not iteration boundaries
    arrivals += [(float(rng.uniform(0.01, 0.6)), 6 + i, int(rng.integers(10, 500)), int(rng.integers(1, 60))) for i in range(5)]
    env = simpy.Environment()
    got: dict = {}
    inst = _instance(env, costs, got)
    for t, traj, ctx, gen in arrivals:
        ev = env.timeout(t)
        ev.callbacks.append(lambda _e, traj=traj, ctx=ctx, gen=gen: inst.enqueue(QueueEntry(traj, ctx, gen, env.now)))
    env.run()
    want = naive(costs, 1, arrivals)
    assert set(got) == set(want)
    for k in want:
        assert got[k][1] == want[k][1]
        assert got[k][0] == pytest.approx(want[k][0], rel=1e-9, abs=1e-12)
    assert inst.gen_tokens == sum(a[3] for a in arrivals)
    # few events: one interval per membership change, not per token
    assert inst.intervals < 4 * len(arrivals)


def test_iterations_done_by_matches_prefix_sums() -> None:
    costs = fake_costs(kv_tokens=10**9)
    env = simpy.Environment()
    inst = _instance(env, costs, {})
    for i in range(5):
        inst.enqueue(QueueEntry(i, 100 * (i + 1), 1000, 0.0))
    env.run(until=1e-9)  # kick: the first interval starts
    assert inst.busy
    times = [inst._cost(n) for n in range(0, 50)]
    for n in range(1, 49):
        mid = (times[n] + times[n + 1]) / 2
        assert inst.iterations_done_by(mid) == n
        # exactly on a boundary, rounding may count it either way; both end the interval there
        assert inst.iterations_done_by(times[n]) in (n - 1, n)


def test_kv_never_exceeds_capacity_and_preemption_loses_nothing() -> None:
    costs = fake_costs(kv_tokens=3000, max_seqs=64)
    env = simpy.Environment()
    got: dict = {}
    inst = _instance(env, costs, got)
    seen: list[int] = []
    orig = inst._start_interval

    def watch() -> None:
        orig()
        seen.append(inst.kv_used + inst._B * inst._N if inst.busy else inst.kv_used)

    inst._start_interval = watch  # type: ignore[method-assign]
    for i in range(12):
        inst.enqueue(QueueEntry(i, 200, 300, 0.0))
    env.run()
    assert len(got) == 12
    assert inst.preemptions > 0
    assert max(seen) <= inst.capacity
    assert inst.peak_kv <= inst.capacity
    assert inst.gen_tokens == 12 * 300
    assert all(ctx == 500 for _, ctx in got.values())


def test_sequence_larger_than_cache_is_a_user_error() -> None:
    costs = fake_costs(kv_tokens=1000)
    env = simpy.Environment()
    inst = _instance(env, costs, {})
    inst.enqueue(QueueEntry(0, 2000, 10, 0.0))
    with pytest.raises(SimulationError, match="TP=1"):
        env.run()


def test_cached_kv_is_evicted_before_preempting() -> None:
    costs = fake_costs(kv_tokens=2000, max_seqs=8)
    env = simpy.Environment()
    got: dict = {}
    inst = _instance(env, costs, got)
    inst.hold(99, 1500)  # a sequence in a tool call keeps 1500 tokens cached
    inst.enqueue(QueueEntry(0, 600, 100, 0.0))
    env.run()
    assert got[0][1] == 700
    assert inst.evictions == 1 and inst.preemptions == 0
    assert inst.cached_for(99) == 0


def test_evacuate_returns_everything_with_progress_kept() -> None:
    costs = fake_costs(kv_tokens=10**6)
    env = simpy.Environment()
    inst = _instance(env, costs, {})
    for i in range(3):
        inst.enqueue(QueueEntry(i, 100, 10_000, 0.0))
    env.run(until=1.0)
    done_before = inst.gen_tokens
    out = inst.evacuate()
    assert sorted(e.traj for e in out) == [0, 1, 2]
    generated = inst.gen_tokens - done_before
    assert sum(10_000 - e.remaining for e in out) == inst.gen_tokens
    assert all(e.context == 100 + (10_000 - e.remaining) for e in out)
    assert generated > 0
    with pytest.raises(InvariantViolation):
        inst.enqueue(QueueEntry(5, 10, 10, env.now))


def _ranked_instance(env: simpy.Environment, costs, finished: dict, rank_of: dict[int, int]) -> Instance:  # type: ignore[no-untyped-def]
    """An instance on engines shared by steps, under step priority: ``rank_of`` maps a sequence
    to its step's rank (smaller: older)."""
    def on_end(inst: Instance, traj: int, ctx: int, now: float) -> None:
        finished[traj] = (now, ctx)

    return Instance(env, 0, 1, 0, (0,), 0, costs, Noise(0, 0.0), on_end, lambda inst: None, step_rank=rank_of.__getitem__)


def test_step_priority_keeps_an_older_steps_parked_kv() -> None:
    """A newer step's turn never evicts KV an older step's trajectory parked for a tool call: it
    waits for free KV. The same turn of the older step's own evicts it (LRU), as without the rule."""
    costs = fake_costs(kv_tokens=2000, max_seqs=8)
    env = simpy.Environment()
    got: dict = {}
    inst = _ranked_instance(env, costs, got, {99: 0, 1: 1})
    inst.hold(99, 1500)  # step 0's trajectory in a tool call
    inst.enqueue(QueueEntry(1, 600, 100, 0.0))  # step 1's first turn: 1,500 + 601 > 2,000
    env.run()
    assert 1 not in got and inst.evictions == 0 and inst.cached_for(99) == 1500
    inst.release(99)  # the older trajectory's KV frees (it ended): the newer turn runs
    env.run()
    assert got[1][1] == 700

    env = simpy.Environment()
    got = {}
    inst = _ranked_instance(env, costs, got, {99: 0, 1: 0})
    inst.hold(99, 1500)
    inst.enqueue(QueueEntry(1, 600, 100, 0.0))  # the same step's: evicts as before
    env.run()
    assert got[1][1] == 700 and inst.evictions == 1


def test_step_priority_orders_the_queue_oldest_step_first() -> None:
    """Queued turns are admitted oldest step first (arrival order within a step), preempted ones
    go back to the front of their step's entries, and cached KV goes newest step first."""
    costs = fake_costs(kv_tokens=100_000, max_seqs=1)
    env = simpy.Environment()
    got: dict = {}
    rank = {10: 1, 11: 1, 12: 1, 20: 0, 21: 0, 30: 2}
    inst = _ranked_instance(env, costs, got, rank)
    for traj in (10, 30, 20, 11, 21):
        inst.enqueue(QueueEntry(traj, 100, 5, 0.0))
    assert [e.traj for e in inst.queue] == [20, 21, 10, 11, 30]
    inst._insert(QueueEntry(12, 100, 5, 0.0), True)
    assert [e.traj for e in inst.queue] == [20, 21, 12, 10, 11, 30]
    env.run()
    order = sorted(got, key=lambda t: got[t][0])
    assert order == [20, 21, 12, 10, 11, 30]

    env = simpy.Environment()
    inst = _ranked_instance(env, fake_costs(kv_tokens=100_000, max_seqs=8), {}, {1: 0, 2: 1, 3: 0})
    inst.hold(1, 100)  # least recently used, older step
    inst.hold(2, 100)  # newer step
    inst.hold(3, 100)
    inst._evict_except(-1, 150)
    assert inst.cached_for(2) == 0 and inst.cached_for(1) == 0 and inst.cached_for(3) == 100
