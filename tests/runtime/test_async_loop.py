"""The asynchronous loop of ``libra-run`` (issue 20): staleness K >= 1.

Pure parts first (no Ray): the staleness rules and the train-once ledger (``staleness``), the
training pipeline's gate (a stale sample never reaches the updater), the trainer's own gate, the
decoupled-PPO loss pieces (``grpo``) and the per-turn versions an ``Episode`` records. Then two
real runs on CPU workers (torch engine and trainer, the bundled tiny policy): K=1 for 3 steps on
2 devices with a trainer rank killed mid-update and a rollout worker killed mid-rollout (every
trajectory trained exactly once, none staler than K, versions recorded in ``steps.csv`` and the
trace, the fidelity replay run with the same K). That async steps make the same decisions in
``libra-run`` and the simulator is ``test_decisions_match.py``'s second test.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from libra.runtime.grpo import Sample, behaviour_targets, behaviour_weights, grpo_loss
from libra.runtime.staleness import (StalenessError, TrainLedger, check_fresh, required_version, rollout_may_start, sample_version,
                                     version_stats)
from runtime_markers import needs_ray, needs_torch


# ---- the rules ----------------------------------------------------------------------------------
def test_rollout_waits_for_the_weights_of_step_j_minus_1_minus_k() -> None:
    # K=1: rollout 2 needs the update of step 0 synced (version 1), not step 1's
    assert required_version(2, 1) == 1 and not rollout_may_start(2, 0, 1) and rollout_may_start(2, 1, 1)
    assert rollout_may_start(0, 0, 1) and rollout_may_start(1, 0, 1)  # the first K+1 rollouts start on the model folder's
    assert required_version(5, 2) == 3 and not rollout_may_start(5, 2, 2)
    assert required_version(3, 0) == 3  # on-policy: every earlier update first


def test_gate_refuses_a_sample_older_than_the_bound_and_one_from_the_future() -> None:
    check_fresh(3, 3, 1, {"a": 2, "b": 3})  # staleness 1 and 0 under K=1
    with pytest.raises(StalenessError, match="older than the staleness bound.*e.g. a of version 1"):
        check_fresh(3, 3, 1, {"a": 1, "b": 3})
    with pytest.raises(StalenessError, match="newer than the trainer"):
        check_fresh(3, 3, 1, {"a": 4})
    check_fresh(3, 3, 1, {"a": 4}, allow_newer=True)
    assert sample_version([2, 2, 3]) == 2 and sample_version([]) == 0


def test_version_stats_and_the_train_once_ledger() -> None:
    vs = version_stats(4, [[3, 4], [4], [3]])
    assert (vs.policy_version, vs.sample_version_min, vs.sample_version_max, vs.staleness_max, vs.mixed_trajectories) == (4, 3, 4, 1, 1)
    assert vs.staleness_mean == pytest.approx(2 / 3)
    led = TrainLedger()
    led.rolled(["a", "b", "c"])
    led.mark(0, ["a", "b"])
    assert led.untrained() == ["c"]
    with pytest.raises(StalenessError, match="already trained in step 0"):
        led.mark(1, ["b"])
    with pytest.raises(StalenessError, match="never rolled out"):
        led.mark(1, ["z"])
    with pytest.raises(StalenessError, match="twice"):
        led.mark(1, ["c", "c"])


# ---- the pipeline's gate: a stale sample never reaches the trainer -------------------------------
class _Actors:
    def __init__(self) -> None:
        self.version = 0


class _Updater:
    """Trains instantly: the weights' version goes up by one per update (as a sync does)."""

    def __init__(self, actors: _Actors, delay_s: float = 0.0) -> None:
        self.actors, self.delay_s = actors, delay_s
        self.trained: list[int] = []

    def train(self, plan: Any, samples: list[Sample], step: int, max_staleness: int | None = None) -> tuple[dict[str, float], float]:
        time.sleep(self.delay_s)
        self.trained.append(step)
        self.actors.version += 1
        return {"train_s": self.delay_s, "logprob_s": 0.0, "tokens": 1.0}, 0.0


