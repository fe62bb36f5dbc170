"""Calibration pipeline: grid tables, CSV validation, fitting (recovering known laws from
synthetic data), the calibration file format, ``libra-calibrate`` errors, ``report`` on a
synthetic calibration root, and ``profile`` + ``fit`` on this CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cost_models import cli
from cost_models.calibration import data as cdata
from cost_models.calibration.fit import (
    affine_fit,
    alpha_beta,
    comm_table,
    choose_projection,
    decode_design,
    fill_by_shape_curvature,
    fit_folder,
    fit_moe,
    log_table,
)
from cost_models.calibration.grid import (
    LogGrid,
    axis_weights,
    fill,
    isotonic_l1,
    make_monotone,
    mesh,
    monotone_l1,
    place,
)
from cost_models.calibration.store import Calibration
from cost_models.errors import CostModelError
from cost_models.hardware import get_gpu
from cost_models.operators import FittedOperators, RooflineOperators, load_operators

RNG = np.random.default_rng(3)


# ---- grid ----------------------------------------------------------------------------------
def test_loggrid_is_exact_on_loglinear_functions_and_scalar_matches_vector() -> None:
    axes = [np.array([1.0, 2.0, 8.0, 64.0]), np.array([16.0, 32.0, 1024.0])]
    xx, yy = np.meshgrid(*axes, indexing="ij")
    grid = LogGrid(axes, 0.5 * np.log(xx) + 2.0 * np.log(yy))
    x, y = np.exp(RNG.uniform(0, np.log(64), 50)), np.exp(RNG.uniform(np.log(16), np.log(1024), 50))
    assert np.allclose(grid(x, y), 0.5 * np.log(x) + 2.0 * np.log(y))
    for i in range(10):
        assert grid.scalar(float(x[i]), float(y[i])) == pytest.approx(float(grid(x[i], y[i])))
    # clamped outside
    assert grid.scalar(1000.0, 1.0) == pytest.approx(0.5 * np.log(64) + 2.0 * np.log(16))
    back = LogGrid.from_json(json.loads(json.dumps(grid.to_json())))
    assert np.allclose(back.values, grid.values, atol=1e-3)


def test_place_fill_and_monotone() -> None:
    coords = np.array([[1, 1], [1, 4], [4, 1], [4, 4], [2, 2]], dtype=float)
    axes, table = place(coords, np.array([0.0, 3.0, 1.0, 4.0, 2.0]))
    assert [list(a) for a in axes] == [[1, 2, 4], [1, 2, 4]]
    assert np.isnan(table[0, 1]) and table[1, 1] == 2.0
    filled = fill(axes, table)
    assert not np.isnan(filled).any()
    # (x=1, y=2) lies halfway (in log) between 0 and 3 along y, and has no x-neighbour below
    assert filled[0, 1] == pytest.approx(1.5)
    mono = make_monotone(np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]]), (0, 1))
    assert np.all(np.diff(mono, axis=0) >= 0) and np.all(np.diff(mono, axis=1) >= 0)
    # a slow small shape takes the time of the faster larger one; larger cells are untouched
    assert list(make_monotone(np.array([9.0, 1.0, 2.0]), (0,))) == [1.0, 1.0, 2.0]


def test_axis_weights_trust_the_smooth_axis_and_fill_stays_exact_on_loglinear_tables() -> None:
    axes = [2.0 ** np.arange(10), 2.0 ** np.arange(10), 2.0 ** np.arange(8)]
    xx, yy, zz = mesh(axes)
    rng = np.random.default_rng(5)
    # smooth along axis 2, quantization-like jumps along axes 0 and 1
    table = 0.3 * np.log(zz) + 0.2 * rng.choice([-1.0, 1.0], size=xx.shape[:2])[:, :, None]
    w = axis_weights(axes, table)
    assert w is not None and w.sum() == pytest.approx(1.0) and np.all(w >= 0.02 / 1.1)
    assert w[2] > 0.6 and w[2] > 3 * max(w[0], w[1])
    # interior holes of a table linear in log axes are filled exactly whatever the weights
    lin = 0.5 * np.log(xx) - 0.25 * np.log(yy) + np.log(zz)
    holey = lin.copy()
    inner = holey[1:-1, 1:-1, 1:-1]
    inner[rng.random(inner.shape) < 0.3] = np.nan
    assert np.allclose(fill(axes, holey, weights=axis_weights(axes, holey)), lin)
    assert axis_weights([np.array([1.0, 2.0])], np.zeros(2)) is None  # too small to learn from


def test_log_table_holes_never_drag_measured_cells_down() -> None:
    # measured: a flat 4 us plateau on a 3x3 grid with the middle cell held out; a roofline that
    # would put the hole far below its measured smaller neighbours
    axes = [np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 4.0])]
    xx, yy = (c.ravel() for c in mesh(axes))
    keep = ~((xx == 2.0) & (yy == 2.0))
    t = np.full(keep.sum(), 4e-6)

    def roof(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where((x == 2.0) & (y == 2.0), 1e-7, 1e-6)

    grid = log_table(np.column_stack([xx[keep], yy[keep]]), t, roof, (0, 1))
    assert np.allclose(np.exp(grid.values), 4e-6)  # hole lifted to its smaller measured shapes
    # measured cells are made monotone among themselves only (padding argument)
    grid = log_table(np.array([[1.0], [2.0], [4.0]]), np.array([5e-6, 3e-6, 4e-6]), lambda x: x * 1e-6, (0,))
    assert np.allclose(np.exp(grid.values), [3e-6, 3e-6, 4e-6])


def test_l1_projection_moves_the_minority_side_of_a_kernel_switch() -> None:
    # a long run at 4.1 us, one larger shape at 2.9 us, then growth: L1 lifts the single cell
    run = [4.1] * 10 + [2.9, 4.2, 5.0]
    assert isotonic_l1(run) == [4.1] * 11 + [4.2, 5.0]
    assert list(make_monotone(np.array(run), (0,)))[:10] == [2.9] * 10  # the running minimum drags the run
    t = np.array([[3.0, 1.0, 4.0], [np.nan, 5.0, 2.0]])
    l1 = monotone_l1(t, (0, 1))
    assert np.isnan(l1[1, 0]) and np.all(np.isfinite(l1[~np.isnan(t)]))  # holes stay holes
    # the choice is made on measured cells held out of the inner fit: a table with such a
    # switch along every line prefers "l1"; a tiny table keeps "min"
    axes = [2.0 ** np.arange(12), 2.0 ** np.arange(12)]
    xx, yy = mesh(axes)
    table = np.log(np.where(xx == 2.0**10, 2.9, 4.1) + 0.01 * np.log2(xx) + 0.01 * np.log2(yy))
    assert choose_projection(axes, table, np.zeros_like(table), (0, 1)) == "l1"
    assert choose_projection([axes[0][:3]], table[:3, 0], np.zeros(3), (0,)) == "min"


def test_comm_table_fills_holes_on_the_measured_alpha_beta_line() -> None:
    n = np.repeat([2.0, 4.0, 8.0], 12)
    b = np.tile(4.0 ** np.arange(4, 16), 3)
    t = 5e-6 * np.log2(n) + b / (100e9 / np.log2(n))
    keep = ~((n == 4.0) & (b == 4.0**9))
    out = comm_table(n[keep], b[keep], t[keep], lambda nn, bb: 1e-5 + bb / 1e12)  # a poor roofline
    grid = LogGrid.from_json(out["grid"])
    assert np.exp(grid.scalar(4.0, 4.0**9)) == pytest.approx(1e-5 + 4.0**9 / 50e9, rel=2e-3)
    assert out["alpha_beta"]["4"] == pytest.approx([1e-5, 50e9], rel=1e-6)


def test_curves_are_completed_from_the_most_parallel_measured_curves() -> None:
    x = 2.0 ** np.arange(10)
    shape = np.log(3.0 + x)  # a shared bend (flat, then linear), not a line in log-log
    mat = np.array([shape + off for off in (0.0, 0.4, 1.1, -0.3)])
    holey = mat.copy()
    holey[0, 4] = np.nan  # interior hole
    holey[1, :2] = np.nan  # below the measured range
    holey[2, 8:] = np.nan  # above it
    out = fill_by_shape_curvature(x, holey, neighbours=2)
    assert np.allclose(out, mat)
    # without extension only the interior is completed
    inner = fill_by_shape_curvature(x, holey, neighbours=2, extend=False)
    assert np.isnan(inner[1, :2]).all() and np.isnan(inner[2, 8:]).all() and inner[0, 4] == pytest.approx(mat[0, 4])


def test_decode_design_keeps_each_cell_in_its_measured_range() -> None:
    law = lambda h, b, step: 1e-5 + 1e-7 * h + 1e-9 * b * step  # noqa: E731
    rows = []
    for h, b, top in ((8, 1, 6), (16, 1, 6), (8, 2, 6), (8, 4, 4)):
        for step in 2 ** np.arange(top):
            rows.append((b, h, 1, step, law(h, b, step)))
    frame = pd.DataFrame(rows, columns=["batch_size", "num_heads", "num_key_value_heads", "step", "latency_s"])
    frame = frame[~((frame["batch_size"] == 2) & (frame["step"] == 4))]
    frame = frame[~((frame["batch_size"] == 1) & (frame["num_heads"] == 8) & (frame["step"] == 32))]
    steps, cells, filled = decode_design(frame)
    assert cells == [(8.0, 1.0, 1.0), (8.0, 1.0, 2.0), (8.0, 1.0, 4.0), (16.0, 1.0, 1.0)]
    assert np.isnan(filled[2, 4:]).all()  # batch 4 was measured up to step 8 only
    assert np.exp(filled[1, 2]) == pytest.approx(law(8, 2, 4), rel=0.01)
    # 16 heads with the same KV heads and batch reached step 32, so 8 heads spans it too,
    # continued by that cell's step (same KV bytes per step)
    assert np.exp(filled[0, 5]) == pytest.approx(law(8, 1, 32), rel=0.02)


def test_moe_table_spans_the_token_axis_and_below_it_follows_the_roofline() -> None:
    roof = RooflineOperators("a100")
    tokens = 2.0 ** np.arange(0, 11)
    curve = lambda x: 2e-5 + 3e-8 * x  # noqa: E731  (a shared shape, scaled per model shape)
    shapes = {(4096.0, 14336.0, 2.0, 8.0, 1.0, 1.0): 1.0, (2048.0, 768.0, 8.0, 128.0, 1.0, 1.0): 0.4}
    rows = []
    for shape, scale in shapes.items():
        for x in tokens:
            if scale != 1.0 and x in (1.0, 1024.0):
                continue  # the second shape lacks both ends
            rows.append((x, *shape, scale * curve(x)))
    frame = pd.DataFrame(rows, columns=["num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                        "moe_tp_size", "moe_ep_size", "latency_s"])
    ops = FittedOperators.from_calibration("a100", Calibration(gpu="a100", families={"moe": fit_moe(frame, roof)}))
    first, second = shapes
    assert list(ops._moe[second].axes[0]) == list(tokens)  # both ends completed from the other curve
    for x in (1.0, 1024.0):
        assert float(ops.moe_s(x, *second)) == pytest.approx(0.4 * curve(x), rel=2e-3)
    # below every measured token count: the roofline ratio, not a clamp to the smallest one
    want = curve(1.0) * float(roof.moe_s(0.5, *first)) / float(roof.moe_s(1.0, *first))
    assert float(ops.moe_s(0.5, *first)) == pytest.approx(want, rel=2e-3)
    assert float(ops.moe_s(0.5, *first)) < float(ops.moe_s(1.0, *first))


# ---- fitting primitives --------------------------------------------------------------------
def test_affine_fit_recovers_an_affine_law_and_respects_bounds() -> None:
    x = np.array([1, 10, 100, 1e3, 1e4, 1e5])
    a, c = affine_fit(x, 2e-5 + 3e-9 * x, 1e-12, 1e-6)
    assert a == pytest.approx(2e-5) and c == pytest.approx(3e-9)
    a, c = affine_fit(x, np.full(6, 1e-5), 1e-10, 1e-6)  # flat data: slope held at its floor
    assert c == pytest.approx(1e-10) and a > 0


def test_alpha_beta_recovers_latency_and_bandwidth() -> None:
    b = np.logspace(3, 9, 20)
    alpha, beta = alpha_beta(b, 8e-6 + b / 150e9)
    assert alpha == pytest.approx(8e-6, rel=1e-6) and beta == pytest.approx(150e9, rel=1e-6)


# ---- synthetic calibration data ------------------------------------------------------------
def _write_synthetic_folder(folder: Path, gpu: str = "a100", noise: float = 0.0) -> dict[str, object]:
    """aiconfigurator-style CSVs from known laws (roofline x smooth efficiency, affine decode),
    with optional multiplicative noise. Returns the laws for checking."""
    folder.mkdir(parents=True, exist_ok=True)
    roof = RooflineOperators(gpu)
    rng = np.random.default_rng(11)
    jitter = lambda n: np.exp(rng.normal(0.0, noise, n)) if noise else np.ones(n)  # noqa: E731
    m, n, k = np.meshgrid([1, 4, 16, 64, 256, 1024, 4096], [64, 256, 1024, 4096], [64, 256, 1024, 4096], indexing="ij")
    m, n, k = m.ravel(), n.ravel(), k.ravel()
    eff = 1.0 + 0.3 / (1.0 + np.log2(m))
    lat = roof.gemm_s(m, n, k) * eff * jitter(m.size) * 1e3
    pd.DataFrame({"m": m, "n": n, "k": k, "latency": lat}).to_csv(folder / "gemm_perf.csv", index=False)
    rows = []
    for b in (1, 2, 4, 8, 16):
        for s in (16, 64, 256, 1024, 4096):
            for h, kv in ((8, 1), (8, 8), (32, 8)):
                rows.append((b, s, h, kv, float(roof.attn_prefill_s(b, s, 0, h, kv)) * 1.4e3))
    pd.DataFrame(rows, columns=["batch_size", "isl", "num_heads", "num_key_value_heads", "latency"]).to_csv(
        folder / "context_attention_perf.csv", index=False)
    law = lambda b, kv_tokens, kv: 1.2e-5 + 1e-8 * b + 6e-10 * kv * kv_tokens  # noqa: E731
    rows = []
    for b in (1, 4, 16, 64, 256):
        for step in (1, 15, 255, 4095, 65535):
            for h, kv in ((8, 1), (16, 2), (32, 4)):
                rows.append((b, h, kv, step, law(b, b * step, kv) * 1e3))
    pd.DataFrame(rows, columns=["batch_size", "num_heads", "num_key_value_heads", "step", "latency"]).to_csv(
        folder / "generation_attention_perf.csv", index=False)
    rows = []
    for op in ("all_reduce", "all_gather"):
        for g in (2, 4, 8):
            for e in 2.0 ** np.arange(8, 28, 2):
                rows.append((op, g, int(e), float(roof.collective_s(op, e * 2, g)) * 1.3e3))
    pd.DataFrame(rows, columns=["op_name", "num_gpus", "message_size", "latency"]).to_csv(
        folder / "nccl_perf.csv", index=False)
    return {"decode": law}


def test_fit_recovers_synthetic_laws(tmp_path: Path) -> None:
    laws = _write_synthetic_folder(tmp_path / "d")
    calib = fit_folder(tmp_path / "d", "a100")
    assert set(calib.families) == {"gemm", "attn_prefill", "attn_decode", "comm"}
    ops = FittedOperators.from_calibration("a100", calib)
    roof = ops.roof
    # measured nodes reproduced; decode law recovered exactly, also between grid nodes
    assert float(ops.gemm_s(64, 1024, 1024)) == pytest.approx(float(roof.gemm_s(64, 1024, 1024)) * (1 + 0.3 / 7), rel=2e-3)
    for b, kv_tokens in ((4, 4 * 255), (37, 37 * 3000), (200, 200 * 50000)):
        assert float(ops.attn_decode_s(b, kv_tokens, 16, 2)) == pytest.approx(laws["decode"](b, kv_tokens, 2), rel=0.02)
    assert float(ops.attn_prefill_s(8, 1024, 0, 32, 8)) == pytest.approx(1.4 * float(roof.attn_prefill_s(8, 1024, 0, 32, 8)), rel=2e-3)
    assert float(ops.allreduce_s(2 * 4096, 8)) == pytest.approx(1.3 * float(roof.allreduce_s(2 * 4096, 8)), rel=2e-3)
    # families without data stay roofline
    assert float(ops.moe_s(64, 2048, 768, 8, 128, 1, 1)) == float(roof.moe_s(64, 2048, 768, 8, 128, 1, 1))


def test_calibration_file_round_trip_and_loader(tmp_path: Path) -> None:
    _write_synthetic_folder(tmp_path / "d")
    calib = fit_folder(tmp_path / "d", "a100")
    path = calib.save(tmp_path / "c.json")
    obj = json.loads(path.read_text())
    assert obj["format"] == "libra-operator-calibration" and obj["version"] == 1
    assert obj["source"]["files_sha256"]["gemm_perf.csv"] == cdata.sha256_of(tmp_path / "d" / "gemm_perf.csv")
    ops = load_operators("a100", path)
    assert isinstance(ops, FittedOperators)
    direct = FittedOperators.from_calibration("a100", calib)
    assert float(ops.gemm_s(100, 300, 700)) == pytest.approx(float(direct.gemm_s(100, 300, 700)), rel=2e-3)


def test_bad_calibration_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="not a JSON calibration"):
        Calibration.load(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CostModelError, match="libra-calibrate fit"):
        Calibration.load(bad)
    bad.write_text(json.dumps({"format": "libra-operator-calibration", "version": 99, "gpu": "a100", "families": {}}))
    with pytest.raises(CostModelError, match="version 99"):
        Calibration.load(bad)
    with pytest.raises(CostModelError, match="not found"):
        load_operators("a100", tmp_path / "missing.json")


# ---- CSV validation ------------------------------------------------------------------------
def test_csv_errors_name_file_line_and_column(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "gemm_perf.csv").write_text("m,n,k,latency\n1,2,3,0.5\n4,5,6,abc\n")
    with pytest.raises(CostModelError, match=r"gemm_perf.csv: line 3, column 'latency'.*'abc'"):
        cdata.load_folder(d)
    (d / "gemm_perf.csv").write_text("m,n,latency\n1,2,0.5\n")
    with pytest.raises(CostModelError, match=r"gemm_perf.csv: missing column\(s\) 'k'"):
        cdata.load_folder(d)
    (d / "gemm_perf.csv").write_text("m,n,k,latency\n1,2,-3,0.5\n")
    with pytest.raises(CostModelError, match="line 2, column 'k': expected a positive number"):
        cdata.load_folder(d)
    (d / "gemm_perf.csv").unlink()
    with pytest.raises(CostModelError, match="no calibration CSV found"):
        cdata.load_folder(d)


def test_nccl_tests_log_parser(tmp_path: Path) -> None:
    ranks = "".join(f"#   Rank {r:2d} Pid 1 on node-{r // 8} device {r % 8} [0x00] A100\n" for r in range(16))
    body = (
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "        1024           256     float     sum    34.66    0.03    0.06    N/A    34.47    0.03    0.06    N/A\n"
        "  1073741824     268435456     float     sum    16170   66.40  124.50    N/A    16166   66.42  124.53    N/A\n"
    )
    log = tmp_path / "nccl_16.log"
    log.write_text(ranks + body)
    df = cdata.parse_nccl_tests_log(log)
    assert list(df["n_gpus"]) == [16, 16]
    assert df["latency_s"].tolist() == pytest.approx([34.47e-6, 16166e-6])
    (tmp_path / "junk.log").write_text("hello\n")
    with pytest.raises(CostModelError, match="not an nccl-tests log"):
        cdata.parse_nccl_tests_log(tmp_path / "junk.log")


# ---- CLI -----------------------------------------------------------------------------------
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fit", "--data", str(tmp_path / "nope"), "--gpu", "a100", "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("libra-calibrate: error: ") and "calibration folder not found" in err and err.count("\n") == 1
    _write_synthetic_folder(tmp_path / "d")
    assert cli.main(["fit", "--data", str(tmp_path / "d"), "--gpu", "b300", "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'b300'; valid: a100, a800, b200, cpu, gb200, h100, h200" in err
    assert cli.main(["report", "--gpu", "tpu", "--data-root", str(tmp_path)]) == 2
    assert "report covers: a100, h100, h200" in capsys.readouterr().err
    assert cli.main(["fit", "--data", str(tmp_path / "d"), "--gpu", "a100", "-o", str(tmp_path / "o.json")]) == 0
    assert (tmp_path / "o.json").is_file()


def test_report_on_a_synthetic_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "calibration"
    _write_synthetic_folder(root / "aiconfigurator" / "a100_sxm", noise=0.02)
    net = root / "vidur" / "network" / "a100_dgx"
    net.mkdir(parents=True)
    sizes = np.logspace(3, 8, 40)
    t_ms = (10e-6 + sizes / 100e9) * 1e3
    pd.DataFrame({"time_stats.send_recv.median": t_ms, "size": sizes, "num_workers": 2, "devices_per_node": 2}).to_csv(
        net / "send_recv.csv")
    out = tmp_path / "rep"
    assert cli.main(["report", "--gpu", "a100", "--data-root", str(root), "--out", str(out), "--quick"]) == 0
    table = pd.read_csv(out / "operator_report.csv")
    assert set(table["family"]) == {"gemm", "attn_prefill", "attn_decode", "comm_intra", "p2p_intra"}
    assert set(table["split"]) == {"random", "extrapolation", "in-sample"}
    rnd = table[table["split"] == "random"].set_index("family")["mape"]
    # 2 % noise on smooth laws: held-out error must be close to the noise level
    assert rnd["gemm"] < 6.0 and rnd["attn_decode"] < 2.0 and rnd["p2p_intra"] < 1.0
    md = (out / "operator_report.md").read_text()
    assert "| gemm | a100 |" in md
    # seeded: a second run writes the same numbers
    assert cli.main(["report", "--gpu", "a100", "--data-root", str(root), "--out", str(tmp_path / "rep2"), "--quick"]) == 0
    assert (tmp_path / "rep2" / "operator_report.md").read_text() == md


# ---- profile + fit on this CPU -------------------------------------------------------------
#: In-sample MAPE bounds of a calibration fitted on this CPU's own quick profile (documented in
#: docs/cost-model-operators.md): GEMM and prefill are interpolated exactly at measured shapes
#: (only monotonicity fixes move them); decode is an affine law in KV per shape.
CPU_BOUNDS = {"gemm": 10.0, "attn_prefill": 10.0, "attn_decode": 20.0}


def test_profile_cpu_quick_then_fit_recovers_its_timings(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from cost_models.calibration.report import predict

    out = tmp_path / "prof"
    assert cli.main(["profile", "--device", "cpu", "--quick", "--threads", "1", "--out", str(out)]) == 0
    meta = json.loads((out / "profile_meta.json").read_text())
    assert meta["dtype"] == "float32" and "bf16" in meta["dtype_note"]
    calib_path = tmp_path / "cpu.json"
    assert cli.main(["fit", "--data", str(out), "--gpu", "cpu", "-o", str(calib_path)]) == 0
    ops = load_operators("cpu", calib_path)
    assert isinstance(ops, FittedOperators)
    assert json.loads(calib_path.read_text())["source"]["profile_meta"]["dtype"] == "float32"
    tables = cdata.load_folder(out)
    for fam, bound in CPU_BOUNDS.items():
        f = tables[fam].frame
        ape = np.abs(predict(ops, fam, f) / f["latency_s"].to_numpy() - 1.0) * 100
        assert ape.mean() < bound, f"{fam}: in-sample MAPE {ape.mean():.1f}% on this CPU's own profile"
    # decode on the CPU is still affine in KV and positive
    t = ops.attn_decode_s(4, np.array([0.0, 1e3, 1e5]), 8, 2)
    assert np.all(t > 0) and np.diff(t)[1] / 99e3 == pytest.approx(np.diff(t)[0] / 1e3)


def test_profile_without_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import builtins

    real_import = builtins.__import__

    def no_torch(name: str, *args: object, **kwargs: object) -> object:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert cli.main(["profile", "--device", "cpu", "--quick", "--out", str(tmp_path / "p")]) == 2
    assert "profiling needs torch" in capsys.readouterr().err


def test_gpu_catalog_names_used_by_bundles() -> None:
    for name in ("a100", "a800", "h100", "h200", "cpu"):
        assert get_gpu(name).name == name


# ---- the bundled files are reproducible from the measured data -----------------------------
@pytest.mark.parametrize("gpu", ["a100", "b200", "gb200"])
def test_bundled_calibration_matches_a_fresh_fit_of_its_source(gpu: str) -> None:
    from cost_models.calibration.sources import BUNDLE_SOURCES, find_calibration_root, fit_bundle

    root = find_calibration_root()  # the copy shipped in the package: never skipped
    src = BUNDLE_SOURCES[gpu]
    bundled = load_operators(gpu)
    stored = json.loads((Path(__file__).parents[1] / "cost_models" / "data" / f"operators_{gpu}.json").read_text())
    for name, digest in stored["source"]["files_sha256"].items():
        if "/" not in name:  # aiconfigurator CSVs: the bundle was fitted on exactly these files
            assert cdata.sha256_of(root / src["data"] / name) == digest, f"{name} changed: refit the bundle"
    fresh = FittedOperators.from_calibration(gpu, fit_bundle(gpu, root))
    m, n, k = np.exp(RNG.uniform(0, 10, 50)), np.exp(RNG.uniform(3, 11, 50)), np.exp(RNG.uniform(3, 11, 50))
    assert np.allclose(bundled.gemm_s(m, n, k), fresh.gemm_s(m, n, k), rtol=2e-3)
    b = np.exp(RNG.uniform(0, 7, 50))
    assert np.allclose(bundled.attn_decode_s(b, b * 3000, 32, 8), fresh.attn_decode_s(b, b * 3000, 32, 8), rtol=2e-3)
    sizes = np.logspace(3, 9, 20)
    for g in (2, 8, 16):  # gb200: 8 is the b200-extended cell, 16 beyond every table
        assert np.allclose(bundled.allreduce_s(sizes, g), fresh.allreduce_s(sizes, g), rtol=2e-3)
    assert np.allclose(bundled.p2p_s(sizes), fresh.p2p_s(sizes), rtol=2e-3)
    assert np.allclose(bundled.allreduce_s(sizes, 64, inter_node=True), fresh.allreduce_s(sizes, 64, inter_node=True), rtol=2e-3)


def test_measured_data_ships_with_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh clone has no shared/ folder: fit and report must find the bundled copy."""
    from cost_models.calibration.sources import BUNDLED_DATA, ENV_VAR, find_calibration_root

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    root = find_calibration_root()
    assert root == BUNDLED_DATA
    for rel in ("aiconfigurator/LICENSE", "aiconfigurator/a100_sxm/gemm_perf.csv", "vidur/LICENSE", "echo/LICENSE",
                "engine/llm_inference_bench.csv", "engine/LICENSE-llm-inference-bench", "rl_steps/rl_step_breakdowns.csv"):
        assert (root / rel).is_file(), rel
