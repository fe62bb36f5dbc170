"""``libra-calibrate from-logs``: logs in three formats, the run's config in each framework's
form, the replay (a log written from a simulated run reads back as predicted = logged within the
noise), the fit (known stage overheads are recovered), the calibration file ``--calibration``
reads, and one-line errors with FILE:LINE for bad log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models.calibration.stages import StageFit, StageOverheads
from cost_models.calibration.store import Calibration
from cost_models.errors import CostModelError
from cost_models.operators.loader import bundled_calibration_path
from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.export import registry
from libra.export.target import ExportPlan
from libra.planner.plan import TrainConfig
from sim.calibrate.cli import main
from sim.calibrate.logs import StepLog, read_log
from sim.calibrate.replay import fixed_plan, simulate, synth_step
from sim.calibrate.run_config import run_shape
from sim.costs import load_costs

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "from_logs"
CONFIG = str(EX / "verl_qwen3_8b_8xh100.sh")


def _table(out: str) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("gen", "log_prob", "update", "sync", "step"):
            rows[parts[0]] = parts[1:]
    return rows


# ---- the hand-written examples ------------------------------------------------------------------
def test_examples_in_three_formats_give_one_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = []
    for name in ("verl_console.log", "verl_metrics.jsonl", "verl_wandb_export.csv"):
        assert main(["from-logs", str(EX / name), "--config", CONFIG, "--gpu", "h100"]) == 0
        out = capsys.readouterr().out
        assert "SIMULATED_s" in out and "5 logged steps" in out and "colocated, rollout TP2" in out
        tables.append(_table(out))
    assert tables[0] == tables[1] == tables[2]
    assert set(tables[0]) == {"gen", "log_prob", "update", "sync", "step"}
    for stage, cells in tables[0].items():  # steps, logged, predicted, error before, scale, fixed, error after
        assert cells[0] == "5" and float(cells[3].rstrip("%")) > 0
        assert float(cells[6].rstrip("%")) <= float(cells[3].rstrip("%")) + 1e-9, stage  # the fit never does worse


def test_the_fitted_file_is_a_calibration_the_replay_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "cal.json"
    assert main(["from-logs", str(EX / "verl_console.log"), "--config", CONFIG, "--gpu", "h100", "-o", str(out_file)]) == 0
    before = _table(capsys.readouterr().out)
    cal = Calibration.load(out_file)
    assert cal.stage_overheads is not None and set(cal.stage_overheads.stages) == {"rollout", "log_prob", "update", "sync", "step"}
    assert cal.families == Calibration.load(bundled_calibration_path("h100")).families  # the bundled operators, unchanged
    # replayed with the file, every stage's error is the fit's "after" error (planner and simulator price through it)
    assert main(["from-logs", str(EX / "verl_console.log"), "--config", CONFIG, "--gpu", "h100", "--calibration", str(out_file)]) == 0
    after = _table(capsys.readouterr().out)
    for stage in before:
        assert abs(float(after[stage][3].rstrip("%")) - float(before[stage][6].rstrip("%"))) <= 0.15, stage
        assert float(after[stage][4]) == pytest.approx(1.0, abs=0.01)
    # refitting from the calibrated file composes with its overheads: the same overheads come out
    again = tmp_path / "cal2.json"
    assert main(["from-logs", str(EX / "verl_console.log"), "--config", CONFIG, "--gpu", "h100", "--calibration", str(out_file),
                 "-o", str(again)]) == 0
    capsys.readouterr()
    first, second = cal.stage_overheads.stages, Calibration.load(again).stage_overheads.stages  # type: ignore[union-attr]
    for name, fit in first.items():
        assert second[name].scale == pytest.approx(fit.scale, rel=0.02) and second[name].fixed_s == pytest.approx(fit.fixed_s, abs=0.1)


# ---- round trip: a log written from a simulated run ----------------------------------------------
def _stats_log(step: int, arrays: object, n: int) -> StepLog:
    gen = arrays.total_gen_tokens  # type: ignore[attr-defined]
    return StepLog(step, {"response_length/mean": float(gen.mean()), "response_length/max": float(gen.max()),
                          "response_length/min": float(gen.min()),
                          "prompt_length/mean": float(arrays.prompt_tokens.mean())}, f"run:{step}")  # type: ignore[attr-defined]


def _write_verl_console(path: Path, logs: list[StepLog], times: list[object]) -> None:
    lines = []
    for lg, t in zip(logs, times):
        d = dict(lg.values)
        d.update({"timing_s/gen": t.gen, "timing_s/old_log_prob": t.log_prob, "timing_s/update_actor": t.update,  # type: ignore[attr-defined]
                  "timing_s/update_weights": t.sync, "timing_s/step": t.step_s})  # type: ignore[attr-defined]
        lines.append(f"(TaskRunner pid=1) step:{lg.step} - " + " - ".join(f"{k}:{v!r}" for k, v in d.items()))
    path.write_text("\n".join(lines) + "\n")


MEANS = (900.0, 1500.0, 2200.0, 2900.0, 1200.0)


def _simulated_run(tmp_path: Path, calibration: str | None, noise: float) -> tuple[Path, str]:
    """A verl run simulated (the 'cluster'), its log written in verl's console format."""
    cfg = tmp_path / "run.sh"
    cfg.write_text(Path(CONFIG).read_text())
    shape = run_shape(cfg)
    assert shape.trajectories == 512 and shape.mini_batches == 4 and shape.colocated and shape.group_size == 8
    seeds = [StepLog(i + 1, {"response_length/mean": m, "response_length/max": 8192.0, "response_length/min": 64.0,
                             "prompt_length/mean": 210.0}, "seed") for i, m in enumerate(MEANS)]
    steps = [synth_step(s, 512, shape.group_size) for s in seeds]
    cluster = ClusterSpec(8, "h100", "qwen3-8b", gpus_per_node=8)
    costs = load_costs("h100", "qwen3-8b", 8, calibration)
    times = simulate(shape, steps, cluster, costs, noise=noise, seed=7)
    log = tmp_path / "run.log"
    _write_verl_console(log, [_stats_log(s.step, a, 512) for s, a in zip(seeds, steps)], times)
    return log, str(cfg)


