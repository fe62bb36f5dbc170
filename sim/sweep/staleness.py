"""The staleness class of a sweep configuration and how a policy runs in it.

A configuration's ``max_staleness`` K is its class: K = 0 is on-policy synchronous RL, K >= 1
allows asynchronous RL with rollouts at most K weight versions behind. Libra is compared with the
best baseline *of the same class*, so every policy of a configuration must run in that class.

Today ``sim.loop.SimConfig`` expresses the class through ``mode`` and ``staleness`` (K = 0:
``mode="sync"``; K >= 1: ``mode="async", staleness=K``), and a colocated policy cannot run async
(rollout and training share every GPU), so it is left out of async classes rather than reported
as failing. When ``libra-sim replay`` gains ``--max-staleness`` (the replay result then carries
``max_staleness`` and the mode that ran), ``class_config`` is the one function to switch over.
"""

from __future__ import annotations

from dataclasses import replace

from sim.loop import SimConfig

#: Policies whose rollout and training share every GPU: they run only in the sync class.
SYNC_ONLY_POLICIES: frozenset[str] = frozenset({"verl-colocated"})


def class_name(max_staleness: int) -> str:
    """``sync`` for K = 0, ``async-K`` otherwise (the label tables and file names use)."""
    return "sync" if max_staleness == 0 else f"async-{max_staleness}"


def runs_in_class(policy: str, max_staleness: int) -> bool:
    """Whether ``policy`` takes part in class K (a colocated policy cannot run async)."""
    return max_staleness == 0 or policy not in SYNC_ONLY_POLICIES


def class_config(base: SimConfig, max_staleness: int) -> SimConfig:
    """``base`` set to run class K: the loop mode and staleness bound every policy replays under."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if max_staleness == 0:
        return replace(base, mode="sync", staleness=0)
    return replace(base, mode="async", staleness=max_staleness)
