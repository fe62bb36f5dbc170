"""Property test: random small workloads, cache sizes, loop modes and routing (migration on or
off) must always replay every trajectory exactly once with the trace's token counts and KV
never above capacity. The simulator raises on any broken invariant itself; this drives it
through many combinations (preemption, eviction, pinned migrations, role changes)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.cluster import ClusterSpec
from libra.pool.base import PoolObservation, RoleChange
from sim.loop import SimConfig, Simulator
from test_sim_support import FixedPolicy, fake_costs, make_step, simple_plan


class _LendIdle:
    """TEST POOL: lends an instance once it is empty (nonblocking or sync join)."""

    def __init__(self, join: str) -> None:
        self.join = join

    def on_rollout_progress(self, obs: PoolObservation) -> list[RoleChange]:
        return [RoleChange(s.instance, self.join) for s in obs.instances if s.running == 0 and s.queued == 0][:1]  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 24),
    kv=st.integers(2_600, 20_000),
    mode=st.sampled_from(["sync", "async"]),
    streaming=st.booleans(),
    kv_mode=st.sampled_from(["keep", "release"]),
    migrate=st.booleans(),
    pool=st.sampled_from([None, "nonblocking", "sync"]),
    max_seqs=st.integers(1, 16),
)
def test_random_replays_keep_every_invariant(seed: int, n: int, kv: int, mode: str, streaming: bool, kv_mode: str,
                                             migrate: bool, pool: str | None, max_seqs: int) -> None:
    steps = [make_step(s, n, seed=seed, turns=(1, 5), gen=(0, 150), trailing_tool_every=5) for s in range(2)]
    plan = simple_plan(4, 2, two_buckets=migrate)
    policy = FixedPolicy(plan, pool=_LendIdle(pool) if pool else None, migrate_to=1 if migrate else None)
    sim = Simulator(steps, policy, ClusterSpec(16, "fake", "fake"), fake_costs(kv_tokens=kv, max_seqs=max_seqs),
                    SimConfig(mode=mode, streaming=streaming and mode == "sync", kv_mode=kv_mode, seed=seed))  # streaming is a sync loop
    res = sim.run()
    assert res.completed == res.expected == 2 * n
    for s, m in zip(steps, res.steps):
        assert m.gen_tokens == int(s.total_gen_tokens.sum())
        assert m.peak_kv_fraction <= 1.0
    assert all(o is None for o in sim.ledger.owner)
