"""libra-run executes the core's decisions (issue 11): the loop the plan chose, the pin as part of
the policy, and a fidelity replay of that same policy.

- ``streaming`` unset follows ``Plan.streaming``; true/false pin it (as ``libra-sim
  --streaming/--no-streaming``); colocated plans never stream;
- the policy is built with the run's loop options (the streaming pin, its mini-batches);
- ``--split``/``bucket_bounds`` are a policy wrapper (``libra.policies.pinned``): the plan the
  policy returns, the plan recorded and the plan executed are one object;
- ``fidelity.csv`` replays the same pinned policy (``libra-sim replay --plan-split
  --bucket-bounds``), so a pinned run is compared with the simulation of its own plan;
- ``max_staleness`` K is the policy's staleness class (issue 20): with K >= 1 it may plan the
  asynchronous loop (staleness <= K), as ``libra-sim --max-staleness K``; a bad K is one line.

Pure tests (no Ray): the core venv runs them too, except where torch's tokenizer is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from libra.errors import UserError
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.runtime.config import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "libra" / "runtime" / "assets" / "tiny-policy" / "config.json")


def _cluster(devices: int, max_train_gpus: int | None = None) -> Any:
    from libra.cluster import ClusterSpec

    return ClusterSpec(devices, "cpu", TINY, devices, max_context=512, max_train_gpus=max_train_gpus, engine="constants")


def _ev(devices: int) -> Any:
    from cost_models import CostEvaluator

    return CostEvaluator("cpu", TINY, gpus_per_node=devices, engine="constants")


def _plan(streaming: bool, colocated: bool = False, mode: str = "sync") -> Plan:
    return Plan(3, 1, TrainConfig(1, 1, 1), tuple(RolloutInstance(i, 1, 0, 0, i) for i in range(3)), (Bucket(0, 1, 0, None),),
                mode=mode, streaming=streaming, colocated=colocated)  # type: ignore[arg-type]


# ---- 1. the loop: the plan's, unless pinned --------------------------------------------------
def test_streaming_follows_the_plan_unless_pinned() -> None:
    from libra.runtime.update import loop_name, streams

    assert streams(_plan(True), None) and not streams(_plan(False), None)  # the plan's choice
    assert streams(_plan(False), True) and not streams(_plan(True), False)  # the user's pin wins
    assert not streams(_plan(True, colocated=True), True)  # time-shared devices never stream
    assert loop_name(_plan(True), None) == "sync+streaming" and loop_name(_plan(True), False) == "sync"


def test_streaming_key_defaults_to_the_plan_and_is_checked() -> None:
    assert load_config(None).streaming is None
    assert load_config(None, {"streaming": True}).streaming is True
    assert load_config(None, {"streaming": False}).streaming is False
    with pytest.raises(UserError, match=r"--streaming: must be true, false or unset \(unset: the plan's choice\), got 'yes'"):
        load_config(None, {"streaming": "yes"})


def test_the_policy_is_built_with_the_runs_loop_options() -> None:
    """The planner prices the loop the run executes: a pinned ``streaming: false`` leaves it no
    streamed candidate, unset lets it choose (it streams at CPU scale: the tail is worth
    overlapping), and the static baselines never stream. The run declares its workload kind:
    the first step of an undeclared kind is never streamed (its layout would be the default
    prior's, unsettled: ``libra.planner.search.UNSETTLED_FIRST_STEP``)."""
    import dataclasses

    from libra.runtime.policyglue import make_policy

    undeclared, ev = _cluster(4, 1), _ev(4)
    c = dataclasses.replace(undeclared, workload="math")
    prompts = np.full(12, 40, np.int64)
    chosen = make_policy("libra", c, ev, 0, False, mini_batches=2).plan(c, [], prompts)
    off = make_policy("libra", c, ev, 0, False, streaming=False, mini_batches=2).plan(c, [], prompts)
    assert chosen.mode == off.mode == "sync" and chosen.streaming and not off.streaming
    assert not make_policy("libra", undeclared, ev, 0, False, mini_batches=2).plan(undeclared, [], prompts).streaming
    assert not make_policy("verl-static-uniform", c, ev, 0, False).plan(c, [], prompts).streaming


# ---- 2. asynchronous RL: the staleness class the policy is built with ----------------------------
@pytest.mark.parametrize("k", [1, 2])
def test_max_staleness_builds_the_policy_in_that_staleness_class(k: int) -> None:
    from libra.runtime.policyglue import make_policy
    from libra.runtime.update import loop_name

    assert load_config(None, {"max_staleness": k}).max_staleness == k
    c, ev = _cluster(2, 1), _ev(2)
    prompts = np.full(12, 40, np.int64)
    plan = make_policy("libra", c, ev, 0, False, mini_batches=2, max_staleness=k, run_steps=3).plan(c, [], prompts)
    # at CPU scale the fastest loop in the class is the asynchronous one, on split devices, within K
    assert plan.mode == "async" and 1 <= plan.max_staleness <= k and not plan.colocated and loop_name(plan, None) == "async"
    on_policy = make_policy("libra", c, ev, 0, False, mini_batches=2, run_steps=3).plan(c, [], prompts)
    assert on_policy.mode == "sync" and on_policy.max_staleness == 0
    with pytest.raises(UserError) as err:
        load_config(None, {"max_staleness": -1})
    assert "\n" not in str(err.value) and str(err.value).startswith("--max-staleness: must be an integer >= 0")
    with pytest.raises(UserError, match=r"--behaviour-weight-cap: must be a number >= 1"):
        load_config(None, {"behaviour_weight_cap": 0.5})


# ---- 3. the pin is part of the policy --------------------------------------------------------
def test_pinned_plan_is_the_one_recorded_and_executed() -> None:
    from libra.runtime.policyglue import make_policy
    from libra.scheduling.recorder import DecisionLog, recorded

    c, ev = _cluster(3, 1), _ev(3)
    log = DecisionLog()
    policy = recorded(make_policy("libra-cmlfq", c, ev, 0, False, split=(2, 1), bucket_bounds=[26], per_node=3), log)
    plan = policy.plan(c, [], np.full(12, 20, np.int64))
    sched = policy.scheduler(plan)
    assert log.planned[0].plan is plan and log.executed[0] is plan  # recorded == executed, one object
    assert (plan.n_rollout_gpus, plan.n_train_gpus, plan.train.dp, plan.colocated) == (2, 1, 1, False)
    assert [(b.tp, b.max_context) for b in plan.buckets] == [(1, 26), (1, None)]
    assert sorted(i.bucket for i in plan.instances) == [0, 1]
    assert plan.notes["pinned"] == "split 2:1, bucket bounds [26]"
    assert sched.inner.plan is plan  # the router was made for the pinned plan (``inner``: the recorder's wrapped scheduler)
    # nothing pinned: the policy itself, unwrapped
    from libra.policies.pinned import PinnedPolicy

    assert not isinstance(make_policy("libra", c, ev, 0, False), PinnedPolicy)
    with pytest.raises(UserError, match="needs 4 devices; the cluster has 3"):
        make_policy("libra", c, ev, 0, False, split=(2, 2), per_node=3).plan(c, [], np.full(4, 20, np.int64))


def test_registry_applies_the_pin_for_every_backend() -> None:
    """``PolicyOptions.pin`` through ``resolve``: how ``libra-sim replay --plan-split`` builds the
    same pinned policy as ``libra-run``."""
    from libra.policies import PlanPin, PolicyOptions, resolve

    c, ev = _cluster(4), _ev(4)
    prompts = np.full(8, 30, np.int64)
    own = resolve("libra-cmlfq", c, PolicyOptions(ev=ev)).plan(c, [], prompts)
    pinned = resolve("libra-cmlfq", c, PolicyOptions(ev=ev, pin=PlanPin((3, 1), (34,), 4))).plan(c, [], prompts)
    assert (own.n_rollout_gpus, own.n_train_gpus) != (3, 1), "the test needs a pin that differs from the policy's own split"
    assert (pinned.n_rollout_gpus, pinned.n_train_gpus, pinned.train.dp) == (3, 1, 1)
    assert [b.max_context for b in pinned.buckets] == [34, None]
    assert (pinned.mode, pinned.streaming) == (own.mode, own.streaming)  # the loop stays the policy's


# ---- 4. the fidelity replay replays the same pinned policy -----------------------------------
def _tiny_trace(path: Path, steps: int = 1, n: int = 8) -> Path:
    lines = [json.dumps({"type": "header", "format": "libra-trace", "version": 1, "workload": "math", "model": "tiny-policy",
                         "max_context": 512})]
    for s in range(steps):
        for i in range(n):
            turns = [{"gen_tokens": 12 + i, "tool": "python", "tool_latency_s": 0.05, "tool_tokens": 8, "outcome": "ok"},
                     {"gen_tokens": 10, "tool": None}]
            lines.append(json.dumps({"id": f"s{s}-{i}", "step": s, "group": f"s{s}-p{i // 4}", "prompt_tokens": 20 + i,
                                     "turns": turns, "reward": float(i % 2), "finish": "stop"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fidelity_replay_passes_the_runs_policy_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from libra.runtime import recording

    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: Any) -> Any:
        seen.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 2, "", "stop here")

    monkeypatch.setattr(recording.subprocess, "run", fake_run)
    for streaming in (None, True, False):
        with pytest.raises(RuntimeError, match="stop here"):
            recording.replay_fidelity(str(tmp_path), "t.jsonl", [], 4, 4, "cpu", "m.json", "libra", streaming=streaming, mini_batches=2,
                                      split=(2, 2), bucket_bounds=[34, 96], seed=7, kl_coef=0.1)
    unpinned, on, off = seen
    for cmd in seen:
        assert cmd[cmd.index("--plan-split") + 1] == "2:2" and cmd[cmd.index("--bucket-bounds") + 1] == "34,96"
        assert cmd[cmd.index("--seed") + 1] == "7" and cmd[cmd.index("--kl") + 1] == "0.1" and cmd[cmd.index("--mini-batches") + 1] == "2"
    assert "--streaming" not in unpinned and "--no-streaming" not in unpinned  # the replayed policy chooses, as the run's did
    assert "--streaming" in on and "--no-streaming" in off


def test_fidelity_replay_of_a_pinned_run_simulates_the_pinned_plan(tmp_path: Path) -> None:
    """A run pinned to split 3:1 with buckets at 34 is compared with the simulation of that plan,
    not with the policy's own split (2:2 here): before the pin was passed on, ``sim_n_rollout``
    was the policy's own."""
    from libra.runtime.recording import replay_fidelity

    tr = _tiny_trace(tmp_path / "t.jsonl")
    rows = [{"step": 0, "n_rollout": 3, "n_train": 1, "rollout_s": 1.0, "train_s": 0.5, "sync_s": 0.1, "streaming": 0,
             "train_overlap_s": 0.0}]
    fid = replay_fidelity(str(tmp_path), str(tr), rows, 4, 4, "cpu", TINY, "libra-cmlfq", streaming=None, mini_batches=2,
                          max_context=512, engine_profile="constants", split=(3, 1), bucket_bounds=[34])
    (row,) = fid
    assert (str(row["sim_n_rollout"]), str(row["sim_n_train"])) == ("3", "1") and row["same_split"] == 1
    assert row["sim_loop"] in ("sync", "sync+streaming")
    os.makedirs(tmp_path / "own")
    own = replay_fidelity(str(tmp_path / "own"), str(tr), rows, 4, 4, "cpu", TINY, "libra-cmlfq", streaming=None, mini_batches=2,
                          max_context=512, engine_profile="constants")
    assert own[0]["same_split"] == 0, "without the pin the replay plans its own split: the comparison the pin prevents"


def test_sim_replay_refuses_a_plan_split_larger_than_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    tr = _tiny_trace(tmp_path / "t.jsonl")
    base = ["replay", str(tr), "--gpus", "4", "--gpu", "cpu", "--model", TINY, "--policy", "libra-cmlfq", "--noise", "0"]
    assert main([*base, "--plan-split", "3:3"]) == 2
    assert main([*base, "--bucket-bounds", "40,x"]) == 2
    err = capsys.readouterr().err
    assert "--plan-split 3:3: needs 6 GPUs, --gpus is 4" in err and "--bucket-bounds '40,x'" in err and "Traceback" not in err
