"""The workload generator's mechanics: determinism, validity per the reader, trace semantics."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from libra.errors import UserError
from libra.trace.reader import open_trace
from libra.trace.records import FINISHES, Trajectory
from libra.trace.workload import (GENERATOR_VERSION, WORKLOADS, generate, generate_steps, make_params,
                                  trace_header)
from libra.trace.workload.engine import to_trajectories
from libra.trace.writer import write_trace

STOP, LENGTH, TOOL_LIMIT = (FINISHES.index(f) for f in ("stop", "length", "tool_limit"))


def _write(path, workload: str, seed: int, steps: int = 2, batch: int = 64, group_size: int = 8, **params) -> bytes:
    p = make_params(workload, **params)
    header = trace_header(p, steps, batch, group_size, seed)
    write_trace(path, generate(workload, steps, batch, group_size, seed, **params), header)
    return path.read_bytes()


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_same_seed_same_bytes_different_seed_different(tmp_path, workload):
    a = _write(tmp_path / "a.jsonl.gz", workload, seed=7)
    b = _write(tmp_path / "b.jsonl.gz", workload, seed=7)
    c = _write(tmp_path / "c.jsonl.gz", workload, seed=8)
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert a != c


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_generated_trace_validates_and_round_trips(tmp_path, workload):
    path = tmp_path / "t.jsonl"
    _write(path, workload, seed=3, steps=3, batch=48, group_size=6)
    reader = open_trace(path)
    summary = reader.validate()
    assert summary.n_trajectories == 3 * 48 and summary.n_steps == 3 and not summary.skipped
    assert reader.header.workload == workload
    assert reader.header.metadata["generator_version"] == GENERATOR_VERSION
    assert reader.header.metadata["params"] == make_params(workload).as_dict()
    expected = list(generate_steps(workload, 3, 48, 6, 3))
    for got, want in zip(reader.steps(), expected, strict=True):
        assert got.step == want.step and got.ids == want.ids and got.groups == want.groups
        for name in ("prompt_tokens", "turn_offsets", "gen_tokens", "tool_tokens", "outcome_code",
                     "finish_code", "reward"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        np.testing.assert_array_equal(got.tool_latency_s, want.tool_latency_s)


def test_generate_yields_trajectory_records_in_step_order():
    trajs = list(generate("search", steps=3, batch=10, group_size=5, seed=0))
    assert all(isinstance(t, Trajectory) for t in trajs)
    assert [t.step for t in trajs] == sorted(t.step for t in trajs) == [s for s in range(3) for _ in range(10)]
    assert len({t.id for t in trajs}) == len(trajs)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_finish_semantics_and_caps(workload):
    p = make_params(workload)
    for sa in generate_steps(workload, 4, 256, 8, 11):
        ends = sa.turn_offsets[1:] - 1
        last_has_tool = sa.tool_code[ends] >= 0
        fin = sa.finish_code
        assert set(np.unique(fin)) <= {STOP, LENGTH, TOOL_LIMIT}
        # stop: last turn without tool; tool_limit: last turn still calls it, at the step limit
        assert not last_has_tool[fin == STOP].any()
        assert last_has_tool[fin == TOOL_LIMIT].all()
        assert (sa.n_turns[fin == TOOL_LIMIT] == p.max_turns).all()
        # every turn before the last calls a tool; tool fields are null exactly when there is no call
        not_last = np.ones(len(sa.gen_tokens), bool)
        not_last[ends] = False
        assert (sa.tool_code[not_last] >= 0).all()
        no_tool = sa.tool_code < 0
        assert np.isnan(sa.tool_latency_s[no_tool]).all() and (sa.outcome_code[no_tool] == -1).all()
        assert (sa.tool_tokens[no_tool] == 0).all()
        assert (sa.tool_latency_s[~no_tool] >= 0).all() and (sa.outcome_code[~no_tool] >= 0).all()
        # the context cap holds; trajectories that end on it reach it exactly
        assert (sa.total_tokens <= p.max_context).all()
        assert (sa.total_tokens[fin == LENGTH] == p.max_context).all()
        assert (sa.n_turns <= p.max_turns).all()
        assert (sa.gen_tokens <= p.gen_max_per_turn).all()
        # only a stop can be rewarded
        assert (sa.reward[fin != STOP] == 0).all()
        assert set(np.unique(sa.reward)) <= {0.0, 1.0}


def test_timeouts_take_exactly_the_timeout():
    p = make_params("swe")
    sa = next(generate_steps("swe", 1, 512, 8, 0))
    timed_out = sa.outcome_code == 2
    assert timed_out.any()
    assert (sa.tool_latency_s[timed_out] == p.lat_timeout_s).all()
    assert (sa.tool_latency_s[sa.outcome_code == 0] < p.lat_timeout_s).all()


def test_groups_share_prompt_and_prompts_are_distinct_within_a_step():
    for sa in generate_steps("swe", 3, 128, 8, 5):
        groups = np.array(sa.groups)
        assert len(set(sa.groups)) == 16
        for g in set(sa.groups):
            members = groups == g
            assert members.sum() == 8
            assert len(set(sa.prompt_tokens[members].tolist())) == 1
        assert sa.ids[0] == f"s{sa.step}-{sa.groups[0]}-r0"


def test_small_context_cap_truncates_and_small_step_limit_limits():
    fin = np.concatenate([sa.finish_code for sa in generate_steps("swe", 2, 256, 8, 0, max_context=8192)])
    assert (fin == LENGTH).mean() > 0.3
    fin = np.concatenate([sa.finish_code for sa in generate_steps("swe", 2, 256, 8, 0, max_turns=5)])
    assert (fin == TOOL_LIMIT).mean() > 0.5


def test_columnar_and_row_forms_agree():
    sa = next(generate_steps("math", 1, 32, 4, 2, first_step=9))
    rows = list(to_trajectories(sa))
    assert sa.step == 9 and all(t.step == 9 for t in rows)
    np.testing.assert_array_equal([t.total_tokens for t in rows], sa.total_tokens)
    np.testing.assert_array_equal([len(t.turns) for t in rows], sa.n_turns)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch": 100, "group_size": 8}, "multiple of --group-size"),
        ({"batch": 0}, "--batch"),
        ({"seed": -1}, "--seed"),
        ({"turns_medianx": 3}, "unknown parameter"),
        ({"error_memory": 1.0}, "error_memory"),
        ({"max_context": 100}, "max_context"),
        ({"max_turns": 2.5}, "integer"),
        ({"drift": "fast"}, "must be a number"),
    ],
)
def test_bad_arguments_raise_user_error(kwargs, match):
    args = {"steps": 1, "batch": 16, "group_size": 8, "seed": 0}
    args.update(kwargs)
    with pytest.raises(UserError, match=match):
        list(generate_steps("swe", **args))


def test_unknown_workload_is_a_user_error():
    with pytest.raises(UserError, match="unknown workload 'chess'"):
        make_params("chess")


def test_more_prompts_per_step_than_the_dataset_still_gives_distinct_prompts():
    sa = next(generate_steps("swe", 1, 4096 * 2, 2, 0, dataset_prompts=16))
    assert len(set(sa.groups)) == 4096


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_model_hint_is_a_cost_model_catalog_model(workload):
    from cost_models.models import get_model

    assert get_model(WORKLOADS[workload].model_hint).name
