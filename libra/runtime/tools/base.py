"""What a tool call returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's return: the text appended to the context, how it ended, its wall time."""

    output: str
    outcome: str  # "ok" | "error" | "timeout"
    latency_s: float
