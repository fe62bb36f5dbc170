"""What a new user of ``libra-run`` gets wrong, and what they must get back: one line naming the
flag (or file and key), the value and what is allowed, exit 2, before Ray starts; never a
traceback. Pure tests: they run without the run extra."""

from __future__ import annotations

import os
import signal

import pytest

from libra.errors import UserError
from libra.runtime.config import KEYS, RANGES, RunConfig, config_warnings, key_types, load_config


def _main(argv: list[str], capsys) -> tuple[int, str]:
    from libra.runtime.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("out", ["/proc/nope/run", "FILE"])
def test_an_output_folder_that_cannot_be_written_is_one_line_before_anything_runs(tmp_path, capsys, out: str) -> None:
    if out == "FILE":
        out = str(tmp_path / "afile")
        open(out, "w").close()
    rc, err = _main(["--steps", "2", "--out", out], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"libra-run: error: --out {out}: ")


def test_a_json_file_that_cannot_be_written_is_refused_up_front(tmp_path, capsys) -> None:
    rc, err = _main(["--steps", "2", "--out", str(tmp_path / "run"), "--json", "/proc/nope/x.json"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "--json /proc/nope/x.json" in err
    rc, err = _main(["--steps", "2", "--out", str(tmp_path / "run"), "--json", str(tmp_path)], capsys)
    assert rc == 2 and "is a folder" in err


@pytest.mark.parametrize("argv, needle", [
    (["--lr", "-1"], "--lr: must be a number in (0, 1]"),
    (["--temperature", "-1"], "--temperature: must be a number in [0, 100]"),
    (["--clip", "0"], "--clip: must be a number in (0, 1]"),
    (["--kl-coef", "-0.1"], "--kl-coef: must be a number >= 0"),
    (["--steps", "0"], "--steps: must be an integer >= 1"),
    (["--checkpoint-every", "-1"], "--checkpoint-every: must be an integer >= 0"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints: must be an integer >= 1"),
    (["--tool-timeout-s", "nan"], "--tool-timeout-s: must be a number in (0, 3600]"),
    (["--eval-temperature", "-1"], "--eval-temperature: must be a number in [0, 100]"),
    (["--seed", "-3"], "--seed: must be an integer >= 0"),
    (["--devices", "8", "--devices-per-node", "9"], "--devices-per-node: must be <= devices (8)"),
    (["--tasks", '{"maths": 1}'], "--tasks: unknown kind(s) maths"),
    (["--tasks", '{"math": -1}'], "--tasks: weights must be numbers >= 0"),
    (["--split", "3:3"], "--split: both sides >= 1"),
    (["--max-new-tokens", "600"], "--max-new-tokens: must be < max_context (512)"),
    (["--policy", "nope"], "--policy: unknown policy 'nope'; known: "),
    (["--gpu", "h900"], "--gpu: unknown cost-model GPU 'h900'"),
    (["--calibration", "/nope/calib.json"], "--calibration: /nope/calib.json: file not found"),
])
def test_every_numeric_flag_is_range_checked_with_key_value_and_range(tmp_path, capsys, argv: list[str], needle: str) -> None:
    rc, err = _main([*argv, "--out", str(tmp_path / "run")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err and ("got" in err or "known" in err or "not found" in err), err
    assert "(defaults)" not in err  # typed on the command line: labelled by its flag


def test_every_int_and_float_key_has_a_range() -> None:
    numeric = {k for k, t in key_types().items() if t in (int, float)}
    assert numeric == set(RANGES), numeric ^ set(RANGES)


def test_a_bad_value_in_a_file_names_the_file_and_key(tmp_path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("lr: -1\n")
    with pytest.raises(UserError, match=r"config .*r\.yaml: key 'lr': must be a number in \(0, 1\].*got -1"):
        load_config(str(p))
    p.write_text("max_batch: many\n")
    with pytest.raises(UserError, match="key 'max_batch': must be an integer >= 1"):
        load_config(str(p))


def test_help_prints_the_tasks_entry_not_argparses_internals(capsys) -> None:
    from libra.runtime.cli import _parser

    text = _parser().format_help()
    assert "0% solved" in text and "'option_strings'" not in text and "{'" not in text


def test_more_devices_than_cores_is_a_warning() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cfg = RunConfig(devices=cores + 1)
    assert any("exceeds" in w and str(cores) in w for w in config_warnings(cfg))
    assert not config_warnings(RunConfig(devices=2, device="cpu")) or cores < 2


def test_async_without_per_step_checkpoints_is_a_warning() -> None:
    assert any("checkpoint_every 0" in w and "max_staleness 1" in w for w in config_warnings(RunConfig(devices=2, max_staleness=1,
                                                                                                        checkpoint_every=0)))
    assert not any("max_staleness" in w for w in config_warnings(RunConfig(devices=2, max_staleness=1)))


def test_keys_and_dataclass_agree() -> None:
    assert set(KEYS) == set(RunConfig.__dataclass_fields__)


def test_first_signal_sets_a_flag_and_a_second_one_stops_at_once(tmp_path) -> None:
    """Raising from the handler inside ray.get gave ``SystemError: ... returned a result with an
    exception set`` (exit 1): the first Ctrl-C must only ask the loop to stop between stages."""
    pytest.importorskip("transformers")
    from libra.runtime.loop import Interrupted, Runner

    seen: list[str] = []
    r = Runner(load_config(None, {"out": str(tmp_path / "run")}), log=seen.append)
    r._on_signal(signal.SIGINT, None)  # must not raise
    assert r._stop and any("Ctrl-C again" in m for m in seen)
    with pytest.raises(Interrupted):
        r._check_stop()
    with pytest.raises(Interrupted):
        r._on_signal(signal.SIGINT, None)


def test_checkpoints_beyond_the_newest_n_are_removed(tmp_path) -> None:
    from libra.runtime.recording import prune_checkpoints

    ck = tmp_path / "ckpt"
    ck.mkdir()
    for i in range(5):
        (ck / f"step{i:06d}.pt").write_bytes(b"x")
    (ck / "step000005").mkdir()  # a DeepSpeed tag folder
    (ck / "latest").write_text("step000005")
    removed = prune_checkpoints(str(ck), 2)
    assert sorted(os.listdir(ck)) == ["latest", "step000004.pt", "step000005"]
    assert len(removed) == 4


def test_the_trace_header_names_the_model_folder_not_this_machines_path(tmp_path) -> None:
    from libra.runtime.recording import write_run_trace
    from libra.trace.reader import open_trace
    from libra.trace.records import Trajectory, Turn

    t = Trajectory("a", 0, 5, (Turn(3, None),))
    path = str(tmp_path / "trace.jsonl")
    write_run_trace(path, [t], "/home/someone/models/tiny-policy/", "cpu", 4, "libra", max_context=512)
    h = open_trace(path).header
    assert h.model == "tiny-policy" and "/home" not in open(path).read()
    assert h.metadata["max_context"] == 512


def test_progress_and_eta() -> None:
    from libra.runtime.recording import progress

    assert progress(18.4, [17.0, 1.0], 3) == "elapsed 0:18, ETA 0:03"  # step 0 (placing actors) not in the ETA
    assert progress(5, [5.0], 0) == "elapsed 0:05, done"


def test_a_step_planned_from_the_prior_says_so() -> None:
    from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
    from libra.runtime.policyglue import describe_plan, plan_from_prior

    plan = Plan(3, 1, TrainConfig(1, 1, 1), tuple(RolloutInstance(i, 1, 0, 0, i) for i in range(3)), (Bucket(0, 1, 0, None),))
    assert plan_from_prior(plan, 0) and not plan_from_prior(plan, 1)  # a baseline's plan carries no note
    assert "a guess from the length prior" in describe_plan(plan, 0)
    assert "from measured steps" in describe_plan(plan, 2)


def test_missing_backends_are_refused_before_ray(tmp_path) -> None:
    """vLLM missing surfaced ~30 s in from an actor; --device cuda without GPUs as a Ray traceback."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    from libra.runtime.engines import vllm_available
    from libra.runtime.loop import Runner

    if not vllm_available():
        with pytest.raises(UserError, match="engine vllm: vLLM is not installed here"):
            Runner(load_config(None, {"engine": "vllm", "out": str(tmp_path / "a")}))
    if torch.cuda.device_count() < 4:
        with pytest.raises(UserError, match="device cuda: "):
            Runner(load_config(None, {"device": "cuda", "devices": 4, "out": str(tmp_path / "b")}))


def test_an_address_where_no_ray_head_listens_is_refused_at_once() -> None:
    """ray.init against a closed port retried for minutes."""
    import socket
    import time

    from libra.runtime.loop import check_ray_address

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=f"--address 127.0.0.1:{port}: cannot reach a Ray head"):
        check_ray_address(f"127.0.0.1:{port}")
    assert time.perf_counter() - t0 < 5
    with pytest.raises(UserError, match="expected HOST:PORT"):
        check_ray_address("nonsense")
    check_ray_address("auto")


def _rows(n: int = 4) -> list[dict]:
    rows = []
    for s in range(n):
        rows.append({"step": s, "reward_mean": 0.3 + 0.05 * s, "reward_math": 0.1, "reward_math2": float("nan"), "reward_search": 0.6,
                     "plan_s": 0.01, "setup_s": 20.0 if s == 0 else 0.0, "rollout_s": 0.5, "train_s": 0.3, "train_overlap_s": 0.2,
                     "sync_s": 0.05, "checkpoint_s": 0.02, "step_s": 0.7 + (20.0 if s == 0 else 0.0)})
    return rows


def test_run_plots_draw_overlap_as_overlap_setup_apart_and_heldout_marks(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from libra.runtime.recording import plot_fidelity, plot_steps

    figs: dict[str, object] = {}
    real = matplotlib.figure.Figure.savefig

    def keep(fig, path, *a, **k):
        figs[os.path.basename(str(path))] = fig
        return real(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    held = {"before": {"reward": 0.41, "n": 96}, "after": {"reward": 0.47, "n": 96}}
    plot_steps(str(tmp_path), _rows(), held)
    setup_ax, ax = figs["stages.png"].axes[:2]
    assert "set-up" in setup_ax.get_title() and [p.get_height() for p in setup_ax.patches] == [20.0]  # step 0's set-up apart
    # the timeline: rollout [0.01, 0.51], train starts 0.2 s before the rollout ends (overlap), beside it
    bars = {(round(p.get_x() + p.get_width() / 2, 2), round(p.get_y(), 3), round(p.get_height(), 3)) for p in ax.patches}
    assert (-0.2, 0.01, 0.5) in bars and (0.2, 0.31, 0.3) in bars
    assert max(p.get_y() + p.get_height() for p in ax.patches) < 1.0  # no 20 s set-up in the timeline
    labels = [t.get_text() for t in figs["reward.png"].axes[0].get_legend().get_texts()]
    assert any(t.startswith("held-out before 0.410") for t in labels) and any(t.startswith("held-out after 0.470") for t in labels)
    fid = [{"step": s, "measured_step_s": 0.7, "sim_step_s": 0.5, "measured_rollout_s": 0.5, "sim_rollout_s": 0.4,
            "measured_train_s": 0.3, "sim_train_s": 0.6} for s in range(3)]
    plot_fidelity(str(tmp_path), fid)
    assert "SIMULATED" in figs["fidelity.png"]._suptitle.get_text() and "step 0.71x" in figs["fidelity.png"]._suptitle.get_text()
    assert (tmp_path / "fidelity.png").stat().st_size > 0


@pytest.mark.parametrize("text, expect", [
    ("lr: 1e-3\n", 1e-3),  # YAML 1.1 reads 1e-3 (no dot) as text
    ("steps: '7'\n", 7),
])
def test_numbers_written_as_text_in_a_file_are_numbers(tmp_path, text: str, expect: float) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    key = text.split(":")[0]
    assert getattr(load_config(str(p)), key) == expect


@pytest.mark.parametrize("text, match", [
    ("out: 3\n", "key 'out': must be text"),  # was a TypeError traceback
    ("model: 3\n", "key 'model': must be text"),
    ("split: 2:2\n", "write ROLLOUT:TRAIN quoted, e.g. split: '2:2'"),  # YAML 1.1: base-60 122
])
def test_wrong_value_types_in_a_file_are_one_line(tmp_path, text: str, match: str) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        load_config(str(p))
