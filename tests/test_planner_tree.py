"""The training decision tree: valid shapes only, memory pruning with reasons, exact best."""

from __future__ import annotations

import pytest

from cost_models import CostEvaluator
from libra.planner.costs import to_strategy, valid_tp_degrees
from libra.planner.decision_tree import DecisionTree, enumerate_strategies, memory_grain, sequence_count, training_time_fn


@pytest.fixture(scope="module")
def ev14() -> CostEvaluator:
    return CostEvaluator(gpu="a800", model="qwen3-14b")


def test_survivors_are_valid_and_fit(ev14: CostEvaluator) -> None:
    res = enumerate_strategies(ev14, 16, 256, 8192, 8, training_time_fn(ev14, 256 * 4096, 4096))
    assert res.ranked
    for t, cfg in res.ranked:
        assert cfg.n_gpus == 16
        assert cfg.tp in valid_tp_degrees(ev14.model, 8)
        assert ev14.model.n_layers % cfg.pp == 0
        assert ev14.train_memory(to_strategy(cfg), 8192, suggest=False).fits
        assert t > 0
    times = [t for t, _ in res.ranked]
    assert times == sorted(times)


def test_pruning_reasons(ev14: CostEvaluator) -> None:
    """Infeasible leaves are cut with a reason naming the rule or the memory need."""
    # one GPU cannot hold 14B parameters with Adam state: every leaf is pruned for memory
    res = enumerate_strategies(ev14, 1, 64, 8192, 8, training_time_fn(ev14, 64 * 4096, 4096))
    assert res.best is None
    assert all(p.reason.startswith("memory") for p in res.pruned)
    assert "GB" in res.why_none()
    # a 5-way TP would not divide the 8 KV heads nor the node: pruned by rule
    res = enumerate_strategies(ev14, 40, 1024, 4096, 8, None)
    reasons = {p.what: p.reason for p in res.pruned}
    assert "tp=5" in reasons and reasons["tp=5"].startswith("rule")
    # too few sequences for DP x micro-batch
    res = enumerate_strategies(ev14, 16, 8, 4096, 8, None)
    assert any("cannot feed DP" in p.reason for p in res.pruned)
    assert all(c.dp * c.micro_batch <= 8 for _, c in res.ranked)


def test_a_rounded_mean_length_counts_every_sequence() -> None:
    """The step's sequence count recovers the trajectory count from the token total and the
    rounded mean length, and floors a fractional one: a plain floor dropped a sequence whenever
    the mean was rounded up (held_out_51's ToolBench DFSDT on
    30 H200 / Llama-3.1-70B: three trajectories counted two, every DP-3 strategy was cut, and the
    planner stopped a run a baseline trained)."""
    assert sequence_count(38912, 12971) == 3  # 3 x 12,970.67 tokens, the mean rounded up
    assert sequence_count(38912, 12970) == 3
    for n in (1, 2, 3, 5, 7, 64, 255, 256):
        for total in (n * 1000 - 1, n * 1000, n * 1000 + 1, n * 12971 - 2, n * n + n):
            assert sequence_count(total, round(total / n)) == n
    # a fractional count (a forecast's mean) is not rounded up: 21.6 sequences feed DP 21, not 22
    assert sequence_count(21600, 1000) == 21
    assert sequence_count(10, 0) == 10 and sequence_count(10, 1) == 10 and sequence_count(0, 100) == 1
    # the count feeds the DP x micro-batch rule: DP 3 is fed by three sequences
    ev = CostEvaluator(gpu="h200", model="llama-3.1-70b")
    res = enumerate_strategies(ev, 30, sequence_count(38912, 12971), 45056, 8, training_time_fn(ev, 38912, 12971))
    assert res.best is not None and res.best.dp == 3


def test_memory_lengths_round_up_by_at_most_a_sixteenth_or_256_tokens() -> None:
    """Memory checks are made at the longest sequence rounded up (memo keys meet): by 256 tokens
    from 4K on, by at most 1/16 of the length below (a 575-token sequence checked at 768 ruled
    out strategies without recompute that hold it)."""
    for n in (1, 7, 100, 575, 632, 1000, 2049, 4095, 4096, 5000, 44924, 131000):
        g = memory_grain(n)
        assert g >= n and g - n <= max(16, min(256, n / 16)) and memory_grain(g) == g
    assert memory_grain(575) == 576 and memory_grain(44924) == 45056 and memory_grain(5000) == 5120
    assert [memory_grain(n) for n in (4096, 4097, 8192)] == [4096, 4352, 8192]


def test_recompute_dominance_and_bound_keep_the_exact_best(ev14: CostEvaluator) -> None:
    """The tree's pruning (recompute dominance, branch and bound) returns the same best as the
    full enumeration of every fitting leaf."""
    for n in (4, 8, 12, 16, 24):
        tokens, seq, seq_max = 512 * 6000, 6144, 32768
        full = enumerate_strategies(ev14, n, tokens // seq, seq_max, 8, training_time_fn(ev14, tokens, seq), dominance=False, bound=False)
        pruned = enumerate_strategies(ev14, n, tokens // seq, seq_max, 8, training_time_fn(ev14, tokens, seq))
        if not full.ranked:
            assert pruned.best is None
            continue
        assert pruned.best_time_s == pytest.approx(min(t for t, _ in full.ranked), rel=1e-12)
        assert len(pruned.ranked) <= len(full.ranked)


def test_budget_cuts_without_changing_an_attainable_best(ev14: CostEvaluator) -> None:
    tree = DecisionTree(ev14, 8)
    exact = tree.best(16, 512 * 4000, 4096, 16384)
    tree2 = DecisionTree(ev14, 8)
    loose = tree2.best(16, 512 * 4000, 4096, 16384, budget_s=exact.best_time_s * 1.01)
    assert loose.best == exact.best
    tight = tree2.best(32, 512 * 4000, 4096, 16384, budget_s=1e-6)
    assert tight.best is None and any(p.reason.startswith("bound") for p in tight.pruned)
    # a memo entry made under a tight budget is not reused for a looser one
    again = tree2.best(32, 512 * 4000, 4096, 16384)
    assert again.best is not None


def test_moe_expert_parallel_rules() -> None:
    ev = CostEvaluator(gpu="h200", model="qwen3-30b-a3b")
    res = enumerate_strategies(ev, 16, 256, 4096, 8, None)
    assert res.ranked
    assert any(c.ep > 1 for _, c in res.ranked)
    for _, c in res.ranked:
        # Megatron MoE parallel folding (ETP = 1): EP divides TP x DP, not only DP
        assert ev.model.n_experts % c.ep == 0 and (c.tp * c.dp) % c.ep == 0
