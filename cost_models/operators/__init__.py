"""Per-GPU operator timings: the ``OperatorSet`` interface, the datasheet roofline, the models
fitted on measured data, and ``load_operators`` which picks the best one for a GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cost_models.operators.base import OperatorSet
from cost_models.operators.loader import load_operators
from cost_models.operators.roofline import RooflineOperators

if TYPE_CHECKING:
    from cost_models.operators.fitted import FittedOperators

__all__ = ["OperatorSet", "RooflineOperators", "FittedOperators", "load_operators"]


def __getattr__(name: str) -> Any:
    if name == "FittedOperators":  # imported lazily: it pulls in the calibration store
        from cost_models.operators.fitted import FittedOperators

        return FittedOperators
    raise AttributeError(name)
