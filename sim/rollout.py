"""One step's rollout on the simulated cluster: trajectories, tool calls, routing, migrations.

The stage owns the step's instances (``sim.instance.Instance``) and walks every trajectory
through its turns: admission (the router picks a bucket, then an instance), a turn's generation
inside a batch, a tool call outside it, the return. It asks the policy exactly what a real
system could answer at each moment (``TrajectoryObservation`` carries no future):

* admission: ``scheduler.admit(obs)`` then ``scheduler.choose_instance(bucket, loads, obs)``
  over the loads of every live instance (a bucket's bound is an upper limit: the router may
  place shorter work on a longer bucket's instance);
* tool call: ``scheduler.on_tool_return(obs)`` is asked **when the call starts**, because that
  is the only moment a KV migration can overlap the tool (the spec's rule: a tool that returns
  before its migration ends waits). The observation then carries the context so far,
  ``last_tool`` = the tool being called (so a router can weigh its expected latency against the
  migration) and ``last_outcome`` = the outcome of the *previous* call (None before the first):
  this call's outcome is not known until it returns. A route to another bucket places the
  trajectory there (``choose_instance``); a route that keeps the bucket leaves it where it is,
  unless the router says it ``rebalances``: then ``choose_instance`` is asked too, and another
  instance it names gets the trajectory's KV by migration (``libra.scheduling.rebalance``);
* finish: ``scheduler.on_finish(obs)`` with the final context and the last outcome;
* a trajectory's last call is routed like any other unless the trace says it ended at its call
  budget (finish ``tool_limit``): a real system knows that budget when the call starts, and
  ``libra-run`` does not route that call either. A call after which the trajectory ends for
  another reason (its output passed the context limit: ``length``; ``abort``) is known to be the
  last only in hindsight, so it is routed, and any move carried out, as ``libra-run`` does;
* work conservation: a trajectory back from a tool whose instance has no room is placed again
  (``choose_instance`` with the instance holding its KV: it stays unless another has room);
  whenever an instance has room and an empty queue (its GPUs became free, a batch boundary left
  free slots, another instance died) it asks ``scheduler.next_for(load, loads)`` and moves the
  queued entries the answer names (their cached KV is dropped; the receiver prefills them).
  Loads report ``started=False`` for an instance whose GPUs are still held (async: the previous
  step's training) or that loads its weights after a re-plan, so routers do not mistake it for
  an empty one; ``ready_in_s`` is the *predicted* wait (the transition's predicted weight load,
  not the noisy one the simulation then charges; unknown while an earlier training holds it).

Async continuous generation (``sim.engines``): a stage may run on instances shared with the
neighbouring steps' stages. Its trajectories are then ids ``[base, base + n)`` on the instances
(``i + self._base`` wherever the stage hands a trajectory to an instance), the engines route each
instance callback to the owning stage, ``admitted`` fires once every trajectory has been seated
in a batch (the next step's prompts may then follow), and the step's metrics are its share of
each instance (``Instance.share``). Such a stage never removes an instance (faults and elastic
pools run on unshared instances).

KV of a trajectory in a tool call is kept (cached on its instance, evictable under pressure)
with ``kv_mode="keep"``, or released (``"release"``: the whole context is prefilled again on
return). A route to another bucket without ``migrate`` releases the KV and re-prefills there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from libra.planner.costs import nvlink_domain
from libra.planner.plan import Plan
from libra.pool.base import InstanceState, PoolObservation, PoolPolicy, RoleChange
from libra.scheduling.base import InstanceLoad, RolloutScheduler, TrajectoryObservation
from libra.trace.columnar import StepArrays
from libra.trace.records import FINISHES, OUTCOMES
from sim.instance import Instance, InvariantViolation, QueueEntry, SimulationError

_TOOL_LIMIT = FINISHES.index("tool_limit")

if TYPE_CHECKING:  # pragma: no cover
    import simpy

    from sim.engines import Engines
    from sim.costs import SimCosts
    from sim.noise import Noise


@dataclass
class RolloutStats:
    """What one step's rollout did (times are simulated seconds from the step's start)."""

    start_s: float = 0.0
    end_s: float = float("nan")
    finish_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gen_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    evictions: int = 0
    migrations: int = 0
    migration_wait_s: float = 0.0
    #: trajectories the router sent to another bucket at a tool's return (outcome and output known)
    return_moves: int = 0
    migrations_refused: int = 0  # the destination had no KV room: moved by re-prefill instead
    queue_wait_s: float = 0.0
    intervals: int = 0
    busy_gpu_s: float = 0.0
    rollout_gpus: int = 0
    peak_kv_fraction: float = 0.0
    role_changes: int = 0
    fault_requeued: int = 0
    pulled: int = 0  # queued sequences moved to an instance with room (``next_for``)
    gantt: list[tuple[int, int, float, float, int]] = field(default_factory=list)  # inst, tp, t0, t1, batch

    @property
    def makespan_s(self) -> float:
        return self.end_s - self.start_s


def _add_counts(s: RolloutStats, src: Any, inst: Instance) -> None:
    """Add ``src``'s counters (an instance's, or one step's share of a shared instance's) to the
    stage's stats, and ``inst``'s KV peak."""
    s.gen_tokens += src.gen_tokens
    s.prefill_tokens += src.prefill_tokens
    s.preemptions += src.preemptions
    s.evictions += src.evictions
    s.queue_wait_s += src.queue_wait_s
    s.intervals += src.intervals
    s.busy_gpu_s += src.busy_s * inst.tp
    if inst.capacity:
        s.peak_kv_fraction = max(s.peak_kv_fraction, inst.peak_kv / inst.capacity)


class RolloutStage:
    """Runs one step's rollout; ``done`` fires when every trajectory has finished exactly once."""

    def __init__(
        self,
        env: simpy.Environment,
        step: StepArrays,
        plan: Plan,
        scheduler: RolloutScheduler,
        pool: PoolPolicy | None,
        costs: SimCosts,
        noise: Noise,
        latencies: np.ndarray,
        kv_mode: str = "keep",
        gpus_per_node: int = 8,
        record_gantt: bool = False,
        on_role_change: Callable[[RolloutStage, Instance, RoleChange], None] | None = None,
        training_state: Callable[[], tuple[bool, int]] | None = None,
        on_group_done: Callable[[list[int]], None] | None = None,
        engines: Engines | None = None,
    ) -> None:
        if kv_mode not in ("keep", "release"):
            raise ValueError(f"kv_mode must be 'keep' or 'release', got {kv_mode!r}")
        self.env = env
        self.step = step
        self.plan = plan
        self.sched = scheduler
        # the router may move a trajectory within its bucket as a call starts (``RolloutScheduler``)
        self._rebalances = bool(getattr(scheduler, "rebalances", False))
        #: engines shared by several steps keep the older steps' KV first (``sim.instance``'s step
        #: priority) when the router says so (``step_priority``)
        self._step_priority = bool(getattr(scheduler, "step_priority", False))
        self.pool = pool
        self.costs = costs
        self.noise = noise
        # KV migrates over NVLink between instances of one NVLink domain (a node; a GB200 rack)
        self._domain = nvlink_domain(getattr(costs.ev, "gpu", None), gpus_per_node)
        self.kv_keep = kv_mode == "keep"
        self.record_gantt = record_gantt
        self._on_role_change = on_role_change
        self._training_state = training_state or (lambda: (False, 0))
        self._on_group_done = on_group_done
        # GRPO groups (a null group is a group of one), for streaming training
        self._group_of: list[int] = []
        self._group_rows: list[list[int]] = []
        index: dict[object, int] = {}
        for i, g in enumerate(step.groups):
            key: object = g if g is not None else ("__row", i)
            k = index.setdefault(key, len(index))
            if k == len(self._group_rows):
                self._group_rows.append([])
            self._group_rows[k].append(i)
            self._group_of.append(k)
        self._group_left = [len(r) for r in self._group_rows]
        n = step.n
        # per-turn data as Python lists: the hot path indexes scalars, lists are fastest for that
        self._off = step.turn_offsets.tolist()
        self._gen = step.gen_tokens.tolist()
        self._ttok = step.tool_tokens.tolist()
        self._lat = latencies.tolist()
        self._tool = step.tool_code.tolist()
        self._outc = step.outcome_code.tolist()
        self._fin = step.finish_code.tolist()
        self._names = step.tool_names
        self._prompt = step.prompt_tokens.tolist()
        self._ids = step.ids
        self._groups = step.groups
        # per-trajectory state
        self._turn = [0] * n
        self._ctx = list(self._prompt)
        self._admit_s = [0.0] * n
        self._bucket: list[int | None] = [None] * n
        self._home: list[int | None] = [None] * n  # instance holding its KV / running it
        self._finish = np.full(n, np.nan)
        self._finished = 0
        self.stats = RolloutStats(rollout_gpus=sum(i.tp for i in plan.instances))
        self.done = env.event()
        # instances
        self.instances: dict[int, Instance] = {}
        self._by_bucket: dict[int, list[Instance]] = {}
        self._retired: list[Instance] = []
        # work conservation (``_pull``): routers that never move queued work say so
        # (``work_conserving = False``), and the simulator then skips asking
        self._wc = callable(getattr(scheduler, "next_for", None)) and getattr(scheduler, "work_conserving", True)
        # async continuous generation (``sim.engines``): the instances may be shared with the
        # neighbouring steps' stages; this stage's trajectories are ids [base, base + n) on them
        self._engines = engines
        self._base = 0
        self._seats = 0  # trajectories seated in a batch at least once (shared engines)
        self._seated_once: list[bool] = []
        self.admitted = env.event()  # shared engines: every trajectory seated once
        self.overlapped = False  # shared engines: another step's rollout ran on them meanwhile
        self.overlap = 0.0  # shared engines: other steps' rollout time inside this one's, over its length (``Engines.overlap_of``)
        self._waiting = [0] if engines is None else engines.waiting  # queued entries over the instances
        adopt = engines is not None and bool(engines.instances)
        for ri in plan.instances:
            if adopt:
                inst = engines.instances[ri.id]  # type: ignore[union-attr]
            else:
                gpus = tuple(ri.node * gpus_per_node + ri.first_gpu + k for k in range(ri.tp))
                if engines is None:
                    inst = Instance(env, ri.id, ri.tp, ri.bucket, gpus, ri.node, costs, noise, self._turn_end, self._idle,
                                    on_room=self._pull if self._wc else None, on_start=self._started, waiting=self._waiting)
                else:
                    inst = Instance(env, ri.id, ri.tp, ri.bucket, gpus, ri.node, costs, noise, engines.turn_end, engines.idle_cb,
                                    on_room=engines.room if self._wc else None, on_start=engines.started, waiting=self._waiting,
                                    owner_of=engines.owner_of, on_admit=engines.admitted,
                                    step_rank=engines.step_rank if self._step_priority else None)
                    engines.instances[ri.id] = inst
                if costs.kv_capacity(ri.tp) <= 0:
                    raise SimulationError(f"plan has a TP={ri.tp} rollout instance but the model's weights do not fit in {ri.tp} GPU(s); use a larger TP")
            if record_gantt and inst.trace is None:  # shared engines: from this stage's start on (observing changes nothing)
                inst.trace = []
            self.instances[ri.id] = inst
            self._by_bucket.setdefault(ri.bucket, []).append(inst)
        if engines is not None:
            self._seated_once = [False] * n
        if not self.instances:
            raise SimulationError("the plan has no rollout instance")
        self._min_bucket = min(self._by_bucket)

    # ------------------------------------------------------------------ helpers
    def _obs(
        self, i: int, inst: Instance | None, last_tool: str | None, last_outcome: str | None, at_call_start: bool = False
    ) -> TrajectoryObservation:
        return TrajectoryObservation(
            traj_id=self._ids[i],
            index=i,
            step=self.step.step,
            group=self._groups[i],
            prompt_tokens=self._prompt[i],
            context_tokens=self._ctx[i],
            turns_done=self._turn[i],
            last_tool=last_tool,
            last_outcome=last_outcome,
            elapsed_s=self.env.now - self._admit_s[i],
            instance=None if inst is None else inst.id,
            bucket=self._bucket[i],
            at_call_start=at_call_start,
        )

    def _load(self, x: Instance) -> InstanceLoad:
        ready = 0.0 if x.started else (float("inf") if x.ready_at is None else max(0.0, x.ready_at - self.env.now))
        return InstanceLoad(x.id, x.bucket, x.n_running, len(x.queue), x.kv_used, x.capacity, x.max_seqs, x.started,
                            x.queued_tokens, ready, self._own(x))

    def _own(self, x: Instance) -> int | None:
        """1 when ``x`` holds work routed to its own bucket (running, queued, in a tool call with
        its KV cached there, or migrating in), else 0; None on the shortest bucket (it can host
        no guest). What a real engine's router knows: the bucket it routed each sequence to.
        A 0/1 answer is all ``takes_guests`` needs, and it stops at the first own sequence."""
        b = x.bucket
        if b <= self._min_bucket:
            return None
        if self._engines is not None:  # shared: every running step's work counts
            bo = self._bucket_of
            return int(any(bo(j) == b for j in x.held) or any(bo(j) == b for j in x.pinned)
                       or any(bo(j) == b for j in x.running) or any(bo(e.traj) == b for e in x.queue))
        bk = self._bucket
        return int(any(bk[j] == b for j in x.held) or any(bk[j] == b for j in x.pinned)
                   or any(bk[j] == b for j in x.running) or any(bk[e.traj] == b for e in x.queue))

    def _bucket_of(self, gid: int) -> int | None:
        """The bucket the owner step routed sequence ``gid`` of the shared engines to."""
        s = self._engines.owner_of(gid)  # type: ignore[union-attr]
        return s._bucket[gid - s._base]

    def _rehome(self, gid: int, iid: int) -> None:
        """Sequence ``gid`` (an instance's id for it) now lives on instance ``iid``."""
        if self._engines is None:
            self._home[gid] = iid
        else:
            s = self._engines.owner_of(gid)
            s._home[gid - s._base] = iid

    def _seated(self, i: int) -> None:
        """Shared engines: trajectory ``i`` entered a batch; once all have, the next step's
        prompts may be admitted behind them (``admitted``)."""
        if not self._seated_once[i]:
            self._seated_once[i] = True
            self._seats += 1
            if self._seats == self.step.n and not self.admitted.triggered:
                self.admitted.succeed()

    def loads(self, bucket: int | None = None) -> list[InstanceLoad]:
        """The load of every live instance (of ``bucket`` only, when given)."""
        return [self._load(x) for xs in self._by_bucket.values() for x in xs if bucket is None or x.bucket == bucket]

    def _choose(self, bucket: int, obs: TrajectoryObservation | None = None) -> Instance:
        """The instance the scheduler places work routed to ``bucket`` on (any live instance)."""
        loads = self.loads()
        if not loads:
            raise SimulationError("every rollout instance of the step is gone (faults or role changes); nothing can run")
        iid = self.sched.choose_instance(bucket, loads, obs)
        inst = self.instances.get(iid)
        if inst is None or not inst.alive or inst in self._retired:
            raise SimulationError(f"the scheduler chose instance {iid}, which is not a live instance of this step")
        return inst

    def _started(self, inst: Instance) -> None:
        """An instance's GPUs became free: it pulls queued work it can run."""
        self._pull(inst)

    def _pull(self, inst: Instance) -> bool:
        """Ask the scheduler which queued work ``inst`` should take (``next_for``) and move it;
        True when something moved. Cheap when no other instance has a queue."""
        nf = getattr(self.sched, "next_for", None)
        if nf is None or not self._wc or not inst.alive or inst in self._retired or not inst.started:
            return False
        if self._waiting[0] - len(inst.queue) <= 0:  # no queue anywhere else
            return False
        moved = False
        for _ in range(8):
            t = nf(self._load(inst), self.loads())
            if t is None:
                break
            src = self.instances.get(t.src)
            if t.dst != inst.id or src is None or src is inst or not src.alive or src in self._retired:
                raise SimulationError(f"the scheduler asked to move queued work {t}, which is not a live instance's queue to instance {inst.id}")
            entries = src.take_queued(int(t.count), t.max_context)
            if not entries:
                break
            for e in entries:
                self._rehome(e.traj, inst.id)
                inst.enqueue(e)
            self.stats.pulled += len(entries)
            moved = True
        return moved

    def _check_bucket(self, b: int) -> int:
        if not isinstance(b, (int, np.integer)) or b not in self._by_bucket:
            raise SimulationError(f"the scheduler returned bucket {b!r}; the plan's buckets are {sorted(self._by_bucket)}")
        return int(b)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Admit every trajectory of the step (all prompts are known at the step's start)."""
        now = self.env.now
        self.stats.start_s = now
        if self._engines is not None:
            self._base = self._engines.attach(self)
            if self.step.n == 0:
                self.admitted.succeed()
        for i in range(self.step.n):
            self._admit_s[i] = now
        first = [self._obs(i, None, None, None) for i in range(self.step.n)]
        order_of = getattr(self.sched, "admission_order", None)  # default: the step's order (FIFO)
        order = [int(k) for k in order_of(first)] if order_of is not None else range(self.step.n)
        if order_of is not None and sorted(order) != list(range(self.step.n)):
            raise SimulationError("the scheduler's admission_order is not a permutation of the step's trajectories")
        for i in order:
            obs = first[i]
            b = self._check_bucket(self.sched.admit(obs))
            self._bucket[i] = b
            inst = self._choose(b, obs)
            self._home[i] = inst.id
            inst.enqueue(QueueEntry(i + self._base, self._ctx[i], self._gen[self._off[i]], now))
        if self.step.n == 0:
            self._complete()

    def _turn_end(self, inst: Instance, i: int, ctx: int, now: float) -> None:
        k = self._turn[i]
        row = self._off[i] + k
        self._ctx[i] = ctx
        last = row + 1 == self._off[i + 1]
        code = self._tool[row]
        if code < 0:  # no tool: the trajectory is over
            self._home[i] = None
            self._turn[i] = k + 1
            self._finish_traj(i, inst, None)
            return
        lat = self._lat[row]
        tool = self._names[code]
        self._turn[i] = k + 1
        if last and self._fin[i] == _TOOL_LIMIT:  # the budget's last call: it runs, then the trajectory ends
            self._home[i] = None
            ev = self.env.timeout(lat)
            ev.callbacks.append(lambda _e: self._finish_traj(i, None, tool))
            return
        prev = self._outc[row - 1] if k > 0 else -1
        obs = self._obs(i, inst, tool, OUTCOMES[prev] if prev >= 0 else None, True)
        route = self.sched.on_tool_return(obs)
        b = self._check_bucket(route.bucket)
        # a move to another bucket carries the KV when the router says so; a guest (running on
        # a longer bucket's instance) that the router relocates within its bucket always does
        migrate = route.migrate if b != self._bucket[i] else True
        self._bucket[i] = b
        ready = now + lat
        if b != inst.bucket:
            dst = self._choose(b, obs) if self.kv_keep else inst
        else:  # the bucket kept: it stays, unless the router rebalances within it (``rebalances``)
            dst = self._choose(b, obs) if self.kv_keep and self._rebalances else inst
        g = i + self._base  # its id on the instances
        if self.kv_keep and dst is inst:
            inst.hold(g, ctx)  # stays home, KV cached while the tool runs
            self._home[i] = inst.id
        elif self.kv_keep and migrate:
            if dst is inst:
                inst.hold(g, ctx)
                self._home[i] = inst.id
            elif dst.try_pin(g, ctx):
                inst.hold(g, ctx)  # the source copy stays until the transfer ends
                self._home[i] = dst.id
                same = inst.gpus[0] // self._domain == dst.gpus[0] // self._domain
                mig = self.costs.kv_migration_s(ctx, inst.tp, dst.tp, same) * self.noise.factor()
                self.stats.migrations += 1
                self.stats.migration_wait_s += max(0.0, mig - lat)
                ready = max(ready, now + mig)
                ev = self.env.timeout(mig)
                ev.callbacks.append(lambda _e, src=inst, dst=dst: self._migrated(i, src, dst))
            else:  # no room to receive the KV there now: move without it (re-prefill on arrival)
                self.stats.migrations_refused += 1
                self._home[i] = None
        else:
            self._home[i] = None  # released: re-prefill wherever it lands
        ev = self.env.timeout(ready - now)
        ev.callbacks.append(lambda _e: self._tool_return(i))

    def _migrated(self, i: int, src: Instance, dst: Instance) -> None:
        g = i + self._base
        if src.alive:
            src.release(g)
        if dst.alive and g in dst.pinned:
            dst.unpin_to_held(g)

    def _tool_return(self, i: int) -> None:
        now = self.env.now
        row = self._off[i] + self._turn[i] - 1
        if row + 1 == self._off[i + 1]:  # its last call (length, abort: not known at its start): it ends now
            home = self._home[i]
            inst = self.instances.get(home) if home is not None else None
            if inst is not None:
                inst.release(i + self._base)  # the KV cached (or migrated) for a continuation that never comes
            self._home[i] = None
            self._finish_traj(i, None, self._names[self._tool[row]])
            return
        self._ctx[i] += self._ttok[row]
        home = self._home[i]
        inst = self.instances.get(home) if home is not None else None
        # routed again now that the call's outcome and output are known (issue 22 (c)): routing
        # only at the call's start left a trajectory whose tool output pushed it past its bucket's
        # bound, or whose error said "this one runs long", in the short bucket for one more turn
        oc = self._outc[row]
        obs = self._obs(i, inst if inst is not None and inst.alive else None, self._names[self._tool[row]],
                        OUTCOMES[oc] if oc >= 0 else None)
        route = self.sched.on_tool_return(obs)
        b = self._check_bucket(route.bucket)
        if b != self._bucket[i]:
            self._bucket[i] = b
            self.stats.return_moves += 1
            if inst is not None and inst.alive and inst not in self._retired and inst.bucket < b:
                obs = self._obs(i, inst, None, None)
                dst = self._choose(b, obs)
                if dst is not inst:
                    self._move_at_return(i, inst, dst, route.migrate, now)
                    return
        if inst is None or not inst.alive or inst in self._retired:
            inst = self._choose(self._bucket[i], self._obs(i, None, None, None))  # type: ignore[arg-type]
        elif len(inst.running) + len(inst.queue) >= inst.max_seqs or not inst.started:
            # its instance is full: placed again (it stays there unless another has room)
            dst = self._choose(self._bucket[i], self._obs(i, inst, None, None))  # type: ignore[arg-type]
            if dst is not inst:
                inst.release(i + self._base)  # its cached KV there is of no use now
                inst = dst
        self._home[i] = inst.id
        inst.enqueue(QueueEntry(i + self._base, self._ctx[i], self._gen[row + 1], now))

    def _move_at_return(self, i: int, src: Instance, dst: Instance, migrate: bool, now: float) -> None:
        """Move a trajectory that is back from its tool to ``dst``: its KV migrates (when the router
        says so, KV is kept and ``dst`` has room to receive it) and it waits for the transfer, none
        of which overlaps a tool now; else ``dst`` re-prefills its context."""
        g = i + self._base
        cached = src.cached_for(g)
        ctx = self._ctx[i]
        row = self._off[i] + self._turn[i]
        if self.kv_keep and migrate and cached > 0 and dst.try_pin(g, cached):
            same = src.gpus[0] // self._domain == dst.gpus[0] // self._domain
            mig = self.costs.kv_migration_s(cached, src.tp, dst.tp, same) * self.noise.factor()
            self.stats.migrations += 1
            self.stats.migration_wait_s += mig
            self._home[i] = dst.id

            def arrived(_e: object) -> None:
                self._migrated(i, src, dst)
                if not dst.alive or dst in self._retired:  # died meanwhile: placed again
                    target = self._choose(self._bucket[i], self._obs(i, None, None, None))  # type: ignore[arg-type]
                else:
                    target = dst
                self._home[i] = target.id
                target.enqueue(QueueEntry(g, ctx, self._gen[row], self.env.now))

            ev = self.env.timeout(mig)
            ev.callbacks.append(arrived)
            return
        src.release(g)
        self._home[i] = dst.id
        dst.enqueue(QueueEntry(g, ctx, self._gen[row], now))

    def _finish_traj(self, i: int, inst: Instance | None, trailing_tool: str | None) -> None:
        if not np.isnan(self._finish[i]):
            raise InvariantViolation(f"trajectory {self._ids[i]} finished twice")
        now = self.env.now
        if trailing_tool is not None:
            row = self._off[i + 1] - 1
            self._ctx[i] += self._ttok[row]
        self._finish[i] = now
        self._finished += 1
        g = self._group_of[i]
        self._group_left[g] -= 1
        if self._group_left[g] == 0 and self._on_group_done is not None:
            self._on_group_done(self._group_rows[g])
        row = self._off[i + 1] - 1
        oc = self._outc[row]
        self.sched.on_finish(self._obs(i, inst, trailing_tool, OUTCOMES[oc] if oc >= 0 and trailing_tool else None))
        if self._finished == self.step.n:
            self._complete()
        else:
            self._pool_progress()

    def _idle(self, inst: Instance) -> None:
        if inst.empty and self._finished < self.step.n:
            self._pool_progress()

    def _complete(self) -> None:
        now = self.env.now
        s = self.stats
        s.end_s = now
        s.finish_s = self._finish - s.start_s
        if self._engines is not None:  # shared: this step's share of each instance
            for inst in self.instances.values():
                sh = inst.share(self)
                if sh.running:
                    raise InvariantViolation(f"instance {inst.id} runs a sequence of step {self.step.step} after its last one finished")
                _add_counts(s, sh, inst)  # KV peak: the engines' so far (shared by the overlapping steps)
                if self.record_gantt and inst.trace is not None:  # the engines' batches while this step ran (every step's sequences)
                    s.gantt.extend((inst.id, inst.tp, max(a, s.start_s) - s.start_s, b - s.start_s, bs) for a, b, bs in inst.trace if b > s.start_s)
                    inst.trace = None
                del inst.shares[self]
            self._engines.detach(self)
            self.overlap = self._engines.overlap_of(self)
            if not self.done.triggered:
                self.done.succeed(s)
            return
        for inst in self.instances.values():  # retired ones included
            if inst.busy:
                raise InvariantViolation(f"instance {inst.id} busy after the last trajectory finished")
            _add_counts(s, inst, inst)
            if inst.trace is not None:
                s.gantt.extend((inst.id, inst.tp, a - s.start_s, b - s.start_s, bs) for a, b, bs in inst.trace)
            inst.alive = False
        if not self.done.triggered:
            self.done.succeed(s)

    # ------------------------------------------------------------------ pool, faults
    def _pool_progress(self) -> None:
        if self.pool is None or self._on_role_change is None:
            return
        now = self.env.now
        waiting = 0
        states = []
        running_total = 0
        for x in self.instances.values():
            if not x.alive:
                continue
            states.append(InstanceState(x.id, x.tp, x.node, x.n_running, len(x.queue), x.idle_since))
            running_total += x.n_running + len(x.queue)
        unfinished = self.step.n - self._finished
        waiting = unfinished - sum(x.n_running for x in self.instances.values() if x.alive)
        training, tgpus = self._training_state()
        obs = PoolObservation(now, self.stats.start_s, tuple(states), unfinished, waiting, training, tgpus)
        for change in self.pool.on_rollout_progress(obs):
            inst = self.instances.get(change.instance)
            if inst is None or not inst.alive:
                raise SimulationError(f"the pool asked to move instance {change.instance}, which is not a live rollout instance")
            if not inst.started:
                continue  # its GPUs are still busy elsewhere: nothing to lend yet
            if len(self.instances) - len(self._retired) <= 1:
                continue  # never take the last instance: the step could not finish
            self.remove_instance(inst)
            self.stats.role_changes += 1
            self._on_role_change(self, inst, change)

    def remove_instance(self, inst: Instance) -> int:
        """Take an instance out (fault or role change): what it ran or queued re-queues
        elsewhere, re-prefilling its context. Returns how many sequences moved."""
        if self._engines is not None:
            raise InvariantViolation("an instance shared by several steps' rollouts cannot be removed (faults and pools run unshared)")
        entries = inst.evacuate()
        self._by_bucket[inst.bucket].remove(inst)
        self._retired.append(inst)
        for e in entries:
            b = self._bucket[e.traj]
            dst = self._choose(b if b is not None else inst.bucket, self._obs(e.traj, None, None, None))
            self._home[e.traj] = dst.id
            dst.enqueue(e)
        for x in self.loads():  # idle instances take what they can run of it
            if x.queued == 0:
                self._pull(self.instances[x.instance])
        return len(entries)

    def fail_gpu(self, gpu: int) -> bool:
        """A GPU fails now: the instance using it stops, its sequences re-queue elsewhere.
        Returns False if no instance of this step uses that GPU."""
        for inst in list(self.instances.values()):
            if inst.alive and gpu in inst.gpus:
                self.stats.fault_requeued += self.remove_instance(inst)
                return True
        return False
