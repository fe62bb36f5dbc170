"""Where the bundled calibrations come from, and how to find the measured data on disk.

Why one table: ``fit`` (to rebuild the bundled files), ``report`` (to refit on held-out splits)
and the docs must agree on which folder fed which GPU. Paths are relative to the calibration
root (by default the copy of the measured tables bundled in ``cost_models/data/measured``).
"""

from __future__ import annotations

import os
from pathlib import Path

from cost_models.errors import CostModelError

#: GPU -> folders (relative to the calibration root) its bundled calibration is fitted on.
#: H200 has no Vidur profile: its NVLink generation is the H100's, so the H100 DGX one is used.
#: The multi-node nccl-tests logs were measured on A100 nodes (200 Gb/s IB per GPU); their
#: bandwidth term is rescaled to each GPU's network (``nccl_logs_gpu``).
BUNDLE_SOURCES: dict[str, dict[str, str]] = {
    "a100": {"data": "aiconfigurator/a100_sxm", "network": "vidur/network/a100_dgx", "nccl_logs": "echo"},
    "h100": {"data": "aiconfigurator/h100_sxm", "network": "vidur/network/h100_dgx", "nccl_logs": "echo"},
    "h200": {"data": "aiconfigurator/h200_sxm", "network": "vidur/network/h100_dgx", "nccl_logs": "echo"},
}
NCCL_LOGS_GPU = "a100"
ENV_VAR = "LIBRA_CALIBRATION_DATA"


#: The measured tables this project is fitted on, shipped in the package (a copy of the
#: project's shared/calibration with each source's licence; see data/measured/README.md), so
#: ``fit`` and ``report`` work from a fresh clone with no folder outside the repository.
BUNDLED_DATA = Path(__file__).resolve().parents[1] / "data" / "measured"


def find_calibration_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The measured-data root: ``explicit``, else ``$LIBRA_CALIBRATION_DATA``, else the copy
    bundled in the package (``cost_models/data/measured``)."""
    if explicit is not None:
        root = Path(explicit)
        if not root.is_dir():
            raise CostModelError(f"{root}: calibration data folder not found")
        return root
    env = os.environ.get(ENV_VAR)
    if env:
        root = Path(env)
        if not root.is_dir():
            raise CostModelError(f"${ENV_VAR}={env}: folder not found")
        return root
    if (BUNDLED_DATA / "aiconfigurator").is_dir():
        return BUNDLED_DATA
    raise CostModelError(
        f"measured calibration data not found: the package's {BUNDLED_DATA} is missing (a broken install?); "
        f"pass --data-root DIR or set ${ENV_VAR} (the folder holding aiconfigurator/, vidur/, echo/)"
    )
