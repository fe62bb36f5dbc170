"""A time-shared plan may train on fewer GPUs than it rolls out on (issue 22, session 31).

Before: the time-shared candidate trained on every GPU the backend can use or was not priced.
On 44 A800s no Qwen3-32B strategy on all 44 (TP at most 4 divides them) holds the 64K-token
sequences of an undeclared kind's default prior, while 40 GPUs (TP 8 x DP 5) do. The time-shared
class then had no price in that scenario, dropped out of the launch hedge, and the K = 1 launch
ran an async split that the measured steps moved to time-shared at step 2 (InterCode SQL and
MINT: 0.934x and 0.944x of verl-colocated, held_out_39, SIMULATED). Now the time-shared plan
trains on the most GPUs below the cap whose strategy holds the step, and the engines on the
GPUs it leaves out get the weights pushed, a cost the planner and the simulator share
(``StepCosts.colocated_sync_s``).
"""

from __future__ import annotations

import pytest

import numpy as np

from libra.cluster import ClusterSpec
from libra.export.fit import inexpressible, restricted
from libra.export.nemo_rl import CAPABILITIES as NEMO_RL
from libra.planner.costs import make_evaluator
from libra.planner.decision_tree import fits_in_memory
from libra.planner.plan import RolloutInstance
from libra.planner.search import Planner, SearchOptions, loop_class
from libra.planner.stats import PriorSpec
from libra.planner.step_costs import StepCosts

PROMPTS = np.full(256, 900, np.int64)
CLUSTER = ClusterSpec(44, "a800", "qwen3-32b", workload="agent")


def p_spec(p: Planner) -> PriorSpec:
    return PriorSpec.of(p.cluster)


def _planner(subset: bool = True, k: int = 1) -> Planner:
    return Planner(CLUSTER, make_evaluator(CLUSTER), SearchOptions(max_staleness=k, colocated_subset=subset))


@pytest.mark.usefixtures("without_sequence_parallelism")
def test_the_default_prior_prices_a_time_shared_plan_on_fewer_gpus_when_all_of_them_hold_nothing() -> None:
    p = _planner()
    nominal = p._search((), PROMPTS, None, p_spec(p), bound=False)
    co = [c for c in nominal.candidates if c.colocated]
    assert co, "the time-shared plan must be priced in the default prior's scenario"
    c = co[0]
    assert c.n_train < CLUSTER.n_gpus and c.train.n_gpus == c.n_train
    _, _, seq_max = p.train_shape(nominal.stats)
    assert fits_in_memory(p.ev, c.train, seq_max)
    # every GPU still rolls out
    assert c.rollout.n_gpus == CLUSTER.n_gpus
    # without the fallback (a framework's colocated mode), nothing on all 44 holds it: no candidate
    q = _planner(subset=False)
    assert not [c for c in q._search((), PROMPTS, None, p_spec(q), bound=False).candidates if c.colocated]


def test_the_launch_hedge_then_prices_time_shared_in_every_scenario() -> None:
    res = _planner().search([], PROMPTS)
    assert "time-shared" in res.hedge
    assert res.hedge[loop_class(res.best)] == min(res.hedge.values())


@pytest.mark.usefixtures("without_sequence_parallelism")
def test_engines_outside_the_trainer_get_the_weights_pushed() -> None:
    p = _planner()
    co = next(c for c in p._search((), PROMPTS, None, p_spec(p), bound=False).candidates if c.colocated)
    sc = StepCosts(p.ev, CLUSTER.gpus_per_node)
    # the 5.5-node cluster's last four GPUs as one TP-4 engine, off the trainer's 40
    inside = tuple(i for i in co.rollout.instances if i.node * CLUSTER.gpus_per_node + i.first_gpu + i.tp <= co.n_train)
    outside = (RolloutInstance(id=99, tp=4, bucket=0, node=5, first_gpu=0),)
    assert inside and co.n_train <= 40
    push = sc.weight_sync_s(co.train, outside, tuple(range(co.n_train)))
    assert push > 0.0
    assert sc.colocated_sync_s(co.train, outside) == push  # no IPC for engines off the trainer's GPUs
    assert sc.colocated_sync_s(co.train, inside + outside) == sc.colocated_sync_s(co.train, inside) + push


def test_a_framework_export_cannot_say_a_subset_and_the_restricted_search_never_makes_one() -> None:
    p = _planner(k=0)
    res = p.search([], PROMPTS)
    plan = p.to_plan(res)
    if plan.colocated and plan.n_train_gpus < plan.n_rollout_gpus:
        assert any("training on" in w for w in inexpressible(plan, NEMO_RL, CLUSTER.n_gpus, CLUSTER.gpus_per_node))
    r = restricted(p, NEMO_RL)
    assert not r.options.colocated_subset
    for c in r._search((), PROMPTS, None, p_spec(r), bound=False).candidates:
        assert not c.colocated or c.n_train == CLUSTER.train_gpu_cap
