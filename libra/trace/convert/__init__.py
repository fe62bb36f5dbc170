"""Converters from agent-framework logs to Libra traces (``libra-sim convert``).

``convert_swe_agent`` reads every SWE-agent ``*.traj`` and mini-swe-agent ``*.traj.json`` file
under a directory and writes one trace step of trajectories. What it cannot convert it reports
(``ConvertResult.skipped``), never drops silently.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from libra.errors import UserError
from libra.trace.convert.chat import AgentRun, SkipRun, run_to_trajectory
from libra.trace.convert.reports import find_reports, load_rewards
from libra.trace.convert.swe_agent import SUFFIXES, load_run
from libra.trace.records import TraceHeader, Trajectory
from libra.trace.tokens import get_counter
from libra.trace.writer import write_trace

#: Source formats ``libra-sim convert --from`` accepts.
SOURCES: tuple[str, ...] = ("swe-agent",)


@dataclass
class ConvertResult:
    """What a conversion wrote, and which files it skipped and why."""

    output: str
    n_trajectories: int
    tokenizer: str
    reports: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    finish_counts: dict[str, int] = field(default_factory=dict)
    n_rewarded: int = 0


def find_trajectory_files(root: Path) -> list[Path]:
    """``*.traj`` and ``*.traj.json`` files under ``root`` (recursively), sorted by path so the
    output order, and hence the trace bytes, do not depend on the file system."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise UserError(f"{root} does not exist; give a directory of SWE-agent/mini-swe-agent runs")
    found: list[Path] = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(SUFFIXES):
                found.append(Path(dirpath) / name)
    return sorted(found)


def _ids(root: Path, runs: Sequence[AgentRun]) -> list[str]:
    """Trajectory ids: the instance id, or the file's path under ``root`` (suffix removed) when
    several files share an instance id (repeated samples of one task)."""
    counts = Counter(r.instance_id for r in runs)
    out = []
    for r in runs:
        if counts[r.instance_id] == 1:
            out.append(r.instance_id)
        else:
            rel = Path(r.path).relative_to(root) if root.is_dir() else Path(r.path).name
            text = rel.as_posix()
            for suf in SUFFIXES:
                if text.endswith(suf):
                    text = text[: -len(suf)]
                    break
            out.append(text)
    return out


def convert_swe_agent(
    root: str | os.PathLike[str],
    output: str | os.PathLike[str],
    step: int = 0,
    tokenizer: str = "auto",
    reports: Iterable[str | os.PathLike[str]] = (),
) -> ConvertResult:
    """Convert every run under ``root`` into trajectories of RL step ``step`` and write them.

    Rewards come from ``reports`` plus any ``results.json``/``report.json`` found under
    ``root``, else from a ``resolved`` field in the run's info, else null. Raises ``UserError``
    when nothing could be converted.
    """
    if step < 0:
        raise UserError(f"--step must be >= 0, got {step}")
    base = Path(root)
    files = find_trajectory_files(base)
    if not files:
        raise UserError(f"no *.traj or *.traj.json files under {base}")
    counter = get_counter(tokenizer)
    report_paths = sorted({*map(Path, reports), *find_reports(base)})
    rewards = load_rewards(report_paths)
    runs: list[AgentRun] = []
    skipped: list[tuple[str, str]] = []
    for f in files:
        try:
            runs.append(load_run(f))
        except SkipRun as why:
            skipped.append((str(f), str(why)))
    trajs: list[Trajectory] = []
    for run, tid in zip(runs, _ids(base, runs)):
        if run.instance_id in rewards:
            run.reward = rewards[run.instance_id]
        try:
            trajs.append(run_to_trajectory(run, counter, tid, step, run.instance_id))
        except SkipRun as why:
            skipped.append((run.path, str(why)))
    if not trajs:
        detail = f"; first problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise UserError(f"no convertible trajectory under {base}{detail}")
    models = {r.model for r in runs if r.model}
    header = TraceHeader(
        workload="swe",
        model=models.pop() if len(models) == 1 else None,
        source=f"libra-sim convert --from swe-agent {base.name} (tokens: {counter.name})",
        metadata={"trajectory_files": len(files), "skipped_files": len(skipped), "tokenizer": counter.name},
    )
    n = write_trace(output, trajs, header)
    finishes = Counter(t.finish or "null" for t in trajs)
    return ConvertResult(
        output=os.fspath(output),
        n_trajectories=n,
        tokenizer=counter.name,
        reports=[str(p) for p in report_paths],
        skipped=sorted(skipped),
        finish_counts=dict(sorted(finishes.items())),
        n_rewarded=sum(t.reward is not None for t in trajs),
    )
