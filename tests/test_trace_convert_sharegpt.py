"""The ShareGPT ReAct converter (``libra-sim convert --from sharegpt-react``) on a hand-written
sample of the documented format (tests/fixtures/sharegpt_react/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.trace.convert import SOURCES, convert_sharegpt
from libra.trace.convert.sharegpt import parse_action
from libra.trace.reader import read_trajectories

SAMPLE = Path(__file__).parent / "fixtures" / "sharegpt_react" / "hotpotqa_react.jsonl"


@pytest.mark.parametrize("text,tool", [
    ("Thought 1: x\nAction 1: Search[Colorado orogeny]", "search"),
    ("Thought: y\nAction: Lookup[eastern sector]", "lookup"),
    ("Thought 3: done\nAction 3: Finish[1,800 to 7,000 ft]", "finish"),
    ("Thought: use the tool\nAction: python\nAction Input: print(1)", "python"),
    ("I now know.\nFinal Answer: 42", "finish"),
    ("Act: click[Buy Now]", "click"),
    ("Thought: no action at all", None),
    ("Action 2: Search Pavel Urysohn", None),
])
def test_parse_action(text: str, tool: str | None) -> None:
    assert parse_action(text) == tool


def test_sample_converts_turns_tools_outcomes(tmp_path: Path) -> None:
    assert "sharegpt-react" in SOURCES
    out = tmp_path / "t.jsonl"
    res = convert_sharegpt(SAMPLE, out)
    assert res.n_trajectories == 5
    assert res.steps == [0, 1]
    assert [w.split(":")[-1] for w, _ in res.skipped] == ["6"]
    assert res.finish_counts == {"null": 1, "stop": 4}
    trajs = read_trajectories(out)
    by = {t.id: t for t in trajs}
    a0 = by["hotpot-a-0"]
    assert [t.tool for t in a0.turns] == ["search", "search", None]
    assert [t.tool_latency_s for t in a0.turns[:2]] == [0.84, 0.61]
    assert a0.group == "q-arthur" and a0.reward == 1.0 and a0.finish == "stop"
    # ReAct's failure replies are errors; an unparseable action is a format error
    b1 = by["hotpot-b-1"]
    assert [(t.tool, t.outcome) for t in b1.turns[:4]] == [("search", "error"), ("lookup", "error"), ("format_error", "error"), ("search", "ok")]
    assert by["hotpot-a-1"].turns[0].outcome == "error"
    # cut off without Finish: null finish, the last call dropped (its observation was never read)
    c0 = by["hotpot-c-0"]
    assert c0.step == 1 and c0.finish is None and c0.turns[-1].tool is None and len(c0.turns) == 3


def test_demonstrations_marked_loss_false_are_prompt(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    conv = [{"from": "human", "loss": False, "value": "You are an agent. Reply OK."},
            {"from": "gpt", "loss": False, "value": "OK"},
            {"from": "human", "loss": False, "value": "Task: list files"},
            {"from": "gpt", "loss": True, "value": "Thought: run ls\nAct: bash[ls]"},
            {"from": "human", "loss": False, "value": "Traceback (most recent call last):\nOSError: x", "duration_ms": 1500},
            {"from": "gpt", "loss": True, "value": "Thought: done\nAct: answer[none]"}]
    src.write_text(json.dumps({"id": "os_0", "conversations": conv}) + "\n" + json.dumps({"conversations": "nope"}) + "\n")
    res = convert_sharegpt(src, tmp_path / "o.jsonl")
    assert res.n_trajectories == 1 and len(res.skipped) == 1 and "conversations" in res.skipped[0][1]
    (t,) = read_trajectories(tmp_path / "o.jsonl")
    assert len(t.turns) == 2 and t.turns[0].tool == "bash" and t.turns[0].outcome == "error"
    assert t.turns[0].tool_latency_s == 1.5 and t.finish == "stop"
    assert t.prompt_tokens > 15  # the acknowledged instruction counts as prompt


def test_cli_converts_and_reports_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    rc = main(["convert", "--from", "sharegpt-react", str(SAMPLE), "-o", str(tmp_path / "r.jsonl")])
    cap = capsys.readouterr()
    assert rc == 0 and "wrote 5 trajectories" in cap.out and "hotpotqa_react.jsonl:6" in cap.err


def test_fireact_messages_layout_and_runs_per_step(tmp_path: Path) -> None:
    """FireAct's OpenAI fine-tuning layout (``messages`` with role/content, observations as user
    messages) converts, and ``runs_per_step`` cuts the step-less runs into steps in file order while
    a run that names its step keeps it."""
    def run(q: str, step: int | None = None) -> str:
        rec: dict = {"messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": "Thought: search it.\nAction: search[" + q + "]"},
            {"role": "user", "content": "Observation: something about " + q},
            {"role": "assistant", "content": "Thought: done.\nAction: finish[x]"},
            {"role": "user", "content": "Observation: Episode finished, reward = True"}]}
        if step is not None:
            rec["step"] = step
        return json.dumps(rec)

    src = tmp_path / "hotpotqa.jsonl"
    src.write_text("\n".join([run("a"), run("b"), run("c", step=7), run("d"), run("e")]) + "\n")
    res = convert_sharegpt(src, tmp_path / "t.jsonl", step=3, runs_per_step=2)
    assert res.n_trajectories == 5 and not res.skipped
    trajs = {t.group: t for t in read_trajectories(tmp_path / "t.jsonl")}
    steps = sorted(t.step for t in trajs.values())
    assert steps == [3, 3, 4, 4, 7]  # a, b -> 3; d, e -> 4; c names step 7
    for t in trajs.values():
        assert [turn.tool for turn in t.turns][:1] == ["search"] and t.finish == "stop"
    with pytest.raises(Exception, match="runs-per-step"):
        convert_sharegpt(src, tmp_path / "u.jsonl", runs_per_step=0)
