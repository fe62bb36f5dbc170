"""scripts/gpu_check.py's CPU dry run: every section runs on tiny Qwen3-shaped models and writes
a row with a measurement and the cost model's prediction for the same shapes (the GPU run uses
the same code with the published Qwen3 shapes; it needs a CUDA device and is not run in CI)."""

from __future__ import annotations

import csv
import importlib.util
import os
import sys

from runtime_markers import needs_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "scripts", "gpu_check.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@needs_torch
def test_dry_run_measures_every_section_against_a_prediction(tmp_path) -> None:
    gc = _load()
    out = str(tmp_path / "gc")
    assert gc.main(["--dry-run", "--out", out]) == 0
    with open(os.path.join(out, "gpu_check.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    sections = {r["section"] for r in rows}
    assert sections == {"gemm", "attn_prefill", "attn_decode", "decode_iter", "train_iter", "copy", "torch_engine"}
    for r in rows:
        assert float(r["measured_s"]) > 0 and float(r["predicted_s"]) > 0, r
        assert abs(float(r["measured_over_predicted"]) - float(r["measured_s"]) / float(r["predicted_s"])) < 1e-9
    assert any("MFU" in r["extra"] for r in rows if r["section"] == "train_iter")
    md = open(os.path.join(out, "gpu_check.md")).read()
    assert md.count("\n| ") == len(rows) + 2  # the header, its rule and one line per row
    # the model configs are Qwen3-shaped and the cost model reads them
    from cost_models.models import get_model

    spec = get_model(os.path.join(out, "configs", "tiny", "config.json"))
    assert spec.qk_norm and spec.n_kv_heads == 2


@needs_torch
def test_budget_spent_skips_cases_with_the_reason(tmp_path) -> None:
    gc = _load()
    out = str(tmp_path / "gc")
    assert gc.main(["--dry-run", "--out", out, "--budget-s", "0", "--sections", "gemm,copies"]) == 0
    with open(os.path.join(out, "gpu_check.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["measured_s"] == "" and "time budget" in r["note"] for r in rows)


def test_real_qwen3_shapes_are_the_published_ones() -> None:
    gc = _load()
    cfg = gc.qwen3_config(*gc.QWEN3["qwen3-8b"])
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"]) == (4096, 36, 32, 8, 12288, 151936)
    from cost_models.models import MODELS

    ref = MODELS["qwen3-8b"]  # the catalog's own Qwen3-8B
    assert (ref.hidden, ref.n_layers, ref.n_heads, ref.n_kv_heads, ref.intermediate) == (4096, 36, 32, 8, 12288)
