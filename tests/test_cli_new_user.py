"""What a new user hit (issue 21, items 2-5): plans refused without a trace, inputs overwritten,
dropped lines not reported, tracebacks instead of one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main


# --- item 2: libra-sim plan without a trace ------------------------------------------------------

@pytest.mark.parametrize("model,gpus,context", [("qwen3-32b", 12, 32768), ("llama-3.1-70b", 20, 16384)])
def test_plan_without_a_trace_falls_back_to_a_context_that_fits(capsys: pytest.CaptureFixture[str], model: str,
                                                                 gpus: int, context: int) -> None:
    # the 65,536-token prior fits neither; the documented 32K/16K/8K/4K fallback does (with
    # sequence parallelism, 16 H100 hold Qwen3-32B's 64K tokens and 64 Llama-3.1-70B's)
    assert main(["plan", "--gpus", str(gpus), "--gpu", "h100", "--model", model, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["assumed_max_context"] == context
    assert f"{context:,}-token contexts" in doc["limits"] and "--max-context" in doc["limits"]


def test_plan_prints_the_launch_libra_replays_when_the_prior_fits_only_a_costly_one(capsys: pytest.CaptureFixture[str]) -> None:
    # 18 A100 / Qwen3-32B: the 65,536-token prior fits only a launch whose regret over the prior
    # scenarios exceeds HEDGE_REGRET_CAP; the policy launches at an assumed 32,768, and until
    # session 34 `libra-sim plan` printed the plan the replay never ran (30 A100 until session 44,
    # when sequence parallelism let 16 of them hold 64K tokens)
    import numpy as np

    from libra.cluster import ClusterSpec
    from libra.planner.stats import PRIOR_PROMPT_TOKENS
    from libra.policies import POLICIES, PolicyOptions

    assert main(["plan", "--gpus", "18", "--gpu", "a100", "--model", "qwen3-32b", "--max-staleness", "1", "--prompts", "128",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["assumed_max_context"] == 32768 and "fits only a launch" in doc["limits"]
    cl = ClusterSpec(18, "a100", "qwen3-32b")
    plan = POLICIES["libra"](cl, PolicyOptions(max_staleness=1)).plan(cl, [], np.full(128, PRIOR_PROMPT_TOKENS, np.int64))
    assert plan.notes["assumed_max_context"] == 32768
    assert (doc["split"]["rollout_gpus"], doc["split"]["train_gpus"]) == (plan.n_rollout_gpus, plan.n_train_gpus)
    assert sorted(i["tp"] for i in doc["instances"]) == sorted(i.tp for i in plan.instances)


def test_plan_that_fits_nothing_names_max_context(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "8", "--gpu", "h100", "--model", "llama-3.1-70b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-context" in err and "Traceback" not in err


def test_plan_with_a_declared_limit_that_does_not_fit_names_max_context(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "12", "--gpu", "h100", "--model", "qwen3-32b", "--max-context", "65536"]) == 2
    assert "--max-context" in capsys.readouterr().err


def test_a_colocated_plan_prints_colocated_not_two_full_pools(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # the 32B: its hedged first step (no kind declared) is time-shared; the 14B's is a streamed split
    from sim.commands import plan as plan_cmd

    search, searched = plan_cmd._search, []

    def once(*args: object, **kwargs: object) -> object:  # the text and --json print one search (CI time)
        if not searched:
            searched.append(search(*args, **kwargs))  # type: ignore[arg-type]
        return searched[0]

    monkeypatch.setattr(plan_cmd, "_search", once)
    assert main(["plan", "--gpus", "64", "--gpu", "h100", "--model", "qwen3-32b"]) == 0
    out = capsys.readouterr().out
    assert "split: colocated: rollout and training time-share all 64 GPUs" in out
    assert "64 rollout GPUs, 64 training GPUs" not in out
    assert main(["plan", "--gpus", "64", "--gpu", "h100", "--model", "qwen3-32b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"]["colocated"] is True


# --- item 3: never overwrite an input; replace an output only with --force -----------------------

FIXTURES = Path(__file__).parent / "fixtures"
_GEN = ["gen", "--workload", "math", "--steps", "1", "--batch", "4", "--group-size", "2"]


def test_gen_refuses_an_existing_file_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    out.write_text("my trace\n")
    assert main([*_GEN, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists; pass --force" in err and err.count("\n") == 1
    assert out.read_text() == "my trace\n"  # untouched
    assert main([*_GEN, "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith('{"type": "header"') or out.read_text().startswith('{"type":"header"')


def test_convert_never_writes_over_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "conversations.jsonl"
    original = (FIXTURES / "openai_chat" / "conversations.jsonl").read_bytes()
    log.write_bytes(original)
    for extra in ([], ["--force"]):  # --force replaces an old output, never the input
        assert main(["convert", "--from", "openai-chat", str(log), "-o", str(log), "--tokenizer", "estimate", *extra]) == 2
        assert "the input" in capsys.readouterr().err
        assert log.read_bytes() == original
    # the same file by another name, and a file inside an input folder
    assert main(["convert", "--from", "openai-chat", str(tmp_path / "." / log.name), "-o", str(log), "--force",
                 "--tokenizer", "estimate"]) == 2
    assert main(["convert", "--from", "openai-chat", str(tmp_path), "-o", str(log), "--force", "--tokenizer", "estimate"]) == 2
    assert log.read_bytes() == original
    out = tmp_path / "sub" / "t.jsonl"
    assert main(["convert", "--from", "openai-chat", str(log), "-o", str(out), "--tokenizer", "estimate"]) == 0
    assert main(["convert", "--from", "openai-chat", str(log), "-o", str(out), "--tokenizer", "estimate"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["convert", "--from", "openai-chat", str(log), "-o", str(out), "--tokenizer", "estimate", "--force"]) == 0


# --- item 4: replay --lenient reports the lines it drops ----------------------------------------

def test_replay_lenient_reports_every_dropped_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_sim_replay_cli import _trace

    tr = _trace(tmp_path / "t.jsonl", steps=2, n=16)
    lines = tr.read_text().splitlines()
    lines[3] = lines[3].replace('"prompt_tokens": ', '"prompt_tokens": -')  # line 4: a negative count
    lines[20] = "{not json"  # line 21
    tr.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    assert main(["replay", str(tr), "--gpus", "16", "--policy", "verl-static-uniform", "--lenient", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped 2 invalid line(s)" in err
    assert f"{tr}:4: field 'prompt_tokens'" in err and f"{tr}:21: " in err
    assert json.loads(out.read_text())["policies"]["verl-static-uniform"]["expected"] == 30


# --- item 5: one-line errors instead of tracebacks, and a decode that cannot fit ---------------

def test_predict_decode_refuses_a_kv_cache_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from cost_models.cli import main as calibrate

    argv = ["predict", "decode", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "1", "--batch", "256", "--context", "32768"]
    assert calibrate(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit" in err and "8,388,608 KV tokens" in err and "would fit: batch <=" in err
    assert calibrate([*argv, "--ignore-memory", "--json"]) == 0  # asked for anyway: a time
    assert json.loads(capsys.readouterr().out)["ms"] > 0
    assert calibrate(["predict", "decode", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "4", "--batch", "64",
                      "--context", "4096", "--json"]) == 0  # one that fits still answers


def test_calibrate_report_checks_its_output_folder_before_the_work(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cost_models.calibration import report as rep
    from cost_models.cli import main as calibrate

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("the report ran before its --out was checked")

    monkeypatch.setattr(rep, "run_report", no_work)
    for extra in ([], ["--engine"]):
        assert calibrate(["report", "--out", "/proc/rep", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--out /proc/rep: cannot write there" in err


def test_sweep_of_a_binary_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    path = tmp_path / "grid.yaml.gz"
    with gzip.open(path, "wt") as f:
        f.write("name: x\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "Traceback" not in err
