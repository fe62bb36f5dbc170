"""Synthetic steps for the policy-core tests, and tests of the planner's step statistics.

``make_step`` builds a seeded SWE-like step: lognormal final lengths, a tool call per ~1K
tokens, and (optionally) trajectories that hit a tool *error* early and then run long, so the
causal router has a signal to learn.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.planner.stats import compute_stats, default_prior_step
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn


def make_step(
    step: int = 0,
    n: int = 64,
    median: float = 4000.0,
    sigma: float = 0.7,
    seed: int = 0,
    error_long: bool = False,
    prompt: int = 500,
    tool_latency: float = 2.0,
) -> StepArrays:
    """A seeded synthetic step. With ``error_long`` a quarter of the trajectories see an ``error``
    on their first tool call and are 4x longer than the rest."""
    rng = np.random.default_rng(seed * 1000 + step)
    trajs = []
    for i in range(n):
        long_err = error_long and i % 4 == 0
        final = float(np.exp(np.log(median) + sigma * rng.standard_normal()))
        final *= 4.0 if long_err else 1.0
        final = min(final, 60000.0)
        body = max(int(final) - prompt, 40)
        k = max(2, int(body // 1000))
        per = body // k
        turns = []
        for t in range(k):
            last = t == k - 1
            gen = per if last else per // 2
            outcome = None if last else ("error" if (long_err and t == 0) else "ok")
            turns.append(Turn(gen_tokens=gen, tool=None if last else "bash", tool_latency_s=None if last else tool_latency,
                              tool_tokens=0 if last else per - gen, outcome=outcome))
        trajs.append(Trajectory(id=f"s{step}-t{i}", step=step, prompt_tokens=prompt, turns=tuple(turns), group=f"g{i // 8}"))
    return StepArrays.from_trajectories(step, trajs)


def make_history(k: int = 3, **kw: object) -> list[StepArrays]:
    return [make_step(step=s, **kw) for s in range(k)]  # type: ignore[arg-type]


def with_timeouts(s: StepArrays, stuck: set[int], latency_s: float = 30.0) -> StepArrays:
    """``s`` with the first tool call of trajectories ``stuck`` taking ``latency_s`` (a tool timeout)."""
    trajs = []
    for i in range(s.n):
        a, b = int(s.turn_offsets[i]), int(s.turn_offsets[i + 1])
        turns = []
        for t in range(a, b):
            tool = None if s.tool_code[t] < 0 else s.tool_names[s.tool_code[t]]
            lat = None if tool is None else (latency_s if i in stuck and t == a else float(s.tool_latency_s[t]))
            turns.append(Turn(int(s.gen_tokens[t]), tool, lat, int(s.tool_tokens[t]), None if tool is None else "ok"))
        trajs.append(Trajectory(s.ids[i], s.step, int(s.prompt_tokens[i]), tuple(turns), group=f"g{i // 8}"))
    return StepArrays.from_trajectories(s.step, trajs)


def test_stats_conserve_tokens() -> None:
    """Per-cell decode and prefill tokens add up to the history's per-trajectory totals,
    rescaled to the upcoming step's trajectory count."""
    hist = make_history(2, n=40)
    prompts = np.full(80, 500)
    st = compute_stats(hist, prompts)
    gen = sum(int(s.gen_tokens.sum()) for s in hist) / sum(s.n for s in hist) * 80
    assert st.decode_tokens.sum() == pytest.approx(gen)
    tool = sum(int(s.tool_tokens.sum()) for s in hist) / sum(s.n for s in hist) * 80
    assert st.prefill_tokens.sum() == pytest.approx(tool + 80 * 500)
    assert st.n_trajectories == 80
    # every trajectory reaches the first cells it passes through; reach never exceeds the count
    assert st.reach.max() <= 80 + 1e-9
    # the tail trajectory is one of the longest
    assert st.tail_context >= np.quantile(st.final_context, 0.9)


