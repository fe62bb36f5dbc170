"""What a new user of ``libra-sim`` gets wrong: outputs that cannot be written are refused before
any simulation (one line, exit 2), and ``plan`` and ``replay`` read a trace's declared limits the
same way (``libra.trace.limits``)."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from libra.errors import UserError
from libra.trace.limits import cluster_limits, trace_limits
from libra.trace.reader import open_trace
from libra.trace.records import TraceHeader, Trajectory, Turn
from libra.trace.writer import write_trace
from sim.cli import main

SWE = "traces/swe-qwen3-14b.jsonl.gz"


def _no_simulation(monkeypatch) -> None:
    import sim.replay

    def boom(*a, **k):
        raise AssertionError("the simulation ran before the outputs were checked")

    monkeypatch.setattr(sim.replay, "replay_policy", boom)
    monkeypatch.setattr(sim.replay, "load_steps", boom)


@pytest.mark.parametrize("flags, needle", [
    (["--out", "/proc/nope/out"], "--out /proc/nope/out: cannot create the folder"),
    (["--json", "/proc/nope/x.json"], "--json /proc/nope/x.json: cannot create the folder"),
    (["--out", "FILE"], "exists and is not a folder"),
    (["--json", "DIR"], "is a folder"),
])
def test_replay_refuses_unwritable_outputs_before_simulating(tmp_path, capsys, monkeypatch, flags: list[str], needle: str) -> None:
    _no_simulation(monkeypatch)
    (tmp_path / "f").write_text("x")
    flags = [str(tmp_path / "f") if f == "FILE" else str(tmp_path) if f == "DIR" else f for f in flags]
    t0 = time.perf_counter()
    rc = main(["replay", SWE, "--gpus", "48", "--gpu", "a800", "--model", "qwen3-14b", "--compare", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err
    assert time.perf_counter() - t0 < 5


def test_gen_refuses_an_unwritable_output_first(capsys) -> None:
    rc = main(["gen", "--workload", "math", "--steps", "1", "--batch", "4", "--group-size", "2", "-o", "/proc/nope/t.jsonl"])
    assert rc == 2 and "-o /proc/nope/t.jsonl" in capsys.readouterr().err


def test_limits_from_the_generators_params_and_from_the_top_level() -> None:
    lim = trace_limits(open_trace("traces/math-tool.jsonl.gz").header)
    assert (lim.max_context, lim.max_turns, lim.max_response_tokens) == (16384, 8, None)
    assert "params.max_context" in lim.describe()
    top = trace_limits(TraceHeader(metadata={"max_context": 4096, "max_response_tokens": 3000, "params": {"max_context": 9}}))
    assert (top.max_context, top.max_response_tokens) == (4096, 3000)
    assert cluster_limits(TraceHeader(metadata={"max_context": 4096}), 1024)[0] == {"max_context": 1024}  # the flag wins
    assert cluster_limits(None) == ({}, "none declared")
    with pytest.raises(UserError, match="header field 'max_context': must be an integer >= 1"):
        trace_limits(TraceHeader(metadata={"max_context": "big"}), "t.jsonl")


def _small_math_trace(path: str) -> None:
    """Two steps of a few trajectories under the bundled math trace's header (max_context 16,384)."""
    with gzip.open("traces/math-tool.jsonl.gz", "rt") as f:
        head = json.loads(f.readline())
    meta = {k: v for k, v in head.items() if k not in ("type", "format", "version", "workload", "model", "source")}
    header = TraceHeader(workload="math", model="Qwen3-32B", source="test", metadata=meta)
    trajs = [Trajectory(f"s{s}-{i}", s, 200, (Turn(300, "python", 0.1, 30, "ok"), Turn(200, None)), group=f"g{s}-{i // 4}", reward=1.0,
                        finish="stop") for s in range(2) for i in range(16)]
    write_trace(path, trajs, header)


