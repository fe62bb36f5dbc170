"""The rollout stage on Ray: many trajectories, several engine instances, concurrent tools.

The driver holds every trajectory's tokens (``Episode``), so no trajectory lives only inside a
worker: when an instance dies its trajectories are re-queued elsewhere and recompute their
context there. Routing is the policy core's: ``admit`` places a new trajectory in a bucket,
``on_tool_return`` decides at each tool call whether it stays or moves (C-MLFQ's
``Route.migrate``; the observation is ``Episode.observation``, the simulator's semantics; the
tool-limit call, after which the trajectory ends, is not routed), ``choose_instance`` picks an instance of the bucket from the loads the driver
sees (every live instance: the policy core's ``place`` may put shorter work on a longer bucket's
instance, and a trajectory back from a tool whose instance is full is placed again), and an idle
instance asks ``next_for`` which queued work to pull from another's queue (work conservation:
no instance idles while work it could run waits). Routing happens as a tool call starts (``TrajectoryObservation.at_call_start``, as in the
simulator), so a move is carried out while the tool runs, by prefix recomputation: the destination
computes the trajectory's context (``EngineActor.prefill``) and the source drops its KV; when
the tool returns, the destination has only the tool's output left to compute. Its
measured time is recorded next to the cost evaluator's ``kv_migration_s`` prediction.

Each instance runs at most one ``generate`` call at a time (a batch of up to ``max_batch``
queued turns); tool calls run on the ``ToolActor`` meanwhile.

Streaming training (``training``, a ``streaming.StreamingTrainer``): each GRPO group is handed
over as its last trajectory finishes, the in-flight mini-batch's refs (and lent instances'
background joins) are waited on with the engines' and the tools', so the elastic pool is
consulted with ``training_running`` true while a mini-batch runs. A ``RoleChange`` for an idle
instance lends it: it gets no rollout work for the rest of the step, its KV is dropped, and its
actor joins training as a gradient helper (if the trainer takes helpers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from libra.planner.plan import Plan
from libra.pool.base import InstanceState, PoolObservation, RoleChange
from libra.runtime.episode import Episode
from libra.scheduling.base import InstanceLoad, RolloutScheduler, TrajectoryObservation


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
    routed: int = 0  # routing decisions at tool-call starts (``on_tool_return``)
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


class Rollout:
    """Runs one step's episodes to completion (see the module docstring)."""

    def __init__(self, plan: Plan, instances: dict[int, Instance], tools: Any, scheduler: RolloutScheduler, decode: Callable[[list[int]], str],
                 encode: Callable[[str], list[int]], ev: Any = None, pool: Any = None, max_batch: int = 8,
                 respawn: Callable[[Instance], Any] | None = None, faults: Sequence[tuple[float, int]] = (), training: Any = None) -> None:
        self.plan, self.inst, self.tools, self.sched = plan, instances, tools, scheduler
        self.decode, self.encode, self.ev, self.pool, self.max_batch = decode, encode, ev, pool, max_batch
        self.respawn = respawn
        self.faults = sorted(faults)  # (seconds into the stage, instance) to kill
        self.training = training  # a StreamingTrainer (see the module docstring), or None
        self.t0 = 0.0

    # ---- observations ------------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _obs(self, ep: Episode, index: int, where: int | None, bucket: int | None, admitted: float) -> TrajectoryObservation:
        """What a real system knows now (``Episode.observation``: a pending call means routing
        at its start, in the simulator's semantics)."""
        return ep.observation(index, where, bucket, self._now() - admitted)

    def _load(self, i: Instance) -> InstanceLoad:
        """What the driver knows of an instance: its batch in flight, its queue, the KV of the
        trajectories it holds (their contexts) and of those queued on it."""
        return InstanceLoad(i.id, i.bucket, len(i.inflight[1]) if i.inflight else 0, len(i.queue),
                            sum(len(self.eps[t].context) for t in i.resident if t in self.eps), i.kv_capacity,
                            self.max_batch, True, sum(len(self.eps[t].context) for t in i.queue if t in self.eps and t not in i.resident))

    def _loads(self) -> list[InstanceLoad]:
        """Every live, un-lent instance's load."""
        live = [self._load(i) for i in self.inst.values() if i.alive and not i.lent]
        if not live:
            raise RuntimeError("no live rollout instance left")
        return live

    def _place(self, bucket: int, obs: TrajectoryObservation | None = None) -> int:
        """The scheduler's instance for work routed to ``bucket`` (any live instance)."""
        loads = self._loads()
        choice = self.sched.choose_instance(bucket, loads, obs)
        if choice not in {l.instance for l in loads}:
            raise RuntimeError(f"the scheduler chose instance {choice}, which is not a live rollout instance")
        return choice

    def _pull(self, inst: Instance, where: dict[str, int]) -> int:
        """Move the queued work the scheduler names (``next_for``) to idle ``inst``; how many
        trajectories moved. Their KV elsewhere is dropped (they re-prefill here)."""
        nf = getattr(self.sched, "next_for", None)
        if nf is None or not any(i.queue for i in self.inst.values() if i is not inst and i.alive and not i.lent):
            return 0
        moved = 0
        for _ in range(8):
            t = nf(self._load(inst), self._loads())
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
                where[x] = inst.id
                inst.queue.append(x)
            moved += len(take)
        return moved

    # ---- the stage ---------------------------------------------------------------------------
    def run(self, episodes: list[Episode]) -> RolloutResult:
        self.t0 = time.perf_counter()
        self.eps = {e.traj_id: e for e in episodes}
        index = {e.traj_id: i for i, e in enumerate(episodes)}
        admitted = {e.traj_id: 0.0 for e in episodes}
        where: dict[str, int] = {}
        bucket_of: dict[str, int] = {}
        res = RolloutResult(episodes, 0.0)
        members: dict[str, list[Episode]] = {}
        for e in episodes:
            members.setdefault(e.group, []).append(e)
        left_in_group = {g: len(m) for g, m in members.items()}
        train = self.training
        if train is not None:
            train.start(self._now)
        for e in episodes:
            o = self._obs(e, index[e.traj_id], None, None, 0.0)
            b = self.sched.admit(o)
            res.admitted_by_bucket[b] = res.admitted_by_bucket.get(b, 0) + 1
            i = self._place(b, o)
            bucket_of[e.traj_id], where[e.traj_id] = b, i
            self.inst[i].queue.append(e.traj_id)
        tools: dict[Any, str] = {}
        prefills: dict[Any, tuple[str, int, int]] = {}
        unfinished = len(episodes)

        def finish(ep: Episode) -> None:
            nonlocal unfinished
            unfinished -= 1
            self.sched.on_finish(self._obs(ep, index[ep.traj_id], where.get(ep.traj_id), bucket_of.get(ep.traj_id), admitted[ep.traj_id]))
            inst = self.inst[where[ep.traj_id]]
            inst.resident.discard(ep.traj_id)
            if inst.alive and not inst.lent:
                inst.handle.drop.remote([ep.traj_id])
            left_in_group[ep.group] -= 1
            if train is not None and left_in_group[ep.group] == 0:
                train.on_group_done(members[ep.group])

        def requeue_from(inst: Instance) -> None:
            lost = list(inst.queue) + (inst.inflight[1] if inst.inflight else [])
            inst.queue.clear()
            inst.inflight = None
            inst.resident.clear()
            for t in lost:
                j = self._place(bucket_of[t], self._obs(self.eps[t], index[t], None, bucket_of[t], admitted[t]))
                where[t] = j
                self.inst[j].queue.append(t)
                res.recovered += 1

        def kill(inst: Instance) -> None:
            inst.alive = False
            res.dead_instances.append(inst.id)
            requeue_from(inst)
            if self.respawn is not None:  # a fresh worker takes its place (weights from the driver)
                inst.handle = self.respawn(inst)
                inst.alive = True

        def dispatch() -> None:
            for inst in self.inst.values():  # idle instances first take queued work they can run
                if inst.alive and not inst.lent and inst.inflight is None and not inst.queue:
                    res.pulled += self._pull(inst, where)
            for inst in self.inst.values():
                if inst.alive and inst.inflight is None and inst.queue:
                    batch, inst.queue[:] = inst.queue[: self.max_batch], inst.queue[self.max_batch :]
                    reqs = [self.eps[t].request() for t in batch]
                    inst.inflight = (inst.handle.generate.remote(reqs), batch, self._now())
                    inst.idle_since = None
                elif inst.alive and inst.inflight is None and not inst.queue and inst.idle_since is None:
                    inst.idle_since = self._now()

        def consult_pool() -> None:
            if self.pool is None:
                return
            states = tuple(InstanceState(i.id, i.tp, i.node, len(i.inflight[1]) if i.inflight else 0, len(i.queue), i.idle_since)
                           for i in self.inst.values() if i.alive and not i.lent)
            waiting = len(tools) + sum(len(i.queue) for i in self.inst.values())
            # without streaming the loop trains only after this stage returns: never running now
            training_running = bool(train is not None and train.running)
            obs = PoolObservation(self._now(), 0.0, states, unfinished, waiting, training_running, self.plan.n_train_gpus)
            res.pool_consulted += 1
            res.pool_consulted_training += training_running
            for ch in self.pool.on_rollout_progress(obs):
                assert isinstance(ch, RoleChange)
                inst = self.inst[ch.instance]
                if inst.queue or inst.inflight or not inst.alive:
                    continue
                if train is None or not train.lend(inst.id, inst.handle):
                    res.lend_declined += 1
                    continue
                inst.lent = True
                if inst.resident:  # its KV is of no use in training; a trajectory back from a tool moves on
                    inst.handle.drop.remote(sorted(inst.resident))
                    inst.resident.clear()
                res.lent.append((self._now(), inst.id))

        dispatch()
        while unfinished > 0:
            # fault injection: once its time has come, kill the victim while it is generating
            # (ray.kill is a SIGKILL of the worker process: its in-flight call fails at once)
            while self.faults and self._now() >= self.faults[0][0]:
                inst = self.inst.get(self.faults[0][1])
                if inst is None or not inst.alive:
                    self.faults.pop(0)
                    continue
                if inst.inflight is None:
                    break
                self.faults.pop(0)
                ray.kill(inst.handle, no_restart=True)
                # the injector handles the death at once: waiting for the in-flight call to fail
                # raced with the call finishing first (then a bucket whose trajectories had all
                # moved on never dispatched to the dead worker again and nothing was recovered).
                # A death nobody injected is noticed when its call fails (RayActorError, below).
                kill(inst)
            pending = [i.inflight[0] for i in self.inst.values() if i.inflight] + list(tools) + list(prefills)
            if not pending:
                dispatch()
                continue
            if train is not None:
                pending += train.refs()
            ready, _ = ray.wait(pending, num_returns=1, timeout=0.05 if self.faults else None)
            for ref in ready:
                if train is not None and train.owns(ref):
                    train.on_ready(ref)  # a mini-batch or a join finished; the next may start
                    continue
                if ref in tools:
                    t = tools.pop(ref)
                    ep = self.eps[t]
                    tr = ray.get(ref)
                    text = Episode.response_text(tr)
                    ep.on_tool_result(tr, self.encode(text), text)
                    res.tool_calls += 1
                    res.tool_errors += tr.outcome == "error"
                    res.tool_timeouts += tr.outcome == "timeout"
                    if ep.done:
                        finish(ep)
                        continue
                    # routed when the call started; continue there (or, if that instance died or
                    # was lent meanwhile, on another of the bucket: it recomputes the context)
                    dst = where[t]
                    d = self.inst[dst]
                    if not d.alive or d.lent or len(d.queue) + (len(d.inflight[1]) if d.inflight else 0) >= self.max_batch:
                        # gone, or full: placed again (it stays unless another instance has room)
                        o = self._obs(ep, index[t], dst if d.alive and not d.lent else None, bucket_of[t], admitted[t])
                        dst = self._place(bucket_of[t], o)
                        if dst != where[t] and d.alive and not d.lent and t in d.resident:
                            d.resident.discard(t)
                            d.handle.drop.remote([t])
                        where[t] = dst
                    self.inst[dst].queue.append(t)
                    continue
                if ref in prefills:
                    t, src, dst = prefills.pop(ref)
                    try:
                        tokens, secs = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        continue  # the destination died; the trajectory was re-queued with its queue
                    ti, to = self.inst[src].tp, self.inst[dst].tp
                    kv = float(self.ev.kv_migration_s(tokens, ti, to, self.inst[src].node == self.inst[dst].node)) if self.ev else float("nan")
                    pf = float(self.ev.prefill_s(to, tokens)) if self.ev else float("nan")
                    res.migrations.append(Migration(t, src, dst, int(tokens), float(secs), kv, pf))
                    continue
                inst = next(i for i in self.inst.values() if i.inflight and i.inflight[0] == ref)
                _, batch, started = inst.inflight  # type: ignore[misc]
                try:
                    outs = ray.get(ref)
                except ray.exceptions.RayActorError:
                    kill(inst)
                    continue
                inst.inflight = None
                # the call's wall time on the engine (per-request prefill/decode times of a
                # batched call overlap, so their sum would count the batch's decode B times)
                busy = float(outs[0].extra.get("call_s", 0.0)) if outs else 0.0
                for r in outs:
                    ep = self.eps[r.traj_id]
                    res.gen_tokens += len(r.tokens)
                    res.prefill_tokens += r.prefill_tokens
                    res.cached_tokens += r.cached_tokens
                    inst.resident.add(r.traj_id)
                    call = ep.on_generation(r, self.decode)
                    if call is None:
                        finish(ep)
                        continue
                    t = r.traj_id
                    tools[self.tools.call.remote(call.name, call.args)] = t
                    if ep.call_ends_trajectory:
                        continue  # the tool-limit call: the trajectory ends when it returns, nothing to route
                    # route as the call starts, so a move's context recomputation on the
                    # destination overlaps the tool call (as the simulator's KV migration does)
                    src = where[t]
                    route = self.sched.on_tool_return(self._obs(ep, index[t], src, bucket_of[t], admitted[t]))
                    res.routed += 1
                    moved_bucket = route.bucket != bucket_of[t]
                    res.rerouted += moved_bucket
                    bucket_of[t] = route.bucket
                    if route.bucket != inst.bucket:  # promoted, or a guest on a longer bucket's instance
                        dst = self._place(route.bucket, self._obs(ep, index[t], src, bucket_of[t], admitted[t]))
                        if dst != src:
                            inst.resident.discard(t)
                            inst.handle.drop.remote([t])
                            if route.migrate or not moved_bucket:
                                prefills[self.inst[dst].handle.prefill.remote(t, tuple(ep.context))] = (t, src, dst)
                            else:
                                res.moves_without_kv += 1
                            where[t] = dst
                res.engine_busy_s[inst.id] = res.engine_busy_s.get(inst.id, 0.0) + busy
            dispatch()
            consult_pool()
            dispatch()
        # a migration's prefill can still be running when the last trajectory ends elsewhere
        for ref, (t, src, dst) in list(prefills.items()):
            try:
                tokens, secs = ray.get(ref)
                ti, to = self.inst[src].tp, self.inst[dst].tp
                kv = float(self.ev.kv_migration_s(tokens, ti, to, True)) if self.ev else float("nan")
                pf = float(self.ev.prefill_s(to, tokens)) if self.ev else float("nan")
                res.migrations.append(Migration(t, src, dst, int(tokens), float(secs), kv, pf))
            except ray.exceptions.RayActorError:
                pass
        res.makespan_s = self._now()
        for inst in self.inst.values():
            inst.lent = False
        return res
