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
    stats: Any  # its ``RolloutStats`` (the rollout's ``start_s`` and ``end_s``)
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


#: Rollout spans an ``Engines`` keeps for ``overlap_of``: more than K + 1 steps never share
#: the engines at once.
SPAN_MEMORY = 16


class Engines:
    """Instances shared by the rollouts of consecutive steps (see the module docstring)."""

    def __init__(self, owner_step: int, key: tuple[tuple[int, int, int, int, int], ...]) -> None:
        self.instances: dict[int, Instance] = {}
        self.key = key
        self.owner_step = owner_step  # the step whose ledger booking holds the GPUs
        self.waiting = [0]  # queued entries over the instances (``Instance``'s shared counter)
        self.stages: list[RolloutStage] = []  # the stages running on them, oldest first
        #: [stage, rollout start, rollout end or None while it runs] of the recent stages, for the
        #: overlap each one measured (``overlap_of``); the last ``SPAN_MEMORY`` only
        self.spans: list[list[Any]] = []
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
        self.spans.append([stage, float(stage.stats.start_s), None])
        del self.spans[:-SPAN_MEMORY]
        return base

    def detach(self, stage: RolloutStage) -> None:
        """A stage's last trajectory finished."""
        self.stages.remove(stage)
        for span in self.spans:
            if span[0] is stage:
                span[2] = float(stage.stats.end_s)

    def overlap_of(self, stage: RolloutStage) -> float:
        """How many other steps' rollouts shared the engines with ``stage``'s, time-weighted:
        their rollout time inside its own, over its length (``StepOutcome.overlap``; a rollout
        still running counts to ``stage``'s end). 0 when it ran alone or took no time."""
        own = next((span for span in self.spans if span[0] is stage), None)
        if own is None or own[2] is None or not own[2] > own[1]:
            return 0.0
        start, end = own[1], own[2]
        inside = sum(max(0.0, min(end, o_end if o_end is not None else end) - max(start, o_start))
                     for other, o_start, o_end in self.spans if other is not stage)
        return inside / (end - start)

    @property
    def idle(self) -> bool:
        return not self.stages

    def owner_of(self, gid: int) -> RolloutStage:
        """The stage whose trajectory has global id ``gid``."""
        for s in self.stages:
            if s._base <= gid < s._base + s.step.n:
                return s
        raise InvariantViolation(f"sequence {gid} on the shared engines belongs to no running step")

    def step_rank(self, gid: int) -> int:
        """The rank of ``gid``'s step among the stages on the engines (its stage's base id: the
        stages attach in step order, so a smaller rank is an older step); the order
        ``sim.instance``'s step priority keeps."""
        return self.owner_of(gid)._base

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
