"""``libra-calibrate predict``: every catalog model x GPU answers decode/prefill/train/memory, and
bad input exits 2 with one line naming what works."""

from __future__ import annotations

import json

import pytest

from cost_models import GPUS, MODELS, CostEvaluator
from cost_models.memory import valid_tps
from cost_models.predict_cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_model_answers(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    gpn = GPUS[gpu].gpus_per_node
    for model in sorted(MODELS):
        tp = max(valid_tps(MODELS[model], gpn))
        rc, out, _ = _run(capsys, "decode", "--gpu", gpu, "--model", model, "--tp", str(tp),
                          "--batch", "8", "--context", "1024", "--ignore-memory", "--json")
        assert rc == 0 and json.loads(out)["ms"] > 0
        rc, out, _ = _run(capsys, "prefill", "--gpu", gpu, "--model", model, "--tp", str(tp),
                          "--tokens", "512", "--cached", "128", "--json")
        assert rc == 0 and json.loads(out)["ms"] > 0
        rc, out, _ = _run(capsys, "train", "--gpu", gpu, "--model", model, "--gpus", str(2 * tp), "--tp", str(tp),
                          "--pp", "1", "--global-batch-tokens", "65536", "--seq-len", "2048", "--zero", "3",
                          "--recompute", "--ignore-memory", "--json")
        res = json.loads(out)
        assert rc == 0 and res["s"] > 0 and isinstance(res["fits"], bool)
        rc, out, _ = _run(capsys, "memory", "--gpu", gpu, "--model", model, "--tp", str(tp), "--json")
        assert rc == 0 and json.loads(out)["kv_tokens"] >= 0


def test_decode_json_matches_evaluator(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "decode", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "4", "--batch", "64",
                      "--context", "4096", "--json")
    ev = CostEvaluator("h100", "qwen3-32b")
    assert rc == 0 and json.loads(out)["ms"] == pytest.approx(ev.decode_s(4, 64, 64 * 4096) * 1e3)


def test_human_lines(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "decode", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "4", "--batch", "64",
                      "--context", "4096")
    assert rc == 0 and out.startswith("decode qwen3-32b on h100 tp=4 batch=64") and "tokens/s" in out
    rc, out, _ = _run(capsys, "train", "--gpu", "h100", "--model", "qwen3-32b", "--gpus", "16", "--tp", "4",
                      "--pp", "2", "--dp", "2", "--ep", "1", "--global-batch-tokens", "1048576", "--seq-len", "4096")
    assert rc == 0 and out.startswith("train step qwen3-32b on 16 x h100 tp=4 pp=2 dp=2")


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["decode", "--gpu", "v100", "--model", "qwen3-8b", "--tp", "1", "--batch", "1", "--context", "1"],
         "unknown GPU 'v100'; valid: a100, a800, b200, cpu, gb200, h100, h200"),
        (["decode", "--gpu", "h100", "--model", "qwen9", "--tp", "1", "--batch", "1", "--context", "1"],
         "unknown model 'qwen9'; valid:"),
        (["decode", "--gpu", "h100", "--model", "qwen3-14b", "--tp", "3", "--batch", "1", "--context", "1"],
         "valid tp: 1, 2, 4, 8"),
        (["decode", "--gpu", "h100", "--model", "qwen3-14b", "--tp", "1", "--batch", "0", "--context", "1"],
         "--batch must be >= 1"),
        (["train", "--gpu", "h100", "--model", "qwen3-32b", "--gpus", "16", "--tp", "4", "--pp", "3",
          "--global-batch-tokens", "1000", "--seq-len", "100"], "--gpus 16 is not a multiple of tp*pp = 12"),
        (["train", "--gpu", "h100", "--model", "qwen3-32b", "--dp", "1", "--tp", "4", "--pp", "65",
          "--global-batch-tokens", "1000", "--seq-len", "100"], "pp=65 exceeds the 64 layers of qwen3-32b"),
        (["train", "--gpu", "h100", "--model", "qwen3-32b", "--gpus", "4", "--tp", "4",
          "--global-batch-tokens", "1000", "--seq-len", "4096"], "does not fit; would fit: at least 8 GPUs"),
        (["train", "--gpu", "h100", "--model", "qwen3-32b", "--tp", "4",
          "--global-batch-tokens", "1000", "--seq-len", "4096"], "give --dp or --gpus"),
    ],
)
def test_errors_exit_2_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], pattern: str) -> None:
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("libra-calibrate predict: error: ") and err.count("\n") == 1
    assert pattern in err


def test_registered_in_libra_calibrate(capsys: pytest.CaptureFixture[str]) -> None:
    cli = pytest.importorskip("cost_models.cli")
    rc = cli.main(["predict", "decode", "--gpu", "h100", "--model", "qwen3-8b", "--tp", "1", "--batch", "4",
                   "--context", "100", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["ms"] > 0
