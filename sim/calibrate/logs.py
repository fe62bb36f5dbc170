"""Step metrics from an RL framework's logs, in the three forms they are kept:

* **console** lines, as verl's console logger prints them (``verl/utils/logger/aggregate_logger.py``,
  ``concat_dict_to_str``): ``step:3 - timing_s/gen:41.2 - timing_s/update_actor:12.9 - ...``;
  other lines (warnings, progress bars) are skipped, a line that starts a record (``step:N - ``)
  must be all ``key:number`` fields;
* **JSONL**: verl's file logger (``verl/utils/tracking.py``, ``FileLogger``) writes
  ``{"step": N, "data": {...}}`` per line; a flat object with ``step`` or ``_step`` is read too;
* **CSV**: a W&B export (``Step`` or ``_step`` column; the UI's ``RUN - metric`` column names
  and its ``__MIN``/``__MAX`` columns are understood).

Stage names (``STAGE_KEYS``): verl's ``timing_s/*`` (``verl/trainer/ppo/ray_trainer.py``'s
``marked_timer`` names, ``metric_utils.compute_timing_metrics``), NeMo RL's ``timing/train/*``
(``nemo_rl/algorithms/grpo.py``: ``generation``, ``policy_and_reference_logprobs``,
``policy_training``, ``weight_sync``, ``total_step_time``), AReaL's ``timeperf/*``
(``areal/utils/stats_tracker.py``'s ``record_timing``: ``rollout``, ``recompute_logp``,
``train_step``, ``update_weights``). Lengths: verl's ``response_length/*`` and
``prompt_length/mean`` (``metric_utils``), NeMo RL's ``train/mean_gen_tokens_per_sample``.
A bad line is a one-line ``UserError``: ``FILE:LINE: rule``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from libra.errors import UserError

#: what each stage is called in each framework's logs (first found wins)
STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "gen": ("timing_s/gen", "timing/train/generation", "timeperf/rollout"),
    "log_prob": ("timing_s/old_log_prob", "timing/train/policy_and_reference_logprobs", "timeperf/recompute_logp"),
    "update": ("timing_s/update_actor", "timing/train/policy_training", "timeperf/train_step"),
    "sync": ("timing_s/update_weights", "timing/train/weight_sync", "timeperf/update_weights"),
    "step": ("timing_s/step", "timing/train/total_step_time"),
}
LENGTH_KEYS: dict[str, tuple[str, ...]] = {
    "response_mean": ("response_length/mean", "train/mean_gen_tokens_per_sample"),
    "response_max": ("response_length/max",),
    "response_min": ("response_length/min",),
    "prompt_mean": ("prompt_length/mean",),
}
STEP_COLUMNS: tuple[str, ...] = ("_step", "Step", "step", "trainer/global_step")
_CONSOLE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")


@dataclass
class StepLog:
    """One logged step: its metrics and where they were read (``FILE:LINE``)."""

    step: int
    values: dict[str, float] = field(default_factory=dict)
    where: str = ""

    def first(self, keys: tuple[str, ...]) -> float | None:
        for k in keys:
            v = self.values.get(k)
            if v is not None and math.isfinite(v):
                return v
        return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_log(path: str | Path) -> list[StepLog]:
    """Every step of ``path`` (console, JSONL or CSV, by content), merged per step number
    (frameworks log one step in several calls), ordered by step."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: log file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not a text log ({exc.reason} at byte {exc.start})") from None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if p.suffix.lower() == ".csv" or (first and not first.startswith("{") and "," in first and any(c in first for c in STEP_COLUMNS)
                                      and "step:" not in first):
        recs = _read_csv(p, text)
    elif first.startswith("{"):
        recs = _read_jsonl(p, text)
    else:
        recs = _read_console(p, text)
    merged: dict[int, StepLog] = {}
    for r in recs:
        m = merged.setdefault(r.step, StepLog(r.step, {}, r.where))
        m.values.update(r.values)
    if not merged:
        raise UserError(f"{p}: no step metrics found (console lines 'step:N - key:value - ...', JSONL objects with "
                        f"'step', or a CSV with a {'/'.join(STEP_COLUMNS)} column)")
    return [merged[k] for k in sorted(merged)]


def _read_console(p: Path, text: str) -> list[StepLog]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = _CONSOLE.search(line.rstrip())
        if m is None:
            continue
        values: dict[str, float] = {}
        for field_ in m.group(2).split(" - "):
            key, sep, val = field_.rpartition(":")
            v = _number(val.strip()) if sep else None
            if not key.strip() or v is None:
                raise UserError(f"{p}:{i}: field {field_.strip()!r} is not key:number (a console record is "
                                "'step:N - key:value - key:value ...')")
            values[key.strip()] = v
        out.append(StepLog(int(m.group(1)), values, f"{p}:{i}"))
    return out


def _read_jsonl(p: Path, text: str) -> list[StepLog]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}:{i}: not a JSON object ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{p}:{i}: each line must be a JSON object, got {type(obj).__name__}")
        step = obj.get("step", obj.get("_step"))
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UserError(f"{p}:{i}: 'step' must be an integer >= 0, got {step!r}")
        data = obj.get("data", obj)
        if not isinstance(data, dict):
            raise UserError(f"{p}:{i}: 'data' must be an object of metrics")
        values = {k: float(v) for k, v in data.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "_step")}
        out.append(StepLog(step, values, f"{p}:{i}"))
    return out


def _read_csv(p: Path, text: str) -> list[StepLog]:
    rows = list(csv.reader(text.splitlines()))
    header = [h.strip() for h in rows[0]]
    col = next((header.index(c) for c in STEP_COLUMNS if c in header), None)
    if col is None:
        raise UserError(f"{p}:1: no step column (one of {', '.join(STEP_COLUMNS)})")
    names = []
    for h in header:  # the W&B UI's export: "RUN NAME - metric", plus metric__MIN / metric__MAX columns
        name = h.split(" - ", 1)[1] if " - " in h else h
        names.append(None if name.endswith(("__MIN", "__MAX")) else name)
    out = []
    for i, row in enumerate(rows[1:], 2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise UserError(f"{p}:{i}: {len(row)} cells, the header has {len(header)}")
        step = _number(row[col])
        if step is None or step < 0 or step != int(step):
            raise UserError(f"{p}:{i}: column {header[col]!r} must be an integer step >= 0, got {row[col]!r}")
        values: dict[str, float] = {}
        for j, (name, cell) in enumerate(zip(names, row)):
            if j == col or name is None or not cell.strip():
                continue
            v = _number(cell)
            if v is None:
                raise UserError(f"{p}:{i}: column {header[j]!r} must be a number or empty, got {cell!r}")
            values[name] = v
        out.append(StepLog(int(step), values, f"{p}:{i}"))
    return out
