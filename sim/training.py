"""The training stage of one RL step, elastic: rollout workers may join it while it runs.

Work model: the per-sample bookkeeping between rollout and training (reward, advantage, data
movement: ``StepCosts.step_fixed_s``), the forward passes RL needs (old-policy log-probs, and the
reference model's when ``--kl`` > 0), then the update over the step's tokens split into
``mini_batches`` optimizer steps (gradient-accumulation boundaries). Each segment's time comes
from ``StepCosts.train_stage_s`` (the formula the planner ranks strategies with) for the strategy
in force when the segment starts, times a noise factor. ``tokens`` is the step's
trained tokens (every trajectory's full context); ``seq_len`` their mean length.

Joining (elastic pool): workers lent by rollout add whole data-parallel replicas (groups of
``tp * pp`` GPUs; leftover GPUs stay booked but idle). A **nonblocking** join loads its shard in
the background (``role_change_s``) and takes part from the first segment boundary after the load
ends; a **sync** join stops the whole job at the next boundary for the re-shard (the full load
time, from that boundary: nothing overlaps it). Lent GPUs go back to rollout when the job ends,
after loading the rollout weights again (``role_change_s`` once more, counted as a transition).

Streaming (synchronous mode, ``--streaming``): a ``Feed`` hands the job its data as GRPO groups
complete; segment ``m`` (forward and backward of one mini-batch, gradients accumulated, one
optimizer step over all of them as in batch mode) starts once the first ``(m+1)/M`` of the
step's trajectories have finished in whole groups. The rollout weights stay at the step's version
until the sync after the last segment, so training stays on-policy.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from libra.planner.plan import TrainConfig

if TYPE_CHECKING:  # pragma: no cover
    import simpy

    from sim.costs import SimCosts
    from sim.noise import Noise


@dataclass
class Loan:
    """GPUs lent to this job by the pool."""

    gpus: tuple[int, ...]
    lent_s: float
    load_s: float  # shard load (nonblocking: in the background; sync: a pause of the whole job)
    sync: bool
    return_s: float = 0.0  # going back to rollout after the job: offload, reload rollout weights
    joined: bool = False


class Feed:
    """Streaming data for a training job: ``ready[m]`` fires when mini-batch ``m``'s groups have
    all finished; ``share[m]`` is then its fraction of the step's trained tokens."""

    def __init__(self, env: simpy.Environment, n_traj: int, total_tokens: float, mini_batches: int) -> None:
        m = max(1, mini_batches)
        self.thresholds = [-(-(k + 1) * n_traj // m) for k in range(m)]
        self.ready = [env.event() for _ in range(m)]
        self.share = [0.0] * m
        self.total = max(float(total_tokens), 1.0)
        self._done = 0
        self._acc = 0.0
        self._next = 0

    def add(self, n_traj: int, tokens: float) -> None:
        """A group of ``n_traj`` trajectories holding ``tokens`` trained tokens finished."""
        self._done += n_traj
        self._acc += tokens
        while self._next < len(self.ready) and self._done >= self.thresholds[self._next]:
            self.share[self._next] = self._acc / self.total
            self._acc = 0.0
            self.ready[self._next].succeed()
            self._next += 1


@dataclass
class TrainStats:
    """What one training stage did."""

    start_s: float = float("nan")
    end_s: float = float("nan")
    prep_s: float = 0.0  # per-sample bookkeeping before the forward passes (streaming: per mini-batch)
    forward_s: float = 0.0
    update_s: float = 0.0
    pause_s: float = 0.0
    gpus_start: int = 0
    gpus_end: int = 0
    tokens: int = 0
    seq_len: int = 0
    joins: int = 0
    busy_gpu_s: float = 0.0
    segments: list[tuple[float, float, int]] = field(default_factory=list)  # t0, t1, gpus

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class TrainJob:
    """One step's training on ``gpus`` with ``cfg``, plus whatever the pool lends meanwhile."""

    def __init__(
        self,
        env: simpy.Environment,
        cfg: TrainConfig,
        gpus: tuple[int, ...],
        tokens: int,
        seq_len: int,
        costs: SimCosts,
        noise: Noise,
        kl: bool,
        mini_batches: int = 4,
        feed: Feed | None = None,
        n_samples: int = 0,
    ) -> None:
        """``n_samples``: the step's trajectories (their bookkeeping is charged first)."""
        if cfg.n_gpus > len(gpus):
            raise ValueError(f"training strategy needs {cfg.n_gpus} GPUs, given {len(gpus)}")
        self.env = env
        self.base_cfg = cfg
        self.cfg = cfg
        self.gpus = gpus
        self.tokens = tokens
        self.seq_len = max(1, seq_len)
        self.costs = costs
        self.noise = noise
        self.kl = kl
        self.mini_batches = max(1, mini_batches)
        self.feed = feed
        self.n_samples = max(0, int(n_samples))
        self.loans: list[Loan] = []
        self.running = False
        self.stats = TrainStats(tokens=tokens, seq_len=self.seq_len)

    def settle(self, cfg: TrainConfig) -> None:
        """Run with ``cfg``, the plan's layout with the knobs the policy set for this step's batch
        (``Policy.settle_training``); only before the job starts."""
        if self.running or not math.isnan(self.stats.start_s):
            raise RuntimeError("a training job's strategy is settled before it starts")
        self.base_cfg = cfg
        self.cfg = cfg

    @property
    def n_gpus(self) -> int:
        """GPUs booked by the job now (its own plus lent ones)."""
        return len(self.gpus) + sum(len(l.gpus) for l in self.loans)

    def lend(self, gpus: tuple[int, ...], load_s: float, sync: bool, return_s: float = 0.0) -> None:
        """The pool moves ``gpus`` here; they are usable after ``load_s`` of shard loading and
        take ``return_s`` to become rollout GPUs again once the job ends."""
        self.loans.append(Loan(gpus, self.env.now, load_s, sync, return_s))

    def _apply_joins(self) -> Generator[Any, Any, None]:
        """At a segment boundary: fold in loaned GPUs whose shard is ready (nonblocking), or
        stop for the re-shard (sync)."""
        now = self.env.now
        ready = [l for l in self.loans if not l.joined and (l.sync or l.lent_s + l.load_s <= now)]
        if not ready:
            return
        wait = max((l.load_s for l in ready if l.sync), default=0.0)
        if wait > 0:
            self.stats.pause_s += wait
            yield self.env.timeout(wait)
        for l in ready:
            l.joined = True
            self.stats.joins += 1
        lent = sum(len(l.gpus) for l in self.loans if l.joined)
        group = self.base_cfg.tp * self.base_cfg.pp
        self.cfg = replace(self.base_cfg, dp=self.base_cfg.dp + lent // group)

    def run(self) -> Generator[Any, Any, TrainStats]:
        """The SimPy process of the job (start it once its GPUs are booked)."""
        env = self.env
        st = self.stats
        st.start_s = env.now
        st.gpus_start = self.n_gpus
        self.running = True
        prep = self.costs.step.step_fixed_s(self.n_samples)
        if self.feed is None:
            if prep > 0:
                d = prep * self.noise.factor()
                yield env.timeout(d)
                st.prep_s = d
            yield from self._apply_joins()
            fwd, _ = self.costs.train_stage_s(self.cfg, self.tokens, self.seq_len, self.kl)
            t0 = env.now
            d = fwd * self.noise.factor()
            yield env.timeout(d)
            st.forward_s = d
            st.busy_gpu_s += d * self.cfg.n_gpus
            st.segments.append((t0, env.now, self.cfg.n_gpus))
        for m in range(self.mini_batches):
            if self.feed is not None:
                yield self.feed.ready[m]
            yield from self._apply_joins()
            fwd, upd = self.costs.train_stage_s(self.cfg, self.tokens, self.seq_len, self.kl)
            f = self.noise.factor()
            t0 = env.now
            if self.feed is None:
                d = upd / self.mini_batches * f
                st.update_s += d
            else:  # a streamed mini-batch: its bookkeeping, its own forward passes, then its backward
                share = self.feed.share[m]
                st.prep_s += prep * share * f
                st.forward_s += fwd * share * f
                st.update_s += upd * share * f
                d = (prep + fwd + upd) * share * f
            yield env.timeout(d)
            st.busy_gpu_s += d * self.cfg.n_gpus
            st.segments.append((t0, env.now, self.cfg.n_gpus))
        st.end_s = env.now
        st.gpus_end = self.cfg.n_gpus
        self.running = False
        return st
