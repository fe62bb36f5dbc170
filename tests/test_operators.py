"""Operator timing models: the roofline, the fitted models on the bundled calibrations, and the
loader. Checks the physical contract (monotone in sizes, decode affine in KV, roofline within a
factor of measurements on mid shapes) on and off the measured grid."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models.errors import CostModelError
from cost_models.hardware import get_gpu
from cost_models.operators import FittedOperators, RooflineOperators, load_operators
from cost_models.operators.loader import bundled_calibration_path

GPUS = ("a100", "h100", "h200")
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module", params=GPUS)
def fitted(request: pytest.FixtureRequest) -> FittedOperators:
    ops = load_operators(request.param)
    assert isinstance(ops, FittedOperators)
    return ops


def _log_uniform(lo: float, hi: float, n: int) -> np.ndarray:
    return np.exp(RNG.uniform(np.log(lo), np.log(hi), n))


# The tables and their extrapolations are monotone by construction; the tolerance only absorbs
# floating-point rounding in exp/log of equal neighbouring values.
MONO_TOL = 1e-9


def _nondecreasing_along(fn, base: list[np.ndarray], axis: int, factors=(1.0, 1.37, 2.0, 3.1, 8.0, 40.0)) -> None:
    """fn(*args) is non-decreasing when argument ``axis`` grows (other arguments fixed)."""
    prev = None
    for f in factors:
        args = list(base)
        args[axis] = base[axis] * f
        t = np.asarray(fn(*args))
        assert np.all(np.isfinite(t)) and np.all(t > 0)
        if prev is not None:
            assert np.all(t >= prev * (1 - MONO_TOL)), f"not monotone along argument {axis} at factor {f}"
        prev = t


# ---- loader --------------------------------------------------------------------------------
def test_bundled_files_exist_and_load_fitted() -> None:
    for gpu in GPUS:
        assert bundled_calibration_path(gpu) is not None
        assert isinstance(load_operators(gpu), FittedOperators)
    a800 = load_operators("a800")
    assert isinstance(a800, FittedOperators) and a800.gpu == "a800" and a800.calibration_gpu == "a100"


def test_cpu_without_profile_is_roofline_and_unknown_gpu_lists_names() -> None:
    assert isinstance(load_operators("cpu"), RooflineOperators)
    with pytest.raises(CostModelError, match="valid: .*a100.*h200"):
        load_operators("b300")


def test_loader_caches_fitted_instances() -> None:
    assert load_operators("h100") is load_operators("h100")


def test_a800_scales_only_intra_node_bandwidth() -> None:
    a100, a800 = load_operators("a100"), load_operators("a800")
    # compute identical
    assert a800.gemm_s(4096, 4096, 4096) == pytest.approx(a100.gemm_s(4096, 4096, 4096))
    assert a800.attn_decode_s(64, 64 * 4096, 8, 1) == pytest.approx(a100.attn_decode_s(64, 64 * 4096, 8, 1))
    # large all-reduce: bandwidth term 600/400 = 1.5x slower; small: latency-bound, unchanged
    big = 256e6
    ratio = float(a800.allreduce_s(big, 8) / a100.allreduce_s(big, 8))
    assert 1.4 < ratio <= 1.5 + 1e-9
    assert float(a800.allreduce_s(1024, 8)) == pytest.approx(float(a100.allreduce_s(1024, 8)), rel=0.05)
    # inter-node is the same network (200 Gb/s per GPU) on both
    assert float(a800.allreduce_s(big, 32, inter_node=True)) == pytest.approx(
        float(a100.allreduce_s(big, 32, inter_node=True)))


def test_h100_inter_node_uses_its_faster_network() -> None:
    a100, h100 = load_operators("a100"), load_operators("h100")
    big = 1e9
    assert float(h100.allreduce_s(big, 64, True)) < 0.7 * float(a100.allreduce_s(big, 64, True))


# ---- roofline ------------------------------------------------------------------------------
def test_roofline_formulas_by_hand() -> None:
    spec = get_gpu("h100")
    r = RooflineOperators("h100")
    m = n = k = 8192.0
    expect = 2 * m * n * k / (spec.bf16_flops * 0.7) + 3e-6
    assert float(r.gemm_s(m, n, k)) == pytest.approx(expect)
    expect_mem = 1e9 / (spec.hbm_bw * 0.8) + 3e-6
    assert float(r.memory_bound_s(1e9)) == pytest.approx(expect_mem)
    ar = 1e8 * 2 * 7 / 8 / (spec.intra_node_bw * 0.8) + 10e-6 * 3
    assert float(r.allreduce_s(1e8, 8)) == pytest.approx(ar)
    assert float(r.allreduce_s(1e8, 1)) == 0.0


def test_roofline_decode_coefficients_match_decode() -> None:
    r = RooflineOperators("a100")
    a, c = r.decode_coefficients(32, 16, 2)
    assert float(r.attn_decode_s(32, 0, 16, 2)) == pytest.approx(a)
    assert float(r.attn_decode_s(32, 1e6, 16, 2)) == pytest.approx(a + c * 1e6)


def test_roofline_vectorized_matches_scalar() -> None:
    r = RooflineOperators("a100")
    m = np.array([1.0, 64.0, 4096.0])
    vec = r.gemm_s(m, 4096, 4096)
    assert vec.shape == (3,)
    for i, mi in enumerate(m):
        assert vec[i] == pytest.approx(float(r.gemm_s(float(mi), 4096.0, 4096.0)))
    n = np.array([1, 2, 8])
    t = r.allreduce_s(1e6, n)
    assert t[0] == 0.0 and t[1] > 0 and t[2] > t[1]


# ---- fitted: the physical contract ---------------------------------------------------------
def test_gemm_monotone_on_and_off_grid(fitted: FittedOperators) -> None:
    base = [_log_uniform(1, 3e4, 40), _log_uniform(16, 7e4, 40), _log_uniform(16, 7e4, 40)]
    for axis in range(3):
        _nondecreasing_along(fitted.gemm_s, base, axis)


def test_prefill_monotone(fitted: FittedOperators) -> None:
    heads = RNG.choice([1, 2, 4, 8, 16, 32, 64], 40).astype(float)
    kv = np.minimum(heads, RNG.choice([1, 2, 4, 8], 40))
    base = [_log_uniform(1, 128, 40), _log_uniform(1, 8192, 40), np.zeros(40), heads, kv]
    for axis in (0, 1, 3):
        _nondecreasing_along(fitted.attn_prefill_s, base, axis)
    # more cached context never makes prefill faster
    for c in (0.0, 100.0, 1000.0, 1e4, 1e5):
        t = fitted.attn_prefill_s(base[0], base[1], c, heads, kv)
        if c > 0:
            assert np.all(t >= prev * (1 - MONO_TOL))
        prev = t


def test_decode_affine_in_total_kv(fitted: FittedOperators) -> None:
    for b, h, kv in [(1.0, 8.0, 1.0), (37.0, 12.0, 2.0), (256.0, 64.0, 8.0), (3000.0, 96.0, 8.0), (5.0, 128.0, 16.0)]:
        xs = np.array([0.0, 1e3, 5e4, 3e6, 4e7])
        t = fitted.attn_decode_s(b, xs, h, kv)
        slopes = np.diff(t) / np.diff(xs)
        assert np.allclose(slopes, slopes[0], rtol=1e-9)
        a, c = fitted.decode_coefficients(b, h, kv)
        assert t[0] == pytest.approx(a) and slopes[0] == pytest.approx(c)
        # scalar path (cached) agrees with the vectorized one
        assert float(fitted.attn_decode_s(b, 3e6, h, kv)) == pytest.approx(t[3])


def test_decode_monotone_in_kv_and_in_batch_at_fixed_length(fitted: FittedOperators) -> None:
    heads = RNG.choice([4, 8, 16, 32, 64], 30).astype(float)
    kv = RNG.choice([1, 2, 4, 8], 30).astype(float)
    kv = np.minimum(kv, heads)
    per_seq = _log_uniform(1, 2e5, 30)
    prev = None
    for b in (1.0, 2.0, 3.0, 8.0, 50.0, 256.0, 2048.0, 8192.0):
        t = fitted.attn_decode_s(b, b * per_seq, heads, kv)
        if prev is not None:
            assert np.all(t >= prev * (1 - MONO_TOL))
        prev = t
    base = [_log_uniform(1, 4096, 30), _log_uniform(1, 1e7, 30), heads, kv]
    _nondecreasing_along(fitted.attn_decode_s, base, 1)


def test_moe_monotone_in_tokens_on_and_off_measured_shapes(fitted: FittedOperators) -> None:
    for shape in [(2048, 768, 8, 128, 1, 1), (4096, 1536, 8, 128, 2, 4), (5000, 1000, 4, 64, 1, 8)]:
        x = np.array([1, 3, 16, 100, 1000, 5000, 16384, 70000, 300000], dtype=float)
        t = fitted.moe_s(x, *shape)
        assert np.all(t[1:] >= t[:-1] * (1 - MONO_TOL))
        assert float(fitted.moe_s(100.0, *map(float, shape))) == pytest.approx(t[3])


def test_collectives_monotone_in_bytes_and_zero_for_one_gpu(fitted: FittedOperators) -> None:
    sizes = np.logspace(2, 10.5, 30)
    for n, inter in [(2, False), (4, False), (8, False), (16, True), (128, True), (512, True), (4, True)]:
        for fn in (fitted.allreduce_s, fitted.allgather_s):
            t = fn(sizes, n, inter)
            assert np.all(t[1:] >= t[:-1] * (1 - MONO_TOL)) and np.all(t > 0)
    assert float(fitted.allreduce_s(1e6, 1)) == 0.0
    assert np.all(fitted.allreduce_s(np.array([1e6, 1e6]), np.array([1, 4])) == [0.0, float(fitted.allreduce_s(1e6, 4))])
    t = fitted.p2p_s(sizes)
    assert np.all(t[1:] >= t[:-1] * (1 - MONO_TOL))
    # all-gather moves half an all-reduce's bytes
    assert float(fitted.allgather_s(1e9, 8)) < float(fitted.allreduce_s(1e9, 8))


def test_roofline_agrees_with_fitted_within_a_factor_on_mid_shapes(fitted: FittedOperators) -> None:
    r = fitted.roof
    checks = [
        (fitted.gemm_s(2048, 4096, 4096), r.gemm_s(2048, 4096, 4096)),
        (fitted.gemm_s(8192, 8192, 8192), r.gemm_s(8192, 8192, 8192)),
        (fitted.attn_prefill_s(4, 4096, 0, 32, 8), r.attn_prefill_s(4, 4096, 0, 32, 8)),
        (fitted.attn_decode_s(64, 64 * 8192, 32, 8), r.attn_decode_s(64, 64 * 8192, 32, 8)),
        (fitted.moe_s(4096, 4096, 1536, 8, 128, 1, 1), r.moe_s(4096, 4096, 1536, 8, 128, 1, 1)),
        (fitted.allreduce_s(64e6, 8), r.allreduce_s(64e6, 8)),
        (fitted.p2p_s(64e6), r.p2p_s(64e6)),
    ]
    for got, roof in checks:
        assert 1 / 3 < float(got) / float(roof) < 3


def test_fitted_reproduces_a_measured_row() -> None:
    # aiconfigurator a100_sxm gemm_perf.csv: m=8192, n=65536, k=4096 -> 15.288 ms
    a100 = load_operators("a100")
    assert float(a100.gemm_s(8192, 65536, 4096)) == pytest.approx(15.288e-3, rel=0.02)


def test_vectorized_and_scalar_paths_agree(fitted: FittedOperators) -> None:
    m, n, k = _log_uniform(1, 5e4, 20), _log_uniform(8, 1e5, 20), _log_uniform(8, 1e5, 20)
    vec = fitted.gemm_s(m, n, k)
    for i in range(20):
        assert float(fitted.gemm_s(float(m[i]), float(n[i]), float(k[i]))) == pytest.approx(vec[i], rel=1e-9)
    b, s = _log_uniform(1, 300, 20), _log_uniform(1, 3e4, 20)
    c = _log_uniform(1, 3e4, 20)
    vec = fitted.attn_prefill_s(b, s, c, 32.0, 8.0)
    for i in range(20):
        assert float(fitted.attn_prefill_s(float(b[i]), float(s[i]), float(c[i]), 32.0, 8.0)) == pytest.approx(vec[i], rel=1e-9)
    sizes = _log_uniform(10, 1e10, 20)
    vec = fitted.allreduce_s(sizes, 8)
    for i in range(20):
        assert float(fitted.allreduce_s(float(sizes[i]), 8)) == pytest.approx(vec[i], rel=1e-9)


def test_broadcast_shapes() -> None:
    ops = load_operators("h100")
    assert ops.gemm_s(np.ones((2, 3)), 4096, np.full(3, 512.0)).shape == (2, 3)
    assert ops.attn_decode_s(np.array([1, 2]), np.array([[10.0], [20.0]]), 8, 1).shape == (2, 2)
    assert ops.moe_s(np.array([1, 2, 3]), 2048, 768, 8, 128, 1, 1).shape == (3,)


def test_calibration_from_other_compute_is_refused() -> None:
    from cost_models.calibration.store import Calibration

    calib = Calibration(gpu="a100", families={})
    with pytest.raises(CostModelError, match="cannot stand for 'h100'"):
        FittedOperators.from_calibration("h100", calib)
