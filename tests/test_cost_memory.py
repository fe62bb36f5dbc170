"""Memory model: sizes that match hand computation for qwen3-14b and qwen3-30b-a3b, KV-head
replication beyond the KV head count, ZeRO sharding, vLLM-like KV capacity, and suggestions
that really fit when a strategy does not."""

from __future__ import annotations

import pytest

from cost_models import CostModelError, get_gpu, get_model
from cost_models.memory import (
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    params_per_gpu,
    rollout_memory,
    train_breakdown,
    train_memory,
)
from cost_models.training import TrainStrategy

Q14 = get_model("qwen3-14b")
MOE = get_model("qwen3-30b-a3b")
H100 = get_gpu("h100")
A100 = get_gpu("a100")


def test_rollout_weights_per_gpu_qwen3_14b() -> None:
    # tp=2: q/o and MLP halve, 4 of 8 KV heads per GPU, vocab-parallel embedding and LM head
    layer = 2 * 5120 * 5120 / 2 + 2 * 5120 * 4 * 128 + 2 * 128 + 2 * 5120 + 3 * 5120 * 17408 / 2
    ends = 2 * 151936 * 5120 / 2 + 5120
    assert params_per_gpu(Q14, 2).total == pytest.approx(40 * layer + ends, rel=1e-12)
    assert params_per_gpu(Q14, 1).total == Q14.params_total


def test_kv_heads_replicate_beyond_kv_head_count() -> None:
    # qwen3-30b-a3b has 4 KV heads: tp=8 keeps one head per GPU (replicated twice)
    assert kv_bytes_per_token_per_gpu(MOE, 1) == 2 * 48 * 4 * 128 * 2
    assert kv_bytes_per_token_per_gpu(MOE, 4) == 2 * 48 * 1 * 128 * 2
    assert kv_bytes_per_token_per_gpu(MOE, 8) == kv_bytes_per_token_per_gpu(MOE, 4)
    assert kv_bytes_per_token_per_gpu(Q14, 8) == 2 * 40 * 1 * 128 * 2


def test_moe_expert_sharding_by_ep() -> None:
    p1 = params_per_gpu(MOE, tp=1, ep=1)
    p8 = params_per_gpu(MOE, tp=1, ep=8)
    assert p1.expert == 48 * 128 * 3 * 2048 * 768
    assert p8.expert == p1.expert / 8
    assert p8.dense == p1.dense  # attention, router, norms, embeddings do not shard by EP


def test_train_breakdown_qwen3_14b_by_hand() -> None:
    s = TrainStrategy(tp=2, pp=1, dp=4, zero_stage=1)
    bd = train_breakdown(H100, Q14, s, 4096)
    P = 40 * (2 * 5120 * 5120 / 2 + 2 * 5120 * 4 * 128 + 256 + 10240 + 3 * 5120 * 17408 / 2) + 151936 * 5120 + 5120
    assert bd["weights"] == pytest.approx(2 * P)
    assert bd["gradients"] == pytest.approx(2 * P)
    assert bd["optimizer"] == pytest.approx(12 * P / 4)  # ZeRO-1 shards fp32 master + m + v over dp
    # per token per layer: 4 x 2h (residuals, norm outputs; split over TP by sequence parallelism)
    # + q,k,v + attn out + fp32 LSE + SwiGLU 4 x inter/tp
    per = 2 * (4 * 5120 / 2 + (2560 + 2 * 4 * 128) + 2560) + 4 * 40 / 2 + 2 * 4 * 17408 / 2
    assert bd["activations"] == pytest.approx(40 * per * 4096)
    assert bd["logits"] == pytest.approx(6 * 151936 / 2 * 4096)


def test_sequence_parallelism_shards_what_tensor_parallelism_leaves_whole() -> None:
    """Megatron's sequence parallelism (on with TP > 1 in every trainer planned for) splits the
    norms' and residuals' activations and the recompute checkpoint over the TP group; at TP 1
    nothing changes, and without it those parts are whole on every rank."""
    from cost_models.memory import activation_bytes_per_token_layer as act

    h = 5120
    assert act(Q14, 8, recompute=True) == pytest.approx(2 * h / 8)
    assert act(Q14, 8, recompute=True, sequence_parallel=False) == pytest.approx(2 * h)
    assert act(Q14, 1, recompute=True) == act(Q14, 1, recompute=True, sequence_parallel=False) == pytest.approx(2 * h)
    assert act(Q14, 4) == pytest.approx(act(Q14, 4, sequence_parallel=False) - 2 * 4 * h * (1 - 1 / 4))
    # Llama-3.1-70B at TP 8 x PP 2 holds one 64K-token sequence on 16 H200 with recompute
    # (11 GB of kept block inputs, not 86): Megatron trains it there
    l70 = get_model("llama-3.1-70b")
    bd = train_breakdown(get_gpu("h200"), l70, TrainStrategy(tp=8, pp=2, dp=1, zero_stage=1, recompute=True), 65536)
    assert sum(bd.values()) < get_gpu("h200").memory_bytes


