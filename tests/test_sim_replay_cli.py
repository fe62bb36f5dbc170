"""``libra-sim replay`` end to end on a tiny trace with the real cost evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main


def _trace(path: Path, steps: int = 2, n: int = 24, model: str = "Qwen3-14B") -> Path:
    lines = [json.dumps({"type": "header", "format": "libra-trace", "version": 1, "workload": "swe", "model": model})]
    for s in range(steps):
        for i in range(n):
            k = 1 + (i % 4)
            turns = [{"gen_tokens": 60 + 17 * ((i * 7 + t) % 9), "tool": "bash", "tool_latency_s": 0.3 + 0.1 * (t % 3),
                      "tool_tokens": 40 + (i % 5) * 10, "outcome": "ok"} for t in range(k - 1)]
            turns.append({"gen_tokens": 80 + i, "tool": None})
            lines.append(json.dumps({"id": f"s{s}-{i}", "step": s, "group": f"g{i // 4}", "prompt_tokens": 300 + 11 * i,
                                     "turns": turns, "reward": (i % 3) / 2, "finish": "stop"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_json_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = _trace(tmp_path / "t.jsonl")
    out = tmp_path / "r.json"
    rc = main(["replay", str(tr), "--gpus", "16", "--policy", "verl-static-uniform", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"trace", "gpus", "gpu", "model", "complete", "policies"} and doc["complete"] is True
    assert doc["gpus"] == 16 and doc["gpu"] == "a800"
    p = doc["policies"]["verl-static-uniform"]
    assert set(p) == {"throughput_tok_s", "mean_step_s", "rollout_makespan_s", "lower_bound_s", "train_s", "completed", "expected",
                      "max_staleness", "mode", "staleness"}
    assert p["max_staleness"] == 0 and p["staleness"] == 0 and p["mode"] in ("sync", "sync+streaming")
    assert p["completed"] == p["expected"] == 48
    assert len(p["rollout_makespan_s"]) == 2
    assert all(m >= lb * 0.9 for m, lb in zip(p["rollout_makespan_s"], p["lower_bound_s"]))
    assert "verl-static-uniform" in capsys.readouterr().out


def test_compare_out_dir_writes_csv_and_plots(tmp_path: Path) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=2, n=16)
    out = tmp_path / "out"
    rc = main(["replay", str(tr), "--gpus", "16", "--compare", "--policies", "verl-colocated,areal-static-optimal",
               "--out", str(out), "--steps", "0:2", "--max-staleness", "1"])  # areal is async by design: class K >= 1
    assert rc == 0
    for f in ("steps.csv", "step_breakdown.png", "throughput.png", "reward_vs_time.png", "gantt.png"):
        assert (out / f).stat().st_size > 0
    rows = (out / "steps.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--policy", "nope"], "unknown"),
        (["--split", "10:10"], "sum"),
        (["--steps", "5:2"], "greater"),
        (["--fail-gpu", "0:x:1"], "STEP:SECONDS:GPU"),
        (["--model", "not-a-model"], "not a catalog model"),
        (["--gpus", "1", "--model", "qwen3-32b"], "fit"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], msg: str) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=8)
    rc = main(["replay", str(tr), "--gpus", "16", "--policy", "verl-static-uniform", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert msg in err and "Traceback" not in err and err.count("\n") == 1


def test_same_seed_same_json(tmp_path: Path) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=12)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for f in (a, b):
        assert main(["replay", str(tr), "--gpus", "16", "--policy", "verl-static-uniform", "--seed", "3", "--json", str(f)]) == 0
    assert a.read_text() == b.read_text()


def test_max_context_scales_the_first_steps_prior(tmp_path: Path) -> None:
    """``--max-context`` (what libra-run's fidelity replay passes) changes only how the first step,
    planned from the length prior, is planned: later steps plan from measured history."""
    tr = _trace(tmp_path / "t.jsonl")
    docs = []
    for extra in ([], ["--max-context", "1024"]):
        out = tmp_path / f"r{len(docs)}.json"
        assert main(["replay", str(tr), "--gpus", "16", "--policy", "libra", "--json", str(out), *extra]) == 0
        docs.append(json.loads(out.read_text())["policies"]["libra"])
    plain, capped = docs
    assert plain["completed"] == capped["completed"] == 48
    assert plain["train_s"][0] != capped["train_s"][0] or plain["rollout_makespan_s"][0] != capped["rollout_makespan_s"][0]


def test_max_train_gpus_bounds_every_policys_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-train-gpus`` (what libra-run's fidelity replay passes for its 1-worker trainer):
    no policy's plan gives training more GPUs; one that makes nothing fit exits 2 naming the
    count that would."""
    import csv

    tr = _trace(tmp_path / "t.jsonl")
    for policy in ("libra", "verl-static-uniform", "verl-colocated"):
        out = tmp_path / policy
        assert main(["replay", str(tr), "--gpus", "16", "--policy", policy, "--max-train-gpus", "8", "--noise", "0", "--out", str(out)]) == 0
        rows = list(csv.DictReader((out / "steps.csv").open()))
        assert rows and all(int(r["n_train_gpus"]) <= 8 for r in rows), policy
        for r in rows:  # a split gives the rest to rollout; a colocated plan (switch_s > 0) rolls out on all 16
            colocated = float(r["switch_s"]) > 0
            assert int(r["n_rollout_gpus"]) == (16 if colocated else 16 - int(r["n_train_gpus"])), (policy, r)
            assert colocated == (policy == "verl-colocated") or policy == "libra"
    capsys.readouterr()
    # 1 device: a 14B model trains at no context (4 fitted once the first step assumed a 32K cap
    # instead of refusing at the prior's own 65,536; libra.policies.LibraPolicy._plan_assuming_cap)
    assert main(["replay", str(tr), "--gpus", "16", "--policy", "libra", "--max-train-gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "--max-train-gpus" in err and "Traceback" not in err and err.count("\n") == 1
