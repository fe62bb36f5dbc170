"""libra-run plans for the trainer it has: the torch trainer is one worker, so its cluster says
``max_train_gpus=1`` (the planner gives training one device, the rest roll out) and its fidelity
replay passes ``--max-train-gpus 1``; deepspeed runs the plan's DP and has no limit."""

from __future__ import annotations

import subprocess
from typing import Any

import numpy as np
import pytest

from libra.runtime.config import load_config


def _runner(tmp_path: Any, **over: Any) -> Any:
    pytest.importorskip("transformers")
    from libra.runtime.loop import Runner

    return Runner(load_config(None, {"out": str(tmp_path / "run"), **over}))


def test_torch_trainer_caps_training_at_one_device_and_the_plan_follows(tmp_path: Any) -> None:
    from cost_models import CostEvaluator
    from libra.runtime.policyglue import make_policy

    r = _runner(tmp_path, devices=4)
    assert r.cluster.max_train_gpus == 1 and r.cluster.max_context == r.cfg.max_context
    ev = CostEvaluator(r.cfg.gpu_name, r.model_cfg, gpus_per_node=r.cfg.per_node)
    for name in ("libra", "verl-static-uniform"):
        policy = make_policy(name, r.cluster, ev, 0, False)
        plan = policy.plan(r.cluster, [], np.full(32, 60, np.int64))
        assert plan.n_train_gpus == 1 and plan.train.n_gpus == 1, name
        if not plan.colocated:
            assert plan.n_rollout_gpus == 3, name
    assert _runner(tmp_path, trainer="deepspeed").cluster.max_train_gpus is None


def test_fidelity_replay_passes_the_training_limit(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from libra.runtime import recording

    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: Any) -> Any:
        seen.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 2, "", "stop here")

    monkeypatch.setattr(recording.subprocess, "run", fake_run)
    for cap in (1, None):
        with pytest.raises(RuntimeError, match="stop here"):
            recording.replay_fidelity(str(tmp_path), "t.jsonl", [], 4, 4, "cpu", "m.json", "libra", max_train_gpus=cap)
    with_cap, without = seen
    assert with_cap[with_cap.index("--max-train-gpus") + 1] == "1"
    assert "--max-train-gpus" not in without
