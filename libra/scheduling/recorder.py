"""A record of the decision calls a backend makes, to compare two backends on one step.

The policy core owns every decision; the simulator (``sim``) and the Ray runtime
(``libra.runtime``) only carry them out and report observations through the same calls. This
module makes that checkable: ``recorded(policy, log)`` wraps a ``Policy`` so that every plan it
returns, and every call of the step's ``RolloutScheduler`` (``admit``, ``on_tool_return``,
``on_finish``, ``choose_instance``, ``next_for``), lands in ``log`` with the observation that
decided it and the frozen decision returned. Both backends take a ``Policy`` and call nothing
else, so the wrapper reaches both through the one place they already share: no backend is
patched, and neither needs to know it is being recorded.

What is comparable between backends is what depends only on what both observe: the plan for
the same cluster and history, a trajectory's admission bucket (its prompt), the bucket each
routing decision chose for a (trajectory, turn) (context so far, the tool and its outcome, the
turn). Which instance of a bucket ran it, and when, depend on timing (loads, batch boundaries)
and differ by design; ``DecisionLog`` records them too, for inspection, but its comparison
helpers (``admissions``, ``routes``) leave them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from libra.policy_wrapper import PolicyWrapper
from libra.scheduling.base import InstanceLoad, Route, RolloutScheduler, TrajectoryObservation, Transfer
from libra.trace.columnar import StepArrays

#: the scheduler calls a ``DecisionLog`` records (``Decision.call``)
CALLS: tuple[str, ...] = ("admit", "on_tool_return", "on_finish", "choose_instance", "next_for")


@dataclass(frozen=True, slots=True)
class Decision:
    """One scheduler call: its observation (None where the call has none: ``next_for``, or a
    ``choose_instance`` without a trajectory) and what it returned (a bucket for ``admit``, a
    ``Route`` for ``on_tool_return``, an instance id for ``choose_instance``, a ``Transfer`` or
    None for ``next_for``, None for ``on_finish``). ``bucket`` is the bucket asked about by
    ``choose_instance``; ``loads`` the instance loads it was shown (timing-dependent)."""

    call: str
    scheduler: int  # which of the log's schedulers (one per step) made it
    obs: TrajectoryObservation | None
    result: int | Route | Transfer | None
    bucket: int | None = None
    loads: tuple[InstanceLoad, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A ``Policy.plan`` call: the plan it returned for ``history_steps`` completed steps and
    ``n_prompts`` prompts. A user's pin of split/bucket bounds is part of the policy
    (``libra.policies.pinned``, inside the recorder), so this is the pinned plan the backend
    executed."""

    history_steps: int
    n_prompts: int
    plan: Plan


@dataclass
class DecisionLog:
    """Everything a recorded policy decided, in call order (see the module docstring)."""

    planned: list[PlanRecord] = field(default_factory=list)
    #: the plan each step's scheduler was made for: the plan the backend executed
    executed: list[Plan] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    #: what the backend reported of each step it ran (``Policy.observe``: a ``StepOutcome``)
    observed: list[Any] = field(default_factory=list)

    def of(self, call: str, step: int | None = None) -> list[Decision]:
        """The decisions of one call kind, of trace step ``step`` when given (by the observation's step)."""
        if call not in CALLS:
            raise ValueError(f"call must be one of {CALLS}, got {call!r}")
        return [d for d in self.decisions if d.call == call and (step is None or (d.obs is not None and d.obs.step == step))]

    def admissions(self, step: int | None = None) -> dict[str, int]:
        """Trajectory id -> the bucket ``admit`` chose (it depends on the prompt only)."""
        return {d.obs.traj_id: int(d.result) for d in self.of("admit", step) if d.obs is not None}  # type: ignore[arg-type]

    def routes(self, step: int | None = None) -> dict[tuple[str, int, bool], tuple[int, int, bool]]:
        """(trajectory id, turns done, at the call's start) -> (the bucket the trajectory was in,
        the bucket ``on_tool_return`` chose, whether its KV moves): the routing decisions at tool
        calls (at a call's start and again at its return), keyed by what both backends observe the
        same way, without the timing-dependent fields."""
        out: dict[tuple[str, int, bool], tuple[int, int, bool]] = {}
        for d in self.of("on_tool_return", step):
            assert d.obs is not None and isinstance(d.result, Route)
            key = (d.obs.traj_id, d.obs.turns_done, d.obs.at_call_start)
            if key in out:
                raise ValueError(f"trajectory {key[0]} was routed twice at turn {key[1]} ({'start' if key[2] else 'return'})")
            out[key] = (-1 if d.obs.bucket is None else int(d.obs.bucket), int(d.result.bucket), bool(d.result.migrate))
        return out

    def finishes(self, step: int | None = None) -> dict[str, tuple[Any, ...]]:
        """Trajectory id -> what ``on_finish`` was told (final context, turns, last tool and
        outcome, routing bucket): a router may learn from it, so both backends must say the same."""
        out: dict[str, tuple[Any, ...]] = {}
        for d in self.of("on_finish", step):
            assert d.obs is not None
            if d.obs.traj_id in out:
                raise ValueError(f"trajectory {d.obs.traj_id} finished twice")
            out[d.obs.traj_id] = (d.obs.context_tokens, d.obs.turns_done, d.obs.last_tool, d.obs.last_outcome, d.obs.bucket)
        return out

    def route_inputs(self, step: int | None = None) -> dict[tuple[str, int, bool], tuple[Any, ...]]:
        """(trajectory id, turns done, at the call's start) -> the observation fields a router
        decides from at a tool call (context, tool, outcome: the previous call's at a start, the
        call's own at a return), to tell a different decision from a different observation."""
        return {(d.obs.traj_id, d.obs.turns_done, d.obs.at_call_start): (d.obs.context_tokens, d.obs.last_tool, d.obs.last_outcome)
                for d in self.of("on_tool_return", step) if d.obs is not None}


