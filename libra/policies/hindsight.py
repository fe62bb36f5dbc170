"""``HindsightReplayer``: the what-if evaluation a backend that holds the whole trace can offer.

Why a Protocol in the core: ``areal-static-optimal`` is the best fixed configuration *in
hindsight*; it picks it by replaying every candidate over the trace, which needs a simulator.
The policy lives in the core with every other policy, so the dependency is inverted: the core
says what it needs (this Protocol), ``sim`` supplies it (``sim.hindsight.SimReplayer``) through
``PolicyOptions.hindsight``, and the core never imports the simulator. A backend without one
(``libra-run``: a real run has no future to replay) cannot run the policy, and the registry
says so before any work starts (``libra.policies.registry.check_backend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from libra.planner.plan import Plan
from libra.trace.columnar import StepArrays


class HindsightReplayer(Protocol):
    """Replays a fixed plan over steps of the trace the backend holds, noise off."""

    @property
    def steps(self) -> Sequence[StepArrays]:
        """The whole trace being replayed (what the hindsight search is over)."""
        ...

    def wall_s(self, plan: Plan, steps: Sequence[StepArrays], staleness: int) -> float:
        """Wall time of ``plan`` held fixed for every one of ``steps`` (a subset of ``self.steps``),
        least-loaded routing, no pool, noise off, with the backend's own replay settings (KV mode,
        mini-batches, KL, seed); ``staleness`` is the bound an async ``plan`` runs with. Results
        may be cached by the backend: the same arguments give the same number."""
        ...
