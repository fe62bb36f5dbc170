"""The rollout instances' queues, filled as the policy core decides (``choose_instance``,
``next_for``); the driver only carries the decisions out.

What the core is shown of an instance is what a real engine reports (``InstanceLoad``: its batch
in flight, its queue, the KV of the trajectories it holds and of those queued on it). ``place``
asks the scheduler which live instance takes work routed to a bucket (any live instance: the
core's ``place`` may put shorter work on a longer bucket's instance); ``pull`` moves the queued
work the scheduler names to an idle instance (work conservation: no instance idles while work
it could run waits elsewhere); ``dispatch`` starts a ``generate`` call of up to ``max_batch``
queued turns on every idle instance with a queue (one call at a time per instance).
"""

from __future__ import annotations

from collections.abc import Callable

from libra.runtime.episode import Episode
from libra.runtime.rollout_state import Instance
from libra.scheduling.base import InstanceLoad, RolloutScheduler, TrajectoryObservation


class Queues:
    """Every instance's queue and which instance each trajectory is on (``where``)."""

    def __init__(self, instances: dict[int, Instance], scheduler: RolloutScheduler, episodes: dict[str, Episode], max_batch: int,
                 now: Callable[[], float]) -> None:
        self.inst, self.sched, self.eps, self.max_batch, self.now = instances, scheduler, episodes, max_batch, now
        self.where: dict[str, int] = {}  # trajectory -> the instance that queues, runs or holds it

    def load(self, i: Instance) -> InstanceLoad:
        """What the driver knows of an instance: its batch in flight, its queue, the KV of the
        trajectories it holds (their contexts) and of those queued on it."""
        return InstanceLoad(i.id, i.bucket, len(i.inflight[1]) if i.inflight else 0, len(i.queue),
                            sum(len(self.eps[t].context) for t in i.resident if t in self.eps), i.kv_capacity,
                            self.max_batch, True, sum(len(self.eps[t].context) for t in i.queue if t in self.eps and t not in i.resident))

    def loads(self) -> list[InstanceLoad]:
        """Every live, un-lent instance's load."""
        live = [self.load(i) for i in self.inst.values() if i.alive and not i.lent]
        if not live:
            raise RuntimeError("no live rollout instance left")
        return live

    def place(self, bucket: int, obs: TrajectoryObservation | None = None) -> int:
        """The scheduler's instance for work routed to ``bucket`` (any live instance)."""
        loads = self.loads()
        choice = self.sched.choose_instance(bucket, loads, obs)
        if choice not in {l.instance for l in loads}:
            raise RuntimeError(f"the scheduler chose instance {choice}, which is not a live rollout instance")
        return choice

    def enqueue(self, t: str, instance: int) -> None:
        """Queue trajectory ``t`` on ``instance`` (it runs there next)."""
        self.where[t] = instance
        self.inst[instance].queue.append(t)

    def pull(self, inst: Instance) -> int:
        """Move the queued work the scheduler names (``next_for``) to idle ``inst``; how many
        trajectories moved. Their KV elsewhere is dropped (they re-prefill here)."""
        nf = getattr(self.sched, "next_for", None)
        if nf is None or not any(i.queue for i in self.inst.values() if i is not inst and i.alive and not i.lent):
            return 0
        moved = 0
        for _ in range(8):
            t = nf(self.load(inst), self.loads())
            if t is None:
                break
            src = self.inst.get(t.src)
            if t.dst != inst.id or src is None or src is inst or not src.alive or src.lent:
                raise RuntimeError(f"the scheduler asked to move queued work {t}, which is not a live instance's queue to instance {inst.id}")
            take = [x for x in src.queue if t.max_context is None or len(self.eps[x].context) < t.max_context][: int(t.count)]
            if not take:
                break
            src.queue[:] = [x for x in src.queue if x not in set(take)]
            dropped = [x for x in take if x in src.resident]
            if dropped:
                src.resident.difference_update(dropped)
                src.handle.drop.remote(dropped)
            for x in take:
                self.where[x] = inst.id
                inst.queue.append(x)
            moved += len(take)
        return moved

    def dispatch(self) -> int:
        """Idle instances first take queued work they can run (``pull``), then every idle
        instance with a queue starts a ``generate`` call of up to ``max_batch`` turns; returns how
        many trajectories were pulled."""
        pulled = 0
        for inst in self.inst.values():
            if inst.alive and not inst.lent and inst.inflight is None and not inst.queue:
                pulled += self.pull(inst)
        for inst in self.inst.values():
            if inst.alive and inst.inflight is None and inst.queue:
                batch, inst.queue[:] = inst.queue[: self.max_batch], inst.queue[self.max_batch :]
                reqs = [self.eps[t].request() for t in batch]
                inst.inflight = (inst.handle.generate.remote(reqs), batch, self.now())
                inst.idle_since = None
            elif inst.alive and inst.inflight is None and not inst.queue and inst.idle_since is None:
                inst.idle_since = self.now()
        return pulled

    def is_full(self, inst: Instance) -> bool:
        """``inst`` already runs and queues a whole batch."""
        return len(inst.queue) + (len(inst.inflight[1]) if inst.inflight else 0) >= self.max_batch