def _job(step: int, versions: dict[str, int], k: int = 1) -> Any:
    from libra.runtime.async_loop import TrainJob

    samples = [Sample((1, 2, 3), (0, 1, 1), 0.5, version=v, traj_id=t) for t, v in versions.items()]
    return TrainJob(step, None, samples, {t: [v] for t, v in versions.items()}, k)  # type: ignore[arg-type]


def _pipeline(updater: _Updater, actors: _Actors) -> Any:
    from libra.runtime.async_loop import TrainingPipeline

    return TrainingPipeline(updater, actors, lambda step: 0.0, time.perf_counter, log=lambda m: None)


def test_pipeline_trains_in_order_and_refuses_a_stale_job_before_training_it() -> None:
    actors = _Actors()
    up = _Updater(actors, delay_s=0.05)
    pipe = _pipeline(up, actors)
    try:
        pipe.submit(_job(0, {"s0-a": 0, "s0-b": 0}))
        pipe.submit(_job(1, {"s1-a": 0, "s1-b": 1}))  # staleness 1 of K=1 at trainer version 1: fine
        assert pipe.wait_version(1) >= 0 and actors.version >= 1
        pipe.drain()
        done = pipe.take_done()
        assert [d.step for d in done] == [0, 1] and up.trained == [0, 1] and actors.version == 2
        assert [d.versions.staleness_max for d in done] == [0, 1] and done[1].version_after == 2
        assert pipe.ledger.untrained() == [] and len(pipe.ledger.trained) == 4
        # a sample of version 0 at trainer version 2 under K=1: refused, and the updater never sees it
        pipe.submit(_job(2, {"s2-a": 0, "s2-b": 2}))
        with pytest.raises(StalenessError, match="step 2: 1 sample"):
            pipe.drain()
        assert up.trained == [0, 1] and actors.version == 2 and pipe.ledger.untrained() == ["s2-a", "s2-b"]
    finally:
        pipe.close()


def test_pipeline_wait_blocks_until_the_version_is_synced() -> None:
    actors = _Actors()
    pipe = _pipeline(_Updater(actors, delay_s=0.3), actors)
    try:
        pipe.submit(_job(0, {"a": 0}))
        assert actors.version == 0
        waited = pipe.wait_version(1)
        assert actors.version == 1 and waited > 0.1
        assert pipe.wait_version(5) < 0.5  # nothing left to train: returns (the caller's rule then refuses)
    finally:
        pipe.close()
    assert not any(t.name == "libra-async-train" and t.is_alive() for t in threading.enumerate())


@needs_torch
def test_trainer_refuses_a_sample_staler_than_its_own_count() -> None:
    from libra.runtime.tiny_model import model_dir
    from libra.runtime.trainer import Learner

    ln = Learner(model_dir(None), lr=1e-3, mini_batches=1, seed=0)
    ids = (1, 5, 6, 7, 2)
    ln.step_done = 3
    with pytest.raises(StalenessError, match="older than the staleness bound"):
        ln.train_step([Sample(ids, (0, 1, 1, 1, 1), 1.0, (0.0, -1.0, -1.0, -1.0, -1.0), version=1, traj_id="old")], max_staleness=1)
    assert ln.step_done == 3  # refused before any optimizer step
    st = ln.train_step([Sample(ids, (0, 1, 1, 1, 1), 1.0, (0.0, -1.0, -1.0, -1.0, -1.0), version=2, traj_id="ok")], max_staleness=1)
    assert ln.step_done == 4 and st["version"] == 4.0 and 0 < st["behav_weight"] <= ln.behaviour_cap


