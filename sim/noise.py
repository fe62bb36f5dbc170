"""Seeded ground-truth noise: what separates the simulator's "measured" times from the cost model.

The planner predicts with the calibrated cost evaluator; if the simulator used the very same
numbers, every prediction would be exact and the replanning logic could never be exercised. So
each decode interval, prefill, training stage and transfer is multiplied by an independent
lognormal factor ``exp(N(-sigma^2/2, sigma))`` (mean 1, so noise does not bias throughput), with
``sigma = 0.03`` by default, the order of the cost evaluator's measured error (2-7% MAPE).
The draws come from one ``numpy.random.Generator`` seeded by ``--seed``; SimPy processes events
in a deterministic order, so the same seed gives the same replay, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np


class Noise:
    """Multiplicative lognormal noise with mean 1 (``sigma = 0`` disables it).

    ``stream`` separates independent uses of one seed (decode intervals, training, transfers)
    so that adding a draw in one place does not shift every other draw.
    """

    def __init__(self, seed: int, sigma: float = 0.03, stream: int = 0, block: int = 4096) -> None:
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"noise sigma must be a finite number >= 0, got {sigma}")
        self.sigma = sigma
        self._rng = np.random.default_rng([seed, stream])
        self._block = block
        self._buf: list[float] = []
        self._i = 0

    def factor(self) -> float:
        """The next factor (drawn in blocks, for speed, always in the same order)."""
        if self.sigma == 0.0:
            return 1.0
        if self._i >= len(self._buf):
            mu = -self.sigma * self.sigma / 2.0
            self._buf = np.exp(self._rng.normal(mu, self.sigma, self._block)).tolist()
            self._i = 0
        f = self._buf[self._i]
        self._i += 1
        return f
