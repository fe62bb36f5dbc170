"""Default tool-latency model, for turns whose trace says ``tool_latency_s: null``.

Part of reading a trace (the policy core's ``libra.trace``): the simulator replays with these
latencies, and the baselines' estimates and bounds (``libra.policies``) use the same draws.

A trace recorded on a real cluster carries measured latencies; a synthetic or converted one may
not. Then the latency of a call is drawn from a lognormal chosen by the tool's name, capped at
that tool family's timeout; a call whose outcome is ``"timeout"`` takes exactly the timeout.
The families and their figures come from docs/reference/workloads.md:

=========  =================================  ========  =====  =======
family     names containing                   median s  sigma  timeout
=========  =================================  ========  =====  =======
shell      bash, shell, terminal, exec, cmd      1.0     1.0     60
code       python, code, interpreter, sandbox    0.05    1.2     30
search     search, retriev, web, browse           0.5     0.5     30
other      anything else                          1.0     0.8     60
=========  =================================  ========  =====  =======

(shell: SWE-agent commands, 60 s per command; code: RollPacker's p50 31 ms / p90 78 ms / mean
0.27 s, 30 s sandbox timeout; search: retrieval plus reranking, verl's 30 s tool timeout.)
Draws are seeded per (seed, step), vectorized over a step's turns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import OUTCOMES


@dataclass(frozen=True, slots=True)
class ToolFamily:
    """A lognormal latency model for tools whose name contains one of ``patterns``."""

    name: str
    patterns: tuple[str, ...]
    median_s: float
    sigma: float
    timeout_s: float


FAMILIES: tuple[ToolFamily, ...] = (
    ToolFamily("shell", ("bash", "shell", "terminal", "exec", "cmd"), 1.0, 1.0, 60.0),
    ToolFamily("code", ("python", "code", "interpreter", "sandbox"), 0.05, 1.2, 30.0),
    ToolFamily("search", ("search", "retriev", "web", "browse"), 0.5, 0.5, 30.0),
)
OTHER = ToolFamily("other", (), 1.0, 0.8, 60.0)
_TIMEOUT = OUTCOMES.index("timeout")


def family_of(tool: str) -> ToolFamily:
    """The latency family of a tool name (case-insensitive substring match, first wins)."""
    low = tool.lower()
    for fam in FAMILIES:
        if any(p in low for p in fam.patterns):
            return fam
    return OTHER


def resolve_latencies(step: StepArrays, seed: int) -> np.ndarray:
    """Tool latency per turn (float64 [n_turns]): the trace's value, or a seeded draw where it
    is NaN; 0 for turns that call no tool."""
    lat = step.tool_latency_s.astype(np.float64, copy=True)
    has_tool = step.tool_code >= 0
    lat[~has_tool] = 0.0
    missing = np.isnan(lat) & has_tool
    if not missing.any():
        return lat
    rng = np.random.default_rng([seed, step.step, 0x7001])
    fams = [family_of(n) for n in step.tool_names]
    med = np.array([f.median_s for f in fams])
    sig = np.array([f.sigma for f in fams])
    cap = np.array([f.timeout_s for f in fams])
    idx = np.flatnonzero(missing)
    codes = step.tool_code[idx].astype(np.int64)
    draws = med[codes] * np.exp(sig[codes] * rng.standard_normal(len(idx)))
    draws = np.minimum(draws, cap[codes])
    timed_out = step.outcome_code[idx] == _TIMEOUT
    draws[timed_out] = cap[codes][timed_out]
    lat[idx] = draws
    return lat
