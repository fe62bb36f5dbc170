"""Policy versions and the staleness bound of the asynchronous loop (``max_staleness`` K >= 1).

Why a module of its own: the bound is the one promise the async loop makes to the RL algorithm
(a sample is at most K policy versions behind the weights it trains), so the rule is written
once, here, as pure functions the driver, the trainer and the tests share.

Versions: a weight version ``v`` is the number of RL steps whose update the weights hold (the
model folder's are 0; the trainer's ``step_done``; after the update of step ``j`` they are
``j + 1``). The engines report, with every turn they generate, the version they generated it
with (``EngineActor.version``), so a trajectory carries the version of each of its turns; new
weights reach an engine between two of its calls, so a trajectory that was in a tool call when
they arrived continues on them and its later turns carry the newer version. Its *sample
version* is its oldest turn's (the versions of one trajectory never decrease).

The rules (the simulator's async loop, ``sim/loop.py``):

* rollout of step ``j`` may start once the engines hold version ``j - K`` (the update of step
  ``j - 1 - K`` is trained and synced: ``rollout_may_start``), so every turn of it is generated
  by a version >= ``j - K``;
* the update of step ``j`` runs on the trainer at version ``j`` (the updates of steps
  ``0 .. j-1`` done, in order), and refuses any sample older than ``version - K``
  (``check_fresh``; the trainer checks it again against its own ``step_done``). With the first
  rule this never fires: it is the assertion that the loop kept its promise, not a filter;
* every trajectory rolled out is trained on exactly once (``TrainLedger``: a second update of
  the same trajectory, or one never trained when the run ends, is an error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class StalenessError(RuntimeError):
    """A sample older than the staleness bound reached (or would reach) the trainer: a bug of the
    loop, never the user's (the loop is built so that it cannot happen)."""


def required_version(step: int, k: int) -> int:
    """The oldest weight version the rollout of ``step`` may run on under staleness ``k``."""
    return max(0, step - k)


def rollout_may_start(step: int, engine_version: int, k: int) -> bool:
    """Whether the rollout of ``step`` may start with the engines at ``engine_version``: they hold
    the update of step ``step - 1 - k`` (the simulator's ``synced[j-1-K]``)."""
    return engine_version >= required_version(step, k)


def sample_version(turn_versions: Sequence[int]) -> int:
    """A trajectory's sample version: its oldest turn's (0 for a trajectory without turns)."""
    return min(turn_versions) if turn_versions else 0


def check_fresh(step: int, trainer_version: int, k: int, versions: Mapping[str, int], allow_newer: bool = False) -> None:
    """Raise ``StalenessError`` if any trajectory (id -> sample version) of ``step`` is older than
    ``trainer_version - k``, or newer than the trainer (weights from the future: a version bug;
    ``allow_newer``: not checked, for a trainer that may have been restarted from an older
    checkpoint than the weights the engines hold)."""
    stale = {t: v for t, v in versions.items() if v < trainer_version - k}
    if stale:
        t, v = min(stale.items(), key=lambda kv: kv[1])
        raise StalenessError(f"step {step}: {len(stale)} sample(s) older than the staleness bound reached the trainer at version "
                             f"{trainer_version} (K={k}), e.g. {t} of version {v}; the async loop must start a rollout only on "
                             f"weights >= step - K")
    ahead = {} if allow_newer else {t: v for t, v in versions.items() if v > trainer_version}
    if ahead:
        t, v = next(iter(ahead.items()))
        raise StalenessError(f"step {step}: sample {t} claims version {v}, newer than the trainer's {trainer_version}")


@dataclass(frozen=True)
class VersionStats:
    """What one update trained, by version: the ``steps.csv`` columns of the async loop."""

    policy_version: int  # the trainer's version the update started from
    sample_version_min: int
    sample_version_max: int
    staleness_max: int  # policy_version - sample_version_min
    staleness_mean: float
    mixed_trajectories: int  # trajectories whose turns span more than one version (weights arrived mid-trajectory)


def version_stats(trainer_version: int, turn_versions: Iterable[Sequence[int]]) -> VersionStats:
    """The ``VersionStats`` of an update at ``trainer_version`` on trajectories with these per-turn
    versions."""
    per = [list(v) for v in turn_versions]
    samples = [sample_version(v) for v in per] or [trainer_version]
    return VersionStats(trainer_version, min(samples), max(samples), trainer_version - min(samples),
                        sum(trainer_version - s for s in samples) / len(samples), sum(1 for v in per if len(set(v)) > 1))


@dataclass
class TrainLedger:
    """Which trajectories have been trained on, so that none is trained twice and none is left
    out (see the module docstring)."""

    trained: dict[str, int] = field(default_factory=dict)  # trajectory -> the step whose update used it
    rolled_out: set[str] = field(default_factory=set)

    def rolled(self, ids: Iterable[str]) -> None:
        """Trajectories a rollout finished (they must each be trained once)."""
        self.rolled_out.update(ids)

    def mark(self, step: int, ids: Sequence[str]) -> None:
        """The update of ``step`` succeeded on ``ids``; raises if any was already trained (or never
        rolled out), or named twice."""
        if len(set(ids)) != len(ids):
            raise StalenessError(f"step {step}: the update names a trajectory twice")
        again = [t for t in ids if t in self.trained]
        if again:
            raise StalenessError(f"step {step}: trajectory {again[0]} was already trained in step {self.trained[again[0]]}")
        unknown = [t for t in ids if t not in self.rolled_out]
        if unknown:
            raise StalenessError(f"step {step}: trajectory {unknown[0]} was never rolled out")
        for t in ids:
            self.trained[t] = step

    def untrained(self) -> list[str]:
        """Trajectories rolled out but not (yet) trained, sorted."""
        return sorted(self.rolled_out - set(self.trained))
