"""Small helpers shared by the plots of ``libra-run`` and ``libra-sim`` (no matplotlib import
here: each plotting function imports it when it draws)."""

from __future__ import annotations

from collections.abc import Iterable


def time_unit(seconds: Iterable[float]) -> tuple[float, str]:
    """``(divisor, unit)`` for an axis of durations: seconds up to 2 minutes, minutes up to
    2 hours, hours beyond, so a 0.7 s step is not drawn as 0.0002 h nor a 9-hour run as 32,400 s.
    The largest finite value decides."""
    peak = max((abs(float(v)) for v in seconds if v == v and abs(float(v)) != float("inf")), default=0.0)
    if peak >= 7200:
        return 3600.0, "h"
    if peak >= 120:
        return 60.0, "min"
    return 1.0, "s"


def format_duration(seconds: float) -> str:
    """``0:42``, ``12:05`` or ``1:02:03``: a wall time the way a person reads it."""
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
