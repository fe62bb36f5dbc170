"""The facade: calibration files and custom GPUs plug in, node size overrides reach the
compositions, and the package stays light to import."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from cost_models import CostEvaluator, CostModelError, GPUSpec, TrainStrategy
from cost_models.operators import RooflineOperators


def test_explicit_calibration_file_matches_bundled_default() -> None:
    path = Path(str(resources.files("cost_models") / "data" / "operators_h100.json"))
    if not path.is_file():
        pytest.skip("no bundled h100 calibration in this build")
    a = CostEvaluator("h100", "qwen3-14b")
    b = CostEvaluator("h100", "qwen3-14b", calibration=path)
    assert a.decode_s(2, 32, 1e5) == b.decode_s(2, 32, 1e5)
    assert a.train_iter_s(TrainStrategy(2, 1, 4), 1 << 18, 4096) == b.train_iter_s(TrainStrategy(2, 1, 4), 1 << 18, 4096)


def test_custom_gpu_spec_works_like_a_name() -> None:
    l40 = GPUSpec("l40s", int(48e9), 0.864e12, 362e12, 32e9, 25e9, 8)
    ev = CostEvaluator(l40, "qwen3-8b")
    assert isinstance(ev.ops, RooflineOperators)
    assert ev.kv_capacity_tokens(1) > 0
    assert ev.decode_s(1, 1, 100) > CostEvaluator("h100", "qwen3-8b").decode_s(1, 1, 100)


def test_gpus_per_node_override() -> None:
    ev = CostEvaluator("h100", "qwen3-14b", gpus_per_node=4)
    assert ev.gpu.gpus_per_node == 4
    with pytest.raises(CostModelError, match="valid tp: 1, 2, 4$"):
        ev.validate(TrainStrategy(8, 1, 1))
    assert ev.valid_rollout_tps() == [1, 2, 4]
    with pytest.raises(CostModelError, match="gpus_per_node must be >= 1"):
        CostEvaluator("h100", "qwen3-14b", gpus_per_node=0)


def test_model_from_config_path(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,'
        ' "num_hidden_layers": 16, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": true}'
    )
    ev = CostEvaluator("a100", cfg)  # a Llama-3.2-1B-like shape, head_dim 64
    assert ev.model.head_dim == 64 and ev.model.tie_embeddings
    assert 1.2e9 < ev.model.params_total < 1.3e9
    assert ev.decode_s(1, 8, 8000) > ev.decode_s(1, 8, 800) > 0


def test_import_is_light() -> None:
    code = (
        "import sys, cost_models; from cost_models import CostEvaluator; CostEvaluator('h100', 'qwen3-8b').decode_s(1, 1, 1);"
        "bad=[m for m in ('torch','ray','vllm','deepspeed','libra','sim','pandas','simpy') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
