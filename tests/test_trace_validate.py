"""One test per rule of TRACE_FORMAT.md v1: the error names the file, the line, the field and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.errors import TraceError
from libra.trace import open_trace

OK_TURN = {"gen_tokens": 1, "tool": None}
CALL = {"gen_tokens": 1, "tool": "bash", "tool_latency_s": 1.0, "tool_tokens": 2, "outcome": "ok"}


def traj(**over: object) -> dict:
    base: dict = {"type": "trajectory", "id": "x", "step": 0, "prompt_tokens": 5, "turns": [CALL, OK_TURN]}
    base.update(over)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()
GOOD = json.dumps({"id": "good", "step": 0, "prompt_tokens": 1, "turns": [OK_TURN]})


def _line(rec: object) -> str:
    return rec if isinstance(rec, str) else json.dumps(rec)


def check(tmp_path: Path, bad: object, field: str, rule: str, line: int = 2, before: list[str] | None = None) -> None:
    lines = before if before is not None else [GOOD]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines + [_line(bad)]) + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as ei:
        open_trace(p).validate()
    e = ei.value
    assert (e.line, e.field) == (line, field), str(e)
    assert rule in e.rule, str(e)
    assert str(e).startswith(f"{p}:{line}: field '{field}': ")


CASES = [
    # (record, field, rule)
    (traj(id=_DROP), "id", "required key is missing"),
    (traj(id=""), "id", "must be a non-empty string"),
    (traj(id=5), "id", "must be a non-empty string"),
    (traj(step=_DROP), "step", "required key is missing"),
    (traj(step=-1), "step", "must be an integer >= 0"),
    (traj(step=1.0), "step", "must be an integer >= 0"),
    (traj(step=True), "step", "must be an integer >= 0"),
    (traj(step="3"), "step", "must be an integer >= 0"),
    (traj(group=3), "group", "must be a string or null"),
    (traj(prompt_tokens=_DROP), "prompt_tokens", "required key is missing"),
    (traj(prompt_tokens=0), "prompt_tokens", "must be an integer >= 1"),
    (traj(prompt_tokens=2.5), "prompt_tokens", "must be an integer >= 1"),
    (traj(turns=_DROP), "turns", "required key is missing"),
    (traj(turns=[]), "turns", "must be a non-empty list"),
    (traj(turns={"gen_tokens": 1}), "turns", "must be a non-empty list"),
    (traj(turns=[3]), "turns[0]", "must be a JSON object"),
    (traj(turns=[{"tool": None}]), "turns[0].gen_tokens", "required key is missing"),
    (traj(turns=[{"gen_tokens": -1, "tool": None}]), "turns[0].gen_tokens", "must be an integer >= 0"),
    (traj(turns=[{"gen_tokens": False, "tool": None}]), "turns[0].gen_tokens", "must be an integer >= 0"),
    (traj(turns=[CALL, {"gen_tokens": 1}]), "turns[1].tool", "required key is missing"),
    (traj(turns=[{**CALL, "tool": ""}, OK_TURN]), "turns[0].tool", "must be a non-empty string or null"),
    (traj(turns=[{**CALL, "tool": 7}, OK_TURN]), "turns[0].tool", "must be a non-empty string or null"),
    (traj(turns=[OK_TURN, OK_TURN]), "turns[0].tool", "must not be null before the last turn"),
    (traj(turns=[CALL, CALL]), "turns[1].tool", "must be null on the last turn unless finish is"),
    (traj(turns=[CALL, CALL], finish="stop"), "turns[1].tool", "must be null on the last turn unless finish is"),
    (traj(turns=[CALL, {**CALL, "tool_latency_s": -0.1}]), "turns[1].tool_latency_s", "must be a finite number >= 0"),
    (traj(turns=[{**CALL, "tool_latency_s": "1s"}, OK_TURN]), "turns[0].tool_latency_s", "must be a finite number >= 0"),
    (traj(turns=[{**CALL, "tool_tokens": -2}, OK_TURN]), "turns[0].tool_tokens", "must be an integer >= 0"),
    (traj(turns=[{**CALL, "tool_tokens": 2.0}, OK_TURN]), "turns[0].tool_tokens", "must be an integer >= 0"),
    (traj(turns=[{**CALL, "outcome": "fail"}, OK_TURN]), "turns[0].outcome", "must be one of ok, error, timeout or null"),
    (traj(turns=[CALL, {"gen_tokens": 1, "tool": None, "tool_tokens": 4}]), "turns[1].tool_tokens", "must be 0 when tool is null"),
    (traj(turns=[CALL, {"gen_tokens": 1, "tool": None, "outcome": "ok"}]), "turns[1].outcome", "must be null when tool is null"),
    (traj(turns=[CALL, {"gen_tokens": 1, "tool": None, "tool_latency_s": 0.0}]), "turns[1].tool_latency_s", "must be null when tool is null"),
    (traj(reward="1"), "reward", "must be a finite number or null"),
    (traj(reward=True), "reward", "must be a finite number or null"),
    (traj(finish="done"), "finish", "must be one of stop, length, tool_limit, abort or null"),
    (traj(type="event"), "type", "must be 'header' or 'trajectory'"),
    ({"type": "header", "format": "libra-trace", "version": 1}, "type", "a header is only allowed as the first non-blank line"),
    ("[1, 2]", "(line)", "line must be a JSON object"),
    ("42", "(line)", "line must be a JSON object"),
    ('{"id": "x", "step": 0,', "(line)", "invalid JSON"),
    ('{"id": "x"} trailing', "(line)", "invalid JSON"),
]


@pytest.mark.parametrize("bad, field, rule", CASES, ids=[f"{c[1]}:{c[2][:30]}" for c in CASES])
def test_rule(tmp_path: Path, bad: object, field: str, rule: str) -> None:
    check(tmp_path, bad, field, rule)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers(tmp_path: Path, literal: str) -> None:
    bad = '{"id": "x", "step": 0, "prompt_tokens": 5, "turns": [{"gen_tokens": 1, "tool": null}], "reward": %s}' % literal
    check(tmp_path, bad, "reward", "must be a finite number or null")
    lat = '{"id": "x", "step": 0, "prompt_tokens": 5, "turns": [{"gen_tokens": 1, "tool": "b", "tool_latency_s": %s}, {"gen_tokens": 1, "tool": null}]}' % literal
    check(tmp_path, lat, "turns[0].tool_latency_s", "must be a finite number >= 0")


def test_invalid_utf8(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(GOOD.encode() + b'\n{"id": "\xff\xfe", "step": 0}\n')
    with pytest.raises(TraceError, match=r":2: field '\(line\)': invalid UTF-8"):
        open_trace(p).validate()


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    rec = {"id": "dup", "step": 0, "prompt_tokens": 1, "turns": [OK_TURN]}
    lines = [GOOD, json.dumps(rec), "", json.dumps({**rec, "step": 4})]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as ei:
        open_trace(p).validate()
    assert ei.value.line == 4 and ei.value.field == "id"
    assert "must be unique within the trace (id 'dup' also on line 2)" in str(ei.value)


@pytest.mark.parametrize(
    "header, field, rule",
    [
        ({"type": "header", "format": "libra-trace", "version": 2}, "version", "must be a known format version (1)"),
        ({"type": "header", "format": "libra-trace", "version": "1"}, "version", "must be a known format version"),
        ({"type": "header", "format": "libra-trace", "version": True}, "version", "must be a known format version"),
        ({"type": "header", "format": "libra-trace"}, "version", "required key is missing"),
        ({"type": "header", "format": "other", "version": 1}, "format", "must be 'libra-trace'"),
        ({"type": "header", "version": 1}, "format", "required key is missing"),
        ({"type": "header", "format": "libra-trace", "version": 1, "model": 14}, "model", "must be a string or null"),
    ],
)
def test_header_rules_are_fatal_even_when_lenient(tmp_path: Path, header: dict, field: str, rule: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("\n  \n" + json.dumps(header) + "\n" + GOOD + "\n")
    for lenient in (False, True):
        with pytest.raises(TraceError) as ei:
            open_trace(p, lenient=lenient).validate()
        assert (ei.value.line, ei.value.field) == (3, field) and rule in ei.value.rule


def test_header_after_blank_lines_is_the_header(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('\n\n{"type": "header", "format": "libra-trace", "version": 1, "workload": "swe", "x": [1]}\n' + GOOD + "\n")
    r = open_trace(p)
    assert r.header is not None and r.header.workload == "swe" and r.header.metadata == {"x": [1]}
    assert r.validate().n_trajectories == 1


def test_valid_fixture(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "traces" / "valid_unsorted.jsonl"
    s = open_trace(fixture).validate()
    assert (s.n_trajectories, s.n_steps, s.n_turns, s.sorted) == (5, 3, 9, False)
