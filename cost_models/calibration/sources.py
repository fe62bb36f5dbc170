"""Where the bundled calibrations come from, and how to find the measured data on disk.

Why one table: ``fit`` (to rebuild the bundled files), ``report`` (to refit on held-out splits)
and the docs must agree on which folder fed which GPU. Paths are relative to the calibration
root (by default the copy of the measured tables bundled in ``cost_models/data/measured``).
"""

from __future__ import annotations

import os
from pathlib import Path

from typing import TYPE_CHECKING

from cost_models.errors import CostModelError

if TYPE_CHECKING:
    from cost_models.calibration.store import Calibration

#: GPU -> folders (relative to the calibration root) its bundled calibration is fitted on.
#: H200 has no Vidur profile: its NVLink generation is the H100's, so the H100 DGX one is used.
#: B200 and GB200 have no Vidur or Echo profile at all. Their send/recv term is the H100 DGX
#: profile with its bandwidth term rescaled to NVLink 5 (``network_gpu``: 450 -> 900 GB/s per
#: direction, the latency kept: it is NCCL's software path, not the link), the same correction
#: a800 gets at load time; their inter-domain all-reduce is the Echo logs rescaled to one
#: 400 Gb/s NIC per GPU, as for H100/H200. Their collectives inside an NVLink domain are
#: aiconfigurator's own nccl/custom all-reduce rows (2-8 GPUs on B200, 2-4 on GB200). GB200's
#: stop at one 4-GPU tray while TP/EP groups span trays (72 GPUs per NVLink domain): its 8-GPU
#: cells are its 4-GPU times grown as B200's measured 4 -> 8 (``comm_extend``; same NVLink 5
#: switch generation, and the two agree within a few percent at 2 and 4 GPUs). Beyond 8 GPUs
#: (training EP/TP groups only) the fitted table continues with the roofline's growth.
#: The multi-node nccl-tests logs were measured on A100 nodes (200 Gb/s IB per GPU); their
#: bandwidth term is rescaled to each GPU's network (``nccl_logs_gpu``).
BUNDLE_SOURCES: dict[str, dict[str, str]] = {
    "a100": {"data": "aiconfigurator/a100_sxm", "network": "vidur/network/a100_dgx", "nccl_logs": "echo"},
    "h100": {"data": "aiconfigurator/h100_sxm", "network": "vidur/network/h100_dgx", "nccl_logs": "echo"},
    "h200": {"data": "aiconfigurator/h200_sxm", "network": "vidur/network/h100_dgx", "nccl_logs": "echo"},
    "b200": {"data": "aiconfigurator/b200_sxm", "network": "vidur/network/h100_dgx", "network_gpu": "h100",
             "nccl_logs": "echo"},
    "gb200": {"data": "aiconfigurator/gb200", "network": "vidur/network/h100_dgx", "network_gpu": "h100",
              "nccl_logs": "echo", "comm_extend": "aiconfigurator/b200_sxm"},
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


def fit_bundle(gpu: str, root: str | os.PathLike[str] | None = None) -> "Calibration":
    """A fresh fit of ``gpu``'s bundled calibration from its ``BUNDLE_SOURCES`` (what
    ``cost_models/data/operators_<gpu>.json`` holds; the reproducibility test compares the two)."""
    from cost_models.calibration.fit import fit_folder

    if gpu not in BUNDLE_SOURCES:
        raise CostModelError(f"no bundled sources for GPU {gpu!r}; bundled: {', '.join(BUNDLE_SOURCES)}")
    base = find_calibration_root(root)
    src = BUNDLE_SOURCES[gpu]
    return fit_folder(
        base / src["data"], gpu,
        network_dir=base / src["network"] if src.get("network") else None,
        nccl_logs=base / src["nccl_logs"] if src.get("nccl_logs") else None,
        nccl_logs_gpu=NCCL_LOGS_GPU,
        network_gpu=src.get("network_gpu"),
        comm_extend_dir=base / src["comm_extend"] if src.get("comm_extend") else None,
    )
