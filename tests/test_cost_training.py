"""Training timing: validation messages name what works, times grow the way the parallelism
trade-offs say (tokens, recompute, ZeRO-3, pipeline bubble, inter-node DP, TP all-reduces), and
the total is plausible against model FLOPs."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models import CostEvaluator, CostModelError, get_gpu
from cost_models.operators import RooflineOperators
from cost_models.training import TrainStrategy, train_flops

TS = TrainStrategy


@pytest.fixture(scope="module")
def ev() -> CostEvaluator:
    return CostEvaluator("h100", "qwen3-14b")


@pytest.mark.parametrize(
    "strategy,n,pattern",
    [
        (TS(3, 1, 1), None, r"tp=3 is invalid .* valid tp: 1, 2, 4, 8$"),
        (TS(16, 1, 1), None, r"tp=16 is invalid .*8 GPUs per NVLink domain"),
        (TS(2, 41, 1), None, r"pp=41 exceeds the 40 layers of qwen3-14b .* valid pp: 1\.\.40 \(uneven stages allowed"),
        (TS(2, 1, 2, ep=2), None, r"ep=2 needs a MoE model; qwen3-14b is dense, use ep=1"),
        (TS(2, 1, 4), 16, r"tp\*pp\*dp = 2\*1\*4 = 8 but 16 GPUs were given; e.g. dp=8"),
        (TS(2, 1, 1, zero_stage=4), None, r"zero_stage must be 0, 1, 2 or 3"),
        (TS(0, 1, 1), None, r"tp must be a positive integer"),
    ],
)
def test_validation_messages(ev: CostEvaluator, strategy: TrainStrategy, n: int | None, pattern: str) -> None:
    with pytest.raises(CostModelError, match=pattern):
        ev.validate(strategy, n)


def test_moe_ep_validation() -> None:
    moe = CostEvaluator("h100", "qwen3-30b-a3b")
    with pytest.raises(CostModelError, match=r"ep=3 must divide the 128 experts and tp\*dp = 1\*6 = 6 .*; valid ep: 1, 2$"):
        moe.validate(TS(1, 1, 6, ep=3))
    moe.validate(TS(1, 1, 8, ep=8))


def test_time_grows_with_tokens_and_recompute(ev: CostEvaluator) -> None:
    s = TS(4, 1, 2)
    t = [ev.train_iter_s(s, n, 4096) for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22)]
    assert np.all(np.diff(t) > 0)
    assert ev.train_iter_s(TS(4, 1, 2, recompute=True), 1 << 20, 4096) > t[2]
    assert ev.forward_s(s, 1 << 20, 4096) < t[2] / 2


def test_zero3_and_inter_node_cost_more(ev: CostEvaluator) -> None:
    # short (1K-token) micro-batches: the per-block gathers of ZeRO-3 cannot hide behind compute
    # (at 4K tokens they do, and ZeRO-3's smaller optimizer step then wins, as the tree's docs say)
    base = ev.train_iter_s(TS(8, 1, 2, zero_stage=1), 1 << 20, 1024)
    z3 = ev.train_iter_s(TS(8, 1, 2, zero_stage=3), 1 << 20, 1024)
    assert z3 >= base
    # the same 16 GPUs in one 16-GPU "node" (DP over NVLink) vs two 8-GPU nodes (DP over IB);
    # 1K-token micro-batches, so the last backward is too short to hide the gradient all-reduce
    # (at 4K tokens it hides both)
    big_node = CostEvaluator("h100", "qwen3-14b", gpus_per_node=16)
    assert big_node.train_iter_s(TS(8, 1, 2, zero_stage=0), 1 << 18, 1024) < ev.train_iter_s(
        TS(8, 1, 2, zero_stage=0), 1 << 18, 1024
    )


def test_pipeline_bubble_shrinks_with_more_micro_batches(ev: CostEvaluator) -> None:
    # per-token time of pp=4 approaches pp=1's as micro-batches (m) grow: bubble (p-1)/(m+p-1)
    def per_token(pp: int, tokens: int) -> float:
        return ev.train_iter_s(TS(2, pp, 1, zero_stage=0), tokens, 4096) / tokens

    r_small = per_token(4, 4 * 4096) / per_token(1, 4 * 4096)
    r_big = per_token(4, 256 * 4096) / per_token(1, 256 * 4096)
    assert r_small > r_big
    # with 4 micro-batches and 4 stages the bubble is 3/7: pp=4 cannot beat (1 - 3/7) * 4 speedup
    assert per_token(1, 4 * 4096) / per_token(4, 4 * 4096) < 4 * 4 / 7 + 0.05


class _NoComm(RooflineOperators):
    def allreduce_s(self, nbytes, n_gpus, inter_node=False):  # type: ignore[no-untyped-def]
        return np.float64(0.0)


def test_tp_all_reduce_term_grows() -> None:
    g = get_gpu("h100")
    full = CostEvaluator(g, "qwen3-32b", ops=RooflineOperators(g))
    quiet = CostEvaluator(g, "qwen3-32b", ops=_NoComm(g))
    comm = [full.forward_s(TS(tp, 1, 1), 1 << 17, 4096) - quiet.forward_s(TS(tp, 1, 1), 1 << 17, 4096) for tp in (1, 2, 4, 8)]
    assert comm[0] == 0.0 and 0 < comm[1] < comm[2] < comm[3]


def test_mfu_is_plausible() -> None:
    # large dense model, long sequences: MFU between 25% and 75% of bf16 peak
    ev = CostEvaluator("h100", "qwen3-32b")
    s = TS(4, 2, 2)
    tokens = 1 << 20
    t = ev.train_iter_s(s, tokens, 4096)
    mfu = train_flops(ev.model, tokens, 4096) / (t * s.n_gpus * ev.gpu.bf16_flops)
    assert 0.25 < mfu < 0.75, mfu


def test_moe_with_ep_runs_and_all_to_all_costs() -> None:
    ev = CostEvaluator("h100", "qwen3-30b-a3b")
    g = ev.gpu
    quiet = CostEvaluator(g, "qwen3-30b-a3b", ops=_NoA2A(g))
    full = CostEvaluator(g, "qwen3-30b-a3b", ops=RooflineOperators(g))
    a2a = [full.forward_s(TS(1, 1, 8, ep=e), 1 << 18, 4096) - quiet.forward_s(TS(1, 1, 8, ep=e), 1 << 18, 4096) for e in (1, 2, 8)]
    assert a2a[0] == 0.0 and 0 < a2a[1] < a2a[2]
    # EP spreads the experts: less memory per GPU
    mem = [ev.train_memory(TS(1, 1, 8, ep=e), 4096).total_bytes for e in (1, 2, 4, 8)]
    assert mem == sorted(mem, reverse=True)


class _NoA2A(RooflineOperators):
    def allgather_s(self, nbytes, n_gpus, inter_node=False):  # type: ignore[no-untyped-def]
        return np.float64(0.0)


def test_bad_token_counts(ev: CostEvaluator) -> None:
    with pytest.raises(CostModelError, match="tokens and seq_len must be >= 1"):
        ev.train_iter_s(TS(1, 1, 1), 0, 4096)


def test_uneven_pipeline_stages_are_priced_at_the_heaviest_stage() -> None:
    """Megatron runs PP degrees that do not divide the layer count (Qwen3-235B-A22B's 94 layers
    on PP 8 as 11 + 6 x 12 + 11); the heaviest stage (ceil(L / pp) blocks) sets time and memory,
    so PP 3 on 40 layers costs what 14-block stages cost, between PP 2 (20) and PP 4 (10)."""
    ev = CostEvaluator(gpu="h100", model="qwen3-14b")
    t = {pp: ev.train_iter_s(TS(2, pp, 1), 65536, 4096) for pp in (2, 3, 4)}
    assert t[4] < t[3] < t[2]
    mem = {pp: ev.train_memory(TS(2, pp, 1, zero_stage=1), 4096).breakdown["weights"] for pp in (2, 3, 4)}
    assert mem[4] < mem[3] < mem[2]


def test_a_rounded_mean_length_counts_the_steps_sequences() -> None:
    """Callers pass a step's tokens and its mean sequence length rounded to a token. 256
    sequences of mean 2,919.02 tokens are 256 sequences, not 257: with ``ceil`` the 257th put a
    ninth sequence on some of 32 ranks, a fifth round of micro-batches of 2 (update 21.2 -> 26.5 s
    on A100, Qwen3-14B), so a step's training time jumped with how its mean happened to round."""
    ev = CostEvaluator("a100", "qwen3-14b")
    s = TS(1, 1, 32, zero_stage=3, micro_batch=2, recompute=True)
    exact = ev.train_iter_s(s, 256 * 2919, 2919)
    assert ev.train_iter_s(s, 256 * 2919 + 5, 2919) == pytest.approx(exact, rel=1e-3)
    assert ev.forward_s(s, 256 * 2919 + 5, 2919) == pytest.approx(ev.forward_s(s, 256 * 2919, 2919), rel=1e-3)
    # a 257th whole sequence is still one more round
    assert ev.train_iter_s(s, 257 * 2919, 2919) > 1.1 * exact
