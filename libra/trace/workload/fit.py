"""Fit a tool-latency mixture (``LatencyModel``) to published summary figures.

Papers report a tool's latency as a few quantiles and a mean, not as a distribution. A body
lognormal plus a slow-tail lognormal has five free numbers, enough to hit five figures exactly;
this is how the ``math`` workload's code-interpreter latency was set from the RollPacker
measurements (workloads.md:41-42).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from libra.errors import UserError


@dataclass(frozen=True)
class MixtureFit:
    """Fitted mixture parameters (``LatencyModel`` field names) and the fit's residual."""

    body_median_s: float
    body_sigma: float
    tail_prob: float
    tail_median_s: float
    tail_sigma: float
    loss: float


def mixture_cdf(x: float, body_median_s: float, body_sigma: float, tail_prob: float, tail_median_s: float,
                tail_sigma: float) -> float:
    """CDF of the two-lognormal mixture at ``x`` seconds."""
    body = stats.norm.cdf(np.log(x / body_median_s) / body_sigma)
    tail = stats.norm.cdf(np.log(x / tail_median_s) / tail_sigma)
    return float((1.0 - tail_prob) * body + tail_prob * tail)


def mixture_quantile(q: float, *params: float) -> float:
    """The ``q`` quantile of the mixture (root of the CDF)."""
    return float(optimize.brentq(lambda x: mixture_cdf(x, *params) - q, 1e-7, 1e5, xtol=1e-12))


def mixture_mean(body_median_s: float, body_sigma: float, tail_prob: float, tail_median_s: float,
                 tail_sigma: float, timeout_s: float) -> float:
    """Mean of ``min(X, timeout_s)``: calls are cut at the timeout, so that is what a trace averages."""

    def capped(median: float, sigma: float) -> float:
        mu = np.log(median)
        a = (np.log(timeout_s) - mu) / sigma
        return float(np.exp(mu + sigma * sigma / 2) * stats.norm.cdf(a - sigma) + timeout_s * stats.norm.sf(a))

    return (1.0 - tail_prob) * capped(body_median_s, body_sigma) + tail_prob * capped(tail_median_s, tail_sigma)


def fit_latency_mixture(quantiles: Mapping[float, float], mean_s: float, timeout_s: float) -> MixtureFit:
    """Least-squares fit (in log space) of the mixture to ``{q: seconds}`` quantiles and a mean.

    Needs at least four quantiles (five figures for five parameters). The quantile of a sample
    maximum is ``1 - 1/n`` for ``n`` measurements.
    """
    if len(quantiles) < 4:
        raise UserError(f"need >= 4 quantiles plus the mean to fit 5 parameters, got {len(quantiles)}")
    for q, v in quantiles.items():
        if not (0.0 < q < 1.0 and v > 0.0):
            raise UserError(f"quantile {q}: {v} s: need 0 < q < 1 and a positive latency")
    if not 0.0 < mean_s < timeout_s:
        raise UserError(f"mean {mean_s} s must be positive and below the timeout {timeout_s} s")
    qs = sorted(quantiles.items())

    def unpack(x: np.ndarray) -> tuple[float, float, float, float, float]:
        return (float(np.exp(x[0])), float(np.exp(x[1])), float(1 / (1 + np.exp(-x[2]))),
                float(np.exp(x[3])), float(np.exp(x[4])))

    # quantiles by linear interpolation of the CDF on a log grid spanning the data 1000x each way
    log_grid = np.linspace(np.log(qs[0][1] / 1e3), np.log(qs[-1][1] * 1e3), 8001)
    q_arr = np.array([q for q, _ in qs])
    v_log = np.log([v for _, v in qs])

    def loss(x: np.ndarray) -> float:
        p = unpack(x)
        cdf = (1.0 - p[2]) * stats.norm.cdf((log_grid - np.log(p[0])) / p[1]) \
            + p[2] * stats.norm.cdf((log_grid - np.log(p[3])) / p[4])
        log_q = np.interp(q_arr, cdf, log_grid)
        err = float(np.sum((log_q - v_log) ** 2))
        return err + float(np.log(mixture_mean(*p, timeout_s) / mean_s) ** 2)

    median = dict(qs).get(0.5, qs[len(qs) // 2][1])
    x0 = np.array([np.log(median), np.log(0.7), -4.0, np.log(qs[-1][1] / 3), np.log(0.6)])
    res = optimize.minimize(loss, x0, method="Nelder-Mead",
                            options={"maxiter": 4000, "xatol": 1e-7, "fatol": 1e-12})
    return MixtureFit(*unpack(res.x), loss=float(res.fun))
