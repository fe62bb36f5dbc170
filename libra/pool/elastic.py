"""The elastic hybrid pool: idle rollout instances lend their GPUs to training during the tail.

Called by the backend whenever rollout load changes. An instance is lent (``RoleChange``) when

1. it has nothing to run (no running or queued sequence) and has been empty for ``grace_s``
   (a trajectory back from a tool may still land on it);
2. it is not the last un-lent instance of its bucket while trajectories remain unfinished (a
   trajectory promoted into that bucket needs somewhere to run);
3. training can use it and is the stage that ends last: training is running (asynchronous mode:
   the previous step's update; synchronous streaming: completed groups' mini-batches), and, in
   asynchronous mode, its predicted remaining time (``predicted_train_s`` minus the time elapsed,
   as it started with the step) exceeds the remaining rollout plus the round trip. Otherwise
   extra training GPUs shorten nothing, and lent GPUs stay with the training job until it ends,
   so they could miss the next rollout's start;
4. the move pays: the expected remaining rollout time ``R`` exceeds the round trip of role
   changes (``StepCosts.lend_s`` to training now, ``return_s`` back to rollout for the next
   step: the same prices the simulator charges) by
   ``payoff_factor``. ``R`` is the plan's predicted rollout makespan minus the time elapsed,
   at least ``min_tail_s`` while trajectories are unfinished; a plan running over its prediction
   has little time left by this estimate and so lends less, the conservative direction;
5. synchronous (streaming) plans only: the loan shortens the training enough to pay for its
   return. A lent GPU goes back to rollout after the step's training and sync, so its
   ``return_s`` lands on the next step's rollout start; the most the loan saves is the training
   tail after the rollout (the plan's predicted step minus rollout and sync, or its predicted
   training when the plan has no step prediction) times the share of training GPUs it adds in
   whole data-parallel replicas. It lends when that gain exceeds ``payoff_factor`` x
   ``return_s``. (Without this rule, on a 4-step Search-R1 trace on 16 H100s, the pool lent 6
   instances to save 0.3 s of training and the next rollout waited ~7 s for them: libra 33.3 s
   per step against 31.1 s without the pool.)

Joining is ``nonblocking`` by default (the worker loads its shard in the background and joins at
the next gradient-accumulation boundary: no training stall; see ``consistency``), or ``sync``
(training pauses for the re-shard), the variant the paper measured as a ~150 s spike.
The GPUs return to rollout at the next step (the backend pays ``role_change_s`` back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.planner.costs import CostModel
from libra.planner.plan import Plan
from libra.planner.step_costs import StepCosts
from libra.pool.base import JoinMode, PoolObservation, RoleChange


@dataclass
class ElasticPool:
    """Decides role changes for one step's plan (see the module docstring)."""

    plan: Plan
    ev: CostModel | StepCosts | None = None
    join: JoinMode = "nonblocking"
    grace_s: float = 1.0
    payoff_factor: float = 1.0
    min_tail_s: float = 0.0
    lent: set[int] = field(default_factory=set)
    decisions: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._bucket_of = {i.id: i.bucket for i in self.plan.instances}
        self._tp_of = {i.id: i.tp for i in self.plan.instances}
        self._rc: dict[int, float] = {}
        self._ret: dict[int, float] = {}
        self._lent_gpus = 0
        self._costs = None if self.ev is None else (self.ev if isinstance(self.ev, StepCosts) else StepCosts(self.ev))

    def round_trip_s(self, tp: int) -> float:
        """Role change to training now plus back to rollout later, for an instance of ``tp``: the
        prices the simulator charges a loan (``StepCosts.lend_s`` + ``return_s``)."""
        if tp in self._rc:
            return self._rc[tp]
        cost = 0.0 if self._costs is None else self._costs.round_trip_s(self.plan.train, tp)
        self._rc[tp] = cost
        return cost

    def return_s(self, tp: int) -> float:
        """A lent TP-``tp`` GPU going back to rollout (``StepCosts.return_s``, the simulator's price)."""
        if tp not in self._ret:
            self._ret[tp] = 0.0 if self._costs is None else self._costs.return_s(self.plan.train, tp)
        return self._ret[tp]

    def training_gain_s(self, tp: int) -> float:
        """The most lending one more TP-``tp`` instance saves a synchronous step (rule 5): the
        training tail after the rollout times the training GPUs it adds (whole DP replicas) over
        the training GPUs then."""
        p = self.plan
        sync_s = p.notes.get("sync_s", 0.0)
        sync_s = float(sync_s) if isinstance(sync_s, (int, float)) else 0.0
        tail = p.predicted_step_s - p.predicted_rollout_s - sync_s
        if not tail == tail:  # no step prediction: at most the whole training stage
            tail = p.predicted_train_s
        if not tail == tail or tail <= 0:
            return 0.0
        group = max(1, p.train.tp * p.train.pp)
        added = ((self._lent_gpus + tp) // group - self._lent_gpus // group) * group
        if added <= 0:
            return 0.0
        return tail * added / (p.n_train_gpus + (self._lent_gpus // group) * group + added)

    def remaining_rollout_s(self, obs: PoolObservation) -> float:
        """Expected rollout time left (see rule 4)."""
        if obs.unfinished_trajectories <= 0:
            return 0.0
        elapsed = obs.now_s - obs.step_started_s
        pred = self.plan.predicted_rollout_s
        left = pred - elapsed if pred == pred else 0.0  # NaN prediction: nothing to go by
        return max(left, self.min_tail_s)

    def on_rollout_progress(self, obs: PoolObservation) -> list[RoleChange]:
        if self.plan.colocated or obs.unfinished_trajectories <= 0:
            return []
        if not obs.training_running:
            return []
        remaining = self.remaining_rollout_s(obs)
        if self.plan.mode == "async":
            train_left = self.plan.predicted_train_s - (obs.now_s - obs.step_started_s)
            if not train_left == train_left or train_left <= remaining + self.round_trip_s(max(self._tp_of.values(), default=1)):
                return []
        active_per_bucket: dict[int, int] = {}
        for s in obs.instances:
            if s.instance not in self.lent:
                b = self._bucket_of.get(s.instance, 0)
                active_per_bucket[b] = active_per_bucket.get(b, 0) + 1
        out: list[RoleChange] = []
        # idle the longest first: the least likely to be needed again
        idle = sorted(
            (s for s in obs.instances if s.instance not in self.lent and s.running == 0 and s.queued == 0 and s.idle_since_s is not None),
            key=lambda s: (s.idle_since_s, s.instance),
        )
        for s in idle:
            if obs.now_s - s.idle_since_s < self.grace_s:
                continue
            b = self._bucket_of.get(s.instance, 0)
            if active_per_bucket.get(b, 0) <= 1:
                continue
            if remaining <= self.payoff_factor * self.round_trip_s(s.tp):
                continue
            if self.plan.mode != "async" and self.training_gain_s(s.tp) <= self.payoff_factor * self.return_s(s.tp):
                continue
            active_per_bucket[b] -= 1
            self._lent_gpus += s.tp
            self.lent.add(s.instance)
            self.decisions.append((obs.now_s, s.instance))
            out.append(RoleChange(s.instance, self.join))
        return out