def test_zero_stages_shard_progressively() -> None:
    tot = [sum(train_breakdown(H100, Q14, TrainStrategy(2, 1, 4, zero_stage=z), 4096).values()) for z in range(4)]
    assert tot[0] > tot[1] > tot[2] > tot[3]
    bd3 = train_breakdown(H100, Q14, TrainStrategy(2, 1, 4, zero_stage=3), 4096)
    P = params_per_gpu(Q14, 2).total
    assert bd3["weights"] == pytest.approx(2 * P / 4)


def test_moe_zero_shards_experts_over_dp_over_ep() -> None:
    s = TrainStrategy(tp=1, pp=1, dp=8, ep=4, zero_stage=1)
    p = params_per_gpu(MOE, 1, 1, 4)
    bd = train_breakdown(H100, MOE, s, 2048)
    assert bd["optimizer"] == pytest.approx(12 * (p.dense / 8 + p.expert / 2))


def test_recompute_and_pp_change_activations() -> None:
    base = train_breakdown(H100, Q14, TrainStrategy(2, 1, 4), 4096)["activations"]
    rc = train_breakdown(H100, Q14, TrainStrategy(2, 1, 4, recompute=True), 4096)["activations"]
    assert rc < base / 5
    # 1F1B: the first of pp stages holds pp micro-batches of L/pp layers = same as pp=1
    pp4 = train_breakdown(H100, Q14, TrainStrategy(2, 4, 1), 4096)["activations"]
    assert pp4 == pytest.approx(base)


def test_kv_capacity_by_hand_qwen3_14b_a100() -> None:
    weights = 2 * Q14.params_total
    act = 8192 * (2 * (2 * 5120 + 5120 + 2048 + 5120) + 2 * 3 * 17408) + 2 * 4 * 256 * 151936
    reserve = 1.0e9 + 0.5e9  # context + CUDA graphs (no NCCL at tp=1)
    free = 0.9 * 80e9 - weights - act - reserve
    expect = int(free // 163840) // 16 * 16
    assert kv_capacity_tokens("a100", "qwen3-14b", 1) == expect
    assert 200_000 < expect < 260_000
    rep = rollout_memory(A100, Q14, 1)
    assert rep.fits and rep.extra["kv_tokens"] == expect


def test_kv_capacity_grows_with_tp_and_zero_when_weights_do_not_fit() -> None:
    caps = [kv_capacity_tokens("h100", "qwen3-32b", t) for t in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[0] > 0
    assert kv_capacity_tokens("a100", "llama-3.1-70b", 1) == 0
    rep = rollout_memory("a100", "llama-3.1-70b", 1)
    assert not rep.fits and rep.suggestions[0] == "tp=4"  # tp=2 leaves no room for KV after 70 GB of weights


def test_not_fitting_strategy_suggests_ones_that_fit() -> None:
    s = TrainStrategy(tp=1, pp=1, dp=8, zero_stage=0)
    rep = train_memory(H100, Q14, s, 8192)
    assert not rep.fits and rep.suggestions
    assert "would fit" in rep.summary()
    big = train_memory(H100, "qwen3-32b", TrainStrategy(4, 1, 1), 4096)
    assert not big.fits and big.suggestions[0].startswith("at least 8 GPUs")


def test_listed_suggestions_really_fit() -> None:
    import re
    from dataclasses import replace

    s = TrainStrategy(tp=2, pp=1, dp=4, zero_stage=1)
    rep = train_memory(H100, Q14, s, 16384)  # long sequences: activations dominate
    assert not rep.fits
    assert rep.suggestions[0].startswith("recompute (")
    assert train_memory(H100, Q14, replace(s, recompute=True), 16384).fits
    assert any(x.startswith("ZeRO-3 + recompute") for x in rep.suggestions)
    for sug in rep.suggestions:
        gb = float(re.search(r"\(([0-9.]+) GB\)$", sug).group(1))
        assert gb <= 80.0


def test_bad_inputs() -> None:
    with pytest.raises(CostModelError, match="valid tp: 1, 2, 4, 8$"):
        kv_capacity_tokens("h100", "qwen3-14b", 3)
    with pytest.raises(CostModelError, match="gpu_mem_util"):
        rollout_memory("h100", "qwen3-14b", 1, gpu_mem_util=1.5)
    with pytest.raises(CostModelError, match="seq_len"):
        train_memory(H100, Q14, TrainStrategy(1, 1, 1), 0)
