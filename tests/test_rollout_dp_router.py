"""The rollout DP's load model follows the work-conserving router (issue 11, cause 4).

Before: the DP charged each bucket only its own context range's work and built two buckets of
the same TP (e.g. TP4 below 724 tokens + TP4 above): in replay the router spills short work onto
the long bucket, so such a plan ran as one bucket plus hundreds of floor-move migrations, and
was slower than one bucket.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import make_evaluator
from libra.planner.rollout_dp import HETERO_MARGIN, BucketLayout
from libra.planner.search import Planner
from libra.planner.stats import compute_stats, default_prior_step


@pytest.fixture(scope="module")
def planner() -> Planner:
    cl = ClusterSpec(48, "a800", "qwen3-14b")
    return Planner(cl, make_evaluator(cl))


def _dp(planner: Planner, n: int, cap: int):  # type: ignore[no-untyped-def]
    h = default_prior_step(n, cap=cap)  # used as a COMPLETED step here (history), not as a prior
    return planner.rollout_dp(compute_stats([h], h.prompt_tokens))


def test_no_layout_has_two_buckets_of_one_tp(planner: Planner) -> None:
    dp = _dp(planner, 4096, 4096)
    assert all(len(set(l.tps)) == len(l.tps) for l in dp.layouts())
    choice = dp.best(24)
    assert choice is not None and len(set(choice.layout.tps)) == len(choice.layout.tps)  # before: (4, 4) at 724


def test_short_bucket_work_spills_onto_the_long_bucket(planner: Planner) -> None:
    dp = _dp(planner, 8192, 4096)
    c = next(c for c in dp._all_curves() if c.layout == BucketLayout((2, 8), (1024,)))
    m1, m2 = np.array([4]), np.array([1])
    l1, l2 = float(c.load[0][3]), float(c.load[1][0])
    assert l1 > l2  # the short bucket is the bottleneck on its own
    pooled = (l1 * 4 * 2 + l2 * 1 * 8) / (4 * 2 + 1 * 8)
    assert float(dp.spill_load(c, m1, m2)[0]) == pytest.approx(pooled)
    assert dp.objective(c, (4, 1))[1] == pytest.approx(pooled)
    # the long bucket as the bottleneck: nothing moves down, its own load stands
    big = len(c.load[0])
    if float(c.load[0][big - 1]) <= l2:
        assert float(dp.spill_load(c, np.array([big]), np.array([1]))[0]) == pytest.approx(l2)


def test_two_buckets_only_when_they_win_by_the_margin(planner: Planner) -> None:
    for n, cap in ((4096, 4096), (8192, 4096), (2048, 16384)):
        dp = _dp(planner, n, cap)
        for G in (16, 24, 32, 48):
            choice = dp.best(G)
            assert choice is not None
            if len(choice.buckets) == 2:
                singles = [r[0] for c in dp._all_curves() if len(c.layout.tps) == 1 and (r := dp._best_counts(c, G)) is not None]
                assert choice.makespan_s * (1 + HETERO_MARGIN) <= min(singles) + 1e-9
