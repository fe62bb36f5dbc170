"""The rules of TRACE_FORMAT.md v1, applied to one parsed JSON record at a time.

The reader and the writer share these checks, so a trace the writer produced is always one the
reader accepts, and the two can never drift apart. Checks are written as straight-line code over
plain dicts (no schema library, no per-field function calls) because the reader runs them on
millions of records; a broken rule raises ``RuleViolation`` which the caller turns into a
``TraceError`` carrying the file and line.

Decisions the spec leaves open (documented in docs/trace-io.md):

* ints are JSON integers: ``3.0`` and ``true`` are rejected where an int is required, because
  the spec says int and a float there usually means a unit or rounding bug upstream;
* numbers must be finite (``NaN``/``Infinity`` literals and overflowing ``1e400`` are rejected);
* ``id`` and ``tool`` must be non-empty strings (an empty tool name would be indistinguishable
  from "no tool" in reports);
* ``tool_latency_s`` must be null when ``tool`` is null (no call, no wall time), like ``outcome``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from libra.trace.records import (
    FINISHES,
    FINISHES_WITH_TRAILING_TOOL,
    FORMAT_NAME,
    FORMAT_VERSION,
    OUTCOMES,
    TraceHeader,
)

#: Versions of the format this reader understands.
KNOWN_VERSIONS: frozenset[int] = frozenset({FORMAT_VERSION})
#: Header keys with a meaning; every other header key is kept as metadata.
HEADER_KEYS: tuple[str, ...] = ("type", "format", "version", "workload", "model", "source")

_OUTCOME_SET = frozenset(OUTCOMES)
_FINISH_SET = frozenset(FINISHES)
_TRAILING_TOOL_SET = frozenset(FINISHES_WITH_TRAILING_TOOL)
_FINISH_TEXT = ", ".join(FINISHES)
_OUTCOME_TEXT = ", ".join(OUTCOMES)
_INDEX_RE = re.compile(r"\[\d+\]")


class RuleViolation(Exception):
    """One broken rule: ``field`` names the JSON path (``turns[2].tool``), ``rule`` is the generic
    rule text (stable, used to count skipped lines per rule) and ``detail`` the offending value."""

    def __init__(self, field: str, rule: str, detail: str = "") -> None:
        self.field = field
        self.rule = rule
        self.detail = detail
        super().__init__(f"field '{field}': {self.message}")

    @property
    def message(self) -> str:
        """The rule followed by what was found, e.g. ``must be an int >= 0 (got -3)``."""
        return f"{self.rule} ({self.detail})" if self.detail else self.rule


@dataclass(frozen=True, slots=True)
class SkipRecord:
    """A line lenient mode skipped, and why. ``rule`` is generic so that lines can be counted per
    rule; ``detail`` holds the specific value found."""

    line: int
    field: str
    rule: str
    detail: str = ""

    @property
    def rule_key(self) -> str:
        """``field 'turns[].tool': RULE`` with list indices removed, for counting per rule."""
        return f"field '{_INDEX_RE.sub('[]', self.field)}': {self.rule}"


class NonFinite:
    """What the JSON decoder yields for ``NaN``/``Infinity`` literals, so that the field check
    (not the parser) reports them and can name the field."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _got(value: Any) -> str:
    if value is None:
        return "got null"
    if isinstance(value, bool):
        return f"got {'true' if value else 'false'}"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"got {type(value).__name__ if not isinstance(value, NonFinite) else 'non-finite'} {text}"


# Rule texts, shared with tests and docs.
R_MISSING = "required key is missing"
R_INT_GE0 = "must be an integer >= 0"
R_INT_GE1 = "must be an integer >= 1"
R_INT_GE0_OR_NULL = "must be an integer >= 0 or null"
R_STR = "must be a non-empty string"
R_STR_OR_NULL = "must be a string or null"
R_TOOL = "must be a non-empty string or null"
R_NUM_GE0_OR_NULL = "must be a finite number >= 0 or null"
R_NUM_OR_NULL = "must be a finite number or null"
R_TURNS = "must be a non-empty list of turn objects"
R_TURN_OBJ = "must be a JSON object"
R_OUTCOME = f"must be one of {_OUTCOME_TEXT} or null"
R_FINISH = f"must be one of {_FINISH_TEXT} or null"
R_TOOL_BEFORE_LAST = "must not be null before the last turn"
R_TOOL_LAST = "must be null on the last turn unless finish is tool_limit, length or abort"
R_TOOL_TOKENS_NO_TOOL = "must be 0 when tool is null"
R_OUTCOME_NO_TOOL = "must be null when tool is null"
R_LATENCY_NO_TOOL = "must be null when tool is null"
R_TYPE = "must be 'header' or 'trajectory'"
R_HEADER_POS = "a header is only allowed as the first non-blank line"
R_FORMAT = f"must be '{FORMAT_NAME}'"
R_VERSION = f"must be a known format version ({', '.join(map(str, sorted(KNOWN_VERSIONS)))})"
R_DUPLICATE = "must be unique within the trace"
R_JSON = "invalid JSON"
R_UTF8 = "invalid UTF-8"
R_OBJECT = "line must be a JSON object"
R_GZIP = "gzip stream is truncated or corrupt"

#: Field name used for problems of the whole line (bad JSON, bad bytes), not of one key.
LINE_FIELD = "(line)"


def _is_int(v: Any) -> bool:
    return type(v) is int