def test_stats_context_sums_match_direct_count() -> None:
    """decode_ctx_sum equals the sum over every generated token of its context position."""
    s = make_step(n=5, seed=3)
    st = compute_stats([s], s.prompt_tokens)
    direct = 0.0
    for i in range(s.n):
        ctx = int(s.prompt_tokens[i])
        for t in range(int(s.turn_offsets[i]), int(s.turn_offsets[i + 1])):
            g = int(s.gen_tokens[t])
            direct += sum(range(ctx, ctx + g))
            ctx += g + int(s.tool_tokens[t])
    assert st.decode_ctx_sum.sum() == pytest.approx(direct)


def test_prior_is_deterministic_and_flagged() -> None:
    a, b = default_prior_step(64), default_prior_step(64)
    assert np.array_equal(a.total_tokens, b.total_tokens)
    st = compute_stats([], np.full(64, 1024))
    assert st.from_prior
    assert st.digest == compute_stats([], np.full(64, 1024)).digest


def test_group_max_is_each_groups_largest_and_leaves_ungrouped_alone() -> None:
    """``group_max`` (one scatter-max since session 36; a per-group loop was most of a hedged
    launch's time) against the definition, on seeded steps with and without groups."""
    import types

    from libra.planner.stats import group_max

    rng = np.random.default_rng(7)
    for trial in range(50):
        n = int(rng.integers(0, 40))
        groups = tuple(None if rng.random() < 0.25 else f"g{int(rng.integers(0, 6))}" for _ in range(n))
        values = rng.integers(0, 10_000, n) if trial % 2 else rng.random(n)
        want = np.array(values, copy=True)
        for g in {x for x in groups if x is not None}:
            rows = [i for i, x in enumerate(groups) if x == g]
            want[rows] = values[rows].max()
        got = group_max(types.SimpleNamespace(groups=groups), values)  # type: ignore[arg-type]
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert got is not values  # the caller's array is left as it was


def test_a_kept_prior_digest_is_the_one_a_fresh_digest_gives() -> None:
    """``compute_stats`` keeps the prior digests a hedged search asks for again: a second call
    with equal arguments answers the same statistics, and any other argument (here the tail
    quantile and the prompts) a digest of its own."""
    from libra.planner.stats import clear_prior_digests

    prompts = np.full(48, 700)
    clear_prior_digests()
    fresh = compute_stats([], prompts, tail_quantile=0.5)
    again = compute_stats([], prompts.copy(), tail_quantile=0.5)
    assert again.digest == fresh.digest and np.array_equal(again.final_context, fresh.final_context)
    assert compute_stats([], prompts, tail_quantile=0.9).digest != fresh.digest
    assert compute_stats([], np.full(48, 300), tail_quantile=0.5).digest != fresh.digest
    clear_prior_digests()
    assert compute_stats([], prompts, tail_quantile=0.5).digest == fresh.digest  # recomputed, the same


def test_drift_grows_with_length_shift() -> None:
    base = compute_stats([make_step(n=64, median=4000)], None)
    same = compute_stats([make_step(n=64, median=4000, seed=1)], None)
    longer = compute_stats([make_step(n=64, median=8000)], None)
    assert same.drift(base) < longer.drift(base)
    assert longer.drift(base) == pytest.approx(np.log(2), abs=0.15)


def test_tool_time_tail_is_kept_next_to_the_length_tail() -> None:
    """A short trajectory stuck in a long tool call can be the critical path: the statistics
    keep it as a second tail next to the longest trajectory."""
    step = with_timeouts(make_step(n=16, median=4000, sigma=0.2, tool_latency=0.05), {3})
    st = compute_stats([step], step.prompt_tokens)
    assert st.tail_decode_tokens.shape[0] == 2
    assert st.tail_tool_s.max() >= 30.0
    assert st.tail_context == int(step.total_tokens.max())


