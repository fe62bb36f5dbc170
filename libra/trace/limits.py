"""The workload limits a trace declares in its header, read in one place.

A trace may say how long its trajectories can get: a hard context cap (``max_context``), the
most tokens the model may generate over a trajectory (``max_response_tokens``) and the most turns
(``max_turns``). All three are optional header keys (docs/trace-io.md). ``libra-sim gen`` writes
its generator's parameters under ``params`` (``params.max_context``, ``params.max_turns``);
``libra-run`` writes ``max_context`` at the top level. A planner that knows the cap plans its first
step (no measured history yet) from the length prior scaled into it instead of for trajectories
that cannot exist, which is what decides whether training fits (``ClusterSpec.max_context``).

``libra-sim plan`` and ``libra-sim replay`` both call ``cluster_limits`` so the same trace on the
same cluster is planned under the same limits by both (they disagreed before: plan fitted a model
that replay refused at sequence length 65,536).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libra.errors import UserError

#: Header keys read as limits, in the order they are reported.
LIMIT_KEYS: tuple[str, ...] = ("max_context", "max_response_tokens", "max_turns")


@dataclass(frozen=True)
class TraceLimits:
    """What a header declares (None: not declared); ``sources`` names the header key each came
    from (``max_context`` or ``params.max_context``)."""

    max_context: int | None = None
    max_response_tokens: int | None = None
    max_turns: int | None = None
    sources: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """``max_context 16,384 (header params.max_context)``, or ``none declared``."""
        parts = [f"{k} {getattr(self, k):,} (header {src})" for k, src in self.sources]
        return ", ".join(parts) if parts else "none declared"


def _positive_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: header field '{key}': must be an integer >= 1 (a declared limit), got {value!r}")
    return value


def trace_limits(header: Any, where: str = "trace") -> TraceLimits:
    """The limits ``header`` (a ``TraceHeader`` or None) declares. A top-level key wins over the
    generator's ``params``; a declared value that is not a positive integer is a ``UserError``
    naming ``where`` (the trace path) and the key."""
    meta = getattr(header, "metadata", None) or {}
    params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
    values: dict[str, int] = {}
    sources: list[tuple[str, str]] = []
    for key in LIMIT_KEYS:
        if meta.get(key) is not None:
            values[key] = _positive_int(meta[key], where, key)
            sources.append((key, key))
        elif params.get(key) is not None:
            values[key] = _positive_int(params[key], where, f"params.{key}")
            sources.append((key, f"params.{key}"))
    return TraceLimits(**values, sources=tuple(sources))


def cluster_limits(header: Any, max_context: int | None = None, where: str = "trace") -> tuple[dict[str, Any], str]:
    """``ClusterSpec`` keyword arguments for the limits of a trace, and a line saying where they
    came from. ``max_context`` (a ``--max-context`` flag) overrides the header's."""
    lim = trace_limits(header, where)
    kwargs: dict[str, Any] = {}
    text = lim.describe()
    if max_context is not None:  # the flag replaces the header's context cap, not its other limits
        kwargs["max_context"] = int(max_context)
        rest = [p for p in text.split(", ") if p != "none declared" and not p.startswith("max_context ")]
        text = ", ".join([f"max_context {int(max_context):,} (--max-context)", *rest])
    elif lim.max_context is not None:
        kwargs["max_context"] = lim.max_context
    # the other declared limits and the workload kind shape the first step's length prior
    # (libra.planner.stats.PriorSpec); the kind is the header's hint, when it names a known one
    if lim.max_response_tokens is not None:
        kwargs["max_response_tokens"] = lim.max_response_tokens
    if lim.max_turns is not None:
        kwargs["max_turns"] = lim.max_turns
    kind = getattr(header, "workload", None)
    if isinstance(kind, str) and kind:
        kwargs["workload"] = kind
    group = (getattr(header, "metadata", None) or {}).get("group_size")  # GRPO samples per prompt (libra-sim gen writes it)
    if group is not None:
        kwargs["group_size"] = _positive_int(group, where, "group_size")
    return kwargs, text + (f"; workload {kind}" if "workload" in kwargs else "")