def check_trajectory(obj: dict[str, Any]) -> None:
    """Check one trajectory record (already parsed) against every v1 rule.

    Raises ``RuleViolation`` on the first broken rule, in a fixed order (top-level keys first,
    then turns in order) so that the same bad line always gives the same message.
    """
    kind = obj.get("type", "trajectory")
    if kind != "trajectory":
        if kind == "header":
            raise RuleViolation("type", R_HEADER_POS)
        raise RuleViolation("type", R_TYPE, _got(kind))
    tid = obj.get("id")
    if type(tid) is not str or not tid:
        raise RuleViolation("id", R_MISSING if "id" not in obj else R_STR, "" if "id" not in obj else _got(tid))
    step = obj.get("step")
    if type(step) is not int or step < 0:
        raise RuleViolation("step", R_MISSING if "step" not in obj else R_INT_GE0, "" if "step" not in obj else _got(step))
    group = obj.get("group")
    if group is not None and type(group) is not str:
        raise RuleViolation("group", R_STR_OR_NULL, _got(group))
    prompt = obj.get("prompt_tokens")
    if type(prompt) is not int or prompt < 1:
        if "prompt_tokens" not in obj:
            raise RuleViolation("prompt_tokens", R_MISSING)
        raise RuleViolation("prompt_tokens", R_INT_GE1, _got(prompt))
    reward = obj.get("reward")
    if reward is not None:
        tr = type(reward)
        if not (tr is float and math.isfinite(reward)) and tr is not int:
            raise RuleViolation("reward", R_NUM_OR_NULL, _got(reward))
    finish = obj.get("finish")
    if finish is not None and (type(finish) is not str or finish not in _FINISH_SET):
        raise RuleViolation("finish", R_FINISH, _got(finish))
    turns = obj.get("turns")
    if type(turns) is not list or not turns:
        if "turns" not in obj:
            raise RuleViolation("turns", R_MISSING)
        raise RuleViolation("turns", R_TURNS, _got(turns) if type(turns) is not list else "got an empty list")
    last = len(turns) - 1
    for i, turn in enumerate(turns):
        if type(turn) is not dict:
            raise RuleViolation(f"turns[{i}]", R_TURN_OBJ, _got(turn))
        gen = turn.get("gen_tokens")
        if type(gen) is not int or gen < 0:
            if "gen_tokens" not in turn:
                raise RuleViolation(f"turns[{i}].gen_tokens", R_MISSING)
            raise RuleViolation(f"turns[{i}].gen_tokens", R_INT_GE0, _got(gen))
        ver = turn.get("policy_version")
        if ver is not None and (type(ver) is not int or ver < 0):
            raise RuleViolation(f"turns[{i}].policy_version", R_INT_GE0_OR_NULL, _got(ver))
        tool = turn.get("tool", turn)  # the turn itself marks "absent"
        lat = turn.get("tool_latency_s")
        ttok = turn.get("tool_tokens", 0)
        outcome = turn.get("outcome")
        if tool is None:
            if i != last:
                raise RuleViolation(f"turns[{i}].tool", R_TOOL_BEFORE_LAST)
            if ttok != 0 or type(ttok) is not int:
                raise RuleViolation(f"turns[{i}].tool_tokens", R_TOOL_TOKENS_NO_TOOL, _got(ttok))
            if outcome is not None:
                raise RuleViolation(f"turns[{i}].outcome", R_OUTCOME_NO_TOOL, _got(outcome))
            if lat is not None:
                raise RuleViolation(f"turns[{i}].tool_latency_s", R_LATENCY_NO_TOOL, _got(lat))
            continue
        if type(tool) is not str or not tool:
            if tool is turn:
                raise RuleViolation(f"turns[{i}].tool", R_MISSING)
            raise RuleViolation(f"turns[{i}].tool", R_TOOL, _got(tool))
        if lat is not None:
            tl = type(lat)
            if not ((tl is float and math.isfinite(lat)) or tl is int) or lat < 0:
                raise RuleViolation(f"turns[{i}].tool_latency_s", R_NUM_GE0_OR_NULL, _got(lat))
        if type(ttok) is not int or ttok < 0:
            raise RuleViolation(f"turns[{i}].tool_tokens", R_INT_GE0, _got(ttok))
        if outcome is not None and (type(outcome) is not str or outcome not in _OUTCOME_SET):
            raise RuleViolation(f"turns[{i}].outcome", R_OUTCOME, _got(outcome))
        if i == last and finish not in _TRAILING_TOOL_SET:
            raise RuleViolation(f"turns[{i}].tool", R_TOOL_LAST, "finish is null" if finish is None else f"finish is {finish!r}")


def parse_header(obj: dict[str, Any]) -> TraceHeader:
    """Check a header record and build its ``TraceHeader``; unknown keys become metadata.

    An unknown ``version`` is an error (the spec says so): a reader that guessed would replay a
    different workload than the one recorded.
    """
    fmt = obj.get("format")
    if fmt != FORMAT_NAME or type(fmt) is not str:
        raise RuleViolation("format", R_MISSING if "format" not in obj else R_FORMAT, "" if "format" not in obj else _got(fmt))
    version = obj.get("version")
    if type(version) is not int or version not in KNOWN_VERSIONS:
        raise RuleViolation("version", R_MISSING if "version" not in obj else R_VERSION, "" if "version" not in obj else _got(version))
    values: dict[str, str | None] = {}
    for key in ("workload", "model", "source"):
        v = obj.get(key)
        if v is not None and type(v) is not str:
            raise RuleViolation(key, R_STR_OR_NULL, _got(v))
        values[key] = v
    metadata = {k: v for k, v in obj.items() if k not in HEADER_KEYS}
    return TraceHeader(
        workload=values["workload"], model=values["model"], source=values["source"], version=version, metadata=metadata
    )
