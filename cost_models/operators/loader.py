"""``load_operators``: the one call the rest of Libra uses to get per-GPU operator timings.

Why a loader: callers name a GPU and get the best model available for it, without knowing where
calibration files live. Resolution order:

1. an explicit ``calibration`` file (written by ``libra-calibrate fit``) -> ``FittedOperators``;
2. the bundled, versioned calibration in ``cost_models/data/`` for that GPU (a100, h100, h200,
   b200, gb200;
   a800 uses the A100 file, since its compute is the A100's, with intra-node collectives
   rescaled to its 400 GB/s NVLink);
3. otherwise (``cpu`` without a profile, a GPU with no data) -> ``RooflineOperators``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from cost_models.hardware import GPUSpec, get_gpu
from cost_models.operators.base import OperatorSet
from cost_models.operators.roofline import RooflineOperators

#: GPU name -> bundled calibration file whose measurements it uses.
BUNDLED: dict[str, str] = {
    "a100": "operators_a100.json",
    "a800": "operators_a100.json",
    "h100": "operators_h100.json",
    "h200": "operators_h200.json",
    "b200": "operators_b200.json",
    "gb200": "operators_gb200.json",
}

_CACHE: dict[tuple[str, str], OperatorSet] = {}


def bundled_calibration_path(gpu: str) -> Path | None:
    """The bundled calibration file for ``gpu`` if the package ships one."""
    fname = BUNDLED.get(gpu)
    if fname is None:
        return None
    path = Path(str(resources.files("cost_models") / "data" / fname))
    return path if path.is_file() else None


def load_operators(gpu: str | GPUSpec, calibration: str | os.PathLike[str] | None = None) -> OperatorSet:
    """The operator timings for ``gpu``: fitted on ``calibration`` if given, else on the bundled
    data for that GPU, else the datasheet roofline. Loaded files are cached per (gpu, path), so
    repeated calls are free."""
    spec = get_gpu(gpu)
    path: Path | None = Path(calibration) if calibration is not None else bundled_calibration_path(spec.name)
    if path is None:
        return RooflineOperators(spec)
    key = (repr(spec), str(path.resolve()) if path.exists() else str(path))
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    from cost_models.calibration.store import Calibration
    from cost_models.operators.fitted import FittedOperators

    ops = FittedOperators.from_calibration(spec, Calibration.load(path))
    _CACHE[key] = ops
    return ops
