"""Engine profiles (``cost_models.engines``): the model, its file format, the fit, the bundled
profiles, ``libra-calibrate fit-engine`` / ``report --engine``, and ``--engine`` reaching the
evaluator in the planner, ``libra-sim plan`` and ``libra-sim replay``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from test_sim_replay_cli import _trace

from cost_models import CostEvaluator
from cost_models.calibration.store import Calibration, EngineOverhead
from cost_models.cli import main as calibrate
from cost_models.engines import DEFAULT_PROFILE, EngineProfile, get_profile
from cost_models.engines import fit as F
from cost_models.engines.measurements import Measurement, read_measurements
from cost_models.engines.registry import BUNDLED_DIR, BUNDLED_RECIPES
from cost_models.errors import CostModelError
from cost_models.models import get_model
from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.costs import make_evaluator
from sim.cli import main as sim_main
from sim.costs import load_costs

KNOWN = EngineProfile(name="known", step_s=1.2e-3, per_seq_s=6.0e-5, per_worker_s=2.0e-4, per_collective_s=1.2e-5,
                      kernel_scale=1.15)


def _synthetic_rows(profile: EngineProfile) -> list[Measurement]:
    """Static-batch latencies of three models on h100 as ``profile`` predicts them."""
    rows = []
    for name in ("qwen3-8b", "llama-3.1-8b", "qwen3-14b"):
        ev = CostEvaluator("h100", name, engine=profile)
        for tp in (1, 2, 4):
            for b in (1, 16, 64):
                for n in (128, 512):
                    r = Measurement(get_model(name), "h100", tp, b, n, n, "latency", 1.0, line=len(rows) + 2)
                    rows.append(Measurement(r.model, "h100", tp, b, n, n, "latency", F.predict_row(ev, r), line=r.line))
    return rows


def test_fit_recovers_known_coefficients_and_matches_the_evaluator() -> None:
    rows = _synthetic_rows(KNOWN)
    fit = F.fit_profile(rows, "recovered", terms=("step_s", "per_seq_s", "per_worker_s", "per_collective_s"), fit_scale=True)
    p = fit.profile
    for t in ("step_s", "per_seq_s", "per_worker_s", "per_collective_s", "kernel_scale"):
        assert getattr(p, t) == pytest.approx(getattr(KNOWN, t), rel=1e-6), t
    # the fit's linear form is the evaluator's prediction
    np.testing.assert_allclose(F.predict(fit.features, KNOWN.kernel_scale, KNOWN.terms), fit.features.value, rtol=1e-9)
    assert fit.chosen.cv.mape < 1e-6 and fit.chosen.cv.speedup_err < 1e-6
    # term selection by leave-one-model-out finds an exact model too, and never a negative term
    auto = F.fit_profile(rows, "auto").profile
    assert all(v >= 0 for v in auto.terms.values())
    assert auto.source["leave_one_model_out"]["mape_pct"] < 1e-3


def test_decode_stays_exactly_affine_with_every_term() -> None:
    prof = KNOWN.with_terms(per_layer_s=3e-6, cuda_graph_max_batch=8)
    ev = CostEvaluator("h100", "qwen3-14b", engine=prof)
    zero = CostEvaluator("h100", "qwen3-14b", engine=F.ZERO)
    L = ev.model.n_layers
    for tp, b in ((1, 1), (2, 7), (4, 64), (8, 300)):
        base, slope = ev.decode_coeffs(tp, b)
        for ctx in (0, 1234, 5e5):
            assert ev.decode_s(tp, b, ctx) == base + slope * float(ctx)  # bit for bit
        b0, s0 = zero.decode_coeffs(tp, b)
        assert slope == pytest.approx(prof.kernel_scale * s0, rel=1e-12)  # overhead never touches the slope
        over = (prof.step_s + prof.per_seq_s * b + prof.per_worker_s * (tp - 1) + (prof.per_collective_s * 2 * L if tp > 1 else 0)
                + (prof.per_layer_s * L if b > 8 else 0))
        assert base == pytest.approx(prof.kernel_scale * b0 + over, rel=1e-12)
    # vectorized and scalar paths agree
    b = np.array([1, 16, 300])
    np.testing.assert_allclose(ev.decode_s(2, b, 1000 * b), [ev.decode_s(2, int(x), 1000 * int(x)) for x in b], rtol=1e-12)
    pre = ev.prefill_s(4, 512, 100, 3)
    assert pre == pytest.approx(prof.kernel_scale * zero.prefill_s(4, 512, 100, 3) + prof.overhead_s(4, 3, L, True), rel=1e-12)
    assert float(ev.prefill_s(np.array([4]), 512, 100, 3)[0]) == pytest.approx(pre, rel=1e-12)


@pytest.mark.parametrize("name", sorted(BUNDLED_RECIPES))
def test_bundled_profiles_are_reproducible(name: str) -> None:
    bundled = json.loads((BUNDLED_DIR / f"{name}.json").read_text())
    fresh = F.fit_bundled(name).profile.to_json()
    for t, v in bundled["terms"].items():
        assert fresh["terms"][t] == pytest.approx(v, rel=1e-6, abs=1e-12), f"{t}: refit with `libra-calibrate fit-engine --rebuild-bundled`"
    assert fresh["kernel_scale"] == pytest.approx(bundled["kernel_scale"], rel=1e-6)
    assert fresh["source"]["sha256"] == bundled["source"]["sha256"]
    assert fresh["source"]["rows"] == bundled["source"]["rows"] and fresh["source"]["terms_fitted"] == bundled["source"]["terms_fitted"]


def test_default_profile_and_what_the_bench_shows() -> None:
    ev = CostEvaluator("h100", "qwen3-8b")
    assert ev.engine.name == DEFAULT_PROFILE == "vllm-2024"
    # the example: Mistral-7B on H100, 1024/1024, batch 1: measured TP4 speed-up 1.32x
    rows, _ = read_measurements(BUNDLED_DIR.parent / "measured" / "engine" / "llm_inference_bench.csv", only_engine="vLLM",
                                skip_unknown=True)
    pick = {r.tp: r for r in rows if r.gpu == "h100" and r.model_name == "mistralai/Mistral-7B-v0.1"
            and r.batch == 1 and r.input_len == 1024}
    speed = {}
    for eng in ("constants", "vllm-2024"):
        e = CostEvaluator("h100", pick[1].model, engine=eng)
        speed[eng] = F.predict_row(e, pick[1]) / F.predict_row(e, pick[4])
    measured = pick[1].value / pick[4].value
    assert abs(speed["vllm-2024"] / measured - 1) < abs(speed["constants"] / measured - 1)
    assert speed["constants"] > 1.8 and speed["vllm-2024"] < 1.7


def test_profile_file_round_trip_and_errors(tmp_path: Path) -> None:
    p = KNOWN.with_terms(source={"x": 1}).save(tmp_path / "k.json")
    back = get_profile(p)
    assert back == KNOWN.with_terms(source={"x": 1})
    assert CostEvaluator("a100", "qwen3-8b", engine=str(p)).engine.per_worker_s == KNOWN.per_worker_s
    obj = json.loads(p.read_text())
    for mutate, msg in ((lambda o: o.update(version=9), "version"), (lambda o: o["terms"].update(step_s=-1), "step_s"),
                        (lambda o: o["terms"].update(bogus=1), "unknown term"), (lambda o: o.update(format="x"), "not a")):
        o = json.loads(json.dumps(obj))
        mutate(o)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(o))
        with pytest.raises(CostModelError, match=msg) as err:
            get_profile(bad)
        assert "bad.json" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CostModelError, match="valid: constants, trtllm-2024, vllm-2024"):
        get_profile("vllm-2031")


def test_old_calibration_engine_entry_is_a_two_term_profile(tmp_path: Path) -> None:
    src = Calibration.load(Path(__file__).resolve().parents[1] / "cost_models" / "data" / "operators_a100.json")
    src.engine = EngineOverhead(2.5e-3, 4.0e-5, {"model": "tiny"})
    path = src.save(tmp_path / "c.json")
    ev = CostEvaluator("a100", "qwen3-8b", calibration=path)
    assert (ev.engine.step_s, ev.engine.per_seq_s, ev.engine.kernel_scale) == (2.5e-3, 4.0e-5, 1.0)
    assert ev.engine.per_worker_s == ev.engine.per_collective_s == ev.engine.per_layer_s == 0.0
    consts = CostEvaluator("a100", "qwen3-8b", calibration=path, engine="constants")
    for tp in (1, 2, 4, 8):  # the same overhead at every TP, as before profiles
        assert ev.decode_s(tp, 4, 1000) - consts.decode_s(tp, 4, 1000) == pytest.approx(1.5e-3 + 4 * 3.5e-5, rel=1e-9)
    # an explicit engine wins over the entry
    assert CostEvaluator("a100", "qwen3-8b", calibration=path, engine="trtllm-2024").engine.name == "trtllm-2024"


# ---- measurements and the CLI ---------------------------------------------------------------
def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "m.csv"
    p.write_text(text)
    return p


def test_measurement_columns_and_conversions(tmp_path: Path) -> None:
    p = _csv(tmp_path, "model,gpu,tp,batch,input_len,output_len,request_latency_s,tpot_ms,output_tok_s_total\n"
                       "meta-llama/Meta-Llama-3-8B,Nvidia H100 GPU,2,4,128,64,2.5,,\n"
                       "qwen3-8b,h100,1,8,256,100,,12.5,\n"
                       "qwen3-8b,,1,8,256,100,,,400\n")
    rows, skipped = read_measurements(p, gpu="a100")
    assert not skipped and [r.gpu for r in rows] == ["h100", "h100", "a100"]
    assert rows[0].model.n_kv_heads == 8 and rows[0].model.vocab == 128256 and rows[0].kind == "latency"
    assert rows[1].kind == "tpot" and rows[1].value == pytest.approx(0.0125)
    assert rows[2].kind == "latency" and rows[2].value == pytest.approx(8 * 100 / 400)


@pytest.mark.parametrize("body, msg", [
    ("model,tp,batch,input_len,output_len\nqwen3-8b,1,1,1,2\n", "line 1: no measurement column"),
    ("model,tp,batch,input_len\n", "line 1: missing column 'output_len'"),
    ("model,tp,batch,input_len,output_len,request_latency_s\nqwen3-8b,two,1,8,8,1.0\n", "line 2: field 'tp': must be a positive integer"),
    ("model,tp,batch,input_len,output_len,request_latency_s\nqwen3-8b,1,1,8,8,-3\n", "line 2: field 'request_latency_s': must be a positive"),
    ("model,tp,batch,input_len,output_len,request_latency_s\nnot-a-model,1,1,8,8,1\n", "line 2: field 'model': unknown model"),
    ("model,gpu,tp,batch,input_len,output_len,request_latency_s\nqwen3-8b,tpu9,1,1,8,8,1\n", "line 2: field 'gpu'"),
    ("model,tp,batch,input_len,output_len,tpot_ms\nqwen3-8b,1,1,8,1,5\n", "line 2: field 'output_len': tpot_ms needs"),
    ("model,tp,batch,input_len,output_len,request_latency_s\nqwen3-8b,3,1,8,8,1\n", "line 2: field 'tp': tp=3 does not divide"),
])
def test_fit_engine_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, msg: str) -> None:
    p = _csv(tmp_path, body)
    rc = calibrate(["fit-engine", str(p), "--gpu", "h100", "-o", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err
    assert msg in err and (str(p) in err or "line 2" in err)


def test_fit_engine_cli_writes_a_usable_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _synthetic_rows(KNOWN)
    lines = ["model,gpu,tp,batch,input_len,output_len,request_latency_s"]
    lines += [f"{r.model_name},{r.gpu},{r.tp},{r.batch},{r.input_len},{r.output_len},{r.value!r}" for r in rows]
    p = _csv(tmp_path, "\n".join(lines) + "\n")
    out = tmp_path / "mine.json"
    assert calibrate(["fit-engine", str(p), "-o", str(out), "--terms", "step_s,per_seq_s,per_worker_s,per_collective_s",
                      "--kernel-scale", "fit"]) == 0
    assert "leave-one-model-out" in capsys.readouterr().out
    prof = get_profile(out)
    assert prof.name == "mine" and prof.per_collective_s == pytest.approx(KNOWN.per_collective_s, rel=1e-6)
    assert prof.source["sha256"] and prof.source["rows"] == len(rows)
    assert calibrate(["predict", "decode", "--gpu", "h100", "--model", "qwen3-8b", "--tp", "2", "--batch", "4",
                      "--context", "100", "--engine", str(out), "--json"]) == 0
    ms = json.loads(capsys.readouterr().out)["ms"]
    assert ms == pytest.approx(CostEvaluator("h100", "qwen3-8b", engine=KNOWN).decode_s(2, 4, 400) * 1e3, rel=1e-6)


def test_predict_and_report_engine_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate(["predict", "decode", "--gpu", "h100", "--model", "qwen3-8b", "--tp", "1", "--batch", "1",
                      "--context", "10", "--engine", "nope"]) == 2
    assert "valid: constants, trtllm-2024, vllm-2024" in capsys.readouterr().err
    assert calibrate(["report", "--engine"]) == 0
    text = capsys.readouterr().out
    assert "vllm-2024" in text and "| h100 | 4 |" in text and "| all | all |" in text


# ---- --engine reaches the evaluator ---------------------------------------------------------
def test_cluster_engine_reaches_planner_and_sim_costs() -> None:
    assert make_evaluator(ClusterSpec(8, "h100", "qwen3-8b")).engine.name == DEFAULT_PROFILE  # type: ignore[attr-defined]
    assert make_evaluator(ClusterSpec(8, "h100", "qwen3-8b", engine="constants")).engine.name == "constants"  # type: ignore[attr-defined]
    assert load_costs("h100", "qwen3-8b", 8, engine="trtllm-2024").ev.engine.name == "trtllm-2024"
    with pytest.raises(UserError, match="--engine: unknown engine profile"):
        load_costs("h100", "qwen3-8b", 8, engine="nope")


def test_plan_cli_engine_changes_the_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    docs = {}
    for eng in ("constants", "vllm-2024"):
        assert sim_main(["plan", "--gpus", "16", "--gpu", "h100", "--model", "qwen3-8b", "--prompts", "64", "--engine", eng,
                         "--json"]) == 0
        docs[eng] = json.loads(capsys.readouterr().out)
    assert docs["vllm-2024"]["cluster"]["engine"] == "vllm-2024"
    assert docs["vllm-2024"]["predicted"]["rollout_s"] > docs["constants"]["predicted"]["rollout_s"]
    assert sim_main(["plan", "--gpus", "16", "--engine", "nope"]) == 2
    assert "unknown engine profile 'nope'" in capsys.readouterr().err


def test_replay_cli_passes_engine_to_costs_and_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.costs

    seen: dict[str, object] = {}
    real = sim.costs.load_costs

    def spy(*a: object, **kw: object) -> object:
        seen["engine"] = kw.get("engine")
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sim.costs, "load_costs", spy)
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=8, model="Qwen3-8B")
    out = tmp_path / "r.json"
    rc = sim_main(["replay", str(tr), "--gpus", "8", "--gpu", "h100", "--policy", "verl-static-uniform", "--split", "4:4",
                   "--noise", "0", "--engine", "trtllm-2024", "--json", str(out)])
    assert rc == 0 and seen["engine"] == "trtllm-2024"
    assert "verl-static-uniform" in json.loads(out.read_text())["policies"]


def test_libra_run_engine_profile_key_reaches_the_fidelity_replay(tmp_path: Path) -> None:
    """``engine_profile`` is a libra-run key, and the run's record-then-replay comparison passes it
    to ``libra-sim replay --engine`` (a subprocess), so the replay times rollouts the same way."""
    from libra.runtime.config import KEYS, load_config
    from libra.runtime.recording import replay_fidelity

    assert "engine_profile" in KEYS and load_config(None, {"engine_profile": "trtllm-2024"}).engine_profile == "trtllm-2024"
    tiny = str(Path(__file__).resolve().parents[1] / "libra" / "runtime" / "assets" / "tiny-policy" / "config.json")
    tr = _trace(tmp_path / "t.jsonl", steps=1, n=8)
    rows = [{"step": 0, "rollout_s": 1.0, "train_s": 0.5, "sync_s": 0.1}]
    sims = {}
    for eng in ("constants", "vllm-2024"):
        out = tmp_path / eng
        out.mkdir()
        fid = replay_fidelity(str(out), str(tr), rows, 4, 4, "cpu", tiny, "verl-static-uniform", engine_profile=eng)
        sims[eng] = fid[0]["sim_rollout_s"]
    assert sims["vllm-2024"] > sims["constants"]
