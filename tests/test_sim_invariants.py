"""Whole-simulator invariants on small hand-made steps with the test-double evaluator:
every trajectory completes exactly once, tokens are conserved, same seed same result, time
never runs backwards, faults lose nothing, GPUs are never double-booked."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy

from libra.cluster import ClusterSpec
from libra.pool.base import PoolObservation, RoleChange
from libra.trace.latencies import resolve_latencies
from sim.instance import InvariantViolation, SimulationError
from sim.ledger import GpuLedger
from sim.loop import Fault, SimConfig, Simulator
from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan

CLUSTER = ClusterSpec(16, "fake", "fake")


def _run(steps, policy, **cfg):  # type: ignore[no-untyped-def]
    sim = Simulator(steps, policy, CLUSTER, fake_costs(kv_tokens=cfg.pop("kv", 60_000)), SimConfig(**cfg))
    return sim, sim.run()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kv_mode", ["keep", "release"])
def test_every_trajectory_completes_once_and_tokens_are_conserved(mode: str, kv_mode: str) -> None:
    steps = [make_step(s, 40, seed=1, trailing_tool_every=7) for s in range(3)]
    sim, res = _run(steps, FixedPolicy(simple_plan(3, 2)), mode=mode, kv_mode=kv_mode, kv=3000)
    for s, m in zip(steps, res.steps):
        assert m.completed == m.n_traj == s.n
        assert m.gen_tokens == int(s.total_gen_tokens.sum())
        assert m.trained_tokens == int(s.total_tokens.sum())
    assert res.completed == res.expected == 120
    assert any(m.preemptions > 0 for m in res.steps)  # the small cache forced preemptions
    # the policy planned each step with the completed steps only (async, continuous generation:
    # the next step is planned once the previous one's trajectories are all seated, not done)
    if mode == "sync":
        assert sim.policy.histories == [0, 1, 2]
    else:
        assert all(h <= j for j, h in enumerate(sim.policy.histories))


def test_same_seed_same_result_and_seed_matters() -> None:
    steps = [make_step(s, 30, seed=2, tool_nan=True) for s in range(2)]
    a = _run(steps, FixedPolicy(simple_plan()), seed=5)[1]
    b = _run(steps, FixedPolicy(simple_plan()), seed=5)[1]
    c = _run(steps, FixedPolicy(simple_plan()), seed=6)[1]
    assert [m.row() for m in a.steps] == [m.row() for m in b.steps]
    assert a.wall_s != c.wall_s


def test_time_never_runs_backwards() -> None:
    steps = [make_step(s, 30, seed=3) for s in range(3)]
    cfg_gantt = 1
    for mode in ("sync", "async"):
        _, res = _run(steps, FixedPolicy(simple_plan()), mode=mode, gantt_step=cfg_gantt)
        ends = [m.step_end_s for m in res.steps]
        assert ends == sorted(ends)
        for prev, m in zip(res.steps, res.steps[1:]):
            if mode == "sync":
                assert m.rollout_start_s >= prev.rollout_start_s + prev.rollout_makespan_s - 1e-9
            else:  # continuous generation: the next rollout may start during this one's tail
                assert m.rollout_start_s >= prev.rollout_start_s - 1e-9
        for m in res.steps:
            assert m.rollout_makespan_s > 0 and m.train_s > 0 and m.step_s > 0
            assert m.train_start_s >= m.rollout_start_s + m.rollout_makespan_s - 1e-9
        by_inst: dict[int, list[tuple[float, float]]] = {}
        for iid, _tp, a, b, _batch in res.gantt:
            assert b >= a
            by_inst.setdefault(iid, []).append((a, b))
        assert by_inst
        for spans in by_inst.values():
            for (a0, b0), (a1, _b1) in zip(spans, spans[1:]):
                assert a1 >= b0 - 1e-9  # one interval at a time per instance, in order


def test_async_overlaps_training_with_next_rollout() -> None:
    steps = [make_step(s, 30, seed=4) for s in range(4)]
    sync = _run(steps, FixedPolicy(simple_plan()), mode="sync", noise_sigma=0.0)[1]
    asyn = _run(steps, FixedPolicy(simple_plan()), mode="async", staleness=1, noise_sigma=0.0)[1]
    assert asyn.wall_s < sync.wall_s
    # staleness 1: rollout j+1 starts before training j ends
    assert any(n.rollout_start_s < m.step_end_s for m, n in zip(asyn.steps, asyn.steps[1:]))


def test_gpu_failure_loses_nothing_and_costs_time() -> None:
    steps = [make_step(0, 40, seed=5, turns=(3, 6), gen=(100, 400))]
    base = _run(steps, FixedPolicy(simple_plan(3, 2)), noise_sigma=0.0)[1]
    t = base.steps[0].rollout_makespan_s / 3
    _, res = _run(steps, FixedPolicy(simple_plan(3, 2)), noise_sigma=0.0, faults=(Fault(0, t, 1),))
    m = res.steps[0]
    assert m.completed == 40 and m.gen_tokens == base.steps[0].gen_tokens
    assert m.fault_requeued > 0
    assert m.rollout_makespan_s > base.steps[0].rollout_makespan_s


def test_fault_on_a_gpu_without_rollout_is_a_user_error() -> None:
    steps = [make_step(0, 10, seed=5)]
    with pytest.raises(Exception, match="serves no rollout"):
        _run(steps, FixedPolicy(simple_plan(2, 2)), faults=(Fault(0, 0.01, 15),))


def test_migration_moves_kv_and_completes() -> None:
    steps = [make_step(0, 30, seed=6, turns=(3, 6))]
    _, res = _run(steps, FixedPolicy(simple_plan(4, 2, two_buckets=True), migrate_to=1))
    m = res.steps[0]
    assert m.migrations > 0 and m.completed == 30


class _LendWhenIdle:
    """TEST POOL: lends every instance that has emptied while trajectories remain."""

    def __init__(self) -> None:
        self.calls = 0

    def on_rollout_progress(self, obs: PoolObservation) -> list[RoleChange]:
        self.calls += 1
        return [RoleChange(s.instance, "nonblocking") for s in obs.instances if s.running == 0 and s.queued == 0]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pool_role_changes_never_double_book(mode: str) -> None:
    steps = [make_step(s, 24, seed=7, turns=(1, 4)) for s in range(3)]
    pool = _LendWhenIdle()
    sim, res = _run(steps, FixedPolicy(simple_plan(4, 2), pool=pool), mode=mode)
    assert pool.calls > 0
    assert sum(m.role_changes for m in res.steps) > 0
    assert res.completed == res.expected
    assert all(o is None for o in sim.ledger.owner)  # everything handed back at the end


def test_ledger_refuses_double_booking() -> None:
    env = simpy.Environment()
    led = GpuLedger(env, 8)
    led.take((0, 1), "a")
    with pytest.raises(InvariantViolation, match="double-booked"):
        led.take((1, 2), "b")
    ev = led.acquire((1, 2), "b")
    assert not ev.triggered
    # a later booking of free GPUs does not wait behind an earlier one it does not overlap
    other = led.acquire((5, 6), "c")
    assert other.triggered and led.owner[5] == "c"
    led.release((0, 1), "a")
    assert ev.triggered and led.owner[2] == "b"


def test_plan_with_overlapping_instances_is_rejected() -> None:
    plan = simple_plan(2, 2)
    bad = replace(plan, instances=(plan.instances[0], replace(plan.instances[1], first_gpu=1)))
    with pytest.raises(SimulationError, match="same GPU"):
        _run([make_step(0, 5)], FixedPolicy(bad))


def test_default_tool_latencies_fill_only_nulls() -> None:
    s = make_step(0, 20, seed=8, tool_nan=True)
    lat = resolve_latencies(s, seed=3)
    has = s.tool_code >= 0
    assert np.all(lat[~has] == 0) and np.all(lat[has] > 0) and np.all(lat[has] <= 60)
    assert np.array_equal(lat, resolve_latencies(s, seed=3))
    t = make_step(0, 20, seed=8)
    assert np.array_equal(resolve_latencies(t, 3)[t.tool_code >= 0], t.tool_latency_s[t.tool_code >= 0])


def test_streaming_starts_training_before_the_tail_ends_and_stays_whole() -> None:
    steps = [make_step(s, 32, seed=9, turns=(1, 6)) for s in range(2)]
    plain = _run(steps, FixedPolicy(simple_plan()), mode="sync", noise_sigma=0.0)[1]
    _, res = _run(steps, FixedPolicy(simple_plan()), mode="sync", streaming=True, noise_sigma=0.0)
    assert res.completed == res.expected
    for m in res.steps:
        assert m.train_start_s < m.rollout_start_s + m.rollout_makespan_s  # overlapped the tail
    # the same work, so the same busy training time, finished no later
    assert res.wall_s <= plain.wall_s + 1e-9
    for a, b in zip(res.steps, plain.steps):
        assert a.forward_s + a.update_s == pytest.approx(b.forward_s + b.update_s, rel=1e-9)


def test_router_observations_hold_only_the_past() -> None:
    from libra.trace.records import OUTCOMES
    from test_sim_support import OneBucketRouter

    step = make_step(0, 20, seed=10, turns=(2, 6))
    seen: list[tuple[str, object]] = []

    class Spy(OneBucketRouter):
        def admit(self, obs):  # type: ignore[no-untyped-def]
            seen.append(("admit", obs))
            return super().admit(obs)

        def on_tool_return(self, obs):  # type: ignore[no-untyped-def]
            seen.append(("tool", obs))
            return super().on_tool_return(obs)

        def on_finish(self, obs):  # type: ignore[no-untyped-def]
            seen.append(("finish", obs))
            super().on_finish(obs)

    pol = FixedPolicy(simple_plan())
    pol.scheduler = lambda plan, future=None: Spy()  # type: ignore[method-assign]
    _run([step], pol)
    off = step.turn_offsets
    for kind, obs in seen:
        i = obs.index
        rows = range(off[i], off[i + 1])
        if kind == "admit":
            assert obs.context_tokens == step.prompt_tokens[i] and obs.turns_done == 0 and obs.last_outcome is None
        elif kind == "tool" and obs.at_call_start:
            k = obs.turns_done - 1  # the turn that just ended with this call
            r = rows[k]
            ctx = step.prompt_tokens[i] + sum(step.gen_tokens[x] + step.tool_tokens[x] for x in rows[:k]) + step.gen_tokens[r]
            assert obs.context_tokens == ctx  # this call's returned tokens are not known yet
            assert obs.last_tool == step.tool_names[step.tool_code[r]]
            prev = step.outcome_code[r - 1] if k > 0 else -1
            assert obs.last_outcome == (OUTCOMES[prev] if prev >= 0 else None)
        elif kind == "tool":  # asked again at the call's return: its outcome and output are known now
            k = obs.turns_done - 1
            r = rows[k]
            assert r + 1 < off[i + 1]  # only calls after which the trajectory continues
            ctx = step.prompt_tokens[i] + sum(step.gen_tokens[x] + step.tool_tokens[x] for x in rows[: k + 1])
            assert obs.context_tokens == ctx
            assert obs.last_tool == step.tool_names[step.tool_code[r]]
            assert obs.last_outcome == OUTCOMES[step.outcome_code[r]]
        else:
            assert obs.context_tokens == step.total_tokens[i] and obs.turns_done == step.n_turns[i]
    assert sum(k == "finish" for k, _ in seen) == step.n


def test_async_split_move_lets_the_previous_training_go_first() -> None:
    """Async, step 1's plan moves the split towards rollout: the GPUs step 0's training still
    needs go to that training first (its job was decided earlier); step 1's new instance on
    them waits for it, instead of booking them at the same instant and stalling the training
    for a whole rollout."""
    from test_sim_support import FixedPolicy, simple_plan

    class Moving(FixedPolicy):
        def plan(self, cluster, history, prompt_tokens):  # type: ignore[no-untyped-def]
            self.histories.append(len(history))
            return simple_plan(n_inst=2) if len(self.histories) == 1 else simple_plan(n_inst=3)

    steps = [make_step(s, 30, seed=4) for s in range(3)]
    sim, res = _run(steps, Moving(simple_plan()), mode="async", staleness=1, noise_sigma=0.0)
    s0, s1 = res.steps[0], res.steps[1]
    assert s0.n_train_gpus == 12 and s1.n_train_gpus == 10
    assert s0.train_start_s == pytest.approx(s0.rollout_start_s + s0.rollout_makespan_s)
    assert s1.rollout_start_s == pytest.approx(s0.rollout_start_s + s0.rollout_makespan_s)
    assert res.completed == res.expected
