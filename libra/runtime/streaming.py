"""Streaming training inside the rollout stage: mini-batches of completed GRPO groups train while
the rollout's tail still runs, and instances the elastic pool lends join as gradient helpers.

Why: ``libra-run``'s loop used to train only after the whole rollout; the rollout's long tail
then left the trainer idle and the elastic pool (which lends an idle instance only while
training runs) never lent. This is the simulator's "sync + streaming" (``sim.training.Feed``)
done for real:

* ``MiniBatchCutter``: mini-batch ``k`` (of ``mini_batches``) is cut once the first
  ``ceil((k+1)*N/M)`` trajectories have finished in whole groups, in completion order (the
  Feed's thresholds); the last one takes what remains when the rollout ends. With DeepSpeed
  every rank must get at least one sample of every mini-batch, so a cut needs ``world`` samples
  on each side of it (fewer, smaller-than-world mini-batches are merged).
* ``StreamingTrainer``: one mini-batch in flight at a time (each needs the previous optimizer
  step); the rollout loop waits on its refs next to the engines' and the tools' (``refs``/
  ``on_ready``), so the pool sees ``training_running`` while a mini-batch runs. On-policy: the
  engines keep the step's weights until the sync after the last mini-batch, and every
  mini-batch's old log-probs come from the trainer's frozen step-start copy (``begin_step``).
* Lending (torch trainer backend): ``lend`` starts a non-blocking join on the lent engine actor
  (``EngineActor.join_training`` builds a trainable copy, ``helper_load`` loads the trainer's
  weights as of the mini-batches launched so far); a helper takes part in a mini-batch only if
  its join had finished when that mini-batch was launched: the trainer never waits for a join.
  A helper that dies is dropped; the trainer recomputes its sub-shard (``Learner``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from libra.runtime.grpo import Sample, gen_tokens


class MiniBatchCutter:
    """Where a streamed step's mini-batches begin and end (see the module docstring). Pure."""

    def __init__(self, n_traj: int, mini_batches: int, world: int = 1) -> None:
        self.n = max(1, n_traj)
        self.world = max(1, world)
        self.m = max(1, min(mini_batches, self.n // self.world))
        self.thresholds = [-(-(k + 1) * self.n // self.m) for k in range(self.m)]
        self.pending: list[Sample] = []
        self.done = 0
        self.cut = 0

    def add(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """A group finished: its samples; returns the mini-batches this completes (0 or 1)."""
        self.done += len(samples)
        self.pending.extend(samples)
        out: list[list[Sample]] = []
        # the last mini-batch is the remainder (close); earlier ones are cut at thresholds
        if (self.cut < self.m - 1 and self.done >= self.thresholds[self.cut] and len(self.pending) >= self.world
                and self.n - self.done >= self.world):
            out.append(self.pending)
            self.pending = []
            self.cut += 1
        return out

    def close(self) -> list[list[Sample]]:
        """The rollout ended: the remaining samples as the remaining mini-batches (contiguous,
        near-equal, each at least ``world`` samples)."""
        rest, self.pending = self.pending, []
        if not rest:
            return []
        q = max(1, min(self.m - self.cut, len(rest) // self.world))
        bounds = [round(i * len(rest) / q) for i in range(q + 1)]
        self.cut += q
        return [rest[bounds[i]:bounds[i + 1]] for i in range(q)]


@dataclass
class Helper:
    """A lent instance joining (or in) training."""

    instance: int
    handle: Any
    lent_s: float
    join_ref: Any  # the helper_load call: ready = joined
    version: int  # trainer optimizer steps this step reflected in the helper's weights
    ready: bool = False
    dead: bool = False
    join_s: float = math.nan
    samples: int = 0


@dataclass
class StreamResult:
    """What the streamed training of one step did (seconds on the driver's step clock)."""

    stats: dict[str, float]
    train_s: float  # the training stage's busy time (begin_step + every mini-batch)
    overlap_s: float  # of it, while the rollout was still running
    logprob_s: float
    batches: list[list[Sample]]
    failed: bool = False  # a trainer worker died: the step's update must be redone
    lent: int = 0
    helper_samples: int = 0  # samples whose gradient a helper computed
    recomputed: int = 0  # samples of dead helpers the trainer recomputed
    join_s: float = math.nan  # mean background join time of the helpers that joined
    dead_helpers: list[int] = field(default_factory=list)


@dataclass
class _InFlight:
    k: int
    refs: list[Any]
    shards: list[Any]
    helpers: list[Helper]
    launched_s: float


class StreamingTrainer:
    """Trains one step's mini-batches as the rollout produces them (see the module docstring).

    ``to_samples`` turns a finished group's episodes into training samples (advantages within
    the group); ``helper_opts`` (``GradHelper`` arguments) enables lending, None disables it
    (``no_lend_reason`` says why); ``behaviour`` is the step-start weights (an ObjectRef of a
    state dict; None: the model folder's, i.e. the trainer never stepped); ``die_first`` makes
    the last trainer rank exit after its first optimizer step (fault injection).
    """

    def __init__(self, trainers: Sequence[Any], n_traj: int, mini_batches: int, to_samples: Callable[[list[Any]], list[Sample]],
                 clock: Callable[[], float] | None = None, helper_opts: dict[str, Any] | None = None, no_lend_reason: str = "",
                 behaviour: Any = None, die_first: bool = False, log: Callable[[str], None] = print) -> None:
        self.trainers = list(trainers)
        self.world = len(self.trainers)
        self.cutter = MiniBatchCutter(n_traj, mini_batches, self.world)
        self.to_samples = to_samples
        self.clock = clock or now_clock(time.perf_counter())
        self.helper_opts = helper_opts if self.world == 1 else None
        self.no_lend_reason = no_lend_reason or ("" if self.world == 1 else "the trainer has several ranks")
        self.behaviour = behaviour
        self.die_first = die_first
        self.log = log
        self.queue: list[list[Sample]] = []
        self.batches: list[list[Sample]] = []
        self.launched = 0
        self.inflight: _InFlight | None = None
        self.helpers: dict[int, Helper] = {}
        self.per_batch: list[tuple[float, float, list[dict[str, float]]]] = []  # launched, done (driver clock), rank stats
        self.failed = False
        self.declined = 0
        self.begin_refs: list[Any] = []
        self.rollout_end_s = math.inf

    # ---- hooks for the rollout loop ------------------------------------------------------------
    def start(self, clock: Callable[[], float] | None = None) -> None:
        """The step's rollout starts (``clock``: its seconds): freeze the step-start policy on
        every rank (queued before any mini-batch)."""
        if clock is not None:
            self.clock = clock
        self.begin_refs = [w.begin_step.remote() for w in self.trainers]

    @property
    def running(self) -> bool:
        """A mini-batch is in flight (what the pool sees as ``training_running``)."""
        return self.inflight is not None

    def refs(self) -> list[Any]:
        """Refs the rollout loop should wait on next to its own."""
        out = list(self.inflight.refs) if self.inflight else []
        return out + [h.join_ref for h in self.helpers.values() if not h.ready and not h.dead]

    def owns(self, ref: Any) -> bool:
        return (self.inflight is not None and ref in self.inflight.refs) or any(h.join_ref == ref for h in self.helpers.values())

    def on_group_done(self, episodes: list[Any]) -> None:
        """A GRPO group finished: it joins the next mini-batch; launch what is ready."""
        for b in self.cutter.add(self.to_samples(episodes)):
            self.queue.append(b)
            self.batches.append(b)
        self._launch()

    def lend(self, instance: int, handle: Any) -> bool:
        """The pool lent ``instance``: start its background join. False: lending is off here."""
        if self.helper_opts is None or self.failed:
            self.declined += 1
            return False
        handle.join_training.remote(self.helper_opts, self.behaviour)
        # the trainer's weights after every mini-batch launched so far (the call queues behind them)
        cur = self.trainers[0].state_dict.remote()
        ref = handle.helper_load.remote(cur, self.launched)
        self.helpers[instance] = Helper(instance, handle, self.clock(), ref, self.launched)
        return True

    def on_ready(self, ref: Any) -> None:
        """One of ``refs()`` finished."""
        import ray

        for h in self.helpers.values():
            if h.join_ref == ref and not h.ready and not h.dead:
                try:
                    ray.get(ref)
                    h.ready = True
                    h.join_s = self.clock() - h.lent_s
                except Exception as exc:  # the lent actor died or could not build the copy: drop it
                    h.dead = True
                    self.log(f"lent instance {h.instance} failed to join training ({type(exc).__name__}); dropped")
                return
        fl = self.inflight
        if fl is None or ref not in fl.refs:
            return
        done, _ = ray.wait(fl.refs, num_returns=len(fl.refs), timeout=0)
        if len(done) < len(fl.refs):
            return
        self.inflight = None
        try:
            stats = ray.get(fl.refs)
        except Exception:  # a rank died (RayActorError), or a peer's collective failed with it
            self.failed = True
            self.log(f"a trainer worker died in streamed mini-batch {fl.k}; the step's update will be redone from the checkpoint")
            return
        self.per_batch.append((fl.launched_s, self.clock(), stats))
        for h, shard in zip(fl.helpers, fl.shards):
            try:
                ray.get(shard.result, timeout=0)
                h.samples += len(shard.samples)
            except Exception:  # died: the trainer recomputed its share; never ask it again
                if not h.dead:
                    h.dead = True
                    self.log(f"gradient helper (instance {h.instance}) died; its samples were recomputed by the trainer")
        self._launch()

    # ---- launching ----------------------------------------------------------------------------
    def _launch(self) -> None:
        if self.inflight is not None or not self.queue or self.failed:
            return
        from libra.runtime.helper import HelperShard, split_for_helpers

        batch = self.queue.pop(0)
        k = self.launched
        self.launched += 1
        die = self.die_first and k == 0
        ready = [h for h in self.helpers.values() if h.ready and not h.dead] if self.world == 1 else []
        shards: list[Any] = []
        if ready:
            parts = split_for_helpers(batch, len(ready))
            ready = ready[: len(parts) - 1]
            cur = self.trainers[0].state_dict.remote() if any(h.version != k for h in ready) else None
            for h, part in zip(ready, parts[1:]):
                need = cur if h.version != k else None
                shards.append(HelperShard(part, h.handle.helper_grad.remote(part, need, k), h.instance))
                h.version = k
            refs = [self.trainers[0].train_minibatch.remote(parts[0], shards, 1.0, die)]
        else:
            per_rank = [batch[r::self.world] for r in range(self.world)]
            total = max(1, sum(gen_tokens(s) for s in batch))
            refs = [w.train_minibatch.remote(part, None, self.world * sum(gen_tokens(s) for s in part) / total if self.world > 1 else 1.0,
                                             die and r == self.world - 1)
                    for r, (w, part) in enumerate(zip(self.trainers, per_rank))]
        self.inflight = _InFlight(k, refs, shards, ready, self.clock())

    def redo(self, batches: Sequence[list[Sample]]) -> StreamResult:
        """Train ``batches`` (a failed step's mini-batches, same partition) from the start,
        without helpers: the redo after a trainer restart."""
        self.start()
        self.helper_opts = None
        self.queue, self.batches = [list(b) for b in batches], [list(b) for b in batches]
        return self.finish(0.0)

    # ---- after the rollout ----------------------------------------------------------------------
    def finish(self, rollout_end_s: float) -> StreamResult:
        """The rollout ended at ``rollout_end_s``: train the rest, close the step on the trainer,
        send helpers back to rollout; returns what the stage did."""
        import ray

        self.rollout_end_s = rollout_end_s
        for b in self.cutter.close():
            self.queue.append(b)
            self.batches.append(b)
        self._launch()
        while self.inflight is not None and not self.failed:
            ready, _ = ray.wait(self.refs(), num_returns=1)
            for r in ready:
                self.on_ready(r)
        begin_s = 0.0
        if not self.failed:
            try:
                begin_s = max(ray.get(self.begin_refs)) if self.begin_refs else 0.0
                ray.get([w.end_step.remote() for w in self.trainers])
            except ray.exceptions.RayActorError:
                self.failed = True
        for h in self.helpers.values():
            if not h.dead:
                h.handle.leave_training.remote()
        return self._result(begin_s)

    def _result(self, begin_s: float) -> StreamResult:
        train_s = begin_s
        overlap = min(begin_s, self.rollout_end_s)
        logprob = 0.0
        tokens = 0.0
        keys = ("loss", "clip_frac", "kl", "ratio_mean")
        acc = {k: 0.0 for k in keys}
        helper_samples = recomputed = 0
        for launched, done, stats in self.per_batch:
            busy = max(s["train_s"] for s in stats)
            train_s += busy
            overlap += min(busy, max(0.0, min(done, self.rollout_end_s) - launched))
            logprob += sum(s["logprob_s"] for s in stats) / len(stats)
            tokens += sum(s["tokens"] for s in stats) / len(stats)
            for k in keys:
                acc[k] += sum(s.get(k, math.nan) for s in stats) / len(stats)
            helper_samples += int(sum(s.get("helper_samples", 0.0) for s in stats))
            recomputed += int(sum(s.get("recomputed", 0.0) for s in stats))
        n = max(1, len(self.per_batch))
        stats_out = {k: v / n for k, v in acc.items()}
        stats_out.update(train_s=train_s, logprob_s=logprob, tokens=tokens)
        joins = [h.join_s for h in self.helpers.values() if h.ready]
        return StreamResult(stats_out, train_s, overlap, logprob, list(self.batches), self.failed, len(self.helpers), helper_samples,
                            recomputed, sum(joins) / len(joins) if joins else math.nan,
                            [h.instance for h in self.helpers.values() if h.dead])


def group_samples(episodes: Sequence[Any]) -> list[Sample]:
    """One finished GRPO group's episodes as samples (advantages within the group: the same
    numbers ``group_advantages`` gives over the whole step, since groups are independent)."""
    from libra.runtime.grpo import group_advantages

    adv = group_advantages([e.reward for e in episodes], [e.group for e in episodes])
    return [Sample(tuple(e.context), tuple(e.gen_mask), float(a)) for e, a in zip(episodes, adv)]


def now_clock(t0: float) -> Callable[[], float]:
    """Seconds since ``t0`` (perf_counter): the step clock the rollout also uses."""
    return lambda: time.perf_counter() - t0
