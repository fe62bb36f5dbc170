"""libra-run's rollout stage carries out the same work-conserving decisions as the simulator
(issue 11, cause 1): work routed to the short bucket runs on the long bucket's idle instance too,
and an idle instance pulls what another's queue holds. Local Ray, fake engines (no model)."""

from __future__ import annotations

import pytest

from runtime_markers import needs_ray

pytestmark = needs_ray


@pytest.fixture(scope="module")
def ray_local():  # type: ignore[no-untyped-def]
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _fake_engine(ray):  # type: ignore[no-untyped-def]
    @ray.remote
    class FakeEngine:
        """Answers every turn with one token after ``delay`` seconds (the batch's wall time)."""

        def __init__(self, delay: float) -> None:
            self.delay = delay

        def generate(self, requests):  # type: ignore[no-untyped-def]
            import time

            from libra.runtime.engines.base import TurnResult

            time.sleep(self.delay)
            return [TurnResult(r.traj_id, (7,), (0.0,), "stop", len(r.context), 0, 0.0, self.delay, extra={"call_s": self.delay}) for r in requests]

        def prefill(self, traj_id, context):  # type: ignore[no-untyped-def]
            return len(context), 0.0

        def drop(self, traj_ids):  # type: ignore[no-untyped-def]
            return 0

    return FakeEngine


def test_short_work_runs_on_the_long_buckets_instance_too(ray_local) -> None:  # type: ignore[no-untyped-def]
    from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
    from libra.runtime.episode import Episode
    from libra.runtime.rollout import Instance, Rollout
    from libra.runtime.tasks import TaskSet
    from libra.scheduling.cmlfq import CMLFQScheduler
    from libra.scheduling.history_model import RemainingWorkModel

    plan = Plan(2, 1, TrainConfig(1, 1, 1), (RolloutInstance(0, 1, 0, 0, 0), RolloutInstance(1, 1, 1, 0, 1)),
                (Bucket(0, 1, 0, 4000), Bucket(1, 1, 4000, None)))
    engine = _fake_engine(ray_local)
    insts = {i: Instance(i, 1, i, 0, engine.remote(0.05)) for i in (0, 1)}
    tasks = TaskSet({"math": 1}, seed=0).batch(0, 12)
    eps = [Episode(f"t{k}", 0, f"g{k // 4}", tasks[k], list(range(1, 21)), max_tool_calls=2, max_new_tokens=8, max_context=512)
           for k in range(12)]
    sched = CMLFQScheduler(plan, RemainingWorkModel())  # routes every short trajectory to bucket 0
    res = Rollout(plan, insts, None, sched, lambda toks: "<answer>1</answer>", lambda s: [1], max_batch=2).run(eps)
    assert all(e.done for e in res.episodes)
    assert res.admitted_by_bucket == {0: 12}
    # before: instance 1 (bucket 1) never ran a turn while instance 0 worked through 6 batches
    assert res.engine_busy_s.get(0, 0.0) > 0 and res.engine_busy_s.get(1, 0.0) > 0, res.engine_busy_s
