"""Training memory holds the longest context a run may bring, for Libra and the baselines alike.

Before: the static baselines checked training memory at their length prior's longest sequence
(~7K tokens on a run declaring a 16,384-token limit), so verl-static-uniform trained with TP 1 and
no recompute while the trace's sequences reached 16K: a strategy no real run could hold (the
simulator charges no OOM), 130 s per step against 157 s for one that holds 16K, and a 4.6% "loss"
for Libra on the never-lose grid that was the baseline's missing memory (SIMULATED).
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import make_evaluator
from libra.planner.decision_tree import DecisionTree, memory_report
from libra.planner.search import Planner, SearchOptions, declared_context
from libra.policies import POLICIES


def test_the_declared_limit_is_held_when_some_strategy_holds_it() -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b", max_context=16384, workload="swe")
    tree = DecisionTree(make_evaluator(cl), 8)
    assert tree.memory_length(8, 1 << 20, 8192, 7000, 16384) == 16384
    assert tree.memory_length(8, 1 << 20, 8192, 20000, 16384) == 20000  # longer seen: the seen one
    assert tree.memory_length(8, 1 << 20, 8192, 7000, None) == 7000
    big = ClusterSpec(8, "a800", "qwen3-32b")
    # nothing on 2 GPUs holds a 32B model's 1M-token context: the seen length stands
    assert DecisionTree(make_evaluator(big), 8).memory_length(2, 1 << 20, 8192, 4096, 1 << 20) == 4096
    assert declared_context(cl) == 16384 and declared_context(big) is None


@pytest.mark.parametrize("policy", ["verl-static-uniform", "verl-colocated"])
def test_a_baselines_training_strategy_holds_the_declared_limit(policy: str) -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b", max_context=16384, workload="swe")
    ev = make_evaluator(cl)
    plan = POLICIES[policy](cl, max_staleness=1).plan(cl, [], np.full(128, 1500, np.int64))
    assert memory_report(ev, plan.train, 16384).fits, plan.train


def test_libras_training_strategy_holds_the_declared_limit() -> None:
    cl = ClusterSpec(16, "a800", "qwen3-8b", max_context=16384, workload="search")
    ev = make_evaluator(cl)
    plan = Planner(cl, ev, SearchOptions(max_staleness=1)).plan([], np.full(128, 200, np.int64))
    assert memory_report(ev, plan.train, 16384).fits, plan.train
