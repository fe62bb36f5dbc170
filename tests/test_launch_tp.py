"""An undeclared kind's async launch takes the rollout TP the prior scenarios agree on (issue 22,
session 32).

Before: the launch split was the scenarios' (``Planner._split_by_regret``), but its rollout layout
was the default prior's, priced in no other scenario (each re-chose its own layout for the split),
and every scenario was longer than the public logs a run of undeclared kind turned out to be. On
38 A100s with Qwen3-8B, Reflexion's first batch launched 18 rollout GPUs at TP 8 x 2, where the
hindsight split runs TP 2 (0.932x of it, held_out_40, SIMULATED). Now the launched degree is the
one of least mean log-regret over the prior scenarios, the ones stretched to ``LAUNCH_STRETCH``
included (``Planner.launch_tp_regrets``), and the split is re-priced at that degree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import make_evaluator
from libra.planner.search import Planner, SearchOptions, SearchResult, loop_class, prior_scenarios
from libra.planner.stats import PriorSpec

#: Reflexion HotpotQA's first step as a run of undeclared kind sees it: 152 prompts of about 1.7K
#: tokens (experiments/data/held_out_29)
PROMPTS = np.full(152, 1686, np.int64)
CLUSTER = ClusterSpec(38, "a100", "qwen3-8b", workload="agent")


def _planner() -> Planner:
    return Planner(CLUSTER, make_evaluator(CLUSTER), SearchOptions(max_staleness=1))


@pytest.fixture(scope="module")
def launched() -> tuple[Planner, SearchResult]:
    p = _planner()
    return p, p.search([], PROMPTS)


def test_the_async_launch_runs_the_degree_of_least_mean_regret_over_the_scenarios(launched: tuple[Planner, SearchResult]) -> None:
    p, res = launched
    best = res.best
    assert loop_class(best) == "async" and len(best.rollout.layout.tps) == 1
    runs = [p._search((), PROMPTS, None, s, bound=False) for s in prior_scenarios(PriorSpec.of(CLUSTER))]
    regrets = p.launch_tp_regrets(best.rollout.n_gpus, p._launch_runs(best, runs, PROMPTS, None))
    assert len(regrets) >= 2 and all(math.isfinite(v) and v >= 0 for v in regrets.values())
    assert best.rollout.layout.tps[0] == min(regrets, key=lambda t: (round(regrets[t], 6), t))


def test_the_default_prior_alone_would_launch_a_larger_degree(launched: tuple[Planner, SearchResult]) -> None:
    p, res = launched
    best = res.best
    # the default prior's own async search, on the same split: its layout is what launched before
    pinned = p._pinned_search("async", PROMPTS, None, PriorSpec.of(CLUSTER), bound=False)
    same = [c for c in pinned.candidates if loop_class(c) == "async" and c.n_train == best.n_train]
    assert same
    assert min(same, key=lambda c: c.rank()).rollout.layout.tps[0] > best.rollout.layout.tps[0]


def test_a_plan_in_force_or_a_time_shared_plan_is_left_as_it_is(launched: tuple[Planner, SearchResult]) -> None:
    p, res = launched
    cands = list(res.candidates)
    co = [c for c in cands if c.colocated]
    for c in co[:1] + [res.best]:
        current = p.to_plan(res) if c is res.best else None
        if current is None and not c.colocated:
            continue
        kept, _ = p._launch_rollout_tp(c, cands, [], PROMPTS, current, PriorSpec.of(CLUSTER))
        assert kept is c


def test_a_degree_whose_instance_cannot_hold_what_the_run_may_bring_is_not_launched(launched: tuple[Planner, SearchResult]) -> None:
    p, res = launched
    runs = [p._search((), PROMPTS, None, s, bound=False) for s in prior_scenarios(PriorSpec.of(CLUSTER))[:2]]
    free = p.launch_tp_regrets(res.best.rollout.n_gpus, runs)
    hold = int(p.table.kv_capacity[1]) + 1  # one token more than a TP-1 instance holds
    held = p.launch_tp_regrets(res.best.rollout.n_gpus, runs, hold)
    assert 1 in free and 1 not in held
    assert set(held) == {t for t in free if p.table.kv_capacity[t] >= hold}