def test_plan_and_replay_agree_on_the_traces_declared_context_limit(tmp_path, capsys) -> None:
    """The issue's case: plan of step 0 (the length prior) fitted qwen3-32b on 16 H100s while
    replay refused training at seq 65,536; both now plan under the header's max_context."""
    trace = str(tmp_path / "m.jsonl.gz")
    _small_math_trace(trace)
    cluster = ["--gpus", "16", "--gpu", "h100", "--model", "qwen3-32b"]
    assert main(["plan", "--trace", trace, "--step", "0", *cluster, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "max_context 16,384" in doc["limits"]
    rc = main(["replay", trace, *cluster, "--policy", "libra", "--steps", "0:1", "--noise", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "max_context 16,384" in out


def test_every_replay_plot_says_simulated_and_the_mode_that_ran(tmp_path, monkeypatch) -> None:
    """Titles start with SIMULATED and name the mode that ran (async here, forced), the Gantt
    has a colour bar for the batch size and shows the --gantt-step asked for, time axes pick
    s/min/h."""
    import matplotlib.figure

    from test_sim_replay_cli import _trace

    seen: dict[str, list[str]] = {}
    real = matplotlib.figure.Figure.savefig

    def record(fig, path, *a, **k):
        texts = [ax.get_title() for ax in fig.axes] + [ax.get_xlabel() for ax in fig.axes] + [ax.get_ylabel() for ax in fig.axes]
        seen[str(path).rsplit("/", 1)[-1]] = texts
        return real(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    import argparse

    from sim.commands import replay as replay_cmd

    probe = argparse.ArgumentParser()
    replay_cmd.add_arguments(probe)
    # async needs a staleness bound where replay has --max-staleness (a K of 0 is on-policy only)
    stale = ["--max-staleness", "1"] if any("--max-staleness" in a.option_strings for a in probe._actions) else []
    tr = _trace(tmp_path / "t.jsonl", steps=3, n=16)
    rc = main(["replay", str(tr), "--gpus", "16", "--compare", "--policies", "verl-static-uniform,areal-static-optimal", "--mode", "async",
               *stale, "--out", str(tmp_path / "out"), "--gantt-step", "2"])
    assert rc == 0
    assert set(seen) == {"step_breakdown.png", "throughput.png", "reward_vs_time.png", "gantt.png"}
    for name, texts in seen.items():
        title = next(t for t in texts if t)
        assert title.startswith("SIMULATED (async"), (name, title)
    gantt = seen["gantt.png"]
    assert any("step 2" in t for t in gantt) and "running batch (sequences)" in gantt  # the colour bar's label
    assert any(t.startswith(("s ", "min ", "h ")) for t in gantt)


def test_time_unit_fits_the_span() -> None:
    from libra.plotting import format_duration, time_unit

    assert time_unit([0.7, 30]) == (1.0, "s")
    assert time_unit([600]) == (60.0, "min")
    assert time_unit([9 * 3600, float("nan")]) == (3600.0, "h")
    assert format_duration(3723) == "1:02:03" and format_duration(42) == "0:42"


@pytest.mark.parametrize("argv, needle", [
    (["replay", SWE, "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    (["replay", SWE, "--kl", "inf"], "--kl must be a finite number >= 0"),
    (["replay", SWE, "--noise", "5"], "--noise must be a number in [0, 1]"),
    (["replay", SWE, "--gpus", "100000"], "--gpus must be an integer in [1, 32,768]"),
    (["replay", SWE, "--gantt-step", "99", "--steps", "0:1"], "--gantt-step 99: not a replayed step"),
    (["plan", "--gpus", "100000"], "--gpus must be an integer in [2, 32,768]"),
    (["plan", "--gpus", "16", "--gpus-per-node", "0"], "--gpus-per-node must be an integer >= 1"),
    (["plan", "--gpus", "16", "--max-context", "0"], "--max-context must be >= 1"),
])
def test_numeric_flags_out_of_range_are_one_line(capsys, monkeypatch, argv: list[str], needle: str) -> None:
    """A negative --seed was a numpy traceback; --gpus 100000 searched for minutes."""
    if "--gantt-step" not in argv:
        _no_simulation(monkeypatch)
    t0 = time.perf_counter()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    assert time.perf_counter() - t0 < 30


def test_a_colocated_plan_is_shown_as_colocated_not_as_a_split_beyond_the_cluster() -> None:
    from rich.console import Console

    from sim.metrics import RunResult, StepMetrics
    from sim.report import summary_table

    step = StepMetrics.__new__(StepMetrics)
    fields = {f: 0 for f in StepMetrics.__dataclass_fields__}
    fields.update(n_rollout_gpus=48, n_train_gpus=48, rollout_tps="8x6")
    for k, v in fields.items():
        object.__setattr__(step, k, v)
    res = RunResult("libra", "sync", [step])
    console = Console(width=250, record=True)
    console.print(summary_table([res], "t", 48))
    text = console.export_text()
    assert "48 coloc" in text and "48:48" not in text


def test_the_max_context_flag_replaces_only_the_context_cap() -> None:
    header = TraceHeader(workload="math", metadata={"params": {"max_context": 16384, "max_turns": 8}})
    kwargs, text = cluster_limits(header, 4096)
    assert kwargs["max_context"] == 4096 and kwargs["max_turns"] == 8
    assert text.startswith("max_context 4,096 (--max-context), max_turns 8")
