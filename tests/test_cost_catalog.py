"""GPU and model catalogs: datasheet values, parameter counts against the published sizes, and
Hugging Face config.json loading (dense, Qwen3-MoE, Mixtral) with errors naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import GPUS, MODELS, CostModelError, get_gpu, get_model
from cost_models.models import ModelSpec, model_from_hf_config


def test_gpu_catalog_values() -> None:
    a100, a800, h100, h200 = (get_gpu(n) for n in ("a100", "a800", "h100", "h200"))
    assert a100.memory_bytes == 80e9 and h200.memory_bytes == 141e9
    assert a100.hbm_bw == 2.039e12 and h200.hbm_bw == 4.8e12
    assert a100.bf16_flops == 312e12 and h100.bf16_flops == 989e12
    # NVLink per direction = half the datasheet's both-direction figure
    assert a100.intra_node_bw == 300e9 and a800.intra_node_bw == 200e9 and h100.intra_node_bw == 450e9
    assert a100.inter_node_bw == 25e9 and h100.inter_node_bw == 50e9
    assert all(g.gpus_per_node == 8 for n, g in GPUS.items() if n not in ("cpu", "gb200"))
    # one NVLink domain per node, except GB200 NVL72: 4-GPU trays on one 72-GPU NVLink fabric
    assert all(g.nvlink_domain == g.gpus_per_node for n, g in GPUS.items() if n != "gb200")
    assert (GPUS["gb200"].gpus_per_node, GPUS["gb200"].nvlink_domain) == (4, 72)
    assert GPUS["cpu"].memory_bytes > 0


def test_gpu_names_case_insensitive_and_errors() -> None:
    assert get_gpu("H100") is GPUS["h100"]
    assert get_gpu("h100_sxm") is GPUS["h100"]
    with pytest.raises(CostModelError, match="valid: a100, a800, b200, cpu, gb200, h100, h200"):
        get_gpu("v100")


@pytest.mark.parametrize(
    "name,total_b,tol",
    [
        ("qwen3-8b", 8.2, 0.05),
        ("qwen3-14b", 14.8, 0.05),
        ("qwen3-32b", 32.8, 0.05),
        ("qwen3-30b-a3b", 30.5, 0.05),
        ("llama-3.1-8b", 8.03, 0.02),
        ("llama-3.1-70b", 70.6, 0.05),
        ("llama-2-70b", 69.0, 0.05),
    ],
)
def test_params_match_published_sizes(name: str, total_b: float, tol: float) -> None:
    m = get_model(name)
    assert abs(m.params_total / 1e9 - total_b) < tol, m.params_total


def test_exact_counts_qwen3_14b_and_30b_a3b() -> None:
    # hand-computed from the config shapes (see docs/cost-model.md)
    q14 = get_model("qwen3-14b")
    layer = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 2 * 128 + 3 * 5120 * 17408 + 2 * 5120
    assert q14.params_total == 40 * layer + 2 * 151936 * 5120 + 5120 == 14_768_307_200
    assert q14.kv_bytes_per_token() == 2 * 40 * 8 * 128 * 2 == 163_840
    moe = get_model("qwen3-30b-a3b")
    experts = 128 * 3 * 2048 * 768
    layer = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 2 * 2048 + experts + 2048 * 128
    assert moe.params_total == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624
    assert moe.params_active == moe.params_total - 48 * 120 * 3 * 2048 * 768
    assert 3.2e9 < moe.params_active < 3.5e9  # "A3B" (3.3B active)
    assert moe.kv_bytes_per_token() == 2 * 48 * 4 * 128 * 2


def test_model_name_forms_and_errors() -> None:
    assert get_model("Qwen/Qwen3-8B") is MODELS["qwen3-8b"]
    assert get_model("meta-llama/Llama-3.1-8B") is MODELS["llama-3.1-8b"]
    with pytest.raises(CostModelError, match="valid: .*qwen3-14b.*config.json"):
        get_model("gpt-5")


QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
    "attention_bias": False,
}
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "num_experts": 128, "num_experts_per_tok": 8, "tie_word_embeddings": False,
}
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}


def _write(tmp: Path, name: str, cfg: dict) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _shape(m: ModelSpec) -> tuple:
    return (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab, m.n_experts,
            m.experts_per_token, m.moe_intermediate, m.tie_embeddings, m.qk_norm, m.params_total)


def test_hf_config_dense_and_moe_match_catalog(tmp_path: Path) -> None:
    dense = get_model(_write(tmp_path, "q8", QWEN3_8B))  # a folder holding config.json
    assert _shape(dense) == _shape(MODELS["qwen3-8b"])
    moe = get_model(str(_write(tmp_path, "moe", QWEN3_MOE) / "config.json"))
    assert _shape(moe) == _shape(MODELS["qwen3-30b-a3b"])
    assert moe.params_active == MODELS["qwen3-30b-a3b"].params_active


def test_hf_config_mixtral(tmp_path: Path) -> None:
    m = model_from_hf_config(_write(tmp_path, "mixtral", MIXTRAL))
    assert m.n_experts == 8 and m.moe_intermediate == 14336 and m.head_dim == 128
    assert abs(m.params_total / 1e9 - 46.7) < 0.1  # Mixtral 8x7B: 46.7B total
    assert abs(m.params_active / 1e9 - 12.9) < 0.1  # 12.9B active


def test_hf_config_errors_name_file_and_key(tmp_path: Path) -> None:
    bad = dict(QWEN3_8B)
    del bad["hidden_size"]
    d = _write(tmp_path, "bad", bad)
    with pytest.raises(CostModelError, match=r"config.json: missing key 'hidden_size'"):
        get_model(d)
    moe = dict(QWEN3_MOE)
    del moe["num_experts_per_tok"]
    with pytest.raises(CostModelError, match="num_experts_per_tok"):
        get_model(_write(tmp_path, "badmoe", moe))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(CostModelError, match="junk.json: not a readable JSON"):
        get_model(tmp_path / "junk.json")
    with pytest.raises(CostModelError, match="no such config.json"):
        get_model(tmp_path / "missing.json")
