"""Libra's cost evaluator: hardware and model catalogs, operator timings, memory model, and the
rollout / training / transfer compositions behind ``CostEvaluator``.

Imports nothing of the rest of Libra (``libra`` and ``sim`` import this package, never the
reverse) and never torch/ray/vllm. Heavy submodules load on first attribute access so that
``import cost_models`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cost_models.errors import CostModelError
from cost_models.hardware import GPUS, GPUSpec, get_gpu
from cost_models.models import MODELS, ModelSpec, get_model

if TYPE_CHECKING:
    from cost_models.evaluator import CostEvaluator
    from cost_models.memory import MemoryReport, fits, kv_capacity_tokens
    from cost_models.operators import OperatorSet, load_operators
    from cost_models.strategy import TrainStrategy
    from cost_models.training import validate_strategy

__all__ = [
    "CostModelError",
    "GPUS",
    "GPUSpec",
    "get_gpu",
    "MODELS",
    "ModelSpec",
    "get_model",
    "CostEvaluator",
    "MemoryReport",
    "fits",
    "kv_capacity_tokens",
    "TrainStrategy",
    "validate_strategy",
    "OperatorSet",
    "load_operators",
]

_LAZY = {
    "CostEvaluator": "cost_models.evaluator",
    "MemoryReport": "cost_models.memory",
    "fits": "cost_models.memory",
    "kv_capacity_tokens": "cost_models.memory",
    "TrainStrategy": "cost_models.strategy",
    "validate_strategy": "cost_models.training",
    "OperatorSet": "cost_models.operators",
    "load_operators": "cost_models.operators",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cost_models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
