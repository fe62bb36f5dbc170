"""Writer -> reader round trips: what goes in comes out, byte-deterministically."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from libra.errors import TraceError, UserError
from libra.trace import StepArrays, TraceHeader, Trajectory, Turn, open_trace, read_trajectories, write_trace
from trace_strategies import trajectory_lists

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _steps_equal(a: StepArrays, b: StepArrays) -> None:
    assert a.step == b.step and a.ids == b.ids and a.groups == b.groups and a.tool_names == b.tool_names
    for name in ("prompt_tokens", "turn_offsets", "gen_tokens", "tool_tokens", "tool_code", "outcome_code", "finish_code"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
    np.testing.assert_array_equal(a.tool_latency_s, b.tool_latency_s)  # NaN == NaN here
    np.testing.assert_array_equal(a.reward, b.reward)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@SETTINGS
@given(trajs=trajectory_lists)
def test_round_trip(tmp_path: Path, suffix: str, trajs: list[Trajectory]) -> None:
    path = tmp_path / ("t" + suffix)
    header = TraceHeader(workload="swe", model="m", source="hypothesis", metadata={"seed": 3, "nested": {"a": [1]}})
    assert write_trace(path, trajs, header) == len(trajs)
    reader = open_trace(path)
    assert reader.header == header
    assert list(reader.trajectories()) == trajs
    # steps(): ascending, every trajectory exactly once, same arrays as the in-memory builder
    by_step: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_step.setdefault(t.step, []).append(t)
    got = list(reader.steps())
    assert [s.step for s in got] == sorted(by_step) == reader.step_numbers()
    for s in got:
        _steps_equal(s, StepArrays.from_trajectories(s.step, by_step[s.step]))
    summary = reader.validate()
    assert summary.n_trajectories == len(trajs)
    assert summary.n_turns == sum(len(t.turns) for t in trajs)


def test_writer_is_byte_deterministic(tmp_path: Path) -> None:
    trajs = [Trajectory(f"t{i}", i % 2, 5, (Turn(3, "bash", 0.5, 7, "ok"), Turn(1, None)), "g", 0.25, "stop") for i in range(50)]
    digests = set()
    for k in range(2):
        p = tmp_path / f"out{k}.jsonl.gz"
        write_trace(p, trajs, TraceHeader(workload="w"))
        digests.add(hashlib.sha256(p.read_bytes()).hexdigest())
        with gzip.open(p) as f:  # really gzip, and the header names no file
            assert f.readline().startswith(b'{"type":"header"')
        assert p.read_bytes()[4:8] == b"\0\0\0\0"  # mtime 0
    assert len(digests) == 1


def test_writer_key_order_and_omissions(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_trace(p, [Trajectory("a", 0, 5, (Turn(3, "bash"), Turn(1, None)))])
    line = p.read_text().strip()
    assert line == (
        '{"type":"trajectory","id":"a","step":0,"group":null,"prompt_tokens":5,"turns":['
        '{"gen_tokens":3,"tool":"bash","tool_latency_s":null,"tool_tokens":0,"outcome":null},'
        '{"gen_tokens":1,"tool":null}],"reward":null,"finish":null}'
    )


@pytest.mark.parametrize(
    "bad, field, rule",
    [
        (Trajectory("a", -1, 5, (Turn(1, None),)), "step", "must be an integer >= 0"),
        (Trajectory("a", 0, 0, (Turn(1, None),)), "prompt_tokens", "must be an integer >= 1"),
        (Trajectory("a", 0, 5, ()), "turns", "must be a non-empty list"),
        (Trajectory("a", 0, 5, (Turn(1, None), Turn(1, None))), "turns[0].tool", "must not be null before the last turn"),
        (Trajectory("a", 0, 5, (Turn(1, None, tool_tokens=3),)), "turns[0].tool_tokens", "must be 0 when tool is null"),
        (Trajectory("a", 0, 5, (Turn(1, None),), reward=float("nan")), "reward", "must be a finite number or null"),
        (Trajectory("a", 0, 5, (Turn(1.5, None),)), "turns[0].gen_tokens", "must be an integer >= 0"),  # type: ignore[arg-type]
    ],
)
def test_writer_rejects_invalid_and_leaves_nothing(tmp_path: Path, bad: Trajectory, field: str, rule: str) -> None:
    p = tmp_path / "t.jsonl"
    good = Trajectory("ok", 0, 5, (Turn(1, None),))
    with pytest.raises(TraceError) as ei:
        write_trace(p, [good, bad], TraceHeader())
    assert ei.value.line == 3 and ei.value.field == field and rule in ei.value.rule
    assert str(ei.value).startswith(f"{p}:3: field '{field}': ")
    assert os.listdir(tmp_path) == []  # no partial file, no temp file


def test_writer_rejects_duplicate_ids(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl.gz"
    trajs = [Trajectory(i, 0, 5, (Turn(1, None),)) for i in ("a", "b", "c", "b")]
    with pytest.raises(TraceError, match=r":4: field 'id': must be unique within the trace \(id 'b' also on line 2\)"):
        write_trace(p, trajs)
    assert not p.exists()


def test_writer_missing_directory_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        write_trace(tmp_path / "nope" / "t.jsonl", [])


def test_reward_and_latency_ints_read_as_floats(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"id":"a","step":0,"prompt_tokens":2,"turns":[{"gen_tokens":1,"tool":"x","tool_latency_s":3},'
                 '{"gen_tokens":1,"tool":null}],"reward":1}\n')
    (t,) = read_trajectories(p)
    assert type(t.reward) is float and type(t.turns[0].tool_latency_s) is float


def test_numpy_scalars_are_written_as_plain_numbers(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    t = Trajectory("a", np.int64(2), np.int32(7), (Turn(np.int64(3), "bash", np.float32(0.5), np.int64(4), "ok"),
                                                   Turn(np.int16(1), None)), reward=np.float64(1.0))  # type: ignore[arg-type]
    write_trace(p, [t])
    (back,) = read_trajectories(p)
    assert back == Trajectory("a", 2, 7, (Turn(3, "bash", 0.5, 4, "ok"), Turn(1, None)), reward=1.0)
    assert type(back.step) is int and type(back.turns[0].gen_tokens) is int


def test_writer_onto_a_directory_is_user_error(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(UserError, match="cannot write trace"):
        write_trace(tmp_path / "d.jsonl", [Trajectory("a", 0, 1, (Turn(1, None),))])
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl"]


def test_written_trace_has_the_mode_open_would_give(tmp_path) -> None:
    """The writer goes through a temporary file; the result must not stay private (0600)."""
    import os

    from libra.trace.records import Trajectory, Turn
    from libra.trace.writer import write_trace

    umask = os.umask(0o022)
    try:
        out = tmp_path / "t.jsonl"
        write_trace(out, [Trajectory("a", 0, 5, (Turn(3, None),))])
        assert (out.stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(umask)


def test_turn_policy_version_is_optional_and_round_trips(tmp_path: Path) -> None:
    """``turns[].policy_version`` (issue 20: libra-run records which policy version generated each
    turn) is written only when known, read back, and a bad value is a named rule."""
    path = tmp_path / "v.jsonl"
    t = Trajectory("a", 2, 5, (Turn(3, "python", 0.1, 4, "ok", policy_version=1), Turn(2, None, policy_version=2)), "g", 1.0, "stop")
    plain = Trajectory("b", 2, 5, (Turn(3, None),), "g", 0.0, "stop")
    write_trace(path, [t, plain])
    text = path.read_text()
    assert text.count('"policy_version"') == 2
    assert read_trajectories(path) == [t, plain]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "step": 0, "prompt_tokens": 1, "turns": [{"gen_tokens": 1, "tool": null, "policy_version": -1}]}\n')
    with pytest.raises(TraceError, match=r"field 'turns\[0\]\.policy_version': must be an integer >= 0 or null"):
        read_trajectories(bad)
