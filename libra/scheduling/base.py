"""The rollout scheduler interface: what a router sees and what it decides.

Both backends call the same methods. An observation holds only what a real system knows at that
moment; never a trajectory's future turns or final length (only the ``oracle`` router receives
those, through its own constructor, and says so).

**Work conservation** (``place``, ``steal``; the decision rules every Libra router uses, the
backends only carry them out): no instance sits idle while work waits that it could run. A
bucket's ``max_context`` is an upper limit of context, not a reservation: a trajectory routed
to bucket ``b`` may run on any instance of a bucket ``>= b`` (a *guest* there; its routing
bucket, what ``TrajectoryObservation.bucket`` reports, stays ``b``). ``place`` picks, for work
routed to ``b``, an instance with room (a free sequence slot and KV for its context), its own
bucket first, then the nearest longer bucket; started instances before ones whose devices are
still held elsewhere (async: the previous step's training); only when nothing has room does the
work queue, on the least-loaded instance of its own bucket. ``steal`` is asked whenever an
instance has room and an empty queue (it started late, drained, or took over from a dead one):
it names a queue to pull from and how many entries. An earlier version admitted every
trajectory to its shortest bucket and never moved queued work: on a math trace whose
trajectories never outgrow the first bucket, 18 of 24 instances idled while 6 held queues
(rollout 770 s against 182 s for one bucket).
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
    """A rollout instance's load as the backend sees it (what a real engine reports: sequences
    running and queued, KV in use), for picking an instance and for moving queued work."""

    instance: int
    bucket: int
    running: int
    queued: int
    kv_tokens_used: int
    kv_tokens_capacity: int
    #: most sequences it runs at once (vLLM's max_num_seqs; the runtime's max batch); 0: unknown
    max_running: int = 0
    #: False while its devices are still held elsewhere (async: the previous step's training)
    started: bool = True
    #: context tokens of its queued sequences (the KV they need once admitted)
    queued_tokens: int = 0
    #: not started: the *predicted* seconds until it starts (a plan transition's weight load, which
    #: the backend knows before it happens; ``inf``: unknown, e.g. waiting for an earlier step's
    #: training); ignored once started
    ready_in_s: float = float("inf")
    #: sequences on it (running, queued, or in a tool call with their KV cached there) that were
    #: routed to its OWN bucket, i.e. not guests from a shorter bucket; None: the backend does not
    #: tell (placement then treats it as having none, the behaviour before this field existed)
    own: int | None = None

    def room(self, context: int = 0) -> int:
        """Sequences of ``context`` tokens it could start now beyond what it runs and queues:
        free slots, limited by the KV left after the running and queued contexts."""
        slots = (self.max_running if self.max_running > 0 else 1 << 30) - self.running - self.queued
        free_kv = self.kv_tokens_capacity - self.kv_tokens_used - self.queued_tokens
        by_kv = free_kv // max(context + 1, 1)
        return int(max(0, min(slots, by_kv)))


@dataclass(frozen=True, slots=True)
class Transfer:
    """Move up to ``count`` queued sequences from instance ``src``'s queue to ``dst`` (those
    with no KV cached on ``src`` first, then oldest first; only those whose context is below
    ``max_context`` when it is set: ``dst``'s bucket bound). Their cached KV on ``src`` is
    dropped; ``dst`` prefills their context."""

    src: int
    dst: int
    count: int
    max_context: int | None = None


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

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        """The instance that runs (or queues) work routed to ``bucket``. ``loads`` lists every
        live instance of the step; ``obs`` (None: unknown) the trajectory, whose ``instance`` is
        the one holding its KV now. Libra's routers answer with ``place``.

        Optional: a router with a true ``rebalances`` attribute is also asked as a tool call
        starts when its route keeps the trajectory's bucket (``obs.at_call_start``); an answer
        other than ``obs.instance`` moves the trajectory there, its KV migrating while the tool
        runs (``libra.scheduling.rebalance``). Without it (every other router) the backends ask
        only when the route changes the bucket.

        Optional too: a router with a true ``step_priority`` attribute has engines shared by
        consecutive steps (async continuous generation) serve the older steps first: their queued
        turns before a newer step's, and a newer step's turn admitted only into free KV, never
        evicting KV an older step's trajectory parked for a tool call (``sim.instance``)."""
        ...

    # Optional: ``admission_order(observations) -> indices`` (a permutation) orders a step's
    # admissions, hence every queue's FIFO order; backends admit in the step's order without it.
    # Only the hindsight ``oracle`` defines it (longest true work first): an honest router knows
    # nothing at admission that would order them.

    def next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        """Queued work ``receiver`` (started, room, empty queue) should pull now, or None.
        Backends ask again after carrying a transfer out, until None. Libra's routers answer with
        ``steal``; a router that never moves queued work returns None."""
        ...