def test_round_trip_predicted_equals_logged_within_noise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, cfg = _simulated_run(tmp_path, None, noise=0.03)
    assert main(["from-logs", str(log), "--config", cfg, "--gpu", "h100", "--model", "qwen3-8b"]) == 0
    table = _table(capsys.readouterr().out)
    for stage in ("gen", "log_prob", "update", "sync"):
        err = float(table[stage][3].rstrip("%")) / 100
        assert err < 0.06, (stage, err)  # lognormal noise of sigma 0.03 per stage
        assert float(table[stage][4]) == pytest.approx(1.0, abs=0.08), stage


def test_round_trip_without_noise_is_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, cfg = _simulated_run(tmp_path, None, noise=0.0)
    assert main(["from-logs", str(log), "--config", cfg, "--gpu", "h100", "--model", "qwen3-8b"]) == 0
    table = _table(capsys.readouterr().out)
    for stage in ("gen", "log_prob", "update", "sync", "step"):
        assert float(table[stage][3].rstrip("%")) <= 0.1, stage


def test_known_stage_overheads_are_recovered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 'cluster' is the simulator with stage overheads of known size; the fit finds them."""
    truth = StageOverheads({"rollout": StageFit(1.25), "log_prob": StageFit(1.3, 0.0), "update": StageFit(1.5, 2.0),
                            "sync": StageFit(0.7)})
    cal = Calibration.load(bundled_calibration_path("h100"))
    cal.stage_overheads = truth
    cluster_cal = str(cal.save(tmp_path / "truth.json"))
    log, cfg = _simulated_run(tmp_path, cluster_cal, noise=0.0)
    out = tmp_path / "fitted.json"
    assert main(["from-logs", str(log), "--config", cfg, "--gpu", "h100", "--model", "qwen3-8b", "-o", str(out)]) == 0
    capsys.readouterr()
    got = Calibration.load(out).stage_overheads
    assert got is not None
    assert got.stages["rollout"].scale == pytest.approx(1.25, rel=0.03)
    assert got.stages["update"].scale == pytest.approx(1.5, rel=0.03) and got.stages["update"].fixed_s == pytest.approx(2.0, abs=0.3)
    assert got.stages["log_prob"].scale == pytest.approx(1.3, rel=0.03) and got.stages["log_prob"].fixed_s == pytest.approx(0.0, abs=0.2)
    assert got.stages["sync"].scale == pytest.approx(0.7, rel=0.03)


# ---- the run's config in each framework's form -----------------------------------------------------
def test_emitted_configs_read_back_as_the_same_layout(tmp_path: Path) -> None:
    from libra.planner.plan import Bucket, Plan, RolloutInstance

    train = TrainConfig(tp=2, pp=2, dp=2, ep=1, zero_stage=1, micro_batch=2, recompute=True)
    inst = tuple(RolloutInstance(i, 2, 0, 0, 2 * i) for i in range(4))
    for mode, k in (("sync", 0), ("async", 1)):
        plan = Plan(8, 8, train, inst, (Bucket(0, 2, 0, None),), mode=mode, max_staleness=k)  # type: ignore[arg-type]
        for fw in registry.EMITTERS:
            mod = registry.get(fw)
            backend, t = mod.trainers(train)
            out = mod.emit(ExportPlan(plan, t, backend, 8, 4, 512, 8192))
            f = tmp_path / f"{fw}-{mode}.txt"
            f.write_text(out.text)
            shape = run_shape(f, trajectories=512)
            assert shape.framework == fw
            assert (shape.n_gpus, shape.n_rollout_gpus, shape.rollout_tp, shape.colocated) == (16, 8, 2, False), fw
            assert (shape.train.tp, shape.train.pp, shape.train.dp) == (2, 2, 2), fw
            assert shape.train.micro_batch == (1 if fw == "areal" else 2), fw  # AReaL: a token budget, said in a note
            assert (shape.mode, shape.max_staleness) == (mode, k), fw
            assert fixed_plan(shape, 8).n_rollout_gpus == 8


def test_verl_hydra_yaml_config(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"  # verl's saved .hydra/config.yaml, trimmed
    f.write_text("data:\n  train_batch_size: 32\nactor_rollout_ref:\n  hybrid_engine: true\n  model:\n    path: /models/Qwen3-14B\n"
                 "  actor:\n    strategy: fsdp2\n    ppo_mini_batch_size: 8\n    ppo_micro_batch_size_per_gpu: 1\n"
                 "  rollout:\n    n: 16\n    tensor_model_parallel_size: 4\ntrainer:\n  nnodes: 2\n  n_gpus_per_node: 8\n")
    s = run_shape(f)
    assert (s.framework, s.n_gpus, s.colocated, s.rollout_tp, s.trajectories, s.mini_batches, s.model_hint) == \
        ("verl", 16, True, 4, 512, 4, "Qwen3-14B")
    assert (s.train.dp, s.train.zero_stage) == (16, 3)


# ---- bad input: one line, FILE:LINE and the rule ---------------------------------------------------
@pytest.mark.parametrize("name, text, where, rule", [
    ("bad.log", "noise\nstep:1 - timing_s/gen:12.5 - timing_s/step:abc\n", ":2:", "is not key:number"),
    ("bad.jsonl", '{"step": 1, "data": {"timing_s/gen": 1}}\n{"step": 2, "data": \n', ":2:", "not a JSON object"),
    ("bad2.jsonl", '{"step": "one", "data": {}}\n', ":1:", "'step' must be an integer"),
    ("bad.csv", "Step,timing_s/gen\n1,12.5\n2,fast\n", ":3:", "must be a number or empty"),
    ("bad2.csv", "epoch,timing_s/gen\n1,12.5\n", ":1:", "no step column"),
])
def test_bad_log_lines_name_file_line_and_rule(tmp_path: Path, name: str, text: str, where: str, rule: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(UserError) as ei:
        read_log(p)
    assert f"{p}{where}" in str(ei.value) and rule in str(ei.value)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "nolen.log"
    p.write_text("step:1 - timing_s/gen:12.5 - timing_s/step:20.1\n")
    assert main(["from-logs", str(p), "--config", CONFIG, "--gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{p}:1: step 1 has no response length" in err
    assert main(["from-logs", str(EX / "verl_console.log"), "--config", str(p), "--gpu", "h100"]) == 2
    assert "no verl overrides" in capsys.readouterr().err


def test_bad_stage_overheads_entry_is_one_line(tmp_path: Path) -> None:
    doc = json.loads(Path(bundled_calibration_path("h100")).read_text())
    doc["stage_overheads"] = {"stages": {"decode": {"scale": 1.2}}}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="stage_overheads.stages.decode: unknown stage"):
        Calibration.load(p)


def test_libra_calibrate_keeps_its_commands_and_adds_from_logs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("fit", "report", "fit-engine", "profile", "from-logs"):
        assert cmd in out


def test_nemo_rl_example(capsys: pytest.CaptureFixture[str]) -> None:
    """NeMo RL's timing/train/* keys in a W&B export with a row of other metrics only (skipped)."""
    assert main(["from-logs", str(EX / "nemo_rl_wandb_export.csv"), "--config", str(EX / "nemo_rl_grpo.yaml"), "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "nemo-rl run: qwen3-8b on 16 x h100, 8 rollout + 8 training GPUs" in out and "1 without stage timings skipped" in out
    table = _table(out)
    assert set(table) == {"gen", "log_prob", "update", "sync", "step"} and all(r[0] == "3" for r in table.values())


def test_plan_prices_with_the_calibrated_overheads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``libra-sim plan --calibration`` plans with the fitted stage overheads (everything 1.5x slower here)."""
    from sim.cli import main as sim_main

    cal = Calibration.load(bundled_calibration_path("h100"))
    cal.stage_overheads = StageOverheads({k: StageFit(1.5) for k in ("rollout", "log_prob", "update", "sync", "step")})
    f = str(cal.save(tmp_path / "slow.json"))
    args = ["plan", "--gpus", "8", "--gpu", "h100", "--model", "qwen3-8b", "--json"]
    assert sim_main(args) == 0
    plain = json.loads(capsys.readouterr().out)["predicted"]
    assert sim_main(args + ["--calibration", f]) == 0
    slow = json.loads(capsys.readouterr().out)["predicted"]
    assert slow["step_s"] == pytest.approx(1.5 * plain["step_s"], rel=0.05)
