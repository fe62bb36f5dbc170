"""``libra-sim gen``: flags, overrides, errors."""

from __future__ import annotations

from sim.cli import main

from libra.trace.reader import open_trace


def test_gen_writes_a_trace_with_overrides_in_its_header(tmp_path, capsys):
    out = tmp_path / "m.jsonl.gz"
    rc = main(["gen", "--workload", "math", "--steps", "2", "--batch", "16", "--group-size", "4", "--seed", "5",
               "--max-context", "8192", "--drift", "0.02", "--error-effect", "1.5", "--param", "turns_median=3",
               "-o", str(out)])
    assert rc == 0
    assert "wrote 32 trajectories" in capsys.readouterr().err
    reader = open_trace(out)
    meta = reader.header.metadata
    assert reader.header.workload == "math" and reader.header.model
    assert (meta["steps"], meta["batch"], meta["group_size"], meta["seed"]) == (2, 16, 4, 5)
    assert meta["params"]["max_context"] == 8192 and meta["params"]["drift"] == 0.02
    assert meta["params"]["error_effect"] == 1.5 and meta["params"]["turns_median"] == 3.0
    assert reader.validate().n_trajectories == 32


def test_gen_list_params(capsys):
    assert main(["gen", "--workload", "swe", "--list-params", "-o", "unused"]) == 0
    out = capsys.readouterr().out
    assert "max_turns" in out and "workloads.md:22" in out


def test_gen_user_errors_exit_2_with_one_line(tmp_path, capsys):
    out = str(tmp_path / "x.jsonl")
    assert main(["gen", "--workload", "swe", "--batch", "10", "--group-size", "8", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "multiple of --group-size" in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["gen", "--workload", "swe", "--param", "nonsense", "-o", out]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert main(["gen", "--workload", "swe", "--param", "no_such=1", "-o", out]) == 2
    assert "unknown parameter(s) no_such" in capsys.readouterr().err