def least_loaded(loads: Sequence[InstanceLoad]) -> int:
    """The instance with the lowest KV occupancy plus queue, ties to the lowest id."""
    best = min(
        loads,
        key=lambda l: ((l.kv_tokens_used + 1) / max(l.kv_tokens_capacity, 1) + l.queued + l.running * 1e-6, l.instance),
    )
    return best.instance


def _bound(plan: Plan, bucket: int) -> int | None:
    bs = plan.buckets
    return bs[bucket].max_context if 0 <= bucket < len(bs) else None


#: An instance that has not started but is predicted to start within this fraction of the step's
#: predicted rollout counts as started for placement (``serves_now``): a wait that short costs less
#: than the imbalance of piling the step onto the instances that happen to be up first. A re-plan
#: that kept 2 of 9 TP-8 instances (the other 7 loading their weights for 0.4 s) gave those 2 the
#: batch's first 512 trajectories, 256 each against ~140 on the rest, and the step took 37.3 s
#: where the same layout with every instance starting together took 31.7 s (SIMULATED).
START_GRACE = 0.05


def serves_now(plan: Plan, l: InstanceLoad) -> bool:
    """Whether placement treats ``l`` as serving: started, or predicted to start within
    ``START_GRACE`` of the plan's predicted rollout."""
    if l.started:
        return True
    horizon = plan.predicted_rollout_s * START_GRACE
    return horizon == horizon and l.ready_in_s <= horizon


def _fill(l: InstanceLoad) -> float:
    """How loaded an instance is: sequences per slot, then KV occupancy (for ties)."""
    slots = l.max_running if l.max_running > 0 else max(1, l.running + l.queued)
    return (l.running + l.queued) / slots + 1e-3 * (l.kv_tokens_used + l.queued_tokens) / max(l.kv_tokens_capacity, 1)


