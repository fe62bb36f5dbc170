"""The staleness class of a sweep configuration and how a policy runs in it.

A configuration's ``max_staleness`` K is its class: K = 0 is on-policy synchronous RL, K >= 1
allows asynchronous RL with rollouts at most K weight versions behind. Libra is compared with the
best baseline *of the same class*, so every policy of a configuration must run in that class.

``sim.loop.SimConfig.max_staleness`` carries the class: every policy then runs its own best loop
within it (Libra's planner picks sync, sync + streaming or async up to K; the baselines their
best honest loop), and a policy that cannot run in a class at all is left out of it rather than
reported as failing (``libra.policies.min_staleness``: ``areal-static-optimal`` is asynchronous by
design, K >= 1 only). The replay result carries the class (``RunResult.max_staleness``) and the
loop that ran (``RunResult.mode``).
"""

from __future__ import annotations

from dataclasses import replace

from libra.policies import min_staleness
from sim.loop import SimConfig


def class_name(max_staleness: int) -> str:
    """``K=0``, ``K=1``...: the label tables use (not "sync"/"async": within a class K >= 1 each
    policy picks its own loop, and several stay synchronous)."""
    return f"K={max_staleness}"


def runs_in_class(policy: str, max_staleness: int) -> bool:
    """Whether ``policy`` takes part in class K (a policy asynchronous by design needs K >= 1; a
    synchronous one runs in every class, staleness 0 being within any bound)."""
    return min_staleness(policy) <= max_staleness


def class_config(base: SimConfig, max_staleness: int) -> SimConfig:
    """``base`` set to run class K: the loop mode and staleness bound every policy replays under."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return replace(base, max_staleness=max_staleness, mode=None, staleness=None)
