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
simulator), and again as it returns (``_route_return``: outcome and output known; a move then
recomputes the context at the destination, exposed), so a move decided at the start is carried out while the tool runs, by prefix recomputation: the destination
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

Files: this one is the stage's event loop and its handlers (``Rollout``: one method per kind of
finished Ray call, the step's state as fields); ``rollout_queues.py`` the instances' queues as
the scheduler fills them (loads, ``choose_instance``, ``next_for``, starting batches);
``rollout_state.py`` the data (``Instance``, ``Migration``, ``RolloutResult``, re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from libra.planner.plan import Plan
from libra.pool.base import InstanceState, PoolObservation, RoleChange
from libra.runtime.episode import Episode
from libra.runtime.rollout_queues import Queues
from libra.runtime.rollout_state import Instance, Migration, RolloutResult
from libra.scheduling.base import RolloutScheduler, TrajectoryObservation

__all__ = ["Instance", "Migration", "Rollout", "RolloutResult"]


class Rollout:
    """Runs one step's episodes to completion (see the module docstring).

    One object per step: ``run`` sets the step's state as fields (the episodes, each
    trajectory's routing bucket, the tool calls and prefills in flight, the result being
    filled) and handles each finished Ray call with the method for its kind."""

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

    def _obs(self, ep: Episode, where: int | None, bucket: int | None) -> TrajectoryObservation:
        """What a real system knows now (``Episode.observation``: a pending call means routing
        at its start, in the simulator's semantics)."""
        return ep.observation(self.index[ep.traj_id], where, bucket, self._now() - self.admitted[ep.traj_id])

    # ---- the stage ---------------------------------------------------------------------------
    def run(self, episodes: list[Episode]) -> RolloutResult:
        self._begin(episodes)
        self._dispatch()
        while self.unfinished > 0:
            self._inject_faults()
            pending = [i.inflight[0] for i in self.inst.values() if i.inflight] + list(self.calls) + list(self.prefills)
            if not pending:
                self._dispatch()
                continue
            if self.training is not None:
                pending += self.training.refs()
            ready, _ = ray.wait(pending, num_returns=1, timeout=0.05 if self.faults else None)
            for ref in ready:
                self._on_ready(ref)
            self._dispatch()
            self._consult_pool()
            self._dispatch()
        self._drain_prefills()
        self.res.faults_unfired = list(self.faults)  # reported, not dropped: the run did not test what was asked
        self.res.makespan_s = self._now()
        for inst in self.inst.values():
            inst.lent = False
        return self.res

    def _begin(self, episodes: list[Episode]) -> None:
        """The step's state, training started (streaming), every trajectory admitted and placed."""
        self.t0 = time.perf_counter()
        self.eps = {e.traj_id: e for e in episodes}
        self.index = {e.traj_id: i for i, e in enumerate(episodes)}
        self.admitted = {e.traj_id: 0.0 for e in episodes}
        self.q = Queues(self.inst, self.sched, self.eps, self.max_batch, self._now)
        self.bucket_of: dict[str, int] = {}  # routing bucket (the scheduler's), whichever instance runs it
        self.res = RolloutResult(episodes, 0.0)
        self.members: dict[str, list[Episode]] = {}
        for e in episodes:
            self.members.setdefault(e.group, []).append(e)
        self.left_in_group = {g: len(m) for g, m in self.members.items()}
        if self.training is not None:
            self.training.start(self._now)
        for e in episodes:
            o = self._obs(e, None, None)
            b = self.sched.admit(o)
            self.res.admitted_by_bucket[b] = self.res.admitted_by_bucket.get(b, 0) + 1
            i = self.q.place(b, o)
            self.bucket_of[e.traj_id] = b
            self.q.enqueue(e.traj_id, i)
        self.calls: dict[Any, str] = {}  # tool call ref -> trajectory
        self.prefills: dict[Any, tuple[str, int, int]] = {}  # migration prefill ref -> (trajectory, src, dst)
        self.unfinished = len(episodes)

    def _dispatch(self) -> None:
        self.res.pulled += self.q.dispatch()

    def _on_ready(self, ref: Any) -> None:
        """One finished Ray call: a mini-batch or join, a tool call, a migration's prefill, or a
        ``generate`` batch."""
        train = self.training
        if train is not None and train.owns(ref):
            train.on_ready(ref)  # a mini-batch or a join finished; the next may start
        elif ref in self.calls:
            self._on_tool_result(ref)
        elif ref in self.prefills:
            self._on_prefill(ref)
        else:
            self._on_generation(ref)

    # ---- events ------------------------------------------------------------------------------
    def _finish(self, ep: Episode) -> None:
        self.unfinished -= 1
        self.res.finish_s[ep.traj_id] = self._now()
        where = self.q.where
        self.sched.on_finish(self._obs(ep, where.get(ep.traj_id), self.bucket_of.get(ep.traj_id)))
        inst = self.inst[where[ep.traj_id]]
        inst.resident.discard(ep.traj_id)
        if inst.alive and not inst.lent:
            inst.handle.drop.remote([ep.traj_id])
        self.left_in_group[ep.group] -= 1
        if self.training is not None and self.left_in_group[ep.group] == 0:
            self.training.on_group_done(self.members[ep.group])

    def _requeue_from(self, inst: Instance) -> None:
        lost = list(inst.queue) + (inst.inflight[1] if inst.inflight else [])
        inst.queue.clear()
        inst.inflight = None
        inst.resident.clear()
        for t in lost:
            j = self.q.place(self.bucket_of[t], self._obs(self.eps[t], None, self.bucket_of[t]))
            self.q.enqueue(t, j)
            self.res.recovered += 1

    def _kill(self, inst: Instance) -> None:
        inst.alive = False
        self.res.dead_instances.append(inst.id)
        alone = not any(i.alive and not i.lent for i in self.inst.values())
        if alone and self.respawn is not None:
            # the only instance (a 1-device rollout side): its work has nowhere else to go, so the
            # replacement comes first and takes it (its KV is gone: the contexts are recomputed)
            inst.handle = self.respawn(inst)
            inst.alive = True
            self._requeue_from(inst)
            return
        self._requeue_from(inst)
        if self.respawn is not None:  # a fresh worker takes its place (weights from the driver)
            inst.handle = self.respawn(inst)
            inst.alive = True

    def _inject_faults(self) -> None:
        """Fault injection: once its time has come, kill the victim while it is generating
        (ray.kill is a SIGKILL of the worker process: its in-flight call fails at once)."""
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
            self._kill(inst)

    def _on_tool_result(self, ref: Any) -> None:
        t = self.calls.pop(ref)
        ep = self.eps[t]
        tr = ray.get(ref)
        text = ep.tool_text(tr)
        ep.on_tool_result(tr, self.encode(text), text)
        res = self.res
        res.tool_calls += 1
        res.tool_errors += tr.outcome == "error"
        res.tool_timeouts += tr.outcome == "timeout"
        if ep.done:
            self._finish(ep)
            return
        # routed when the call started; continue there (or, if that instance died or
        # was lent meanwhile, on another of the bucket: it recomputes the context)
        where = self.q.where
        self._route_return(ep)
        dst = where[t]
        d = self.inst[dst]
        if not d.alive or d.lent or self.q.is_full(d):
            # gone, or full: placed again (it stays unless another instance has room)
            o = self._obs(ep, dst if d.alive and not d.lent else None, self.bucket_of[t])
            dst = self.q.place(self.bucket_of[t], o)
            if dst != where[t] and d.alive and not d.lent and t in d.resident:
                d.resident.discard(t)
                d.handle.drop.remote([t])
        self.q.enqueue(t, dst)

    def _record_migration(self, t: str, src: int, dst: int, tokens: int, secs: float, same_node: bool) -> None:
        ti, to = self.inst[src].tp, self.inst[dst].tp
        kv = float(self.ev.kv_migration_s(tokens, ti, to, same_node)) if self.ev else float("nan")
        pf = float(self.ev.prefill_s(to, tokens)) if self.ev else float("nan")
        self.res.migrations.append(Migration(t, src, dst, int(tokens), float(secs), kv, pf))

    def _on_prefill(self, ref: Any) -> None:
        t, src, dst = self.prefills.pop(ref)
        try:
            tokens, secs = ray.get(ref)
        except ray.exceptions.RayActorError:
            return  # the destination died; the trajectory was re-queued with its queue
        self._record_migration(t, src, dst, tokens, secs, self.inst[src].node == self.inst[dst].node)

    def _on_generation(self, ref: Any) -> None:
        inst = next(i for i in self.inst.values() if i.inflight and i.inflight[0] == ref)
        _, batch, started = inst.inflight  # type: ignore[misc]
        try:
            outs = ray.get(ref)
        except ray.exceptions.RayActorError:
            self._kill(inst)
            return
        inst.inflight = None
        # the call's wall time on the engine (per-request prefill/decode times of a
        # batched call overlap, so their sum would count the batch's decode B times)
        busy = float(outs[0].extra.get("call_s", 0.0)) if outs else 0.0
        res = self.res
        for r in outs:
            ep = self.eps[r.traj_id]
            res.gen_tokens += len(r.tokens)
            res.prefill_tokens += r.prefill_tokens
            res.cached_tokens += r.cached_tokens
            inst.resident.add(r.traj_id)
            call = ep.on_generation(r, self.decode)
            if call is None:
                self._finish(ep)
                continue
            self.calls[self.tools.call.remote(call.name, call.args)] = r.traj_id
            if ep.call_ends_trajectory:
                continue  # the tool-limit call: the trajectory ends when it returns, nothing to route
            self._route_call(inst, ep)
        res.engine_busy_s[inst.id] = res.engine_busy_s.get(inst.id, 0.0) + busy

    def _route_call(self, inst: Instance, ep: Episode) -> None:
        """Route as the call starts, so a move's context recomputation on the destination
        overlaps the tool call (as the simulator's KV migration does)."""
        t = ep.traj_id
        where = self.q.where
        src = where[t]
        route = self.sched.on_tool_return(self._obs(ep, src, self.bucket_of[t]))
        res = self.res
        res.routed += 1
        moved_bucket = route.bucket != self.bucket_of[t]
        res.rerouted += moved_bucket
        self.bucket_of[t] = route.bucket
        # promoted, a guest on a longer bucket's instance, or a router that rebalances within the
        # bucket (``libra.scheduling.rebalance``: it names another instance of it, or this one)
        if route.bucket != inst.bucket or getattr(self.sched, "rebalances", False):
            dst = self.q.place(route.bucket, self._obs(ep, src, self.bucket_of[t]))
            if dst != src:
                inst.resident.discard(t)
                inst.handle.drop.remote([t])
                if route.migrate or not moved_bucket:
                    self.prefills[self.inst[dst].handle.prefill.remote(t, tuple(ep.context))] = (t, src, dst)
                else:
                    res.moves_without_kv += 1
                where[t] = dst

    def _route_return(self, ep: Episode) -> None:
        """Route again as the call returns (issue 22), as the simulator does: the call's outcome
        and output are known now, so a trajectory the output pushed past its bucket's bound, or
        whose error says it runs long, moves now instead of one turn later. A move leaves the
        instance holding its KV only for a longer bucket's; the destination recomputes the
        context when the trajectory is admitted there (nothing overlaps it now)."""
        t = ep.traj_id
        where = self.q.where
        src = where[t]
        s = self.inst[src]
        route = self.sched.on_tool_return(self._obs(ep, src if s.alive and not s.lent else None, self.bucket_of[t]))
        res = self.res
        res.routed += 1
        if route.bucket == self.bucket_of[t]:
            return
        res.rerouted += 1
        self.bucket_of[t] = route.bucket
        if s.alive and not s.lent and s.bucket < route.bucket:
            dst = self.q.place(route.bucket, self._obs(ep, src, route.bucket))
            if dst != src:
                if t in s.resident:
                    s.resident.discard(t)
                    s.handle.drop.remote([t])
                res.moves_without_kv += 1
                where[t] = dst

    def _drain_prefills(self) -> None:
        """A migration's prefill can still be running when the last trajectory ends elsewhere."""
        for ref, (t, src, dst) in list(self.prefills.items()):
            try:
                tokens, secs = ray.get(ref)
                self._record_migration(t, src, dst, tokens, secs, True)
            except ray.exceptions.RayActorError:
                pass

    # ---- the elastic pool --------------------------------------------------------------------
    def _consult_pool(self) -> None:
        if self.pool is None:
            return
        train, res = self.training, self.res
        states = tuple(InstanceState(i.id, i.tp, i.node, len(i.inflight[1]) if i.inflight else 0, len(i.queue), i.idle_since)
                       for i in self.inst.values() if i.alive and not i.lent)
        waiting = len(self.calls) + sum(len(i.queue) for i in self.inst.values())
        # without streaming the loop trains only after this stage returns: never running now
        training_running = bool(train is not None and train.running)
        obs = PoolObservation(self._now(), 0.0, states, self.unfinished, waiting, training_running, self.plan.n_train_gpus)
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