def place(plan: Plan, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
    """The work-conserving instance for work routed to ``bucket`` (module docstring).

    Candidates are the instances of buckets ``>= bucket`` (all, if the pool or a fault emptied
    those). In order: the instance already holding the trajectory's KV, if it is a candidate
    with room (no move); a candidate with room, serving first (``serves_now``: started, or
    starting within ``START_GRACE``), own bucket then the nearest
    longer one, least filled. Nothing has room: a trajectory already running somewhere waits on
    the instance holding its KV if that bucket still holds its context (moving it to a shorter
    queue re-prefills it and was slower in tests: 25.0 s against 20.7 s on a two-bucket step);
    otherwise it queues on the least-filled candidate, serving first, shorter bucket on ties.
    Guests (issue 22): a longer bucket's instance takes shorter work only while it has none of
    its own (``takes_guests``), and a guest on one that has work of its own goes back to its own
    bucket at its next call when an instance of that bucket has room.
    (Queuing all new work in its own bucket concentrated the backlog there: 23.5 s against
    21.1 s for one bucket of the same instances.)"""
    if not loads:
        raise ValueError("place: no live instance")
    ctx = obs.context_tokens if obs is not None else 0
    cur = obs.instance if obs is not None else None
    cands = [l for l in loads if l.bucket >= bucket]
    if not cands:
        cands = [l for l in loads if (_bound(plan, l.bucket) or 1 << 62) > ctx] or list(loads)
    roomy = [l for l in cands if l.room(ctx) > 0]
    if cur is not None:
        for l in roomy:
            # a guest on a longer bucket's instance that now has work of its own goes home when
            # its own bucket has room
            if l.instance == cur and l.started and (takes_guests(l, bucket) or not any(o.bucket == bucket and o.started for o in roomy)):
                return cur
    roomy = [l for l in roomy if takes_guests(l, bucket)]
    if roomy:
        return min(roomy, key=lambda l: (not serves_now(plan, l), l.bucket - bucket if l.bucket >= bucket else 1 << 20, _fill(l),
                                         not l.started, l.instance)).instance
    if cur is not None:
        for l in loads:
            if l.instance == cur and l.started and (_bound(plan, l.bucket) or 1 << 62) > ctx:
                return cur
    cands = [l for l in cands if takes_guests(l, bucket)] or cands
    return min(cands, key=lambda l: (not serves_now(plan, l), _fill(l), l.bucket, not l.started, l.instance)).instance


def takes_guests(l: InstanceLoad, bucket: int) -> bool:
    """Whether ``l`` may take work routed to the shorter ``bucket`` (a guest): only while it has
    no work of its own bucket. A longer bucket's instances exist for the trajectories that outgrow
    the shorter ones; with guests admitted up to its slot limit, a TP-8 tail instance decoded its
    tail at batch 256 and the hindsight two-bucket layout that beat the best homogeneous one
    (rollout 490 s against 693 s) degraded to 679 s (issue 22's audit, SIMULATED). An idle
    longer instance still takes guests (no instance idles while work it could run waits)."""
    return l.bucket <= bucket or not l.own


def excess(l: InstanceLoad, plan: Plan | None = None) -> int:
    """Queued sequences ``l`` cannot start itself now: all of them while it has not started
    (unless ``plan`` says it starts within the grace, ``serves_now``: its queue is then its own
    share), else those beyond its free slots and free KV (at their mean context). A queue it will
    admit at its next iteration boundary (a sequence just back from a tool) is not waiting work."""
    if l.queued <= 0:
        return 0
    if not l.started and (plan is None or not serves_now(plan, l)):
        return l.queued
    mean_ctx = l.queued_tokens // l.queued
    own = InstanceLoad(l.instance, l.bucket, l.running, 0, l.kv_tokens_used, l.kv_tokens_capacity, l.max_running)
    return max(0, l.queued - own.room(mean_ctx))


def steal(plan: Plan, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
    """The queued work ``receiver`` should pull (module docstring), or None.

    Only a started receiver with room and an empty queue pulls (so two instances never trade
    the same work back and forth). Donors: every other instance with ``excess`` queued work
    (what it cannot start itself now; only that is taken); its own bucket
    and shorter buckets first (their work fits any longer bound), then longer buckets (only
    entries whose context is below the receiver's bound); within those, donors not serving
    first (their queue cannot run at all), then the longest queue per slot. A receiver with work
    of its own bucket pulls no shorter bucket's work (``takes_guests``). It takes up to its
    free slots, limited by its free KV at the donor's mean queued context."""
    if not receiver.started or receiver.queued > 0:
        return None
    donors = [(l, excess(l, plan)) for l in loads if l.queued > 0 and l.instance != receiver.instance
              and takes_guests(receiver, l.bucket)]
    donors = [(l, e) for l, e in donors if e > 0]
    if not donors:
        return None
    best, extra = min(donors, key=lambda d: (d[0].bucket > receiver.bucket, serves_now(plan, d[0]), -d[1] / max(d[0].max_running, 1), d[0].instance))
    mean_ctx = best.queued_tokens // max(best.queued, 1)
    n = min(receiver.room(mean_ctx), extra)
    if n <= 0:
        return None
    return Transfer(best.instance, receiver.instance, n, _bound(plan, receiver.bucket) if best.bucket > receiver.bucket else None)


class WorkConserving:
    """Mixin: ``choose_instance`` by ``place`` and ``next_for`` by ``steal`` over ``self.plan``."""

    plan: Plan
    #: backends may skip asking ``next_for`` of a router that says False (it never moves queued work)
    work_conserving: bool = True
    #: on engines that consecutive steps share, the older steps' turns and parked KV come first:
    #: a newer step's turn waits for free KV instead of evicting an older step's (``sim.instance``)
    step_priority: bool = True

    def choose_instance(self, bucket: int, loads: Sequence[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        return place(self.plan, bucket, loads, obs)

    def next_for(self, receiver: InstanceLoad, loads: Sequence[InstanceLoad]) -> Transfer | None:
        return steal(self.plan, receiver, loads)


class SchedulerFactory(Protocol):
    """Makes the scheduler of a step from that step's plan."""

    def __call__(self, plan: Plan) -> RolloutScheduler: ...
