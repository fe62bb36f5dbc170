"""Rewards from SWE-bench evaluation reports: which instances were resolved.

Accepted shapes (all produced by the SWE-bench harness or tools around it):

* a summary with id lists: ``{"resolved_ids": [...], "unresolved_ids": [...], ...}`` (harness
  run summary, sb-cli) or the older ``{"resolved": [...], "applied": [...], ...}``
  (SWE-agent's ``results.json``); listed-but-not-resolved ids get reward 0.0;
* per-instance reports: ``{"<instance_id>": {"resolved": true, ...}, ...}`` (the harness's
  ``report.json``).

The reward is 1.0 for resolved, 0.0 for evaluated-but-unresolved, and absent (null in the trace)
for instances no report mentions: an unevaluated run is unknown, not a failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from libra.errors import UserError

#: File names picked up automatically under the converted directory.
REPORT_NAMES: tuple[str, ...] = ("results.json", "report.json")
_ID_LIST_KEYS = ("resolved_ids", "resolved")
#: Id lists of instances that were evaluated (so not resolved means reward 0). Lists such as
#: ``incomplete_ids``/``submitted_ids`` are left out: an instance only there was never judged.
_EVALUATED_LISTS = frozenset({
    "unresolved_ids", "completed_ids", "error_ids", "empty_patch_ids",  # harness summary / sb-cli
    "applied", "no_apply", "test_errored", "test_timeout", "install_fail", "reset_failed",  # old results.json
    "generated", "with_logs", "no_generation",
})


def rewards_from_report(doc: Any) -> dict[str, float]:
    """Instance id -> reward from one parsed report (empty when the shape is not a report)."""
    out: dict[str, float] = {}
    if not isinstance(doc, dict):
        return out
    for key in _ID_LIST_KEYS:
        resolved = doc.get(key)
        if not (isinstance(resolved, list) and all(isinstance(x, str) for x in resolved)):
            continue
        for k, v in doc.items():  # ids evaluated but not resolved get 0.0
            if k in _EVALUATED_LISTS and isinstance(v, list):
                for x in v:
                    if isinstance(x, str):
                        out[x] = 0.0
        for x in resolved:
            out[x] = 1.0
        return out
    for k, v in doc.items():
        if isinstance(v, dict) and isinstance(v.get("resolved"), bool):
            out[k] = 1.0 if v["resolved"] else 0.0
    return out


def find_reports(root: Path) -> list[Path]:
    """Report files under ``root`` (by name, see ``REPORT_NAMES``), in sorted order."""
    if root.is_file():
        return []
    found: list[Path] = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name in REPORT_NAMES:
                found.append(Path(dirpath) / name)
    return sorted(found)


def load_rewards(paths: Iterable[Path]) -> dict[str, float]:
    """Merged rewards of several reports; a resolved verdict wins over an unresolved one."""
    merged: dict[str, float] = {}
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read report {p}: {exc}") from None
        for k, r in rewards_from_report(doc).items():
            merged[k] = max(r, merged.get(k, r))
    return merged
