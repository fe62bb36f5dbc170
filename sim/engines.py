"""Rollout engines shared by consecutive steps' rollouts: asynchronous continuous generation.

Why: real asynchronous RL systems (AReaL, NeMo RL's async GRPO, verl's fully-async trainer) keep
their inference engines generating. While step j's long-tail trajectories still decode, engine
slots they free already take step j+1's prompts, as far as the staleness bound allows. A rollout
modelled as one batch per step whose tail gates the next batch leaves the engines idle during
every tail, so the asynchronous step came out as the batch's makespan instead of the engines'
throughput (NeMo RL Qwen3-30B-A3B, 8 steps off: +146% over the published step).

``Engines`` owns the instances (``sim.instance.Instance``) of a plan's rollout layout and lets
several ``sim.rollout.RolloutStage`` objects (one per step) run on them at once. Each stage's
trajectories get a global id range ``[base, base + n)`` on the engines (the instances key
sequences by these ids); the engines route an instance's callbacks to the stage that owns the
sequence (turn ends, first admissions) or to every live stage (idle, room, start), and the
instances count each owner's tokens and busy time apart (``Instance.share``), so each step's
metrics stay its own. The GPUs are booked once in the ledger, by the step that created the
engines, and released when the engines retire (no stage runs on them and the next plan did not
adopt them), so nothing is double-booked across the overlapping steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sim.instance import Instance, InvariantViolation

if TYPE_CHECKING:  # pragma: no cover
    from libra.planner.plan import RolloutInstance


class RolloutStage(Protocol):
    """What the engines need of a step's rollout (``sim.rollout.RolloutStage``): stated here so
    the engines do not import the stage module that imports them."""

    step: Any  # the step's ``StepArrays`` (its ``n``)
    overlapped: bool
    _base: int

    def _turn_end(self, inst: Instance, i: int, ctx: int, now: float) -> None: ...
    def _seated(self, i: int) -> None: ...
    def _idle(self, inst: Instance) -> None: ...
    def _pull(self, inst: Instance) -> bool: ...
    def _started(self, inst: Instance) -> None: ...


def layout(instances: Sequence[RolloutInstance]) -> tuple[tuple[int, int, int, int, int], ...]:
    """What must match for a step to run on the previous step's engines: every instance's id,
    TP, bucket and place (a plan that moves or resizes an instance pays a transition instead)."""
    return tuple((ri.id, ri.tp, ri.bucket, ri.node, ri.first_gpu) for ri in instances)


class Engines:
    """Instances shared by the rollouts of consecutive steps (see the module docstring)."""

    def __init__(self, owner_step: int, key: tuple[tuple[int, int, int, int, int], ...]) -> None:
        self.instances: dict[int, Instance] = {}
        self.key = key
        self.owner_step = owner_step  # the step whose ledger booking holds the GPUs
        self.waiting = [0]  # queued entries over the instances (``Instance``'s shared counter)
        self.stages: list[RolloutStage] = []  # the stages running on them, oldest first
        self.next_base = 0
        self.closing = False  # the next plan did not adopt them: retire once no stage runs
        self.retired = False

    def attach(self, stage: RolloutStage) -> int:
        """A stage starts running on the engines; returns its base id."""
        if self.retired:
            raise InvariantViolation("a stage attached to retired rollout engines")
        base = self.next_base
        self.next_base += stage.step.n
        if self.stages:  # they share the engines from now on
            stage.overlapped = True
            for s in self.stages:
                s.overlapped = True
        self.stages.append(stage)
        return base

    def detach(self, stage: RolloutStage) -> None:
        """A stage's last trajectory finished."""
        self.stages.remove(stage)

    @property
    def idle(self) -> bool:
        return not self.stages

    def owner_of(self, gid: int) -> RolloutStage:
        """The stage whose trajectory has global id ``gid``."""
        for s in self.stages:
            if s._base <= gid < s._base + s.step.n:
                return s
        raise InvariantViolation(f"sequence {gid} on the shared engines belongs to no running step")

    # ---------------------------------------------------------------- instance callbacks
    def turn_end(self, inst: Instance, gid: int, ctx: int, now: float) -> None:
        s = self.owner_of(gid)
        s._turn_end(inst, gid - s._base, ctx, now)

    def admitted(self, gid: int) -> None:
        s = self.owner_of(gid)
        s._seated(gid - s._base)

    def idle_cb(self, inst: Instance) -> None:
        for s in list(self.stages):
            s._idle(inst)

    def room(self, inst: Instance) -> bool:
        return any(s._pull(inst) for s in list(self.stages))

    def started(self, inst: Instance) -> None:
        for s in list(self.stages):
            s._started(inst)
