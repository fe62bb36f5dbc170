"""The rollout scheduler interface: what a router sees and what it decides.

Both backends call the same three methods. An observation holds only what a real system knows
at that moment; never a trajectory's future turns or final length (only the ``oracle`` router
receives those, through its own constructor, and says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from libra.planner.plan import Plan


@dataclass(frozen=True, slots=True)
class TrajectoryObservation:
    """What is known about a trajectory at an admission or a tool return."""

    traj_id: str
    index: int  # row of the trajectory in the step's StepArrays
    step: int
    group: str | None
    prompt_tokens: int
    context_tokens: int  # prompt + everything generated and returned so far
    turns_done: int
    last_tool: str | None  # tool just returned (None at admission)
    last_outcome: str | None  # "ok" | "error" | "timeout" | None
    elapsed_s: float  # since the trajectory was admitted
    instance: int | None  # the instance holding its KV (None at admission)
    bucket: int | None
    # True when the backend routes as a tool call STARTS (the simulator: the KV migration then
    # overlaps the tool): ``last_tool`` is the tool being called, ``last_outcome`` the PREVIOUS
    # call's outcome (None before the first), ``context_tokens`` excludes this call's output.
    # False (default): routed at the tool's return, ``last_outcome`` is that call's outcome.
    at_call_start: bool = False


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """A rollout instance's load as the backend sees it, for picking an instance in a bucket."""

    instance: int
    bucket: int
    running: int
    queued: int
    kv_tokens_used: int
    kv_tokens_capacity: int


@dataclass(frozen=True, slots=True)
class Route:
    """Where a trajectory continues after a tool return; ``migrate`` moves its KV meanwhile."""

    bucket: int
    migrate: bool


class RolloutScheduler(Protocol):
    """Routes trajectories to buckets. One object per step, made for that step's plan."""

    def admit(self, obs: TrajectoryObservation) -> int:
        """The bucket a new trajectory starts in."""
        ...

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        """The bucket a trajectory continues in after a tool call, and whether its KV moves."""
        ...

    def on_finish(self, obs: TrajectoryObservation) -> None:
        """A trajectory ended (it may learn from it)."""
        ...

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad]) -> int:
        """Pick one instance of ``bucket`` (``loads`` lists that bucket's instances)."""
        ...


def least_loaded(loads: Sequence[InstanceLoad]) -> int:
    """The instance with the lowest KV occupancy plus queue, ties to the lowest id."""
    best = min(
        loads,
        key=lambda l: ((l.kv_tokens_used + 1) / max(l.kv_tokens_capacity, 1) + l.queued + l.running * 1e-6, l.instance),
    )
    return best.instance


class SchedulerFactory(Protocol):
    """Makes the scheduler of a step from that step's plan."""

    def __call__(self, plan: Plan) -> RolloutScheduler: ...
