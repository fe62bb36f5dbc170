"""A policy bundles the three decisions a backend asks for each step.

Backends (``sim`` and ``libra.runtime``) drive a ``Policy`` and nothing else: ``plan`` before a
step (seeing only completed steps), ``scheduler`` to route that step's trajectories, ``pool`` to
move workers between roles while it runs. Every policy, the baselines included, is built by the
core's one registry (``libra.policies``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from libra.pool.base import PoolPolicy
from libra.scheduling.base import RolloutScheduler
from libra.trace.columnar import StepArrays


class Policy(Protocol):
    """A named resource-management policy."""

    name: str
    #: True only for upper-bound policies (``hindsight-routing``) that are handed the step's true future;
    #: the backend then calls ``scheduler(plan, future=step_arrays)``. Every honest policy: False.
    #: The one capability a backend hands a policy beyond observations; the registry declares it
    #: up front (``libra.policies.registry``: ``PolicyEntry.needs``), so a backend that cannot
    #: supply the future (``libra-run``) refuses such a policy before it starts.
    sees_future: bool

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        """Plan the next step. ``history`` holds completed steps only (oldest first);
        ``prompt_tokens`` the next step's prompt lengths, known before its rollout starts."""
        ...

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        """The router for a step run under ``plan``. ``future`` is given only when
        ``sees_future`` is True (``hindsight-routing``)."""
        ...

    def pool(self, plan: Plan) -> PoolPolicy | None:
        """The elastic pool for a step, or None for a fixed split."""
        ...

    # Optional: ``observe(outcome: libra.planner.feedback.StepOutcome) -> None``. Backends call it
    # once a step's rollout has ended, with the plan they executed, the step's trajectories and the
    # measured rollout time (a real run measures it; the simulator reports its simulated one),
    # before asking for the next plan. Libra's planner corrects its rollout predictions with it;
    # the fixed baselines do not define it.
    # Optional: ``settle_training(plan, batch: StepArrays, seen: Sequence[StepArrays]) -> TrainConfig``.
    # Backends call it when a step's training is about to start on a complete batch (not a
    # streamed one), with that batch and every step whose rollout is over (``batch`` among them),
    # and run the strategy it returns: the plan's layout with the micro-batch and recompute set
    # for the batch (``libra.planner.settle``). Without it the plan's strategy runs.
    # Optional: ``streamed_knobs(plan, longest: int, seen: Sequence[StepArrays]) -> TrainConfig |
    # None``. Backends call it when a streamed step (trained as its groups complete, so never
    # settled) brings a sequence of ``longest`` tokens its plan's strategy cannot hold, with every
    # step whose rollout is over; it returns that layout at a micro-batch that holds it (a trainer
    # forming micro-batches by a token budget), or another layout on the same training GPUs (the
    # backend charges the re-shard), or None (the step cannot train: a real trainer runs out of
    # memory). Without it such a step fails.
    # Optional: ``oversized_training(plan, batch: StepArrays, seen: Sequence[StepArrays]) ->
    # TrainConfig | None``. Backends call it when a complete (unstreamed) batch of a split plan
    # brings a sequence no strategy on the plan's training GPUs holds (after ``settle_training``);
    # it returns a strategy on another GPU count that holds it (``libra.planner.settle.
    # outgrown_training``), and the backend trains the step on that many GPUs: fewer of its own,
    # or its own plus rollout GPUs it takes once their rollouts end (re-shards and the GPUs'
    # return to rollout charged). None, or without it, the step fails (a real trainer runs out of
    # memory). The simulator runs it; libra-run does not ask it yet.
    # Optional: ``training_plan(plan, latest: Plan) -> Plan``. Backends call it when a step's
    # (unstreamed, split or time-shared) training is about to start and a later step's plan (``latest``) has
    # been made with another training split or layout; it returns ``plan`` or ``latest``, and
    # with ``latest`` the backend trains the step on that plan's training GPUs and layout when
    # they are free (a re-shard, the price of ``latest``'s move, charged once). Without it every
    # step trains under its own plan.
