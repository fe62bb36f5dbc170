"""Baseline routers behind the same ``RolloutScheduler`` interface as C-MLFQ.

* ``RoundRobinRouter``: instances in turn, across buckets; trajectories never move.
* ``LeastLoadedRouter``: the bucket with the fewest live trajectories per GPU, then the
  least-loaded instance in it; trajectories never move (verl-style load balancing).
* ``ReactiveMLFQRouter``: starts in the bucket holding the prompt and moves (migrating KV) only
  once the context has outgrown the bucket's bound: MLFQ without causal prediction.
* ``LengthPredictorRouter``: routes to the bucket holding a *predicted* final length. The
  predictor is trained on past steps only (``RemainingWorkModel``: mean remaining tokens for the
  state), so its error grows by itself when the policy drifts (lengths move away from what past
  steps showed), plus a documented noise term: a seeded lognormal factor ``exp(sigma z -
  sigma^2/2)`` (mean 1, ``sigma`` 0.5 by default, the spread reported for learned output-length
  predictors) on the predicted remainder, drawn once per trajectory and decision.
* ``OracleRouter``: an UPPER BOUND, not a policy a real system can run: it is handed the step's
  true final lengths and places each trajectory in its final bucket at admission.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from libra.planner.plan import Plan
from libra.scheduling.base import InstanceLoad, Route, TrajectoryObservation, least_loaded
from libra.scheduling.cmlfq import floor_bucket
from libra.scheduling.history_model import RemainingWorkModel
from libra.trace.columnar import StepArrays


def _stay(obs: TrajectoryObservation) -> Route:
    return Route(obs.bucket if obs.bucket is not None else 0, False)


class RoundRobinRouter:
    """Instances in turn over the whole plan; no moves."""

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

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        k = self._per_bucket.get(bucket, 0)
        self._per_bucket[bucket] = k + 1
        return sorted(l.instance for l in loads)[k % len(loads)]


class LeastLoadedRouter:
    """Fewest live trajectories per GPU at admission, least-loaded instance; no moves."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
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

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        return least_loaded(loads)


class ReactiveMLFQRouter:
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

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        return least_loaded(loads)


class LengthPredictorRouter:
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

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        return least_loaded(loads)


class OracleRouter:
    """UPPER BOUND: knows every trajectory's true final length (``future``) and places it in its
    final bucket at admission, so it never moves. Not runnable by a real system."""

    sees_future = True

    def __init__(self, plan: Plan, future: StepArrays) -> None:
        self.plan = plan
        self._final = future.total_tokens

    def admit(self, obs: TrajectoryObservation) -> int:
        return floor_bucket(self.plan, int(self._final[obs.index]) - 1)

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        cur = obs.bucket if obs.bucket is not None else 0
        b = floor_bucket(self.plan, obs.context_tokens)
        return Route(b, True) if b > cur else Route(cur, False)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        return None

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        return least_loaded(loads)
