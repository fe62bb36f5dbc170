"""Rollout timing: the affine decode decomposition is exact (scalar and vectorized), times are
monotone in batch, context and tokens, TP adds all-reduce time, and the tables extend on demand.
Run on the default (bundled) operator set and on the datasheet roofline."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models import CostEvaluator, CostModelError, get_gpu
from cost_models.operators import RooflineOperators, load_operators


def _evaluators() -> list[tuple[str, str, str]]:
    return [("h100", "qwen3-14b", "default"), ("a100", "qwen3-30b-a3b", "default"),
            ("h200", "qwen3-32b", "roofline"), ("a800", "llama-3.1-8b", "roofline")]


def _make(gpu: str, model: str, kind: str) -> CostEvaluator:
    ops = RooflineOperators(get_gpu(gpu)) if kind == "roofline" else load_operators(gpu)
    return CostEvaluator(gpu, model, ops=ops)


@pytest.fixture(params=_evaluators(), ids=lambda p: "-".join(p))
def ev(request: pytest.FixtureRequest) -> CostEvaluator:
    return _make(*request.param)


def test_decode_coeffs_exact_scalar(ev: CostEvaluator) -> None:
    for tp in (1, 2, 4):
        for b in (1, 7, 64, 256):
            base, slope = ev.decode_coeffs(tp, b)
            for ctx in (0, 1, 1234, 10_000_000):
                assert ev.decode_s(tp, b, ctx) == base + slope * ctx
            assert base > 0 and slope > 0


def test_decode_vectorized_matches_scalar_exactly(ev: CostEvaluator) -> None:
    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], size=200)
    b = rng.integers(1, 600, size=200)
    ctx = rng.integers(0, 2_000_000, size=200).astype(float)
    base, slope = ev.decode_coeffs(tp, b)
    t = ev.decode_s(tp, b, ctx)
    assert np.array_equal(t, base + slope * ctx)
    for i in range(0, 200, 17):
        assert t[i] == ev.decode_s(int(tp[i]), int(b[i]), float(ctx[i]))


def test_decode_monotone_in_batch_and_context(ev: CostEvaluator) -> None:
    for tp in (1, 2, 4, 8):
        base, slope = ev.decode_coeffs(np.full(1024, tp), np.arange(1, 1025))
        assert np.all(np.diff(base) >= 0)
        # the per-KV-token slope may fall with batch (measured attention kernels use bandwidth
        # better with more sequences); it must stay positive
        assert np.all(slope > 0)
        # fixed context per sequence: more sequences -> longer iteration, more tokens/s
        t = ev.decode_s(tp, np.arange(1, 1025), np.arange(1, 1025) * 2048.0)
        assert np.all(np.diff(t) > 0)
        ctx = np.linspace(0, 5e6, 50)
        assert np.all(np.diff(ev.decode_s(tp, 64, ctx)) > 0)


def test_decode_zero_batch_and_table_growth(ev: CostEvaluator) -> None:
    assert ev.decode_coeffs(2, 0) == (0.0, 0.0)
    small = ev.decode_s(2, 511, 1e5)
    big = ev.decode_s(2, 5000, 1e5)  # beyond the first table: it grows
    assert big > small
    assert ev.decode_s(2, 511, 1e5) == small  # rebuilt tables give the same numbers


def test_prefill_monotone(ev: CostEvaluator) -> None:
    toks = np.array([1, 16, 128, 1024, 4096, 16384])
    t = ev.prefill_s(2, toks)
    assert np.all(np.diff(t) > 0)
    cached = ev.prefill_s(2, 512, np.array([0, 1000, 10_000, 100_000]))
    assert np.all(np.diff(cached) > 0)
    assert ev.prefill_s(2, 512, 0, 4) > ev.prefill_s(2, 512, 0, 1)
    assert ev.prefill_s(2, 0) == 0.0
    assert isinstance(ev.prefill_s(1, 100), float)
    # prefilling N tokens at once beats decoding them one by one
    assert ev.prefill_s(1, 1024) < 1024 * ev.decode_s(1, 1, 512)


class _NoComm(RooflineOperators):
    def allreduce_s(self, nbytes, n_gpus, inter_node=False):  # type: ignore[no-untyped-def]
        return np.zeros(np.broadcast(np.asarray(nbytes), np.asarray(n_gpus)).shape)

    def allgather_s(self, nbytes, n_gpus, inter_node=False):  # type: ignore[no-untyped-def]
        return np.zeros(np.broadcast(np.asarray(nbytes), np.asarray(n_gpus)).shape)


def test_higher_tp_adds_communication() -> None:
    full = CostEvaluator("h100", "qwen3-32b", ops=RooflineOperators(get_gpu("h100")))
    quiet = CostEvaluator("h100", "qwen3-32b", ops=_NoComm(get_gpu("h100")))
    comm = [full.decode_s(tp, 64, 64 * 2048) - quiet.decode_s(tp, 64, 64 * 2048) for tp in (1, 2, 4, 8)]
    assert comm[0] == 0.0
    assert comm[1] > 0 and comm[1] < comm[2] < comm[3]
    pf = [full.prefill_s(tp, 4096) - quiet.prefill_s(tp, 4096) for tp in (1, 2, 4, 8)]
    assert pf[0] == 0.0 and pf[1] < pf[2] < pf[3]
    # yet more TP still lowers a large model's decode iteration time
    t = [full.decode_s(tp, 64, 64 * 2048) for tp in (1, 2, 4, 8)]
    assert t == sorted(t, reverse=True)


def test_decode_is_memory_bound_plausible() -> None:
    # batch 1 on one H100: ~ weights / HBM bandwidth (qwen3-8b: 16.4 GB / 3.35 TB/s = 4.9 ms)
    ev = CostEvaluator("h100", "qwen3-8b")
    t = ev.decode_s(1, 1, 1000)
    assert 4.9e-3 < t < 12e-3


def test_bad_tp() -> None:
    ev = CostEvaluator("h100", "qwen3-14b")
    with pytest.raises(CostModelError, match="valid tp"):
        ev.decode_s(3, 4, 100)
    with pytest.raises(CostModelError, match="valid tp"):
        ev.prefill_s(3, 100)
    ev1 = CostEvaluator("h100", "qwen3-14b", gpus_per_node=4)
    with pytest.raises(CostModelError, match="exceeds the 4 GPUs"):
        ev1.decode_s(8, 4, 100)
    with pytest.raises(CostModelError, match="batch must be >= 0"):
        ev.decode_s(2, -1, 100)


def test_max_running_seqs() -> None:
    ev = CostEvaluator("h100", "qwen3-14b")
    assert ev.max_running_seqs(1) == 256
    # a tight memory budget: fewer KV blocks than vLLM's 256 sequences -> memory-bound
    lo, hi = 0.80, 0.95  # qwen3-32b on one A100: 65.5 GB of weights
    for _ in range(40):
        mid = (lo + hi) / 2
        cap = CostEvaluator("a100", "qwen3-32b", gpu_mem_util=mid).kv_capacity_tokens(1)
        if cap == 0:
            lo = mid
        elif cap > 2000:
            hi = mid
        else:
            break
    tight = CostEvaluator("a100", "qwen3-32b", gpu_mem_util=mid)
    assert 0 < tight.kv_capacity_tokens(1) <= 2000
    assert tight.max_running_seqs(1) == tight.kv_capacity_tokens(1) // 16 < 256
