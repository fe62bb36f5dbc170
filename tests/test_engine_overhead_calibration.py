"""Engine-overhead calibration: the optional ``engine`` entry of a calibration file, how the
evaluator uses it, the non-negative fit, and (with torch + transformers) the profiling command on
the bundled tiny policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cost_models import cli
from cost_models.calibration.engine import EngineRow, fit_overhead, holdout_mask, nnls_affine, read_rows, write_rows
from cost_models.calibration.store import Calibration, EngineOverhead, load_engine_overhead
from cost_models.errors import CostModelError
from cost_models.evaluator import CostEvaluator
from cost_models.rollout import ENGINE_PER_SEQ_S, ENGINE_STEP_S

TINY = Path(__file__).resolve().parents[1] / "libra" / "runtime" / "assets" / "tiny-policy"
BUNDLED_A100 = Path(__file__).resolve().parents[1] / "cost_models" / "data" / "operators_a100.json"


def _calib_with(tmp_path: Path, engine: EngineOverhead | None, name: str = "c.json") -> Path:
    """The bundled A100 operator tables, with or without an engine entry."""
    base = Calibration.load(BUNDLED_A100)
    return Calibration(gpu=base.gpu, families=base.families, source={"test": True}, engine=engine).save(tmp_path / name)


def test_store_round_trip_and_bad_entries(tmp_path: Path) -> None:
    eng = EngineOverhead(2.5e-3, 4.0e-5, {"model": "tiny", "holdout_mape": {"all": 3.0}})
    path = _calib_with(tmp_path, eng)
    back = Calibration.load(path)
    assert back.engine == eng
    assert load_engine_overhead(path) == eng
    assert Calibration.load(_calib_with(tmp_path, None, "none.json")).engine is None
    assert "engine" not in json.loads((tmp_path / "none.json").read_text())
    obj = json.loads(path.read_text())
    for bad, msg in (({"step_s": 1e-3}, "per_seq_s"), ({"step_s": -1.0, "per_seq_s": 0.0}, "step_s"),
                     ({"step_s": "x", "per_seq_s": 0.0}, "step_s"), ([1, 2], "object")):
        obj["engine"] = bad
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(obj))
        with pytest.raises(CostModelError, match=msg) as err:
            Calibration.load(p)
        assert "bad.json" in str(err.value) and "\n" not in str(err.value)


def test_evaluator_adds_exactly_the_fitted_overhead(tmp_path: Path) -> None:
    step, per_seq = 3.0e-3, 7.0e-5
    with_eng = CostEvaluator("a100", "qwen3-8b", calibration=_calib_with(tmp_path, EngineOverhead(step, per_seq)))
    # the pre-profile constants, named (a file without an entry now gets the default profile)
    without = CostEvaluator("a100", "qwen3-8b", calibration=_calib_with(tmp_path, None, "n.json"), engine="constants")
    assert with_eng.engine.name == "calibration-engine-entry" and without.engine.name == "constants"
    assert (with_eng.engine.step_s, with_eng.engine.per_seq_s, with_eng.engine.kernel_scale) == (step, per_seq, 1.0)
    for tp, b, ctx in ((1, 1, 100), (2, 16, 20000), (4, 200, 1e6)):
        d = with_eng.decode_s(tp, b, ctx) - without.decode_s(tp, b, ctx)
        assert d == pytest.approx((step - ENGINE_STEP_S) + (per_seq - ENGINE_PER_SEQ_S) * b, rel=1e-9, abs=1e-12)
    for tp, s, c, b in ((1, 512, 0, 1), (2, 128, 4096, 8), (8, 2048, 0, 3)):
        d = with_eng.prefill_s(tp, s, c, b) - without.prefill_s(tp, s, c, b)
        assert d == pytest.approx((step - ENGINE_STEP_S) + (per_seq - ENGINE_PER_SEQ_S) * b, rel=1e-9, abs=1e-12)
    # arrays take the same path
    b = np.array([1, 8, 64])
    d = with_eng.decode_s(1, b, 1000 * b) - without.decode_s(1, b, 1000 * b)
    np.testing.assert_allclose(d, (step - ENGINE_STEP_S) + (per_seq - ENGINE_PER_SEQ_S) * b, rtol=1e-9)
    # an explicit engine= wins over the file's entry
    explicit = CostEvaluator("a100", "qwen3-8b", calibration=_calib_with(tmp_path, EngineOverhead(step, per_seq), "e.json"),
                             engine=EngineOverhead(0.0, 0.0))
    assert explicit.decode_s(1, 4, 100) == pytest.approx(without.decode_s(1, 4, 100) - ENGINE_STEP_S - 4 * ENGINE_PER_SEQ_S)


def test_decode_stays_exactly_affine_in_context(tmp_path: Path) -> None:
    ev = CostEvaluator("a100", "qwen3-8b", calibration=_calib_with(tmp_path, EngineOverhead(2e-3, 3e-5)))
    for tp, b in ((1, 1), (2, 7), (4, 300)):
        base, slope = ev.decode_coeffs(tp, b)
        for ctx in (0, 1234, 5e5):
            assert ev.decode_s(tp, b, ctx) == base + slope * float(ctx)  # bit for bit
        without = CostEvaluator("a100", "qwen3-8b", engine="constants")
        assert slope == without.decode_coeffs(tp, b)[1]  # the overhead never touches the slope


def test_no_entry_means_unchanged_predictions(tmp_path: Path) -> None:
    from cost_models.engines import DEFAULT_PROFILE

    plain = CostEvaluator("a100", "qwen3-8b")  # bundled file, no engine entry: the default profile
    no_entry = CostEvaluator("a100", "qwen3-8b", calibration=_calib_with(tmp_path, None))
    cpu = CostEvaluator("cpu", TINY / "config.json", engine="constants")
    assert plain.engine.name == DEFAULT_PROFILE and no_entry.engine.name == DEFAULT_PROFILE
    consts = CostEvaluator("a100", "qwen3-8b", engine="constants")
    assert consts._rollout.engine_step_s == ENGINE_STEP_S and consts._rollout.engine_per_seq_s == ENGINE_PER_SEQ_S
    for tp, b, ctx in ((1, 1, 100), (2, 32, 50000)):
        assert no_entry.decode_s(tp, b, ctx) == plain.decode_s(tp, b, ctx)
    assert no_entry.prefill_s(2, 1000, 500, 4) == plain.prefill_s(2, 1000, 500, 4)
    # pinned values of the pre-profile constants (CPU roofline, tiny policy): a change here is a
    # change in every prediction made with engine="constants"
    assert cpu.decode_s(1, 4, 400) == pytest.approx(0.00122672, rel=1e-6)
    assert cpu.prefill_s(1, 100, 0, 4) == pytest.approx(0.0063691383, rel=1e-6)


def test_nnls_recovers_known_overhead_and_respects_bounds() -> None:
    rng = np.random.default_rng(0)
    B = np.repeat([1, 2, 4, 8, 16], 6).astype(float)
    compute = rng.uniform(1e-4, 5e-3, B.size)
    step, per_seq = 1.7e-3, 4.5e-5
    meas = compute + step + per_seq * B
    rows = [EngineRow("decode" if i % 2 else "prefill", int(b), 32, 1, float(m), float(c))
            for i, (b, m, c) in enumerate(zip(B, meas, compute))]
    fit = fit_overhead(rows)
    assert fit.step_s == pytest.approx(step, rel=1e-9)
    assert fit.per_seq_s == pytest.approx(per_seq, rel=1e-9)
    assert fit.holdout_mape["all"] < 1e-6 and fit.holdout_rows == int(holdout_mask(rows).sum()) > 0
    # 3 % multiplicative noise: still close
    noisy = [EngineRow(r.kind, r.batch, r.context, r.new_tokens, r.measured_s * (1 + 0.03 * e), r.compute_s)
             for r, e in zip(rows, rng.standard_normal(len(rows)))]
    fit = fit_overhead(noisy)
    assert fit.step_s == pytest.approx(step, rel=0.1) and fit.per_seq_s == pytest.approx(per_seq, rel=0.3)
    # a remainder that falls with batch: the slope is clamped to 0, never negative
    a, b = nnls_affine(np.array([1.0, 2, 4, 8]), np.array([4e-3, 3e-3, 2e-3, 1e-3]), np.ones(4))
    assert b == 0.0 and a == pytest.approx(2.5e-3)
    # a remainder below zero everywhere (operators over-predict): both 0
    assert nnls_affine(np.array([1.0, 4]), np.array([-1e-3, -2e-3]), np.ones(2)) == (0.0, 0.0)
    with pytest.raises(CostModelError):
        fit_overhead([])


def test_engine_csv_round_trip(tmp_path: Path) -> None:
    rows = [EngineRow("decode", 4, 128, 1, 1.25e-3, 2.0e-4), EngineRow("prefill", 2, 0, 64, 3.5e-3, 1.0e-3)]
    path = write_rows(tmp_path / "engine.csv", rows)
    assert read_rows(path) == rows
    path.write_text("kind,batch,context,new_tokens,measured_s,compute_s\ndecode,x,1,1,1,1\n")
    with pytest.raises(CostModelError, match="line 2"):
        read_rows(path)


def test_fit_refuses_an_engine_entry_for_another_device(tmp_path: Path) -> None:
    from cost_models.calibration.fit import fit_folder

    out = tmp_path / "p"
    out.mkdir()
    (out / "gemm_perf.csv").write_text("m,n,k,latency\n" + "".join(
        f"{m},{n},{k},{1e-6 * m * n * k / 1e3 + 0.01:.6g}\n" for m in (1, 8, 64) for n in (64, 256) for k in (64, 256)))
    meta = {"engine": {"step_s": 1e-3, "per_seq_s": 1e-5, "source": {"gpu": "cpu"}}}
    (out / "profile_meta.json").write_text(json.dumps(meta))
    assert fit_folder(out, "cpu").engine == EngineOverhead(1e-3, 1e-5, {"gpu": "cpu"})
    with pytest.raises(CostModelError, match="--gpu cpu"):
        fit_folder(out, "h100")


def test_profile_engine_quick_on_the_tiny_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "prof"
    assert cli.main(["profile", "--device", "cpu", "--quick", "--threads", "1", "--out", str(out),
                     "--engine-model", str(TINY)]) == 0
    printed = capsys.readouterr().out
    assert "engine overhead: step" in printed and "held-out" in printed
    rows = read_rows(out / "engine.csv")
    assert {r.kind for r in rows} == {"decode", "prefill"}
    assert all(r.measured_s > 0 and r.compute_s > 0 for r in rows)
    meta = json.loads((out / "profile_meta.json").read_text())
    eng = meta["engine"]
    assert eng["step_s"] > 0 and math.isfinite(eng["source"]["holdout_mape"]["all"])
    calib = tmp_path / "calib.json"
    assert cli.main(["fit", "--data", str(out), "--gpu", "cpu", "-o", str(calib)]) == 0
    loaded = Calibration.load(calib)
    assert loaded.engine is not None and loaded.engine.step_s == pytest.approx(eng["step_s"])
    assert "engine.csv" in loaded.source["files_sha256"]
    # the calibrated evaluator reproduces the measured iterations it was fitted on (in-sample)
    ev = CostEvaluator("cpu", TINY / "config.json", calibration=calib)
    pred = [ev.decode_s(1, r.batch, r.batch * r.context) if r.kind == "decode"
            else ev.prefill_s(1, r.new_tokens, r.context, r.batch) for r in rows]
    ape = [abs(p - r.measured_s) / r.measured_s for p, r in zip(pred, rows)]
    assert np.mean(ape) == pytest.approx(eng["source"]["insample_mape"]["all"] / 100, rel=1e-3)  # engine.csv: 6 digits
    # --engine-only reuses the operator CSVs
    assert cli.main(["profile", "--device", "cpu", "--quick", "--threads", "1", "--out", str(out),
                     "--engine-model", str(TINY), "--engine-only"]) == 0


def test_profile_engine_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profile", "--out", str(tmp_path / "p"), "--engine-only"]) == 2
    assert "--engine-only needs --engine-model" in capsys.readouterr().err
    assert cli.main(["profile", "--device", "cuda", "--out", str(tmp_path / "p"), "--engine-model", str(TINY)]) == 2
    assert "needs --gpu" in capsys.readouterr().err
    pytest.importorskip("torch")
    assert cli.main(["profile", "--out", str(tmp_path / "e"), "--engine-model", str(TINY), "--engine-only"]) == 2
    assert "profile_meta.json not found" in capsys.readouterr().err
