"""At a K >= 1 launch of undeclared kind, the loop class's regret also takes the prior scenarios
stretched to ``LAUNCH_STRETCH`` (issue 22, session 33).

Before: the class of least worst-case regret was taken over the eight prior scenarios (the
default prior, each kind's, each stretched to 1/3). For a 5-step run of a 70B model they agreed on
the time-shared plan (least worst-case regret), the launch ran time-shared and the first measured steps
moved it to a split (18:28), paying the move inside the async pipeline's fill: ToRA GSM8K on 46 H200s
with Llama-3.1-70B at K = 1, 0.786x of areal-static-optimal (held_out_41's worst row; 0.934x
with this change, seen, SIMULATED). The 1/9-stretched scenarios price the time-shared plan at
several times their best.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import make_evaluator
from libra.planner.search import (LAUNCH_STRETCH, UNSETTLED_FIRST_STEP, Planner, SearchOptions, SearchResult, class_prices,
                                  prior_scenarios)
from libra.planner.stats import PriorSpec

#: ToRA GSM8K's first step as a run of undeclared kind sees it: 528 prompts of about 62 tokens
#: (experiments/data/held_out_34), a 5-step run
PROMPTS = np.full(528, 62, np.int64)
CLUSTER = ClusterSpec(46, "h200", "llama-3.1-70b", workload="agent")


def _planner(k: int) -> Planner:
    return Planner(CLUSTER, make_evaluator(CLUSTER), SearchOptions(max_staleness=k, run_steps=5))


def _regrets(runs: list[SearchResult]) -> dict[str, float]:
    """Each loop class's worst-case regret over ``runs`` (what ``hedged_search`` ranks)."""
    prices = [{c: v for c, v in class_prices(r.candidates).items() if c != UNSETTLED_FIRST_STEP} for r in runs]
    classes = [c for c in prices[0] if all(c in p for p in prices)]
    return {c: max(p[c] / min(p.values()) for p in prices) for c in classes}


@pytest.fixture(scope="module")
def scenario_runs() -> tuple[Planner, list[SearchResult], SearchResult]:
    """The prior scenarios' searches (what ``hedged_search`` starts from) and the launch, in the
    memory regime this case was written in (no sequence parallelism, ``tests/conftest.py``'s
    ``without_sequence_parallelism``: with it 46 H200 hold the prior on more splits, and the
    eight long scenarios no longer agree on the time-shared plan)."""
    import cost_models.memory as memory

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory, "SEQUENCE_PARALLEL", False)
        p = _planner(1)
        runs = [p._search((), PROMPTS, None, s, bound=False) for s in prior_scenarios(PriorSpec.of(CLUSTER))]
        return p, runs, p.search([], PROMPTS)


def test_the_short_scenarios_join_only_a_k1_launch(scenario_runs: tuple[Planner, list[SearchResult], SearchResult]) -> None:
    p, runs, res = scenario_runs
    short = p._short_class_runs(runs, PROMPTS, None)
    unstretched = [r for r in runs if r.stats_spec is not None and r.stats_spec.stretch == 1.0]
    assert len(short) == len(unstretched) > 0
    assert all(r.stats_spec is not None and r.stats_spec.stretch == LAUNCH_STRETCH for r in short)
    assert p._short_class_runs(runs, PROMPTS, p.to_plan(res)) == []  # a plan in force
    assert _planner(0)._short_class_runs(runs, PROMPTS, None) == []  # K = 0 (session 20: AgentDojo)


@pytest.mark.usefixtures("without_sequence_parallelism")
def test_a_k1_launch_of_a_70b_short_run_no_longer_goes_time_shared(scenario_runs: tuple[Planner, list[SearchResult], SearchResult]) -> None:
    p, runs, res = scenario_runs
    eight = _regrets(runs)
    twelve = _regrets(runs + p._short_class_runs(runs, PROMPTS, None))
    # the eight long scenarios agree on the time-shared plan; the short ones price it far behind
    assert min(eight, key=eight.__getitem__) == "time-shared"
    assert twelve["time-shared"] > 1.5 and min(twelve, key=twelve.__getitem__) == "async"
    assert res.hedge is not None and set(res.hedge) == set(twelve)
    assert all(res.hedge[c] == pytest.approx(v) for c, v in twelve.items())
    assert not res.best.colocated and res.best.mode == "async"
