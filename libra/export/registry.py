"""The frameworks ``libra-sim plan --emit`` writes for, by name: one module each, with
``NAME``, ``CAPABILITIES`` (``target.Capabilities``), ``trainers(TrainConfig) -> (trainer,
TrainConfig)`` and ``emit(ExportPlan) -> Emitted``. Modules are imported on use."""

from __future__ import annotations

import importlib
from types import ModuleType

from libra.errors import UserError

#: name -> module; the order ``--help`` lists them in
EMITTERS: dict[str, str] = {
    "verl": "libra.export.verl",
    "areal": "libra.export.areal",
    "slime": "libra.export.slime",
    "nemo-rl": "libra.export.nemo_rl",
}


def get(name: str) -> ModuleType:
    """The emitter module of ``name`` (a ``UserError`` naming the valid ones otherwise)."""
    if name not in EMITTERS:
        raise UserError(f"--emit {name!r}: unknown framework; valid: {', '.join(EMITTERS)}")
    return importlib.import_module(EMITTERS[name])
