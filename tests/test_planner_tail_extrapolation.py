"""The next step's longest trajectory beyond what the history window has seen.

A tail scenario asks a quantile of the next step's longest; above the pool's own longest the
window cannot answer it from data, so ``compute_stats`` extrapolates it from the tail index of
the trajectories' generated tokens (``tail_index``, ``beyond_window_stretch``), inside the
declared limits. The rollout DP then picks each GPU budget's layout by its mean makespan over
the tail scenarios, the expectation the search ranks by.
"""

from __future__ import annotations

import numpy as np

from libra.planner.stats import PriorSpec, beyond_window_stretch, compute_stats, tail_index
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from tests.test_planner_workload import make_history, make_step


def test_the_stretch_is_one_where_the_pool_answers_the_quantile_and_grows_with_the_tail_index() -> None:
    """P(next longest <= observed longest) = m / (m + n) for exchangeable draws: below it the
    pool answers; above it the Frechet ratio of the two maxima grows with the tail index."""
    assert beyond_window_stretch(0.5, 64, 64, 0.5) == 1.0
    assert beyond_window_stretch(0.74, 64, 192, 0.5) == 1.0  # m / (m + n) = 0.75
    assert beyond_window_stretch(0.875, 64, 64, 0.0) == 1.0  # an exponential-like tail: no stretch
    assert np.isclose(beyond_window_stretch(0.875, 31, 31, 0.5), 7.0 ** 0.5)
    assert beyond_window_stretch(0.875, 64, 64, 0.6) > beyond_window_stretch(0.875, 64, 64, 0.3) > 1.0
    # a longer window (m = 3n) extrapolates less than one step (m = n)
    assert beyond_window_stretch(0.875, 64, 192, 0.4) < beyond_window_stretch(0.875, 64, 64, 0.4)


def test_the_tail_index_tells_a_pareto_tail_from_an_exponential_one() -> None:
    rng = np.random.default_rng(7)
    assert tail_index(rng.exponential(500.0, 4000)) < 0.2
    assert abs(tail_index(rng.pareto(2.0, 4000) + 1.0) - 0.5) < 0.15
    assert tail_index(np.array([10.0, 20.0, 30.0])) == 0.0  # too few to estimate


