"""``libra-sim replay --calibration FILE``: a ``libra-calibrate fit`` file reaches the cost
evaluator (CLI, ``sim.replay``/``sim.costs`` API, parallel ``--compare`` workers, and the
runtime's record-then-replay comparison); a bad file is a one-line user error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_calibration import _write_synthetic_folder
from test_sim_replay_cli import _trace

from cost_models import CostEvaluator
from cost_models.calibration.fit import fit_folder
from cost_models.operators.fitted import FittedOperators
from libra.cluster import ClusterSpec
from libra.errors import UserError
from sim.cli import main
from sim.costs import load_costs
from sim.loop import SimConfig
from sim.replay import load_steps, replay_policy

#: the runtime's tiny policy: a model small enough for a CPU "cluster"
TINY = str(Path(__file__).resolve().parents[1] / "libra" / "runtime" / "assets" / "tiny-policy" / "config.json")


@pytest.fixture(scope="module")
def cpu_calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration fitted on synthetic CPU measurements (slower than the CPU roofline in some
    operators, faster in decode attention), so a replay that uses it must differ."""
    root = tmp_path_factory.mktemp("calib")
    _write_synthetic_folder(root / "data", gpu="cpu")
    return fit_folder(root / "data", "cpu").save(root / "cpu.json")


def _replay_json(tmp_path: Path, trace: Path, *extra: str) -> dict[str, object]:
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    rc = main(["replay", str(trace), "--gpus", "4", "--gpus-per-node", "4", "--gpu", "cpu", "--model", TINY,
               "--noise", "0", "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())["policies"]  # type: ignore[no-any-return]


def test_load_costs_uses_the_calibration_file(cpu_calibration: Path) -> None:
    plain = load_costs("cpu", TINY, 4)
    fitted = load_costs("cpu", TINY, 4, str(cpu_calibration))
    assert not isinstance(plain.ev.ops, FittedOperators)
    assert isinstance(fitted.ev.ops, FittedOperators) and fitted.ev.ops.calibration_gpu == "cpu"
    direct = CostEvaluator("cpu", TINY, calibration=cpu_calibration, gpus_per_node=4)
    assert fitted.decode_coeffs(1, 8) == pytest.approx(tuple(float(x) for x in direct.decode_coeffs(1, 8)))
    assert fitted.decode_coeffs(1, 8) != pytest.approx(plain.decode_coeffs(1, 8))


def test_cli_replay_on_cpu_follows_the_calibration(tmp_path: Path, cpu_calibration: Path) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=2, n=8)
    pol = ["--policy", "verl-static-uniform", "--split", "2:2"]
    plain = _replay_json(tmp_path, tr, *pol)["verl-static-uniform"]
    cal = _replay_json(tmp_path, tr, *pol, "--calibration", str(cpu_calibration))["verl-static-uniform"]
    assert cal["rollout_makespan_s"] != pytest.approx(plain["rollout_makespan_s"], rel=1e-3)  # type: ignore[index]
    # the API with the same file gives the CLI's numbers
    steps, _ = load_steps(str(tr))
    res = replay_policy(steps, "verl-static-uniform", ClusterSpec(4, "cpu", TINY, 4), SimConfig(noise_sigma=0.0),
                        calibration=str(cpu_calibration), split=(2, 2))
    assert [s.rollout_makespan_s for s in res.steps] == pytest.approx(cal["rollout_makespan_s"])  # type: ignore[index]


def test_parallel_compare_workers_get_the_calibration(tmp_path: Path, cpu_calibration: Path) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=8)
    args = ["--compare", "--policies", "verl-static-uniform,areal-static-optimal", "--calibration", str(cpu_calibration)]
    par = _replay_json(tmp_path, tr, *args, "--jobs", "2")
    seq = _replay_json(tmp_path, tr, *args, "--jobs", "1")
    assert par == seq


@pytest.mark.parametrize("kind, msg", [
    ("missing", "file not found"),
    ("folder", "is a folder of measurements"),
    ("not-json", "not a JSON calibration file"),
    ("other-gpu", "cannot stand for 'cpu'"),
])
def test_bad_calibration_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, msg: str) -> None:
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=4)
    path = tmp_path / "c.json"
    if kind == "folder":
        path.mkdir()
    elif kind == "not-json":
        path.write_text("{nope")
    elif kind == "other-gpu":
        _write_synthetic_folder(tmp_path / "d", gpu="a100")
        fit_folder(tmp_path / "d", "a100").save(path)
    rc = main(["replay", str(tr), "--gpus", "4", "--gpus-per-node", "4", "--gpu", "cpu", "--model", TINY,
               "--policy", "verl-static-uniform", "--calibration", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "--calibration" in err
    assert "Traceback" not in err and err.count("\n") == 1
    with pytest.raises(UserError, match=msg):
        load_costs("cpu", TINY, 4, str(path))


def test_runtime_fidelity_replay_passes_the_run_calibration(tmp_path: Path, cpu_calibration: Path) -> None:
    """``libra.runtime.recording.replay_fidelity`` (pure: it runs ``libra-sim replay`` as a
    subprocess) replays with the run's calibration, so its simulated seconds are the calibrated ones."""
    from libra.runtime.recording import replay_fidelity

    tr = _trace(tmp_path / "t.jsonl", steps=2, n=8)
    rows = [{"step": s, "rollout_s": 1.0, "train_s": 0.5, "sync_s": 0.1} for s in (0, 1)]
    sims = {}
    for name, cal in (("plain", None), ("cal", str(cpu_calibration))):
        out = tmp_path / name
        out.mkdir()
        fid = replay_fidelity(str(out), str(tr), rows, 4, 4, "cpu", TINY, "verl-static-uniform", calibration=cal)
        assert [r["step"] for r in fid] == [0, 1] and (out / "fidelity.csv").is_file()
        sims[name] = [r["sim_rollout_s"] for r in fid]
    want = _replay_json(tmp_path, tr, "--policy", "verl-static-uniform", "--mini-batches", "1",
                        "--calibration", str(cpu_calibration))["verl-static-uniform"]
    assert sims["cal"] == pytest.approx(want["rollout_makespan_s"])  # type: ignore[index]
    assert sims["cal"] != pytest.approx(sims["plain"], rel=1e-3)
