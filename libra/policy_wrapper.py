"""A ``Policy`` that wraps another and forwards every call it does not change.

Why one base: the core wraps policies in two places (``libra.policies.pinned``: a user's pin
becomes part of the plan; ``libra.scheduling.recorder``: every decision is logged), and a
backend may stack both (libra-run records a pinned policy). Each wrapper had its own copy of the
forwarding (name, ``sees_future``, the scheduler call with or without ``future``, the pool, the
policy's own extras); a call added to the ``Policy`` protocol (``observe``) then had to be added
to every copy, or it silently stopped at the first wrapper that lacked it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from libra.pool.base import PoolPolicy
from libra.scheduling.base import RolloutScheduler
from libra.trace.columnar import StepArrays


class PolicyWrapper:
    """Forwards the ``Policy`` calls to ``inner``; subclasses override the ones they change.
    Attributes it does not define (a policy's options, its planner) are the inner policy's."""

    #: attribute names of the wrapper itself, never looked up on ``inner`` (``__getattr__``)
    _own: tuple[str, ...] = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return str(getattr(self.inner, "name", "?"))

    @property
    def sees_future(self) -> bool:
        return bool(getattr(self.inner, "sees_future", False))

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        return self.inner.plan(cluster, history, prompt_tokens)  # type: ignore[no-any-return]

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        # a policy that does not see the future may not take the argument at all
        return self.inner.scheduler(plan) if future is None else self.inner.scheduler(plan, future=future)  # type: ignore[no-any-return]

    def pool(self, plan: Plan) -> PoolPolicy | None:
        return self.inner.pool(plan)  # type: ignore[no-any-return]

    def observe(self, outcome: Any) -> None:
        """Forwarded to a policy that learns from measured steps (``libra.planner.feedback``)."""
        inner = getattr(self.inner, "observe", None)
        if inner is not None:
            inner(outcome)

    def settle_training(self, plan: Plan, batch: StepArrays, seen: Sequence[StepArrays]) -> Any:
        """Forwarded to a policy that settles a step's training knobs for its batch
        (``libra.planner.settle``); without one, the plan's strategy runs."""
        inner = getattr(self.inner, "settle_training", None)
        return plan.train if inner is None else inner(plan, batch, seen)

    def training_plan(self, plan: Plan, latest: Plan) -> Plan:
        """Forwarded to a policy that trains a step under a later plan's split
        (``Policy.training_plan``); without one, the step's own plan."""
        inner = getattr(self.inner, "training_plan", None)
        return plan if inner is None else inner(plan, latest)

    def __getattr__(self, name: str) -> Any:
        if name in type(self)._own:
            raise AttributeError(name)
        return getattr(self.inner, name)  # the inner policy's own extras (options, planner) stay visible
