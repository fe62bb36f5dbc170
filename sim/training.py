"""The training stage of one RL step, elastic: rollout workers may join it while it runs.

Work model: the forward passes RL needs first (old-policy log-probs, and the reference model's
when ``--kl`` > 0), then the update over the step's tokens split into ``mini_batches`` optimizer
steps (gradient-accumulation boundaries). Each segment's time comes from the cost evaluator for
the strategy in force when the segment starts, times a noise factor. ``tokens`` is the step's
trained tokens (every trajectory's full context); ``seq_len`` their mean length.

Joining (elastic pool): workers lent by rollout add whole data-parallel replicas (groups of
``tp * pp`` GPUs; leftover GPUs stay booked but idle). A **nonblocking** join loads its shard in
the background (``role_change_s``) and takes part from the first segment boundary after the load
ends; a **sync** join stops training at the next boundary while every worker re-shards (the same
load time, paid by the whole job). Lent GPUs go back to rollout when the job ends, after loading
the rollout weights again (``role_change_s`` once more, counted as a transition).
"""

from __future__ import annotations

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
    ready_s: float  # when their shard is loaded
    sync: bool
    return_s: float = 0.0  # going back to rollout after the job: offload, reload rollout weights
    joined: bool = False


@dataclass
class TrainStats:
    """What one training stage did."""

    start_s: float = float("nan")
    end_s: float = float("nan")
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
    ) -> None:
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
        self.loans: list[Loan] = []
        self.running = False
        self.stats = TrainStats(tokens=tokens, seq_len=self.seq_len)

    @property
    def n_gpus(self) -> int:
        """GPUs booked by the job now (its own plus lent ones)."""
        return len(self.gpus) + sum(len(l.gpus) for l in self.loans)

    def lend(self, gpus: tuple[int, ...], load_s: float, sync: bool, return_s: float = 0.0) -> None:
        """The pool moves ``gpus`` here; they are usable after ``load_s`` of shard loading and
        take ``return_s`` to become rollout GPUs again once the job ends."""
        self.loans.append(Loan(gpus, self.env.now + load_s, sync, return_s))

    def _apply_joins(self) -> Generator[Any, Any, None]:
        """At a segment boundary: fold in loaned GPUs whose shard is ready (nonblocking), or
        stop for the re-shard (sync)."""
        now = self.env.now
        ready = [l for l in self.loans if not l.joined and (l.sync or l.ready_s <= now)]
        if not ready:
            return
        wait = max((l.ready_s - now for l in ready if l.sync), default=0.0)
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
        yield from self._apply_joins()
        fwd, _ = self.costs.train_stage_s(self.cfg, self.tokens, self.seq_len, self.kl)
        t0 = env.now
        d = fwd * self.noise.factor()
        yield env.timeout(d)
        st.forward_s = d
        st.busy_gpu_s += d * self.cfg.n_gpus
        st.segments.append((t0, env.now, self.cfg.n_gpus))
        for _ in range(self.mini_batches):
            yield from self._apply_joins()
            _, upd = self.costs.train_stage_s(self.cfg, self.tokens, self.seq_len, self.kl)
            t0 = env.now
            d = upd / self.mini_batches * self.noise.factor()
            yield env.timeout(d)
            st.update_s += d
            st.busy_gpu_s += d * self.cfg.n_gpus
            st.segments.append((t0, env.now, self.cfg.n_gpus))
        st.end_s = env.now
        st.gpus_end = self.cfg.n_gpus
        self.running = False
        return st
