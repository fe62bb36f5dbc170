"""Vectorized random distributions shared by the workload models.

Every function takes an explicit ``numpy.random.Generator`` (PCG64, seeded by the caller) and
returns arrays, so a whole batch of trajectories is drawn in one call. The shapes used here are
the ones agentic traces show: lognormal bodies with a rare Pareto tail (token counts, where the
p99 is about 10x the median), and tool latencies as a lognormal body plus a slow-tail component
plus hung calls cut at the tool's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: z-score of the 99th percentile of a standard normal; ``exp(Z99 * sigma)`` is a lognormal's p99/p50.
Z99 = 2.3263478740408408


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, used to turn latent scores into probabilities."""
    return 1.0 / (1.0 + np.exp(-x))


def lognormal(rng: np.random.Generator, median: np.ndarray | float, sigma: float, size: int) -> np.ndarray:
    """Lognormal draws given the median (not the mean): medians are what traces report."""
    return np.asarray(median, np.float64) * np.exp(sigma * rng.standard_normal(size))


def pareto_tail_mult(rng: np.random.Generator, prob: float, alpha: float, size: int) -> np.ndarray:
    """Multipliers that are 1 except, with probability ``prob``, a Pareto(``alpha``) draw >= 1.

    Multiplying a lognormal body by these gives the rare very long generations (runaway
    reasoning, huge file dumps) that a lognormal alone under-produces.
    """
    mult = np.ones(size)
    if prob <= 0.0 or size == 0:
        return mult
    hit = rng.random(size) < prob
    k = int(hit.sum())
    if k:
        mult[hit] = (1.0 - rng.random(k)) ** (-1.0 / alpha)
    return mult


def round_tokens(x: np.ndarray, low: int, high: int) -> np.ndarray:
    """Discretize continuous token draws to integers in ``[low, high]``."""
    return np.clip(np.rint(x), low, high).astype(np.int64)


@dataclass(frozen=True)
class LatencyModel:
    """A tool's wall-time distribution: body, slow tail, hung calls, and a hard timeout.

    A call hangs with probability ``hang_prob`` and is killed at ``timeout_s`` (outcome
    ``timeout``). Otherwise its latency is lognormal(``body_median_s``, ``body_sigma``), or with
    probability ``tail_prob`` lognormal(``tail_median_s``, ``tail_sigma``); any draw at or above
    ``timeout_s`` is also a timeout. ``floor_s`` is the fixed overhead no call beats.
    """

    body_median_s: float
    body_sigma: float
    tail_prob: float
    tail_median_s: float
    tail_sigma: float
    hang_prob: float
    timeout_s: float
    floor_s: float = 0.0

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(latency_s, timed_out)`` for ``size`` calls."""
        lat = lognormal(rng, self.body_median_s, self.body_sigma, size)
        tail = rng.random(size) < self.tail_prob
        k = int(tail.sum())
        if k:
            lat[tail] = lognormal(rng, self.tail_median_s, self.tail_sigma, k)
        lat = np.maximum(lat, self.floor_s)
        hung = rng.random(size) < self.hang_prob
        timed_out = hung | (lat >= self.timeout_s)
        lat[timed_out] = self.timeout_s
        return lat, timed_out