@needs_torch
def test_behaviour_logprobs_of_the_proximal_policy_give_the_on_policy_update() -> None:
    """Alignment check: a sample whose behaviour log-probs are the trainer's own (an engine on the
    same weights) gets weight 1 on every token, so its update equals the on-policy one; a sample
    whose behaviour policy made its tokens likelier gets weights < 1."""
    import torch

    from libra.runtime.grpo import token_logprobs
    from libra.runtime.tiny_model import model_dir
    from libra.runtime.trainer import Learner

    ids = (1, 5, 6, 7, 2, 9, 4)
    mask = (0, 0, 1, 1, 0, 1, 1)
    a, b = (Learner(model_dir(None), lr=1e-2, mini_batches=1, seed=0) for _ in range(2))
    with torch.no_grad():
        lp = token_logprobs(a.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].tolist()
    own = tuple([0.0] + [v if m else 0.0 for v, m in zip(lp, mask[1:])])
    st = a.train_step([Sample(ids, mask, 1.0, own, version=0, traj_id="x")], max_staleness=1)
    b.train_step([Sample(ids, mask, 1.0)])
    assert st["behav_weight"] == pytest.approx(1.0, abs=1e-5) and st["behav_truncated"] == 0.0
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)
    with torch.no_grad():  # the proximal policy now: the weights after that update
        lp = token_logprobs(a.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].tolist()
    likelier = tuple([0.0] + [v + 0.5 if m else 0.0 for v, m in zip(lp, mask[1:])])
    st2 = a.train_step([Sample(ids, mask, 1.0, likelier, version=1, traj_id="y")], max_staleness=1)
    assert st2["behav_weight"] == pytest.approx(float(np.exp(-0.5)), rel=1e-4)


# ---- decoupled PPO -------------------------------------------------------------------------------
def test_behaviour_weights_are_aligned_truncated_and_neutral_on_policy() -> None:
    import torch

    s = Sample((1, 2, 3, 4), (0, 1, 0, 1), 1.0, (0.0, -0.5, 0.0, -2.0))
    b = behaviour_targets([s, Sample((1, 2), (0, 1), 0.0)], 4)
    assert b.tolist() == [[-0.5, 0.0, -2.0], [0.0, 0.0, 0.0]]  # target-aligned like collate's loss mask
    assert behaviour_targets([Sample((1, 2), (0, 1), 0.0)], 2) is None  # on-policy samples: no weights
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    prox = torch.tensor([[-0.5, -9.0, 0.0]])
    w, st = behaviour_weights(prox, b[:1], mask, cap=2.0)
    assert w.tolist()[0][0] == pytest.approx(1.0) and w.tolist()[0][1] == 1.0 and w.tolist()[0][2] == pytest.approx(2.0)
    assert st["behav_truncated"] == pytest.approx(0.5) and st["behav_weight"] == pytest.approx(1.5)
    # weight 1 everywhere is the plain GRPO loss; a weight scales each token's surrogate
    logp = torch.tensor([[-0.4, -1.0, -0.1]], requires_grad=True)
    adv = torch.tensor([1.0])
    plain, _ = grpo_loss(logp, prox, mask, adv)
    ones, _ = grpo_loss(logp, prox, mask, adv, weight=torch.ones(1, 3))
    halved, _ = grpo_loss(logp, prox, mask, adv, weight=torch.full((1, 3), 0.5))
    assert plain.item() == pytest.approx(ones.item()) and halved.item() == pytest.approx(0.5 * plain.item())


def test_episode_records_each_turns_version_and_behaviour_logprobs() -> None:
    from libra.runtime.engines.base import TurnResult
    from libra.runtime.episode import Episode
    from libra.runtime.tasks import TaskSet
    from libra.runtime.tools.base import ToolResult

    task = TaskSet({"math": 1.0}, seed=0).batch(0, 1)[0]
    ep = Episode("t", 0, "g", task, [1, 2, 3], max_tool_calls=3, max_new_tokens=8, max_context=64)
    r1 = TurnResult("t", (10, 11), (-0.1, -0.2), "stop", 3, 0, 0.0, 0.0, extra={"version": 4})
    call = ep.on_generation(r1, lambda ids: "<tool_call>python\nprint(1)</tool_call>")
    assert call is not None
    ep.on_tool_result(ToolResult("1", "ok", 0.01), [20, 21, 22], "\n<tool_response>1</tool_response>\n")
    ep.on_generation(TurnResult("t", (12,), (-0.3,), "stop", 0, 0, 0.0, 0.0, extra={"version": 5}), lambda ids: "<|im_end|>")
    assert ep.turn_versions == [4, 5] and ep.sample_version == 4
    assert len(ep.behaviour_logp) == len(ep.context) and ep.behaviour_logp == [0.0] * 3 + [-0.1, -0.2] + [0.0] * 3 + [-0.3]
    assert [t.policy_version for t in ep.to_trajectory().turns] == [4, 5]


