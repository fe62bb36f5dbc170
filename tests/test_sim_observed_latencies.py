"""The simulator reports a finished step to the policy as a real run measures it: with the tool
latencies the replay ran, not the trace's nulls (``sim.loop.observed_step``).

Every converted public log but tau2-retail records no latency. The replay draws each missing one
from its tool family (``libra.trace.latencies.resolve_latencies``), and libra-run's episodes
record each call's measured latency; the planner was handed the trace's nulls and priced every
call at the default latency (MedAgentBench, 48 B200, Qwen3-14B, K=1: 6.75 s forecast against
critical paths of 8.2-11.9 s, SIMULATED)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan

from libra.cluster import ClusterSpec
from libra.trace.latencies import resolve_latencies
from sim.loop import SimConfig, Simulator, observed_step

CLUSTER = ClusterSpec(16, "fake", "fake")


class RecordingPolicy(FixedPolicy):
    """``FixedPolicy`` that keeps every history it is handed and every outcome it observes."""

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self.seen: list[tuple[Any, ...]] = []
        self.outcomes: list[Any] = []

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Any:
        self.seen.append(tuple(history))
        return super().plan(cluster, history, prompt_tokens)

    def observe(self, outcome: Any) -> None:
        self.outcomes.append(outcome)


@pytest.mark.parametrize("mode,k", [("sync", 0), ("async", 1)])
def test_the_policy_sees_the_latencies_the_replay_drew(mode: str, k: int) -> None:
    steps = [make_step(s, 12, seed=7, tool_nan=True) for s in range(3)]
    assert all(np.isnan(s.tool_latency_s[s.tool_code >= 0]).all() for s in steps)
    policy = RecordingPolicy(simple_plan(2, 2))
    seed = 11
    Simulator(steps, policy, CLUSTER, fake_costs(), SimConfig(noise_sigma=0.0, seed=seed, mode=mode, max_staleness=k)).run()
    last = policy.seen[-1]
    assert len(last) >= 1
    for seen in last:
        trace = next(s for s in steps if s.step == seen.step)
        drawn = resolve_latencies(trace, seed)
        calls = trace.tool_code >= 0
        assert np.array_equal(seen.tool_latency_s[calls], drawn[calls])  # what the replay ran, call by call
        assert np.isnan(seen.tool_latency_s[~calls]).all()  # turns that call no tool stay as the trace has them
        assert np.array_equal(seen.gen_tokens, trace.gen_tokens)  # nothing else changes
    assert [o.trajectories.step for o in policy.outcomes] == sorted(o.trajectories.step for o in policy.outcomes)
    assert all(not np.isnan(o.trajectories.tool_latency_s[o.trajectories.tool_code >= 0]).any() for o in policy.outcomes)


def test_a_trace_with_latencies_is_reported_as_it_is() -> None:
    step = make_step(0, 8, seed=3)
    assert observed_step(step, resolve_latencies(step, 0)) is step
