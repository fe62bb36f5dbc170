"""Baseline routers behind the same ``RolloutScheduler`` interface as C-MLFQ.

* ``RoundRobinRouter``: instances in turn, across buckets; trajectories never move.
* ``LeastLoadedRouter``: the bucket with the fewest live trajectories per GPU, then the
  least-loaded instance in it; trajectories never move between buckets (verl-style load
  balancing); with a decode table (Libra's ``libra``), a trajectory starting a tool call may
  move to a faster instance of its bucket (``libra.scheduling.rebalance``).
* ``ReactiveMLFQRouter``: starts in the bucket holding the prompt and moves (migrating KV) only
  once the context has outgrown the bucket's bound: MLFQ without causal prediction.
* ``LengthPredictorRouter``: routes to the bucket holding a *predicted* final length. The
  predictor is trained on past steps only (``RemainingWorkModel``: mean remaining tokens for the
  state), so its error grows by itself when the policy drifts (lengths move away from what past
  steps showed), plus a documented noise term: a seeded lognormal factor ``exp(sigma z -
  sigma^2/2)`` (mean 1, ``sigma`` 0.5 by default, the spread reported for learned output-length
  predictors) on the predicted remainder, drawn once per trajectory and decision.
* ``OracleRouter``: hindsight placement, not a policy a real system can run: it is handed the
  step's true lengths, routes each trajectory to the bucket of its true final length, and places
  it on the instance of that bucket or a longer one with the least true work left (see the
  class); queued work moves like every Libra router's.

Every router but round-robin is work-conserving (``libra.scheduling.base.place``/``steal``):
instance choice spans the bucket and the longer ones, and idle instances pull queued work.
``LeastLoadedRouter(work_conserving=False)`` is the plain least-loaded balancer the simulator's
baselines run (verl-style: a trajectory stays on the instance it was placed on).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from libra.planner.costs import DecodeTable
from libra.planner.plan import Plan
from libra.scheduling.base import InstanceLoad, Route, Transfer, TrajectoryObservation, WorkConserving, least_loaded, place, steal, takes_guests
from libra.scheduling.cmlfq import floor_bucket
from libra.scheduling.history_model import RemainingWorkModel
from libra.scheduling.rebalance import rebalance_target
from libra.trace.columnar import StepArrays


def _stay(obs: TrajectoryObservation) -> Route:
    return Route(obs.bucket if obs.bucket is not None else 0, False)


def bucket_loads(bucket: int, loads: Sequence[InstanceLoad]) -> list[InstanceLoad]:
    """The loads of ``bucket``'s instances; if the pool or a fault emptied it, those of the
    nearest bucket that has instances (longer first: its instances hold more KV)."""
    own = [l for l in loads if l.bucket == bucket]
    if own or not loads:
        return own
    live = sorted({l.bucket for l in loads})
    up = [b for b in live if b > bucket]
    b = up[0] if up else live[-1]
    return [l for l in loads if l.bucket == b]


class RoundRobinRouter:
    """Instances in turn over the whole plan; no moves."""

    work_conserving = False

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._order = [i.bucket for i in sorted(plan.instances, key=lambda i: i.id)] or [0]
        self._next = 0
        self._per_bucket: dict[int, int] = {}

    def admit(self, obs: TrajectoryObservation) -> int:
        b = self._order[self._next % len(self._order)]
        self._next += 1
        return b

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        return _stay(obs)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        return None

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        own = bucket_loads(bucket, loads)
        k = self._per_bucket.get(bucket, 0)
        self._per_bucket[bucket] = k + 1
        return sorted(l.instance for l in own)[k % len(own)]

    def next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        return None  # round-robin never moves queued work


class LeastLoadedRouter:
    """Fewest live trajectories per GPU at admission, least-loaded instance; no moves between
    buckets. ``work_conserving`` (Libra's ``libra-homogeneous``): instance choice by ``place``
    and idle instances pull queued work (``steal``); False (the simulator's baselines): the
    least-loaded instance of the bucket, and queued work stays where it was put. ``table``
    (work-conserving only; Libra's ``libra``): a trajectory starting a tool call moves to a
    faster instance of its bucket (``libra.scheduling.rebalance``), its KV migrating while the
    tool runs; the backends then ask ``choose_instance`` at every call's start (``rebalances``)."""

    def __init__(self, plan: Plan, work_conserving: bool = False, table: DecodeTable | None = None) -> None:
        self.plan = plan
        self.work_conserving = work_conserving
        self.table = table if work_conserving else None
        #: the backends ask ``choose_instance`` as a call starts even when the route keeps the bucket
        self.rebalances = self.table is not None
        #: Libra's work-conserving variant serves the older steps first on shared engines (``WorkConserving``)
        self.step_priority = work_conserving
        self._gpus = {b.index: sum(i.tp for i in plan.instances_in(b.index)) for b in plan.buckets}
        self._live = {b.index: 0 for b in plan.buckets}

    def admit(self, obs: TrajectoryObservation) -> int:
        b = min(self._live, key=lambda k: ((self._live[k] + 1) / max(self._gpus.get(k, 0), 1), k))
        self._live[b] += 1
        return b

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        return _stay(obs)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        if obs.bucket is not None and obs.bucket in self._live:
            self._live[obs.bucket] = max(0, self._live[obs.bucket] - 1)

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        if self.table is not None and obs is not None and obs.at_call_start and obs.instance is not None:
            # a call's start, the route keeping the bucket: stay, or rebalance within the bucket
            here = next((load for load in loads if load.instance == obs.instance), None)
            if here is not None and here.bucket == bucket:
                target = rebalance_target(self.plan, self.table, loads, obs)
                return obs.instance if target is None else target
        if self.work_conserving:
            return place(self.plan, bucket, loads, obs)
        return least_loaded(bucket_loads(bucket, loads))

    def next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        return steal(self.plan, receiver, loads) if self.work_conserving else None


class ReactiveMLFQRouter(WorkConserving):
    """Moves (with KV) only after the context outgrew the current bucket's bound."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.moves = 0

    def admit(self, obs: TrajectoryObservation) -> int:
        return floor_bucket(self.plan, obs.context_tokens)

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        cur = obs.bucket if obs.bucket is not None else 0
        b = floor_bucket(self.plan, obs.context_tokens)
        if b > cur:
            self.moves += 1
            return Route(b, True)
        return Route(cur, False)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        return None


class LengthPredictorRouter(WorkConserving):
    """Routes by a predicted final length (see the module docstring for the error model)."""

    def __init__(self, plan: Plan, model: RemainingWorkModel, sigma: float = 0.5, seed: int = 0) -> None:
        self.plan = plan
        self.model = model
        self.sigma = sigma
        self.seed = seed
        self.moves = 0

    def predicted_final(self, obs: TrajectoryObservation) -> float:
        """Context so far + the model's expected remainder x a seeded lognormal factor."""
        rem = max(self.model.remaining(obs.last_outcome, obs.turns_done, obs.context_tokens, obs.at_call_start), 0.0)
        key = zlib.crc32(f"{self.seed}|{obs.step}|{obs.traj_id}|{obs.turns_done}".encode())
        z = np.random.default_rng(key).standard_normal()
        return obs.context_tokens + rem * float(np.exp(self.sigma * z - self.sigma**2 / 2))

    def admit(self, obs: TrajectoryObservation) -> int:
        return floor_bucket(self.plan, int(self.predicted_final(obs)))

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        cur = obs.bucket if obs.bucket is not None else 0
        b = max(cur, floor_bucket(self.plan, int(self.predicted_final(obs))), floor_bucket(self.plan, obs.context_tokens))
        if b != cur:
            self.moves += 1
            return Route(b, True)
        return Route(cur, False)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        return None


class OracleRouter:
    """Hindsight placement (``sees_future``; not runnable by a real system): it is handed the
    step's true final lengths (``future``), routes each trajectory to the bucket of its final
    length at admission (so it never has to move), and places it, among the instances of that
    bucket and longer ones, on the one with the least true work left per GPU (the tokens its
    trajectories still have to reach their final length, greedy list scheduling), preferring
    instances with room; queued work moves by the same ``steal`` rule as every Libra router.

    It is the best that knowing every length allows *under these rules* (route by final
    length, balance by true work), not a proven bound on every policy: an earlier version
    balanced by trajectory count only and landed below ``libra`` (0.94x)."""

    sees_future = True
    work_conserving = True
    step_priority = True  # as every Libra router (``WorkConserving.step_priority``)

    def __init__(self, plan: Plan, future: StepArrays) -> None:
        self.plan = plan
        self._final = future.total_tokens
        self._gpus = {i.id: max(1, i.tp) for i in plan.instances}
        self._work: dict[int, float] = {}  # instance -> true tokens left of what it holds
        self._at: dict[int, tuple[int, float]] = {}  # trajectory row -> (instance, tokens counted)

    def admission_order(self, observations: Sequence[TrajectoryObservation]) -> list[int]:
        """Longest true remaining work first (LPT): with every queue FIFO, the trajectories that
        take longest start first, so none of them starts last."""
        return sorted(range(len(observations)), key=lambda k: (-(int(self._final[observations[k].index]) - observations[k].context_tokens), k))

    def admit(self, obs: TrajectoryObservation) -> int:
        return floor_bucket(self.plan, int(self._final[obs.index]) - 1)

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        cur = obs.bucket if obs.bucket is not None else 0
        b = floor_bucket(self.plan, obs.context_tokens)
        if obs.instance is not None:  # it may have been moved by a steal: count it where it is
            self._charge(obs.index, obs.instance, obs.context_tokens)
        return Route(b, True) if b > cur else Route(cur, False)

    def _charge(self, row: int, inst: int, context: int) -> None:
        old = self._at.pop(row, None)
        if old is not None:
            self._work[old[0]] = self._work.get(old[0], 0.0) - old[1]
        left = max(float(self._final[row]) - context, 1.0)
        self._work[inst] = self._work.get(inst, 0.0) + left
        self._at[row] = (inst, left)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        old = self._at.pop(obs.index, None)
        if old is not None:
            self._work[old[0]] = self._work.get(old[0], 0.0) - old[1]

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        if obs is None:
            return place(self.plan, bucket, loads, obs)
        ctx = obs.context_tokens
        cands = [l for l in loads if l.bucket >= bucket] or bucket_loads(bucket, loads)
        roomy = [l for l in cands if l.room(ctx) > 0 and l.started]
        if not roomy and obs.instance is not None and any(l.instance == obs.instance and l.started for l in cands):
            return obs.instance  # nothing has room: wait where its KV is cached (as ``place``)
        roomy = [l for l in roomy if takes_guests(l, bucket)] or roomy or cands
        left = max(float(self._final[obs.index]) - ctx, 1.0)

        old = self._at.get(obs.index)

        def key(l: InstanceLoad) -> tuple[float, int]:
            stay = old[1] if old is not None and old[0] == l.instance else 0.0  # already counted there
            return ((self._work.get(l.instance, 0.0) - stay + left) / self._gpus.get(l.instance, 1), l.instance)

        best = min(roomy, key=key).instance
        self._charge(obs.index, best, ctx)
        return best

    def next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        return steal(self.plan, receiver, loads)