def test_resume_after_an_async_update_recorded_only_in_the_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An async run stopped after step 1's update wrote its checkpoint, before its row: the trace
    (written as each rollout ends) still holds step 1, so the resumed run plans from it, and the
    missing row is said, not silently skipped."""
    from libra.runtime.recording import write_run_trace, write_steps_csv
    from libra.runtime.resume import resume_records
    from libra.trace.records import Trajectory, Turn

    out, ckpt = tmp_path / "run", tmp_path / "run" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "step000002.pt").write_bytes(b"")
    trajs = [Trajectory(f"s{s}-p0-r{r}", s, 5, (Turn(3, None, policy_version=max(0, s - 1)),), f"s{s}-p0", 1.0, "stop")
             for s in range(3) for r in range(2)]
    write_run_trace(str(out / "trace.jsonl"), trajs, "tiny-policy", "cpu", 2, "libra")
    write_steps_csv(str(out / "steps.csv"), [{"step": 0, "policy": "libra", "loop": "async", "staleness_max": 0}])
    said: list[str] = []
    got = resume_records(str(out), str(ckpt), said.append)
    assert got.done == 2 and [h.step for h in got.history] == [0, 1] and len(got.trajectories) == 4
    assert [r["step"] for r in got.rows] == [0] and got.rows[0]["loop"] == "async"
    assert any("no row for step(s) 1" in m for m in said) and said[-1].startswith("resuming after step 1")


# ---- real runs -----------------------------------------------------------------------------------
SMALL = dict(prompts_per_step=3, group_size=4, max_new_tokens=40, eval_tasks=0, engine="torch", trainer="torch")


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@needs_ray
def test_k1_run_trains_every_trajectory_once_within_the_bound_through_faults(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """K=1, 3 steps, 2 devices (split 1:1, async): a trainer rank killed in step 1's update (the
    group alone is restarted from the checkpoint while rollout 2 runs) and the rollout worker
    killed in step 2; the fidelity replay runs the same K."""
    from libra.runtime.config import load_config
    from libra.runtime.loop import Runner
    from libra.trace.reader import read_trajectories

    faults = [{"kill": "trainer", "step": 1}, {"kill": "rollout", "step": 2, "at_s": 0.05, "instance": 0}]
    cfg = load_config(None, {"out": str(tmp_path / "run"), **SMALL, "steps": 3, "devices": 2, "max_staleness": 1,
                             "policy": "verl-static-uniform", "faults": faults, "replay": True})
    s = Runner(cfg, log=lambda m: print(m, flush=True)).run()
    out = s["out"]
    n = 3 * 3 * 4
    assert s["async"] == {"rolled_out": n, "trained": n, "untrained": 0, "max_staleness_observed": 1, "max_staleness": 1}
    rows = _rows(os.path.join(out, "steps.csv"))
    assert [int(r["step"]) for r in rows] == [0, 1, 2] and all(r["loop"] == "async" and r["staleness_k"] == "1" for r in rows)
    assert sum(int(r["trajectories"]) for r in rows) == n
    for r in rows:
        j = int(r["step"])
        assert int(r["policy_version"]) == j  # the trainer's version before the update of step j
        assert j - 1 <= int(r["sample_version_min"]) <= int(r["sample_version_max"]) <= j and int(r["staleness_max"]) <= 1
    assert int(rows[-1]["trainer_restarts"]) == 1 and int(rows[2]["recovered"]) > 0 and int(rows[2]["faults_unfired"]) == 0
    # the overlap the loop exists for: a later rollout started before this step's weights were synced
    assert float(rows[1]["rollout_start_s"]) < float(rows[0]["step_end_s"])
    trajs = read_trajectories(os.path.join(out, "trace.jsonl"))
    assert len(trajs) == n and len({t.id for t in trajs}) == n
    for t in trajs:
        vs = [u.policy_version for u in t.turns if u.policy_version is not None]
        assert vs and vs == sorted(vs) and min(vs) >= t.step - 1 and max(vs) <= t.step
    fid = _rows(os.path.join(out, "fidelity.csv"))
    assert [int(r["step"]) for r in fid] == [0, 1, 2]
    assert all(r["measured_loop"] == r["sim_loop"] == "async" and float(r["sim_step_s"]) > 0 and float(r["measured_step_s"]) > 0
               for r in fid)
