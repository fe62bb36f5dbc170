"""``SimReplayer``: the simulator's what-if evaluation, offered to the policy core.

``areal-static-optimal`` (``libra.policies.areal``) picks the best fixed configuration in
hindsight by replaying candidates over the whole trace. The policy lives in the core and never
imports ``sim``; it asks for a ``libra.policies.hindsight.HindsightReplayer``, and this is the
simulator's: it replays a plan held fixed (least-loaded routing, no pool) with the replay's own
settings (``SimConfig``: KV mode, mini-batches, KL, seed) and the noise off. ``sim.replay``
hands one to every policy it builds (``PolicyOptions.hindsight``); only the hindsight baseline
uses it.

Results are cached in ``SimCosts.memo`` per (trace steps, plan, replay settings), so a sweep or a
repeated search in one process replays a candidate once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from libra.pool.base import PoolPolicy
from libra.scheduling.base import RolloutScheduler
from libra.scheduling.routers import LeastLoadedRouter
from libra.trace.columnar import StepArrays
from sim.costs import SimCosts
from sim.loop import SimConfig, Simulator


def _steps_digest(steps: Sequence[StepArrays]) -> str:
    """A digest of what a replay of ``steps`` depends on (the cache key of a hindsight replay)."""
    h = hashlib.sha1()
    for s in steps:
        h.update(str((s.step, s.n)).encode())
        for arr in (s.prompt_tokens, s.total_tokens, s.total_gen_tokens, s.tool_code):
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _plan_key(plan: Plan) -> tuple[object, ...]:
    """What makes two fixed plans replay the same."""
    return (plan.n_rollout_gpus, plan.n_train_gpus, plan.train, plan.instances, plan.colocated, plan.mode,
            plan.max_staleness, plan.streaming)


class FixedPlan:
    """The same plan every step, least-loaded routing, no pool (a hindsight candidate)."""

    sees_future = False

    def __init__(self, plan: Plan) -> None:
        self.name = "hindsight-candidate"
        self._plan = plan

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        """The candidate, whatever happened."""
        return self._plan

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        """Least-loaded routing, as the static baselines route."""
        return LeastLoadedRouter(plan)

    def pool(self, plan: Plan) -> PoolPolicy | None:
        """No pool: a static configuration."""
        return None


class SimReplayer:
    """A ``HindsightReplayer`` over ``steps`` on ``cluster``, priced by ``costs``, with the
    replay settings of ``config`` (None: the defaults, seeded with ``seed``)."""

    def __init__(self, steps: Sequence[StepArrays], cluster: ClusterSpec, costs: SimCosts, config: SimConfig | None = None,
                 seed: int = 0) -> None:
        self._steps = list(steps)
        self.cluster = cluster
        self.costs = costs
        self.config = config if config is not None else SimConfig(seed=seed)

    @property
    def steps(self) -> Sequence[StepArrays]:
        """The whole trace this replayer holds."""
        return self._steps

    def config_for(self, mode: str, staleness: int) -> SimConfig:
        """The replay settings of a candidate: the replay's own, noise off, no faults, the
        candidate's loop, ``staleness`` as its bound (async) and its class."""
        return replace(self.config, mode=mode, staleness=staleness if mode == "async" else None,
                       max_staleness=max(staleness, 0), streaming=False, noise_sigma=0.0, faults=(), gantt_step=None)

    def wall_s(self, plan: Plan, steps: Sequence[StepArrays], staleness: int) -> float:
        """Simulated wall time of ``plan`` held fixed over ``steps`` (cached in ``costs.memo``)."""
        cfg = self.config_for(plan.mode, staleness)
        key = ("hindsight-wall", _steps_digest(steps), _plan_key(plan),
               (cfg.mode, cfg.staleness, cfg.kl, cfg.kv_mode, cfg.seed, cfg.mini_batches))
        got = self.costs.memo.get(key)
        if got is None:
            got = self.costs.memo[key] = Simulator(steps, FixedPlan(plan), self.cluster, self.costs, cfg).run().wall_s
        return float(got)  # type: ignore[arg-type]
