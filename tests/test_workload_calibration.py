"""Each workload's statistics fall in their documented bands, and the modeled effects are real.

Traces are generated in memory (columnar), the paper's batch of 512 over 20 steps: about a
tenth of a second each.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.trace.workload import WORKLOAD_TARGETS, WORKLOADS, generate_steps
from libra.trace.workload.report import trace_stats


def _stats(workload: str, seed: int = 0, steps: int = 20, batch: int = 512, **params) -> dict[str, float]:
    return trace_stats(generate_steps(workload, steps, batch, 8, seed, **params))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_statistics_within_documented_bands(workload, seed):
    stats = _stats(workload, seed)
    bad = [f"{t.stat}={stats[t.stat]:.4g} not in {t.band} ({t.source})"
           for t in WORKLOAD_TARGETS[workload] if not t.holds(stats[t.stat])]
    assert not bad, bad


def test_every_target_names_a_measured_statistic_and_a_source():
    from libra.trace.workload.report import LABELS

    for workload, targets in WORKLOAD_TARGETS.items():
        assert targets, workload
        for t in targets:
            assert t.stat in LABELS, (workload, t.stat)
            assert t.source.startswith("workloads.md:") or t.source == "chosen"
            assert t.low is not None or t.high is not None


def test_heavy_tails_where_the_reference_says_so():
    # workloads.md:46: p99 about 10x the median (generation lengths)
    for workload in ("swe", "math"):
        assert _stats(workload)["gen_per_turn_p99_over_p50"] > 6
    swe = _stats("swe")
    assert swe["turns_p99"] / swe["turns_p50"] > 2.5  # heavy-tailed turns, bounded by the 50-step limit


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_error_effect_is_causal_and_scales(workload):
    by_effect = {e: _stats(workload, steps=10, error_effect=e) for e in (0.0, 1.0, 2.0)}
    stop = [by_effect[e]["stop_next_error_over_ok"] for e in (0.0, 1.0, 2.0)]
    nxt = [by_effect[e]["next_gen_error_over_ok"] for e in (0.0, 1.0, 2.0)]
    rem = [by_effect[e]["remaining_error_over_ok"] for e in (0.0, 1.0, 2.0)]
    # no effect: an error barely changes what follows (only the shared difficulty links them)
    assert stop[0] > 0.8 and 0.9 < nxt[0] < 1.15
    # the effect grows with the parameter
    assert stop[0] > stop[1] + 0.2
    assert stop[1] > stop[2]
    assert nxt[0] < nxt[1] < nxt[2] and nxt[1] > 1.3
    assert rem[1] > rem[0] and rem[2] >= rem[0] + 0.05
    # failures make trajectories longer overall
    assert by_effect[2.0]["tool_calls_mean"] > by_effect[0.0]["tool_calls_mean"]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_drift_direction_follows_its_sign(workload):
    up = _stats(workload, steps=10, batch=1024, drift=0.05)
    flat = _stats(workload, steps=10, batch=1024, drift=0.0)
    down = _stats(workload, steps=10, batch=1024, drift=-0.05)
    assert up["drift_gen_slope"] > 0.02
    assert down["drift_gen_slope"] < -0.02
    assert abs(flat["drift_gen_slope"]) < 0.02
    assert up["final_len_last_step"] > up["final_len_first_step"]
    assert down["final_len_last_step"] < down["final_len_first_step"]


def test_turn_counts_drift_with_lengths_when_asked():
    up = _stats("swe", steps=10, batch=1024, drift=0.05, turn_drift_share=1.0)
    still = _stats("swe", steps=10, batch=1024, drift=0.05, turn_drift_share=0.0)
    assert up["drift_turns_slope"] > 0.01 > abs(still["drift_turns_slope"])


def test_reward_rises_with_learning_and_failed_trajectories_are_longer():
    s = _stats("swe", steps=20, reward_learn_per_step=0.1)
    assert s["reward_last_step"] > s["reward_first_step"] + 0.15
    flat = _stats("swe", steps=20, reward_learn_per_step=0.0)
    assert abs(flat["reward_last_step"] - flat["reward_first_step"]) < 0.12
    assert s["final_len_failed_over_resolved"] > 1.3


def _group_share_of_variance(workload: str, **params) -> float:
    """Between-group share of the variance of log turns (an intraclass correlation estimate)."""
    sa = next(generate_steps(workload, 1, 4096, 8, 0, **params))
    y = np.log(sa.n_turns.astype(float))
    g = y.reshape(-1, 8)
    between = g.mean(axis=1).var()
    within = g.var(axis=1, ddof=1).mean()
    return float((between - within / 8) / (between - within / 8 + within))


def test_grpo_samples_of_a_prompt_are_correlated():
    assert _group_share_of_variance("swe") > 0.15
    assert abs(_group_share_of_variance("swe", group_corr=0.0, error_difficulty_coef=0.0,
                                        prompt_difficulty_coef=0.0)) < 0.05


def test_turns_correlate_with_length():
    # workloads.md:11: tool-call count grows with sequence length
    assert _stats("swe")["spearman_turns_len"] > 0.85
    weak = _stats("math", gen_persistence_corr=0.0)["spearman_turns_len"]
    strong = _stats("math", gen_persistence_corr=0.9)["spearman_turns_len"]
    assert strong > weak