def _runaway_step(n: int = 32, long_gen: int = 1800, step: int = 0) -> StepArrays:
    """``n`` short trajectories (10 turns of ~20-120 tokens) and one that repeats a long turn
    (a degenerate loop, as InterCode CTF's GPT-4 runs do)."""
    rng = np.random.default_rng(step)
    trajs = []
    for i in range(n):
        per = [int(x) for x in rng.integers(20, 120, 10)]
        if i == 0:
            per = [8, 8] + [long_gen // 8] * 8
        turns = tuple(Turn(g, None if t == 9 else "bash", None if t == 9 else 2.0, 0 if t == 9 else 60, None if t == 9 else "ok")
                      for t, g in enumerate(per))
        trajs.append(Trajectory(id=f"s{step}-t{i}", step=step, prompt_tokens=500, turns=turns, group=f"g{i}"))
    return StepArrays.from_trajectories(step, trajs)


def test_a_quantile_beyond_the_window_generates_more_than_the_longest_seen() -> None:
    """With one step of history (m = n), the 87.5th percentile of the next step's longest lies
    beyond the pool: its tail row generates more than any trajectory did, the 12.5th does not,
    and a declared context limit holds the extrapolated row inside it."""
    hist = [_runaway_step()]
    prompts = hist[0].prompt_tokens
    seen = int(np.add.reduceat(hist[0].gen_tokens, hist[0].turn_offsets[:-1]).max())
    hi = compute_stats(hist, prompts, tail_quantile=0.875)
    lo = compute_stats(hist, prompts, tail_quantile=0.125)
    assert hi.tail_decode_tokens[0].sum() > 1.2 * seen
    assert lo.tail_decode_tokens.sum(1).max() <= seen
    assert hi.tail_context > int(hist[0].total_tokens.max())
    capped = compute_stats(hist, prompts, tail_quantile=0.875, prior=PriorSpec(max_context=3000))
    assert seen <= capped.tail_decode_tokens[0].sum() < hi.tail_decode_tokens[0].sum()
    assert capped.tail_context <= 3000
    # the nominal statistics (the longest's expected rank, within the pool) are not extrapolated
    assert compute_stats(hist, prompts).tail_decode_tokens.sum(1).max() <= seen


def test_a_light_tailed_workload_is_barely_extrapolated() -> None:
    """Lognormal lengths of sigma 0.2 have a thin tail: the extrapolated row stays within a few
    percent of the longest seen (the bulk statistics do not move with the tail rows)."""
    hist = make_history(3, n=64, median=4000, sigma=0.2)
    prompts = np.full(64, 500)
    gen = np.concatenate([np.add.reduceat(s.gen_tokens, s.turn_offsets[:-1]) for s in hist])
    hi = compute_stats(hist, prompts, tail_quantile=0.875)
    assert hi.tail_decode_tokens[0].sum() <= 1.15 * gen.max()
    nominal = compute_stats(hist, prompts)
    k = min(len(nominal.decode_tokens), len(hi.decode_tokens))
    assert np.allclose(nominal.decode_tokens[:k], hi.decode_tokens[:k]) and hi.decode_tokens[k:].sum() == 0


def test_the_dp_picks_each_budgets_layout_by_its_mean_over_the_tail_scenarios() -> None:
    """Given the tail scenarios' DPs, the layout chosen on a GPU budget is the one whose mean
    makespan over them is least (its counts the nominal best), not the nominal best."""
    from libra.cluster import ClusterSpec
    from libra.planner.search import TAIL_SCENARIOS, Planner

    planner = Planner(ClusterSpec(24, "a100", "qwen3-14b", 8))
    hist = [make_step(n=32, median=3000, sigma=1.0, seed=3)]
    prompts = hist[0].prompt_tokens
    dp = planner.rollout_dp(compute_stats(hist, prompts))
    tails = [planner.rollout_dp(compute_stats(hist, prompts, tail_quantile=u)) for u in TAIL_SCENARIOS]
    for G in (4, 8, 12):
        choice = dp.best(G, tails=tails)
        assert choice is not None
        means = {}
        for c in dp._all_curves():
            r = dp._best_counts(c, G)
            if r is not None and len(c.layout.tps) == 1:
                means[c.layout] = float(np.mean([t.scenario_makespan(c.layout, r[1], r[0]) for t in tails]))
        if len(choice.layout.tps) == 1:
            assert means[choice.layout] <= min(means.values()) + 1e-9


def test_a_tool_bound_step_does_not_leave_an_unseen_runaway_to_low_tp() -> None:
    """InterCode CTF's GPT-4 log (a seen held-out log, in the repo): after step 0, whose critical
    path was a 60 s tool wait and whose longest run generated 1,815 tokens, every rollout TP
    looks equally fast on the window; step 1 then held a run of 4,151 tokens (106 s at TP 1 on
    A100, 32 s at TP 8). With the 7/8 scenario extrapolated beyond the window, the plan for step
    1 runs no instance below TP 4 (the nominal DP had picked three TP-2 instances)."""
    from libra.cluster import ClusterSpec
    from libra.planner.search import Planner, SearchOptions
    from libra.trace.reader import TraceReader
    from tests.test_planner_workload import with_timeouts

    steps = list(TraceReader("experiments/data/held_out_11/intercode-ctf-gpt-4.jsonl.gz").steps())
    step0 = with_timeouts(steps[0], {22}, 60.0)  # the replay drew a 60 s tool wait for run 22
    planner = Planner(ClusterSpec(24, "a100", "qwen3-14b"), options=SearchOptions(max_staleness=0, mini_batches=4))
    best = planner.search([step0], steps[1].prompt_tokens).best
    assert min(i.tp for i in best.rollout.instances) >= 4
