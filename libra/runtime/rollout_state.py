"""What the rollout stage's driver keeps: its view of each engine instance, and what it measured.

Plain data, shared by the stage (``rollout.Rollout``), its queues (``rollout_queues``) and the
loop that places the instances (``placement``); importable from ``libra.runtime.rollout`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libra.runtime.episode import Episode


@dataclass
class Migration:
    """One measured move of a trajectory between instances."""

    traj_id: str
    src: int
    dst: int
    tokens: int  # context recomputed on the destination
    measured_s: float  # the destination's prefill of that context
    predicted_kv_s: float  # cost evaluator: KV transfer of the same tokens
    predicted_prefill_s: float  # cost evaluator: recomputing them on the destination


@dataclass
class RolloutResult:
    """What the rollout stage did (times are wall seconds from the stage's start)."""

    episodes: list[Episode]
    makespan_s: float
    migrations: list[Migration] = field(default_factory=list)
    moves_without_kv: int = 0
    recovered: int = 0  # trajectories re-queued after their instance died
    dead_instances: list[int] = field(default_factory=list)
    #: injected kills that never fired: (seconds, instance) whose victim generated nothing after that time
    faults_unfired: list[tuple[float, int]] = field(default_factory=list)
    lent: list[tuple[float, int]] = field(default_factory=list)
    gen_tokens: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    engine_busy_s: dict[int, float] = field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    pool_consulted: int = 0  # times the elastic pool was asked (after rollout events)
    pool_consulted_training: int = 0  # of those, with training running (streamed mini-batches)
    lend_declined: int = 0  # role changes the trainer could not take (no helpers on its backend)
    admitted_by_bucket: dict[int, int] = field(default_factory=dict)  # the scheduler's admissions
    #: each trajectory's finish, seconds from the stage's start (the planner's ``CompletionOrder``)
    finish_s: dict[str, float] = field(default_factory=dict)
    routed: int = 0  # routing decisions at tool-call starts and returns (``on_tool_return``)
    rerouted: int = 0  # of those, to another bucket
    pulled: int = 0  # queued trajectories an idle instance took from another's queue (``next_for``)


@dataclass
class Instance:
    """The driver's view of one engine instance."""

    id: int
    tp: int
    bucket: int
    node: int
    handle: Any
    queue: list[str] = field(default_factory=list)
    inflight: tuple[Any, list[str], float] | None = None
    resident: set[str] = field(default_factory=set)  # trajectories whose KV it holds
    alive: bool = True
    lent: bool = False
    idle_since: float | None = 0.0
    kv_capacity: int = 1 << 20
