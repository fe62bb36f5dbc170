"""One rollout instance: vLLM-style continuous batching, advanced in closed form.

Why closed form: a step of an agentic workload generates millions of tokens; an event per token
would make a replay take hours. Between two changes of the batch's membership (a sequence ends
its turn, one is admitted, KV runs out, an external arrival interrupts) every decode iteration
has the same batch size ``B``, and its cost is affine in the total context
(``base(B) + slope(B) * context``), with the context growing by ``B`` tokens per iteration. So
``N`` iterations from a start context ``C0`` cost exactly::

    P + N * base + slope * (N * C0 + B * N * (N - 1) / 2)

where ``P`` is the prefill of the sequences admitted at the start of the interval (chunked
prefill: it rides on the first iteration). One SimPy event per interval; an arrival in the
middle of a long interval truncates it at the next iteration boundary (solving the quadratic for
the iterations already done), exactly where vLLM would pick the newcomer up.

Per-sequence state is kept relative to the instance's iteration counter ``it``: a running
sequence stores the iteration it joined at, its context then, and the iteration its turn ends
at. The batch's total context is then ``S + B * it`` for a running sum ``S``, and the next turn
end is the top of a heap, so an interval costs O(log B) scalar work regardless of batch size.
(A NumPy array per instance was slower at the batch sizes that occur, tens to hundreds, because
every interval touches only a handful of sequences.)

KV accounting (tokens, per instance): running sequences hold their context; sequences in a tool
call may keep theirs as *cached* KV (vLLM's prefix cache: evictable, least recently used first,
before any running sequence is preempted); KV reserved for an incoming migration is *pinned*.
When a decode iteration cannot grow every running sequence by one token, the newest running
sequence is preempted (vLLM's recompute preemption): its KV is freed and it is re-queued at the
front, re-prefilling its whole context later.

Step priority (``step_rank``; engines shared by consecutive steps whose router asks for it,
``sim.engines``/``sim.rollout``): the queue is kept in step order (the oldest step's entries
first, arrival order within a step), a turn of a newer step than one holding KV here (running or
cached) is admitted only into free KV (it evicts nothing and waits), and cached KV is evicted
newest step first (least recently used within a step). Why: where the steps' parked KV does not
fit the engines together, admissions evicted it LRU, every return re-prefilled its whole context,
and two steps sharing three TP-4 engines ran 1,516 s and 1,498 s (31.7M and 32.3M prefill tokens)
where either alone runs 513 s (4.3M); with the rule they ran 781 s and 743 s (5.8M and 8.5M;
MCPMark on 28 B200 / Llama-3.1-70B at 12:16, K = 1, SIMULATED). It is what a router does that
holds a newer step's turn back while the instance's resident contexts leave it no room, with
vLLM's priority scheduling (``scheduling_policy="priority"``, the step as the priority).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from libra.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import simpy

    from sim.costs import SimCosts
    from sim.noise import Noise


class SimulationError(UserError):
    """The replay cannot continue as configured (e.g. a sequence longer than any KV cache)."""


class InvariantViolation(AssertionError):
    """The simulator broke one of its own invariants (a bug, never a user mistake)."""


@dataclass(slots=True)
class QueueEntry:
    """A sequence waiting for a seat. ``context`` is the KV it needs once admitted (everything
    so far, including the returned tool tokens); whatever of it is still cached on this instance
    is not prefilled again, the rest is."""

    traj: int
    context: int
    remaining: int  # tokens left to generate in the current turn
    enqueued_s: float


@dataclass(slots=True)
class Share:
    """What an instance did for one owner (a step's rollout) when several steps' rollouts share
    it (async continuous generation, ``sim.engines``): each step's metrics count its own
    sequences. Tokens, prefill, preemptions, evictions and queue waits belong to the sequence's
    owner; an interval's busy time is split by the owners' shares of its batch."""

    running: int = 0
    gen_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    evictions: int = 0
    queue_wait_s: float = 0.0
    intervals: int = 0
    busy_s: float = 0.0


class Instance:
    """A rollout engine of ``tp`` GPUs (see the module docstring for the model)."""

    def __init__(
        self,
        env: simpy.Environment,
        iid: int,
        tp: int,
        bucket: int,
        gpus: tuple[int, ...],
        node: int,
        costs: SimCosts,
        noise: Noise,
        on_turn_end: Callable[[Instance, int, int, float], None],
        on_idle: Callable[[Instance], None],
        on_room: Callable[[Instance], bool] | None = None,
        on_start: Callable[[Instance], None] | None = None,
        waiting: list[int] | None = None,
        owner_of: Callable[[int], object] | None = None,
        on_admit: Callable[[int], None] | None = None,
        step_rank: Callable[[int], int] | None = None,
    ) -> None:
        self.env = env
        self.id = iid
        self.tp = tp
        self.bucket = bucket
        self.gpus = gpus
        self.node = node
        self.costs = costs
        self.noise = noise
        self.capacity = costs.kv_capacity(tp)
        self.max_seqs = costs.max_seqs(tp)
        self._on_turn_end = on_turn_end
        self._on_idle = on_idle
        # work conservation (sim.rollout): asked when a batch boundary leaves free slots and no
        # queue (True: it queued work pulled from elsewhere), and when the GPUs become free
        self._on_room = on_room
        self._on_start = on_start
        # sequence state
        self.it = 0
        self.running: dict[int, tuple[int, int, int]] = {}  # traj -> (join_it, ctx_at_join, end_it)
        self._heap: list[tuple[int, int]] = []  # (end_it, traj), lazily cleaned
        self._S = 0  # sum(ctx_at_join - join_it) over running
        self.queue: deque[QueueEntry] = deque()
        self.queued_tokens = 0  # sum of the queued entries' contexts
        # queued entries over all instances sharing this counter (a step's stage): lets the stage
        # skip asking for queued work in O(1) when no queue exists anywhere
        self._waiting = waiting if waiting is not None else [0]
        self.held: OrderedDict[int, int] = OrderedDict()  # traj -> cached KV tokens (LRU first)
        self.pinned: dict[int, int] = {}  # traj -> KV reserved for an incoming migration
        self.H = 0  # held + pinned tokens
        self._pending_prefill: dict[int, tuple[int, int]] = {}  # traj -> (new, cached), unpaid
        # interval state
        self.busy = False
        self.alive = True
        self.started = True  # False while its GPUs are still held elsewhere
        self.ready_at: float | None = None  # not started: the predicted start (sim time); None unknown
        self._version = 0
        self._kicked = False
        self._t0 = 0.0
        self._N = 0
        self._B = 0
        self._C0 = 0
        self._P = 0.0
        self._base = 0.0
        self._slope = 0.0
        self._f = 1.0
        self._truncated = False
        self.idle_since: float | None = env.now
        # metrics
        self.busy_s = 0.0
        self.intervals = 0
        self.preemptions = 0
        self.evictions = 0
        self.gen_tokens = 0
        self.prefill_tokens = 0
        self.queue_wait_s = 0.0
        self.peak_kv = 0
        self.trace: list[tuple[float, float, int]] | None = None  # (start, end, batch) if recorded
        # shared by several steps' rollouts (``sim.engines``): per-owner metrics and first seats
        self._owner_of = owner_of
        self._on_admit = on_admit
        #: step priority (see the module docstring): a sequence's step rank, smaller = older; None: FIFO and LRU
        self._rank = step_rank
        self.shares: dict[object, Share] = {}

    def share(self, owner: object) -> Share:
        """The metrics of ``owner``'s sequences on this instance (shared instances only)."""
        sh = self.shares.get(owner)
        if sh is None:
            sh = self.shares[owner] = Share()
        return sh

    # ---------------------------------------------------------------- observation helpers
    @property
    def n_running(self) -> int:
        return len(self.running)

    @property
    def kv_used(self) -> int:
        """KV tokens in use now (running contexts at the last iteration boundary + held)."""
        return self._S + len(self.running) * self.it + self.H

    def context_of(self, traj: int) -> int:
        """Current context of a running sequence (at the last iteration boundary)."""
        j, c, _ = self.running[traj]
        return c + self.it - j

    @property
    def empty(self) -> bool:
        """Nothing running or queued (cached KV of sequences in tool calls may remain)."""
        return not self.running and not self.queue

    # ---------------------------------------------------------------- arrivals
    def enqueue(self, entry: QueueEntry, front: bool = False) -> None:
        """Queue a sequence; an idle instance starts at once (after same-instant arrivals), a
        busy one picks it up at its next iteration boundary."""
        if not self.alive:
            raise InvariantViolation(f"enqueue on dead instance {self.id}")
        self._insert(entry, front)
        self.queued_tokens += entry.context
        self._waiting[0] += 1
        if not self.started:
            return
        if self.busy:
            self._truncate()
        elif not self._kicked:
            self._kicked = True
            ev = self.env.timeout(0.0)
            ev.callbacks.append(self._kick)

    def _insert(self, entry: QueueEntry, front: bool) -> None:
        """Put ``entry`` in the queue: at its end (``front``: its start), and under step priority
        within its step's entries, which stay in step order (oldest step first)."""
        q = self.queue
        rank = self._rank
        if rank is None or not q:
            if front:
                q.appendleft(entry)
            else:
                q.append(entry)
            return
        r = rank(entry.traj)
        if front:  # before the first entry of its step or a newer one
            k = 0
            while k < len(q) and rank(q[k].traj) < r:
                k += 1
        else:  # after the last entry of its step or an older one
            k = len(q)
            while k > 0 and rank(q[k - 1].traj) > r:
                k -= 1
        q.insert(k, entry)

    def start(self) -> None:
        """The instance's GPUs became free: begin serving what queued meanwhile."""
        self.started = True
        if self._on_start is not None:
            self._on_start(self)
        self._maybe_kick()

    def take_queued(self, count: int, max_context: int | None = None) -> list[QueueEntry]:
        """Remove up to ``count`` queued entries (those with no KV cached here first, then oldest
        first; only those with a context below ``max_context`` when set) for another instance to
        run; their cached KV here is dropped."""
        fits = [e for e in self.queue if max_context is None or e.context < max_context]
        # entries with nothing cached here first (moving them costs no recomputation)
        out = sorted(fits, key=lambda e: e.traj in self.held)[:count]
        taken = {id(e) for e in out}
        self.queue = deque(e for e in self.queue if id(e) not in taken)
        self._waiting[0] -= len(out)
        for e in out:
            self.queued_tokens -= e.context
            tokens = self.held.pop(e.traj, 0)
            self.H -= tokens
        return out

    def _kick(self, _ev: object) -> None:
        self._kicked = False
        if self.alive and not self.busy:
            self._start_interval()

    # ---------------------------------------------------------------- KV of sequences in tool calls
    def hold(self, traj: int, tokens: int) -> None:
        """Keep ``tokens`` of KV cached for a sequence in a tool call (evictable)."""
        self.held[traj] = tokens
        self.H += tokens

    def try_pin(self, traj: int, tokens: int) -> bool:
        """Reserve KV for a sequence migrating here (not evictable until the transfer ends), if
        it fits next to what the running batch will hold at the end of its current interval
        (evicting cached KV first). False: no room, the migration cannot land here."""
        running_end = self._S + len(self.running) * self.it
        if self.busy:
            running_end = self._C0 + self._B * self._N
        need = running_end + self.H + tokens - self.capacity
        if need > 0:
            self._evict(need)
            need = running_end + self.H + tokens - self.capacity
            if need > 0:
                return False
        self.pinned[traj] = tokens
        self.H += tokens
        self._note_kv()
        return True

    def unpin_to_held(self, traj: int) -> None:
        """A migration finished: the reserved KV becomes ordinary cached KV."""
        tokens = self.pinned.pop(traj)
        self.held[traj] = tokens
        self._maybe_kick()

    def release(self, traj: int) -> int:
        """Drop whatever KV is held or pinned for ``traj``; returns the tokens freed."""
        tokens = self.held.pop(traj, None)
        if tokens is None:
            tokens = self.pinned.pop(traj, 0)
        self.H -= tokens
        if tokens:
            self._maybe_kick()
        return tokens

    def _maybe_kick(self) -> None:
        """KV was freed while idle with sequences waiting for room: try admitting again."""
        if self.queue and self.started and self.alive and not self.busy and not self._kicked:
            self._kicked = True
            ev = self.env.timeout(0.0)
            ev.callbacks.append(self._kick)

    def cached_for(self, traj: int) -> int:
        """KV tokens still cached here for ``traj`` (0 if evicted or never held)."""
        return self.held.get(traj, 0)

    def _evict(self, need: int) -> bool:
        """Evict cached KV (LRU first) until ``need`` tokens are free; True if anything went."""
        return self._evict_except(-1, need)

    # ---------------------------------------------------------------- scheduling
    def _admit(self) -> None:
        running = self.running
        q = self.queue
        cap = self.capacity
        while q and len(running) < self.max_seqs:
            e = q[0]
            cached = min(self.held.get(e.traj, 0), e.context)
            used = self._S + len(running) * self.it + self.H - cached
            need = e.context + 1  # its whole context plus room for one decode token
            if used + need > cap:
                if not self._older_here(e.traj):  # step priority: a newer step's turn evicts nothing
                    self._evict_except(e.traj, used + need - cap)
                used = self._S + len(running) * self.it + self.H - cached
                if used + need > cap:
                    if not running and not self.pinned and not (self.held.keys() - {e.traj}):
                        raise SimulationError(
                            f"trajectory row {e.traj} needs {need} KV tokens but a TP={self.tp} instance holds "
                            f"{cap}; give rollout a larger TP (e.g. --rollout-tp {min(self.tp * 2, 8)}) or a "
                            "larger-memory GPU"
                        )
                    break
            q.popleft()
            self.queued_tokens -= e.context
            self._waiting[0] -= 1
            if e.traj in self.held:
                self.H -= self.held.pop(e.traj)
            new = e.context - cached
            end = self.it + e.remaining
            running[e.traj] = (self.it, e.context, end)
            self._S += e.context - self.it
            heapq.heappush(self._heap, (end, e.traj))
            if new:
                self._pending_prefill[e.traj] = (new, cached)
            self.prefill_tokens += new
            self.queue_wait_s += self.env.now - e.enqueued_s
            if self._owner_of is not None:
                sh = self.share(self._owner_of(e.traj))
                sh.running += 1
                sh.prefill_tokens += new
                sh.queue_wait_s += self.env.now - e.enqueued_s
                if self._on_admit is not None:
                    self._on_admit(e.traj)

    def _older_here(self, traj: int) -> bool:
        """Step priority: whether a sequence of an older step than ``traj``'s holds KV here
        (running or cached); False without step priority."""
        rank = self._rank
        if rank is None:
            return False
        r = rank(traj)
        return any(rank(t) < r for t in self.running) or any(rank(t) < r for t in self.held)

    def _evict_except(self, keep: int, need: int) -> bool:
        """Evict cached KV of sequences other than ``keep``, least recently used first (under
        step priority the newest step's first); True if any went."""
        freed = False
        order = list(self.held)
        if self._rank is not None:
            rank = self._rank
            order.sort(key=lambda t: -rank(t))  # stable: LRU within a step
        for traj in order:
            if need <= 0:
                break
            if traj == keep:
                continue
            tokens = self.held.pop(traj)
            self.H -= tokens
            need -= tokens
            self.evictions += 1
            if self._owner_of is not None:
                self.share(self._owner_of(traj)).evictions += 1
            freed = True
        return freed

    def _min_end(self) -> int:
        heap = self._heap
        running = self.running
        while heap:
            end, traj = heap[0]
            r = running.get(traj)
            if r is not None and r[2] == end:
                return end
            heapq.heappop(heap)
        raise InvariantViolation("heap empty while sequences run")

    def _preempt_newest(self) -> None:
        traj, (j, c, end) = self.running.popitem()  # dicts keep admission order: newest last
        self._S -= c - j
        ctx = c + self.it - j
        self._pending_prefill.pop(traj, None)  # admitted this instant: its prefill never ran
        self.preemptions += 1
        if self._owner_of is not None:
            sh = self.share(self._owner_of(traj))
            sh.running -= 1
            sh.preemptions += 1
        self._insert(QueueEntry(traj, ctx, end - self.it, self.env.now), True)
        self.queued_tokens += ctx
        self._waiting[0] += 1

    def _start_interval(self) -> None:
        now = self.env.now
        self._admit()
        if self._on_room is not None and not self.queue and len(self.running) < self.max_seqs and self._on_room(self):
            self._admit()
        while True:
            B = len(self.running)
            if B == 0:
                if self._pending_prefill:
                    raise InvariantViolation("prefill pending with an empty batch")
                self.busy = False
                if self.idle_since is None:
                    self.idle_since = now
                self._on_idle(self)
                return
            C0 = self._S + B * self.it
            rmin = self._min_end() - self.it
            free = self.capacity - self.H - C0
            if rmin > 0 and free < B:
                if self._evict(B - free):
                    continue
                if B == 1 and not self.pinned:
                    raise SimulationError(
                        f"a sequence outgrew the KV cache of a TP={self.tp} instance ({self.capacity} tokens); "
                        "use a larger rollout TP"
                    )
                # preempt the newest (with B == 1 only pinned reservations stand in the way: it
                # steps aside until the migration ends and that KV becomes evictable cache)
                self._preempt_newest()
                continue
            break
        self.idle_since = None
        nkv = free // B if rmin > 0 else 0
        N = min(rmin, nkv) if rmin > 0 else 0
        P = 0.0
        if self._pending_prefill:
            P = self.costs.prefill_batch_s(self.tp, list(self._pending_prefill.values()))
            self._pending_prefill = {}
        base, slope = self.costs.decode_coeffs(self.tp, B)
        f = self.noise.factor()
        self._t0 = now
        self._N = N
        self._B = B
        self._C0 = C0
        self._P = P
        self._base = base
        self._slope = slope
        self._f = f
        self._truncated = False
        self.busy = True
        self.intervals += 1
        kv = C0 + self.H + B * N
        if kv > self.peak_kv:
            self.peak_kv = kv
            if kv > self.capacity:
                raise InvariantViolation(f"instance {self.id}: KV {kv} > capacity {self.capacity}")
        self._schedule(self._cost(N))

    def _cost(self, n: int) -> float:
        """Wall time of the first ``n`` iterations of the current interval (noise included)."""
        return self._f * (self._P + n * self._base + self._slope * (n * self._C0 + self._B * n * (n - 1) / 2))

    def _schedule(self, dur: float) -> None:
        self._version += 1
        ev = self.env.timeout(dur if dur > 0.0 else 0.0, self._version)
        ev.callbacks.append(self._on_timer)

    def _on_timer(self, ev: simpy.Event) -> None:
        self._end_interval(ev.value)  # the value is the interval's version

    def iterations_done_by(self, elapsed: float) -> int:
        """Iterations of the current interval complete ``elapsed`` seconds after it started
        (the largest n with cost(n) <= elapsed), by the quadratic formula plus an exact fix-up."""
        y = elapsed / self._f - self._P
        if y < 0:
            return 0
        a = self._slope * self._B / 2.0
        b = self._base + self._slope * (self._C0 - self._B / 2.0)
        if a > 0:
            n = int((-b + math.sqrt(b * b + 4 * a * y)) / (2 * a))
        elif b > 0:
            n = int(y / b)
        else:
            n = self._N
        n = max(0, min(n, self._N))

        def g(k: int) -> float:
            return k * self._base + self._slope * (k * self._C0 + self._B * k * (k - 1) / 2)

        while n > 0 and g(n) > y:
            n -= 1
        while n < self._N and g(n + 1) <= y:
            n += 1
        return n

    def _truncate(self) -> None:
        """An arrival while busy: end the interval at the next iteration boundary."""
        if self._truncated:
            return
        self._truncated = True
        done = self.iterations_done_by(self.env.now - self._t0)
        target = min(done + 1, self._N)
        if target < self._N:
            self._N = target
            end = self._t0 + self._cost(target)
            self._schedule(max(end - self.env.now, 0.0))

    def _end_interval(self, version: int) -> None:
        if version != self._version or not self.alive or not self.busy:
            return
        now = self.env.now
        N = self._N
        self.busy_s += now - self._t0
        if self.trace is not None:
            self.trace.append((self._t0, now, self._B))
        self.gen_tokens += self._B * N
        if self._owner_of is not None:
            self._split(N, now - self._t0)
        self.it += N
        it = self.it
        heap = self._heap
        running = self.running
        done: list[tuple[int, int]] = []
        while heap and heap[0][0] <= it:
            end, traj = heapq.heappop(heap)
            r = running.get(traj)
            if r is None or r[2] != end:
                continue
            j, c, _ = r
            del running[traj]
            self._S -= c - j
            if self._owner_of is not None:
                self.share(self._owner_of(traj)).running -= 1
            done.append((traj, c + end - j))
        self.busy = False
        for traj, ctx in done:
            self._on_turn_end(self, traj, ctx, now)
        if self.alive and not self.busy:
            self._start_interval()

    def _split(self, n: int, dur: float) -> None:
        """Shared instance: the interval's ``n`` iterations and ``dur`` seconds, by owner."""
        B = self._B
        for sh in self.shares.values():
            if sh.running > 0:
                sh.gen_tokens += sh.running * n
                sh.busy_s += dur * sh.running / B
                sh.intervals += 1

    def _note_kv(self) -> None:
        kv = self.kv_used
        if kv > self.peak_kv:
            self.peak_kv = kv

    # ---------------------------------------------------------------- faults and role changes
    def evacuate(self) -> list[QueueEntry]:
        """Stop now (a GPU failed, or the pool takes the GPUs): every running and queued
        sequence comes back as a queue entry to re-prefill elsewhere; cached KV is dropped.
        Tokens generated in the current interval up to now are kept (iterations completed)."""
        now = self.env.now
        if self.busy:
            done = self.iterations_done_by(now - self._t0)
            self.busy_s += now - self._t0
            self.gen_tokens += self._B * done
            if self._owner_of is not None:
                self._split(done, now - self._t0)
            self.it += done
        out: list[QueueEntry] = []
        for traj, (j, c, end) in self.running.items():
            ctx = c + self.it - j
            out.append(QueueEntry(traj, ctx, end - self.it, now))
        for e in self.queue:
            out.append(QueueEntry(e.traj, e.context, e.remaining, now))
        self.running.clear()
        for sh in self.shares.values():
            sh.running = 0
        self._heap.clear()
        self._S = 0
        self._waiting[0] -= len(self.queue)
        self.queue.clear()
        self.queued_tokens = 0
        self.held.clear()
        self.pinned.clear()
        self.H = 0
        self._pending_prefill = {}
        self.busy = False
        self.alive = False
        self._version += 1
        return out
