"""Elastic pool decisions and the join-state accounting behind the consistency protocol."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_scheduling_cmlfq import two_bucket_plan

from cost_models import CostEvaluator
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.pool.base import InstanceState, PoolObservation, RoleChange
from libra.pool.consistency import join_transfer, leave_transfer, nonblocking_join_delay_s, sync_join_pause_s
from libra.pool.elastic import ElasticPool


def plan3(mode: str = "async", predicted: float = 600.0, train: float = 2000.0) -> Plan:
    inst = (RolloutInstance(0, 2, 0, 0, 0), RolloutInstance(1, 2, 0, 0, 2), RolloutInstance(2, 2, 0, 0, 4), RolloutInstance(3, 4, 1, 1, 0))
    return Plan(n_rollout_gpus=10, n_train_gpus=6, train=TrainConfig(2, 1, 3, zero_stage=3), instances=inst,
                buckets=(Bucket(0, 2, 0, 8000), Bucket(1, 4, 8000, None)), mode=mode, max_staleness=1,  # type: ignore[arg-type]
                predicted_rollout_s=predicted, predicted_train_s=train)


def pobs(now: float, idle: dict[int, float | None], unfinished: int = 10, training: bool = True) -> PoolObservation:
    states = tuple(
        InstanceState(i, 4 if i == 3 else 2, 0 if i < 3 else 1, 0 if idle.get(i) is not None else 5, 0, idle.get(i))
        for i in range(4)
    )
    return PoolObservation(now, 0.0, states, unfinished, 2, training, 6)


@pytest.fixture(scope="module")
def ev() -> CostEvaluator:
    return CostEvaluator(gpu="a800", model="qwen3-14b")


def test_idle_instances_are_lent_when_it_pays(ev: CostEvaluator) -> None:
    pool = ElasticPool(plan3(), ev=ev)
    rt = pool.round_trip_s(2)
    assert rt > 0
    out = pool.on_rollout_progress(pobs(100.0, {0: 50.0, 1: 60.0}))
    # both idle instances of bucket 0 may go, but one of the bucket's instances must stay:
    # instance 2 is busy, so both 0 and 1 are lent (longest idle first)
    assert out == [RoleChange(0, "nonblocking"), RoleChange(1, "nonblocking")]
    assert pool.on_rollout_progress(pobs(101.0, {0: 50.0, 1: 60.0})) == []  # already lent


def test_last_instance_of_a_bucket_stays(ev: CostEvaluator) -> None:
    pool = ElasticPool(plan3(), ev=ev)
    out = pool.on_rollout_progress(pobs(100.0, {0: 50.0, 1: 50.0, 2: 50.0, 3: 50.0}))
    lent = {c.instance for c in out}
    assert lent == {0, 1}  # one of bucket 0's kept (instance 2), bucket 1's only instance kept


def test_no_move_when_it_would_not_pay_or_nothing_to_join(ev: CostEvaluator) -> None:
    # the predicted rollout is nearly over: the round trip would not pay
    pool = ElasticPool(plan3(predicted=100.0), ev=ev)
    assert pool.on_rollout_progress(pobs(99.0, {0: 50.0})) == []
    # asynchronous plan whose training ends before the rollout: extra training GPUs gain nothing
    pool = ElasticPool(plan3(predicted=600.0, train=300.0), ev=ev)
    assert pool.on_rollout_progress(pobs(100.0, {0: 50.0})) == []
    # synchronous plan and no training running: nobody to join
    pool = ElasticPool(plan3(mode="sync"), ev=ev)
    assert pool.on_rollout_progress(pobs(100.0, {0: 50.0}, training=False)) == []
    assert pool.on_rollout_progress(pobs(100.0, {0: 50.0}, training=True)) == [RoleChange(0, "nonblocking")]
    # a just-emptied instance waits out the grace period; a finished rollout lends nothing
    pool = ElasticPool(plan3(), ev=ev, grace_s=5.0)
    assert pool.on_rollout_progress(pobs(100.0, {0: 98.0})) == []
    assert pool.on_rollout_progress(pobs(100.0, {0: 50.0}, unfinished=0)) == []
    # colocated plans never lend
    assert ElasticPool(replace(plan3(), colocated=True), ev=ev).on_rollout_progress(pobs(100.0, {0: 50.0})) == []


def test_sync_join_mode_is_passed_through(ev: CostEvaluator) -> None:
    pool = ElasticPool(plan3(), ev=ev, join="sync")
    assert pool.on_rollout_progress(pobs(100.0, {0: 50.0})) == [RoleChange(0, "sync")]


def test_join_transfer_bytes_per_optimizer_and_zero_stage() -> None:
    P = 1e9
    # ZeRO-0: a full replica of weights, master weights and optimizer state
    assert join_transfer("adam", 0, P, 3, 4).total == pytest.approx(P * (2 + 4 + 8))
    assert join_transfer("sgd", 0, P, 3, 4).total == pytest.approx(P * (2 + 4))
    # ZeRO-1: full bf16 weights, a 1/dp_new shard of master + state
    assert join_transfer("momentum", 1, P, 3, 4).total == pytest.approx(P * 2 + P * 8 / 4)
    # ZeRO-2 mid mini-batch: plus the accumulated gradient shard
    assert join_transfer("adam", 2, P, 3, 4).grad_handover == pytest.approx(P * 4 / 4)
    assert join_transfer("adam", 2, P, 3, 4, mid_minibatch=False).grad_handover == 0
    # ZeRO-3: everything sharded
    assert join_transfer("adam", 3, P, 3, 4).weights == pytest.approx(P * 2 / 4)
    assert "adam step count" in join_transfer("adam", 1, P, 1, 2).scalars
    assert leave_transfer("adam", 3, P, 4, 3) == pytest.approx(P * 14 / 4)
    with pytest.raises(ValueError):
        join_transfer("adam", 1, P, 4, 4)


def test_sync_join_stalls_and_nonblocking_does_not() -> None:
    t = join_transfer("adam", 1, 14e9 / 2, 3, 4)
    pause = sync_join_pause_s(t, 25e9)
    stall, delay = nonblocking_join_delay_s(t, 25e9, microbatch_s=2.0)
    assert pause > 5.0 and stall == 0.0
    assert delay >= t.total / 25e9 and delay % 2.0 == pytest.approx(0.0)


def test_two_bucket_plan_fixture_is_a_valid_pool_input(ev: CostEvaluator) -> None:
    assert ElasticPool(two_bucket_plan(), ev=ev).round_trip_s(1) > 0
