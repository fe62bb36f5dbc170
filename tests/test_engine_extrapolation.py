"""Where a prediction rests on an engine profile outside what it was fitted on: the measured
TP/batch range every fitted profile records, ``EngineProfile.extrapolation``,
``CostEvaluator.engine_extrapolation``, and the line ``libra-sim plan`` prints (and its JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import CostEvaluator
from cost_models.engines import EngineProfile, get_profile
from cost_models.engines import fit as F
from cost_models.engines.measurements import Measurement
from cost_models.models import get_model
from sim.cli import main as sim_main

KNOWN = EngineProfile(name="known", step_s=1.2e-3, per_seq_s=6.0e-5, per_worker_s=2.0e-4, per_collective_s=1.2e-5)


def test_bundled_profiles_record_their_measured_range_and_say_what_is_outside() -> None:
    for name in ("vllm-2024", "trtllm-2024"):
        p = get_profile(name)
        assert p.measured_tps == (1, 2, 4) and p.measured_batches == (1, 64)
        assert p.extrapolation([1, 2, 4], 64) == []
        (line,) = p.extrapolation([2, 8], 16)
        assert line.startswith(f"rollout TP 8 is outside the engine profile {name}'s measured TP 1-4")
        (line,) = p.extrapolation([4], 256)
        assert "256 running sequences" in line and "largest measured batch 64" in line
    # not fitted on runs: nothing is measured, and it says so
    (line,) = get_profile("constants").extrapolation([1])
    assert "not fitted on TP-scaling runs: its TP speed-ups are assumptions" in line
    # fitted before profiles recorded their range
    old = get_profile("vllm-2024").with_terms(source={"rows": 453})
    (line,) = old.extrapolation([1])
    assert "records no measured TP range (refit it" in line


def test_a_profile_fitted_up_to_tp8_does_not_flag_tp8() -> None:
    ev = CostEvaluator("h100", "qwen3-8b", engine=KNOWN)
    rows = []
    for tp in (1, 2, 8):
        for b in (1, 32, 256):
            r = Measurement(get_model("qwen3-8b"), "h100", tp, b, 256, 256, "latency", 1.0, line=len(rows) + 2)
            rows.append(Measurement(r.model, "h100", tp, b, 256, 256, "latency", F.predict_row(ev, r), line=r.line))
    p = F.fit_profile(rows, "to-tp8").profile
    assert p.measured_tps == (1, 2, 8) and p.measured_batches == (1, 256)
    assert p.extrapolation([8], 256) == []
    assert p.extrapolation([16]) and "measured TP 1-8" in p.extrapolation([16])[0]  # a range, not the list


def test_evaluator_caps_the_batch_at_what_an_instance_runs() -> None:
    ev = CostEvaluator("h100", "qwen3-8b")
    assert ev.engine_extrapolation([1, 2], 10_000) == [
        f"about {ev.max_running_seqs(2)} running sequences per instance is above the engine profile vllm-2024's largest "
        "measured batch 64: its per-sequence cost is extrapolated"]
    assert ev.engine_extrapolation([4], 64) == []


def test_plan_says_where_its_prediction_is_extrapolated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--gpus", "16", "--gpu", "h100", "--model", "qwen3-8b", "--prompts", "64"]
    assert sim_main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tps = sorted({i["tp"] for i in doc["instances"]})
    outside = [t for t in tps if t > 4]
    assert outside, "this cluster's plan uses TP 8 instances (the case the check exists for)"
    assert [x for x in doc["extrapolation"] if x.startswith("rollout TP")] == [
        f"rollout TP {t} is outside the engine profile vllm-2024's measured TP 1-4: its TP speed-up is extrapolated" for t in outside]
    assert sim_main(args) == 0
    text = capsys.readouterr().out
    assert "extrapolation: rollout TP 8 is outside the engine profile vllm-2024's measured TP 1-4" in text
    # a profile whose measured range covers the plan: no TP line
    wide = get_profile("vllm-2024").with_terms(name="wide", source={"measured": {"tp": [1, 2, 4, 8], "batch": [1, 256]}})
    path = wide.save(tmp_path / "wide.json")
    assert sim_main([*args, "--engine", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["extrapolation"] == []


# ---- the diagnostics behind docs/cost-model.md ("One model at several TP degrees", "TP-scaling structure")
def _experiment(name: str):  # type: ignore[no-untyped-def]
    import importlib
    import sys

    exp = str(Path(__file__).resolve().parents[1] / "experiments")
    if exp not in sys.path:
        sys.path.insert(0, exp)
    return importlib.import_module(name)


def test_tp_structure_check_backs_the_documented_decision() -> None:
    """Leave-one-family-out: the shipping term choice never takes a TP-growing all-reduce latency
    for vLLM (held-out error unchanged), forced in it moves the error by under a point, and no
    structure fitted on TP 1-4 comes near the issue's measured 1.22x TP2->TP8 (why the plan flags TP 8)."""
    mod = _experiment("engine_tp_structure")
    table, case = mod.evaluate(engines=("vLLM",))  # TensorRT-LLM's rows: the same check, run by the script
    overall = {r["structure"]: r["speedup_err_pct"] for r in table if r["family"] == "all (held out)"}
    assert overall["profile"] == pytest.approx(5.4, abs=0.05)
    for s in ("ring", "log"):
        assert overall[s] == pytest.approx(overall["profile"], abs=1e-9)
    for s in mod.STRUCTURES:
        assert abs(overall[s] - overall["profile"]) < 1.0, s
    assert all(c["speedup"] > 2.0 for c in case)
    assert "| vLLM | profile |" in mod.to_markdown(table, case)


def test_one_model_fits_of_the_bench_predict_the_other_models() -> None:
    rs = _experiment("engine_one_model").evaluate(engines=("vLLM",))
    assert len(rs) == 7 and {tuple(r["not_identifiable"]) for r in rs} == {(), ("per_worker_s",), ("per_collective_s",)}
    assert all(r["others_speedup"] < 10.0 for r in rs)