def test_the_trajectory_that_generates_most_is_a_tail_where_tool_returns_make_the_longest() -> None:
    """The critical path is decode and tool time. Where tool returns make most of the context
    (InterCode-SQL's result tables), the longest trajectory generates little and the one that
    generates most is shorter: it is kept as a tail too (the hindsight makespan of one such
    step was predicted at 54.6 s against 134.1 s simulated, TP 1 on 56 A800)."""
    trajs = []
    for i in range(16):
        if i == 0:  # the longest: one huge tool return, little generation
            turns = (Turn(50, "sql", 2.0, 20000, "ok"), Turn(50, None, None, 0, None))
        elif i == 1:  # generates most: many turns, fast tools, short returns
            turns = tuple(Turn(500, "sql", 0.01, 20, "ok") for _ in range(9)) + (Turn(500, None, None, 0, None),)
        else:
            turns = (Turn(100, "sql", 2.0, 200, "ok"), Turn(100, "sql", 2.0, 200, "ok"), Turn(100, None, None, 0, None))
        trajs.append(Trajectory(f"t{i}", 0, 500, turns, group=f"g{i // 4}"))
    step = StepArrays.from_trajectories(0, trajs)
    st = compute_stats([step], step.prompt_tokens)
    assert st.tail_context == int(step.total_tokens.max())  # the length tail is still there
    assert st.tail_decode_tokens.sum(1).max() == pytest.approx(5000.0)


def test_tail_scenarios_hold_a_rare_timeout_that_the_expected_rank_misses() -> None:
    """One 30 s timeout in 192 trajectories: the longest of the next 64 holds it with
    probability about 1 - (1 - 1/192)^64 = 0.28. The expected-rank tail (the pooled sample's
    1 - 1/65 quantile, the 3rd longest tool time) never shows it; the tail rows at the longest's
    87.5th percentile do, those at its 12.5th and 37.5th do not."""
    hist = make_history(3, n=64, median=600, sigma=0.2, tool_latency=0.05)
    hist[1] = with_timeouts(hist[1], {5})
    prompts = np.full(64, 500)
    assert compute_stats(hist, prompts).tail_tool_s.max() < 1.0
    tool = {u: compute_stats(hist, prompts, tail_quantile=u).tail_tool_s.max() for u in (0.125, 0.375, 0.625, 0.875)}
    assert tool[0.875] >= 30.0
    assert tool[0.125] < 1.0 and tool[0.375] < 1.0
    # the bulk does not move with the tail rows (the 7/8 row, extrapolated beyond the window's
    # longest, may add context cells past it: the bulk has nothing there)
    a, b = compute_stats(hist, prompts), compute_stats(hist, prompts, tail_quantile=0.875)
    k = len(a.decode_tokens)
    assert np.array_equal(a.decode_tokens, b.decode_tokens[:k]) and not b.decode_tokens[k:].any()
    assert np.array_equal(a.reach, b.reach[:k]) and not b.reach[k:].any()
    assert a.digest != b.digest


def test_prior_is_capped_by_a_known_context_limit_and_plans_for_it() -> None:
    """A run with a 512-token context limit is not planned from 8K-token SWE-like trajectories:
    the prior is scaled into the limit, and the planner uses the cluster's ``max_context``."""
    from libra.cluster import ClusterSpec
    from libra.planner.search import Planner

    full, capped = default_prior_step(128), default_prior_step(128, cap=512)
    assert int(full.total_tokens.max()) > 4096
    assert int(capped.total_tokens.max()) <= 512 and np.median(capped.total_tokens) <= 512 / 4
    assert capped.n == 128 and (capped.gen_tokens >= 1).all()
    assert np.array_equal(default_prior_step(128, cap=None).total_tokens, full.total_tokens)  # no cap: unchanged
    st = compute_stats([], np.full(64, 40), prior_cap=512)
    assert st.from_prior
    big = Planner(ClusterSpec(8, "h100", "qwen3-8b", 8)).search([], np.full(64, 40)).stats
    small = Planner(ClusterSpec(8, "h100", "qwen3-8b", 8, max_context=512)).search([], np.full(64, 40)).stats
    assert small.n_trajectories == big.n_trajectories and small.from_prior
    assert small.digest != big.digest
