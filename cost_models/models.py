"""The model catalog: transformer shapes every timing and memory model is composed from.

Why shapes and not parameter counts: rollout and training time are sums over per-layer GEMMs,
attention and collectives whose sizes depend on hidden size, head counts and (for MoE) expert
shapes; memory depends on how each tensor shards under TP/PP/EP. A ``ModelSpec`` carries exactly
those shapes; ``params_total``/``params_active``/``kv_bytes_per_token`` are derived from them.

Catalog values are copied from the models' Hugging Face ``config.json`` files. Any such file
(dense Llama/Qwen2/Qwen3 or MoE Qwen2-MoE/Qwen3-MoE/Mixtral keys) loads with ``get_model(path)``.
Assumption: every layer of a MoE model is a MoE layer (true for the catalog; ``mlp_only_layers``
and ``decoder_sparse_step`` are not modelled).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost_models.errors import CostModelError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shapes (SwiGLU MLP, RMSNorm, GQA, optional MoE)."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (unused by MoE layers)
    vocab: int
    tie_embeddings: bool = False
    n_experts: int = 0  # 0 = dense
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0  # Qwen2-MoE style always-on expert; 0 = none
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head (head_dim weights each)
    attn_bias: bool = False  # Qwen2: bias on q, k, v projections

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (n_heads * head_dim; may differ from hidden)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection output."""
        return self.n_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v, o projections (+ qkv bias, q/k norms), i.e. what TP shards in attention."""
        p = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        if self.attn_bias:
            p += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            p += 2 * self.head_dim
        return p

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def mlp_params_per_layer(self) -> int:
        """Dense MLP, or all experts + router + shared expert of a MoE layer."""
        if not self.is_moe:
            return 3 * self.hidden * self.intermediate
        p = self.n_experts * self.expert_params + self.hidden * self.n_experts  # + router
        if self.shared_expert_intermediate:
            p += 3 * self.hidden * self.shared_expert_intermediate + self.hidden  # + its gate
        return p

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP parameters one token touches (top-k experts, router, shared expert)."""
        if not self.is_moe:
            return self.mlp_params_per_layer
        return self.mlp_params_per_layer - (self.n_experts - self.experts_per_token) * self.expert_params

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden

    @property
    def layer_params(self) -> int:
        """All parameters of one transformer block."""
        return self.attn_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """0 when tied to the embedding (the shared matrix is counted once, in the embedding)."""
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def params_total(self) -> int:
        """Every parameter, counted once (embedding, blocks, final norm, untied LM head)."""
        return self.embedding_params + self.n_layers * self.layer_params + self.hidden + self.lm_head_params

    @property
    def params_active(self) -> int:
        """Parameters one token uses (embeddings included, as model cards count "active")."""
        inactive = self.n_layers * (self.mlp_params_per_layer - self.active_mlp_params_per_layer)
        return self.params_total - inactive

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies over all layers (K and V, all KV heads, unsharded)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes


def _dense(name: str, L: int, h: int, nh: int, nkv: int, hd: int, inter: int, vocab: int, **kw: Any) -> ModelSpec:
    return ModelSpec(name, L, h, nh, nkv, hd, inter, vocab, **kw)


MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": _dense("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, qk_norm=True),
    "qwen3-14b": _dense("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, qk_norm=True),
    "qwen3-32b": _dense("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True),
    "qwen3-30b-a3b": _dense(
        "qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936,
        n_experts=128, experts_per_token=8, moe_intermediate=768, qk_norm=True,
    ),
    "llama-3.1-8b": _dense("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3.1-70b": _dense("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    "llama-2-70b": _dense("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
}


def _req(cfg: dict[str, Any], path: Path, *keys: str) -> Any:
    """First present key of ``keys``; a missing one names the file and the key(s)."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise CostModelError(f"{path}: missing key {' or '.join(repr(k) for k in keys)} in config.json")


def _int(cfg: dict[str, Any], path: Path, *keys: str) -> int:
    v = _req(cfg, path, *keys)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CostModelError(f"{path}: key {keys[0]!r} must be a non-negative integer, got {v!r}")
    return v


def model_from_hf_config(path: str | os.PathLike[str]) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (or a folder holding one).

    Reads the Llama/Qwen2/Qwen3 keys (``num_hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads`` (default: attention heads), ``head_dim``
    (default: hidden / heads), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``)
    and, for MoE, ``num_experts``/``num_local_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size`` (Mixtral: ``intermediate_size``), ``shared_expert_intermediate_size``.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise CostModelError(f"{p}: no such config.json") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CostModelError(f"{p}: not a readable JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise CostModelError(f"{p}: config.json must hold a JSON object")
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg

    n_layers = _int(cfg, p, "num_hidden_layers")
    hidden = _int(cfg, p, "hidden_size")
    n_heads = _int(cfg, p, "num_attention_heads")
    n_kv = _int(cfg, p, "num_key_value_heads") if cfg.get("num_key_value_heads") is not None else n_heads
    if n_heads == 0 or hidden == 0 or n_layers == 0:
        raise CostModelError(f"{p}: num_hidden_layers, hidden_size and num_attention_heads must be > 0")
    head_dim = _int(cfg, p, "head_dim") if cfg.get("head_dim") is not None else hidden // n_heads
    vocab = _int(cfg, p, "vocab_size")
    n_experts = 0
    for k in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(k):
            n_experts = _int(cfg, p, k)
            break
    topk = moe_inter = shared = 0
    intermediate = int(cfg.get("intermediate_size") or 0)
    if n_experts:
        topk = _int(cfg, p, "num_experts_per_tok")
        # Mixtral keeps the expert width in intermediate_size
        moe_inter = _int(cfg, p, "moe_intermediate_size", "intermediate_size")
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    else:
        intermediate = _int(cfg, p, "intermediate_size")
    model_type = str(cfg.get("model_type", ""))
    archs = " ".join(cfg.get("architectures") or [])
    qk_norm = model_type.startswith("qwen3") or "Qwen3" in archs
    attn_bias = bool(cfg.get("attention_bias", model_type.startswith("qwen2")))
    name = str(cfg.get("_name_or_path") or p.parent.name or p.stem)
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, intermediate=intermediate, vocab=vocab,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        n_experts=n_experts, experts_per_token=topk, moe_intermediate=moe_inter,
        shared_expert_intermediate=shared, qk_norm=qk_norm, attn_bias=attn_bias,
    )


def get_model(name_or_path: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """A catalog model by name (case-insensitive; ``Qwen/Qwen3-8B`` works too), or a
    ``config.json`` path / a folder holding one. A ``ModelSpec`` is returned unchanged."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    s = os.fspath(name_or_path)
    key = s.strip().lower()
    if key in MODELS:
        return MODELS[key]
    short = key.rsplit("/", 1)[-1].replace("meta-llama-", "llama-")
    if short in MODELS and not os.path.exists(s):
        return MODELS[short]
    if os.path.exists(s) or s.endswith(".json"):
        return model_from_hf_config(s)
    raise CostModelError(
        f"unknown model {s!r}; valid: {', '.join(sorted(MODELS))}, or a Hugging Face config.json path"
    )