class RecordingScheduler:
    """A ``RolloutScheduler`` that forwards every call to ``inner`` and logs it. Optional
    methods (``next_for``, ``admission_order``) and attributes (``work_conserving``, counters)
    exist on it exactly when they exist on ``inner``, so a backend that asks whether the router
    has one gets the same answer as without the recorder."""

    def __init__(self, inner: RolloutScheduler, log: DecisionLog, index: int) -> None:
        self.inner = inner
        self.log = log
        self.index = index

    def admit(self, obs: TrajectoryObservation) -> int:
        b = self.inner.admit(obs)
        self.log.decisions.append(Decision("admit", self.index, obs, b))
        return b

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        r = self.inner.on_tool_return(obs)
        self.log.decisions.append(Decision("on_tool_return", self.index, obs, r))
        return r

    def on_finish(self, obs: TrajectoryObservation) -> None:
        self.inner.on_finish(obs)
        self.log.decisions.append(Decision("on_finish", self.index, obs, None))

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        i = self.inner.choose_instance(bucket, loads, obs)
        self.log.decisions.append(Decision("choose_instance", self.index, obs, i, bucket, tuple(loads)))
        return i

    def _next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        t = self.inner.next_for(receiver, loads)
        self.log.decisions.append(Decision("next_for", self.index, None, t, receiver.bucket, (receiver, *loads)))
        return t

    def __getattr__(self, name: str) -> Any:
        # only reached for names not defined above: ``next_for`` is recorded when the inner
        # router has it, everything else (``admission_order``, ``work_conserving``, ``plan``,
        # C-MLFQ's counters) is the inner router's own
        if name in ("inner", "log", "index"):
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        if name == "next_for":
            return self._next_for
        return attr


class RecordingPolicy(PolicyWrapper):
    """A ``Policy`` that forwards to ``inner`` and logs its plans and its schedulers' calls."""

    _own = ("inner", "log")

    def __init__(self, inner: Any, log: DecisionLog) -> None:
        super().__init__(inner)
        self.log = log

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        p = self.inner.plan(cluster, history, prompt_tokens)
        self.log.planned.append(PlanRecord(len(history), int(len(prompt_tokens)), p))
        return p

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        inner = super().scheduler(plan, future)
        self.log.executed.append(plan)
        return RecordingScheduler(inner, self.log, len(self.log.executed) - 1)  # type: ignore[return-value]

    def observe(self, outcome: Any) -> None:
        """Logged, then forwarded (``PolicyWrapper.observe``)."""
        self.log.observed.append(outcome)
        super().observe(outcome)



def recorded(policy: Any, log: DecisionLog | None) -> Any:
    """``policy`` with its decisions recorded into ``log`` (``policy`` itself when ``log`` is None)."""
    return policy if log is None else RecordingPolicy(policy, log)
