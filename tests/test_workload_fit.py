"""The code-interpreter latency model reproduces the published figures it was fitted to."""

from __future__ import annotations

import numpy as np
import pytest

from libra.errors import UserError
from libra.trace.workload import make_params
from libra.trace.workload.distributions import LatencyModel
from libra.trace.workload.fit import fit_latency_mixture, mixture_mean, mixture_quantile

#: workloads.md:41-42 (RollPacker, 2,001 KodCode prompts); the max read as the 1 - 1/2001 quantile.
PUBLISHED = {0.5: 0.031, 0.9: 0.078, 0.99: 9.1, 1 - 1 / 2001: 21.0}
PUBLISHED_MEAN = 0.27


def _mixture(p) -> tuple[float, ...]:
    return (p.lat_body_median_s, p.lat_body_sigma, p.lat_tail_prob, p.lat_tail_median_s, p.lat_tail_sigma)


def test_math_defaults_hit_the_published_figures_analytically():
    p = make_params("math")
    for q, v in PUBLISHED.items():
        assert mixture_quantile(q, *_mixture(p)) == pytest.approx(v, rel=2e-3)
    assert mixture_mean(*_mixture(p), p.lat_timeout_s) == pytest.approx(PUBLISHED_MEAN, rel=2e-3)


def test_fit_recovers_the_math_defaults():
    fit = fit_latency_mixture(PUBLISHED, PUBLISHED_MEAN, timeout_s=30.0)
    assert fit.loss < 1e-8
    np.testing.assert_allclose(
        (fit.body_median_s, fit.body_sigma, fit.tail_prob, fit.tail_median_s, fit.tail_sigma),
        _mixture(make_params("math")), rtol=1e-3)


def test_sampled_latencies_match_the_published_quantiles():
    p = make_params("math")
    lat, timed_out = p.latency.sample(np.random.default_rng(0), 400_000)
    assert np.percentile(lat, 50) == pytest.approx(0.031, rel=0.03)
    assert np.percentile(lat, 90) == pytest.approx(0.078, rel=0.03)
    assert np.percentile(lat, 99) == pytest.approx(9.1, rel=0.08)
    assert lat.mean() == pytest.approx(0.27, rel=0.05)
    assert lat.max() <= 30.0 and timed_out.mean() < 1e-4


def test_hung_calls_end_at_the_timeout():
    m = LatencyModel(body_median_s=1.0, body_sigma=0.5, tail_prob=0.0, tail_median_s=1.0, tail_sigma=0.5,
                     hang_prob=0.1, timeout_s=60.0, floor_s=0.05)
    lat, timed_out = m.sample(np.random.default_rng(1), 100_000)
    assert timed_out.mean() == pytest.approx(0.1, abs=0.01)
    assert (lat[timed_out] == 60.0).all() and (lat[~timed_out] < 60.0).all() and lat.min() >= 0.05


def test_fit_rejects_too_few_figures():
    with pytest.raises(UserError, match=">= 4 quantiles"):
        fit_latency_mixture({0.5: 0.03, 0.9: 0.08}, 0.27, 30.0)
    with pytest.raises(UserError, match="below the timeout"):
        fit_latency_mixture(PUBLISHED, 40.0, 30.0)
