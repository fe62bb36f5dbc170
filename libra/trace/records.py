"""The records of the trace format (TRACE_FORMAT.md, version 1), as immutable Python objects.

These are the row form, used by the reader, the writer, the generators and the converters.
The simulator and the planner use the columnar form in ``libra.trace.columnar``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FORMAT_NAME = "libra-trace"
FORMAT_VERSION = 1

Outcome = Literal["ok", "error", "timeout"]
Finish = Literal["stop", "length", "tool_limit", "abort"]

OUTCOMES: tuple[str, ...] = ("ok", "error", "timeout")
FINISHES: tuple[str, ...] = ("stop", "length", "tool_limit", "abort")
#: ``finish`` values for which the last turn may still call a tool.
FINISHES_WITH_TRAILING_TOOL: tuple[str, ...] = ("tool_limit", "length", "abort")


@dataclass(frozen=True, slots=True)
class Turn:
    """One model generation, and the tool call that ended it (if any)."""

    gen_tokens: int
    tool: str | None
    tool_latency_s: float | None = None
    tool_tokens: int = 0
    outcome: Outcome | None = None
    #: the policy version (RL steps trained into the weights) that generated this turn, when the
    #: recorder knows it (``libra-run``; an asynchronous run's turns may be older than their step)
    policy_version: int | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One rollout trajectory: a prompt and its turns, in order."""

    id: str
    step: int
    prompt_tokens: int
    turns: tuple[Turn, ...]
    group: str | None = None
    reward: float | None = None
    finish: Finish | None = None

    @property
    def total_tokens(self) -> int:
        """Context length after the last turn: prompt plus every generation and tool return."""
        return self.prompt_tokens + sum(t.gen_tokens + t.tool_tokens for t in self.turns)

    @property
    def gen_tokens(self) -> int:
        """Tokens the model generated over all turns."""
        return sum(t.gen_tokens for t in self.turns)


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The optional first record. ``workload`` and ``model`` are hints; other keys are metadata."""

    workload: str | None = None
    model: str | None = None
    source: str | None = None
    version: int = FORMAT_VERSION
    metadata: dict[str, Any] = field(default_factory=dict)
