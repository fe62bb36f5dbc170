"""The training side of the asynchronous loop (a plan with ``mode == "async"``, staleness K >= 1).

What runs where (the simulator's async loop, ``sim/loop.py``): the driver rolls out step after
step; each finished rollout's update is handed to this pipeline, which trains the steps one
after another on a background thread (update, weight sync to the engines, checkpoint), so the
update of step j runs on the trainer's devices while the rollout of step j+1 runs on the
engines' (an async plan is never colocated). Before the rollout of step j starts, the driver
waits (``wait_version``) until the engines hold the weights of step ``j - 1 - K``'s update
(``staleness.rollout_may_start``); the weights of later updates reach the engines while the
rollout runs, between two calls of each engine, without stopping a trajectory.

Guarantees, checked rather than assumed: before each update the pipeline refuses samples older
than the trainer's version - K (``staleness.check_fresh``; the trainer checks again against its
own count, ``Learner.train_step``), and the ``TrainLedger`` refuses a trajectory trained twice
and says which were never trained. A trainer worker that dies is replaced alone (``Updater``
with ``max_staleness``: ``Actors.restart_trainers``) and the step's update redone from the last
checkpoint on the same driver-held samples: none is lost, and the update that counts uses each
once. An error on the thread (a bug, or training that failed three times) is raised in the
driver at its next call here.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libra.planner.plan import Plan
from libra.runtime.staleness import TrainLedger, VersionStats, check_fresh, version_stats


@dataclass
class TrainJob:
    """One step's update: its plan, its samples (``grpo.Sample``, each with its sample version
    and behaviour log-probs), each trajectory's per-turn versions, and the staleness bound ``k``
    its rollout ran under."""

    step: int
    plan: Plan
    samples: list[Any]
    turn_versions: dict[str, list[int]]
    k: int


@dataclass
class TrainDone:
    """What the update of one step did (times in seconds on the run's clock)."""

    step: int
    stats: dict[str, float]
    sync_s: float
    checkpoint_s: float
    start_s: float  # the update started (the previous one and its sync were done)
    end_s: float  # its weights are on the engines (and the checkpoint written, when one was due)
    versions: VersionStats
    version_after: int  # the weights' version once synced


@dataclass
class TrainingPipeline:
    """Trains submitted steps in order on a background thread (see the module docstring).

    ``updater``: the run's ``update.Updater``; ``actors``: its ``placement.Actors`` (``version``:
    what the engines hold); ``checkpoint(step)``: write the step's checkpoint if one is due,
    returning seconds; ``clock``: the run's clock."""

    updater: Any
    actors: Any
    checkpoint: Callable[[int], float]
    clock: Callable[[], float]
    log: Callable[[str], None] = print
    ledger: TrainLedger = field(default_factory=TrainLedger)

    def __post_init__(self) -> None:
        self._jobs: queue.Queue[TrainJob | None] = queue.Queue()
        self._cv = threading.Condition()
        self._done: dict[int, TrainDone] = {}
        self._submitted = 0
        self._finished = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="libra-async-train", daemon=True)
        self._thread.start()

    # ---- the driver's side -----------------------------------------------------------------
    def submit(self, job: TrainJob) -> None:
        """Queue ``job``'s update (after every earlier one)."""
        self._raise()
        self.ledger.rolled(s.traj_id for s in job.samples)
        with self._cv:
            self._submitted += 1
        self._jobs.put(job)

    @property
    def busy(self) -> bool:
        """An update is queued or running."""
        with self._cv:
            return self._finished < self._submitted

    def wait_version(self, version: int, stop: Callable[[], None] | None = None) -> float:
        """Block until the engines hold ``version`` (or everything submitted is trained: then the
        version cannot rise further and the caller's rule decides); returns seconds waited.
        ``stop`` is called while waiting (it raises when the run was asked to stop)."""
        t0 = time.perf_counter()
        with self._cv:
            while self.actors.version < version and self._finished < self._submitted and self._error is None:
                self._cv.wait(0.2)
                if stop is not None:
                    stop()
        self._raise()
        return time.perf_counter() - t0

    def drain(self, stop: Callable[[], None] | None = None) -> None:
        """Block until every submitted update is trained and synced."""
        with self._cv:
            while self._finished < self._submitted and self._error is None:
                self._cv.wait(0.2)
                if stop is not None:
                    stop()
        self._raise()

    def take_done(self) -> list[TrainDone]:
        """The finished updates not taken yet, in step order."""
        self._raise()
        with self._cv:
            out = [self._done.pop(s) for s in sorted(self._done)]
        return out

    def close(self) -> None:
        """Stop the thread once the queue is empty (an update in flight finishes or fails)."""
        self._jobs.put(None)
        self._thread.join(timeout=5.0)

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    # ---- the thread --------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                done = self._train(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver, which raises it
                with self._cv:
                    self._error = exc
                    self._finished += 1
                    self._cv.notify_all()
                return
            with self._cv:
                self._done[job.step] = done
                self._finished += 1
                self._cv.notify_all()

    def _train(self, job: TrainJob) -> TrainDone:
        actors = self.actors
        version = int(actors.version)  # the trainer's: every earlier update is trained and synced
        check_fresh(job.step, version, job.k, {s.traj_id: s.version for s in job.samples})
        vs = version_stats(version, job.turn_versions.values())
        start = self.clock()
        stats, sync_s = self.updater.train(job.plan, job.samples, job.step, max_staleness=job.k)
        self.ledger.mark(job.step, [s.traj_id for s in job.samples])
        ck_s = self.checkpoint(job.step)
        return TrainDone(job.step, stats, sync_s, ck_s, start, self.clock(), vs, int(actors.version))
