"""The planner's output: how a step's GPUs are split between training and rollout.

A ``Plan`` is what both backends (SimPy cluster, Ray runtime) execute; it carries the
predictions it was chosen by, so a run can report predicted against achieved times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from cost_models.strategy import TrainStrategy

LoopMode = Literal["sync", "async"]


#: A training strategy on ``n_gpus = tp * pp * dp`` GPUs (EP folds the MoE layers' TP x DP ranks).
#: The planner's name for the cost model's ``TrainStrategy``: one frozen type, so a plan's
#: training shape goes to the evaluator as it is (``cost_models.strategy`` imports nothing).
TrainConfig = TrainStrategy


def same_layout(a: TrainConfig, b: TrainConfig) -> bool:
    """Whether ``a`` and ``b`` place the same shards on the same GPUs (TP x PP x DP, EP, the
    ZeRO stage) and differ at most in the per-step knobs, micro-batch size and activation
    recompute. Changing the layout is a re-shard (``StepCosts.transition``); the knobs are set
    per step (``libra.planner.settle``)."""
    return (a.tp, a.pp, a.dp, a.ep, a.zero_stage) == (b.tp, b.pp, b.dp, b.ep, b.zero_stage)


@dataclass(frozen=True, slots=True)
class RolloutInstance:
    """One rollout engine: ``tp`` GPUs on node ``node`` (starting at local GPU ``first_gpu``)."""

    id: int
    tp: int
    bucket: int
    node: int = 0
    first_gpu: int = 0


@dataclass(frozen=True, slots=True)
class Bucket:
    """A group of rollout instances serving one context range ``[min_context, max_context)``.

    Buckets are ordered: bucket 0 serves the shortest contexts. ``max_context`` is ``None`` for
    the last (unbounded) bucket.
    """

    index: int
    tp: int
    min_context: int
    max_context: int | None


@dataclass(frozen=True)
class Plan:
    """GPU split, training strategy, rollout instances and buckets for one RL step.

    ``colocated`` plans run rollout and training on the same GPUs one after the other (verl's
    hybrid engine): then ``n_rollout_gpus`` is the cluster size and ``n_train_gpus`` too, unless
    the training backend uses fewer (``ClusterSpec.max_train_gpus``): training then runs on the
    first ``n_train_gpus`` of them.

    The loop the step runs in is part of the plan, because the fastest split depends on it:
    ``mode`` "sync" (on-policy; with ``streaming`` the training starts on mini-batches of
    finished GRPO groups while the rollout's tail runs, still on-policy) or "async" (the rollout
    runs ahead of training by at most ``max_staleness`` weight versions, >= 1; 0 for sync plans).
    A backend runs the mode the plan says (the simulator's ``--mode``/``--streaming`` only
    override it within the staleness the user allowed).

    ``stagger_fill`` (an async plan that starts a pipeline): the next step's prompts join the
    engines when this step's rollout ends, not with it, so this step rolls out alone and its
    training starts sooner; the rest of the fill follows together (``libra.planner.pipeline``,
    ``Planner.staggered``). libra-run rolls out its steps one after another, which is this.
    """

    n_rollout_gpus: int
    n_train_gpus: int
    train: TrainConfig
    instances: tuple[RolloutInstance, ...]
    buckets: tuple[Bucket, ...]
    mode: LoopMode = "sync"
    max_staleness: int = 0
    streaming: bool = False
    colocated: bool = False
    predicted_rollout_s: float = float("nan")
    predicted_train_s: float = float("nan")
    predicted_step_s: float = float("nan")
    stagger_fill: bool = False
    notes: dict[str, object] = field(default_factory=dict)

    def instances_in(self, bucket: int) -> tuple[RolloutInstance, ...]:
        """The instances of one bucket."""
        return tuple(i for i in self.instances if i.bucket == bucket)

    @property
    def idle_rollout_gpus(self) -> int:
        """A split's rollout GPUs that no instance runs on (a TP degree that does not tile its
        share): free for its training to take (``libra.planner.settle.first_layout``). 0 in a
        time-shared plan."""
        if self.colocated:
            return 0
        return max(0, self.n_rollout_gpus - sum(i.tp for i in self.instances))

    def over_idle_rollout_gpus(self, train: TrainConfig) -> bool:
        """Whether ``train`` lays over this split's training GPUs and some of its idle rollout
        GPUs (``idle_rollout_gpus``): the one GPU-count change a settle may make (both backends
        and ``LibraPolicy`` ask this)."""
        return 0 < train.n_gpus - self.n_train_gpus <= self.idle_rollout_gpus

    def with_training(self, train: TrainConfig) -> Plan:
        """This plan with its training on ``train``, which may lay over idle rollout GPUs too
        (``idle_rollout_gpus``): those become training GPUs; the instances stay."""
        if self.colocated or train.n_gpus <= self.n_train_gpus:
            return dataclasses.replace(self, train=train)
        moved = train.n_gpus - self.n_train_gpus
        if moved > self.idle_rollout_gpus:
            raise ValueError(f"a training on {train.n_gpus} GPUs needs {moved} of the plan's rollout GPUs; "
                             f"only {self.idle_rollout_gpus} run no engine")
        return dataclasses.replace(self, train=train, n_train_gpus=train.n_gpus, n_rollout_gpus=self.n_rollout_gpus - moved)
