"""Traces: the records of TRACE_FORMAT.md v1, reading/validating, writing, and per-step stats.

The public API, re-exported here so callers need not know the module layout::

    from libra.trace import open_trace, write_trace, Trajectory, Turn, StepArrays
"""

from libra.trace.columnar import StepArrays
from libra.trace.reader import TraceReader, TraceSummary, open_trace, read_trajectories
from libra.trace.records import (
    FINISHES,
    FORMAT_NAME,
    FORMAT_VERSION,
    OUTCOMES,
    TraceHeader,
    Trajectory,
    Turn,
)
from libra.trace.stats import StepStats, stats_frame, step_stats, trace_stats
from libra.trace.validate import SkipRecord
from libra.trace.writer import trajectory_to_dict, write_trace

__all__ = [
    "FINISHES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "OUTCOMES",
    "SkipRecord",
    "StepArrays",
    "StepStats",
    "TraceHeader",
    "TraceReader",
    "TraceSummary",
    "Trajectory",
    "Turn",
    "open_trace",
    "read_trajectories",
    "stats_frame",
    "step_stats",
    "trace_stats",
    "trajectory_to_dict",
    "write_trace",
]
