"""The elastic hybrid pool interface: which rollout workers move to training, and when.

As a step's rollout drains into its long tail, instances that have nothing left to run can lend
their GPUs to training. The pool policy decides; the backend carries the move out (drop KV,
load a training shard, join at the next gradient-accumulation boundary) and returns the GPUs to
rollout for the next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

JoinMode = Literal["sync", "nonblocking"]


@dataclass(frozen=True, slots=True)
class InstanceState:
    """A rollout instance as the pool sees it."""

    instance: int
    tp: int
    node: int
    running: int
    queued: int
    idle_since_s: float | None  # when it last became empty (None while busy)


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """The rollout stage seen by the pool at a moment ``now_s`` of the step."""

    now_s: float
    step_started_s: float
    instances: tuple[InstanceState, ...]
    unfinished_trajectories: int  # not yet finished in this step's rollout
    waiting_trajectories: int  # in tool calls or queued (not in any running batch)
    training_running: bool
    training_gpus: int


@dataclass(frozen=True, slots=True)
class RoleChange:
    """Move ``instance``'s GPUs from rollout to training, joining with ``join`` semantics."""

    instance: int
    join: JoinMode = "nonblocking"


class PoolPolicy(Protocol):
    """Decides role changes; pure, called by the backend whenever rollout load changes."""

    def on_rollout_progress(self, obs: PoolObservation) -> list[RoleChange]:
        ...
