"""``resume``: where a run left off. The trainer's newest checkpoint says how many steps are done;
the trace and ``steps.csv`` are cut back to those steps (a step that ran past its checkpoint is
redone), so the resumed run plans from the same history and appends to the same records."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory


@dataclass
class Resumed:
    """The steps already done and their records."""

    done: int
    trajectories: list[Trajectory] = field(default_factory=list)
    history: list[StepArrays] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


def resume_records(out: str, ckpt: str, log: Any) -> Resumed:
    """Steps already done (from the trainer's checkpoint in ``ckpt``) and their trace/metrics
    from ``out``; ``done`` 0 (nothing else) when there is no checkpoint."""
    from libra.runtime.recording import read_csv
    from libra.trace.reader import read_trajectories  # type: ignore[attr-defined]

    trace = os.path.join(out, "trace.jsonl")
    steps_csv = os.path.join(out, "steps.csv")
    found = sorted(glob.glob(os.path.join(ckpt, "step*")))
    if not found:
        log(f"resume: no checkpoint in {ckpt}; starting at step 0")
        return Resumed(0)
    got = Resumed(int(os.path.basename(found[-1])[4:10]))
    done = got.done
    if os.path.isfile(trace):
        got.trajectories = [t for t in read_trajectories(trace) if t.step < done]
        by_step: dict[int, list[Trajectory]] = {}
        for t in got.trajectories:
            by_step.setdefault(t.step, []).append(t)
        got.history = [StepArrays.from_trajectories(s, ts) for s, ts in sorted(by_step.items())]
    if os.path.isfile(steps_csv):
        got.rows = [dict(r) for r in read_csv(steps_csv) if int(r["step"]) < done]
        for r in got.rows:
            for k, v in r.items():
                try:
                    r[k] = float(v) if k not in ("policy", "rollout_tps") else v
                except ValueError:
                    pass
            r["step"] = int(r["step"])
        missing = sorted(set(range(done)) - {r["step"] for r in got.rows})
        if missing:  # an asynchronous run stopped after an update's checkpoint, before its row was written
            log(f"resume: steps.csv has no row for step(s) {', '.join(map(str, missing))} (trained and checkpointed; the run "
                f"stopped before recording them); their trajectories are in the trace")
    log(f"resuming after step {done - 1} (checkpoint {found[-1]})")
    return got
