"""The GPU catalog: the datasheet constants every timing and memory model starts from.

Why a catalog and not free-form numbers: the planner, the simulator and the calibration files all
key on the same GPU names, so one table keeps them consistent. Values are vendor datasheet
figures (dense bf16, no sparsity); see docs/cost-model.md for sources and assumptions.

Link assumptions (documented in docs/cost-model.md):
- ``intra_node_bw`` is NVLink bandwidth per GPU per direction = datasheet total / 2
  (A100 600 GB/s -> 300; A800 400 -> 200; H100/H200 900 -> 450).
- ``inter_node_bw`` assumes one InfiniBand NIC per GPU (the DGX/HGX "rail" layout): 200 Gb/s
  HDR (25 GB/s) for A100/A800 and 400 Gb/s NDR (50 GB/s) for H100/H200.
- ``pcie_bw`` is achieved host<->GPU copy bandwidth from pinned memory: ~25 GB/s on PCIe
  Gen4 x16 (A100/A800, 32 GB/s theoretical), ~50 GB/s on Gen5 x16 (H100/H200, 64 theoretical).
- ``nvlink_domain`` is how many GPUs one NVLink fabric joins (TP and EP groups, intra- vs
  inter-node collectives, same-node transfers); ``gpus_per_node`` stays the host: processes,
  host memory, the offload link. They are equal on HGX/DGX boards (8); a GB200 NVL72 rack has
  4 GPUs per compute tray (its "node") and 72 on one NVLink switch fabric, so a TP-8 group
  spans two trays at NVLink speed. ``inter_node_bw`` is then the network *between* domains.
- B200 / GB200 (aiconfigurator ``b200_sxm`` / ``gb200`` system.yaml and NVIDIA's Blackwell
  datasheet): NVLink 5, 1.8 TB/s total -> 900 GB/s per direction. Network: one 400 Gb/s NDR
  ConnectX-7 NIC per GPU (50 GB/s), what DGX B200 and the first GB200 NVL72 trays ship with;
  aiconfigurator's system.yaml assumes 800 Gb/s ConnectX-8 (100 GB/s, the B300/GB300
  generation), which halves every inter-domain bandwidth term if your cluster has it (build a
  ``GPUSpec`` with ``inter_node_bw=100e9``). Host link: B200 is PCIe Gen5 x16 like H100 (~50
  GB/s achieved; the system.yaml's 128 GB/s is PCIe 6). GB200 talks to its Grace CPU over
  NVLink-C2C (900 GB/s total, 450 per direction), but two GPUs share one Grace whose LPDDR5X
  streams ~512 GB/s, so an offload of both GPUs at once (every role change moves all GPUs of a
  tray) gets ~256 GB/s each: that, not C2C, is the offload bandwidth used.
- ``cpu`` stands for this machine, used by the small CPU engine and tests. Its memory is read
  from the OS; its compute and bandwidth are conservative defaults (documented below) that
  ``libra-calibrate profile``/``fit`` replace with measured operator timings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from cost_models.errors import CostModelError

GB = 1e9  # datasheets count memory and bandwidth in decimal gigabytes


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator kind. Bytes, bytes/s and FLOP/s (SI units, no GiB)."""

    name: str
    memory_bytes: int  # HBM capacity
    hbm_bw: float  # HBM bandwidth, B/s
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s
    intra_node_bw: float  # NVLink, B/s per GPU per direction
    inter_node_bw: float  # network, B/s per GPU (one NIC per GPU)
    gpus_per_node: int = 8  # GPUs per host (processes, host memory, the offload link)
    pcie_bw: float = 25e9  # host <-> GPU, B/s achieved (offload/reload of weights and optimizer state)
    nvlink_domain: int = 0  # GPUs per NVLink domain; 0 = gpus_per_node (one board per node)

    def __post_init__(self) -> None:
        # A domain is whole nodes: a node never straddles two NVLink fabrics.
        if self.nvlink_domain == 0:
            object.__setattr__(self, "nvlink_domain", self.gpus_per_node)
        if self.gpus_per_node < 1 or self.nvlink_domain < self.gpus_per_node or self.nvlink_domain % self.gpus_per_node:
            raise CostModelError(
                f"GPU {self.name!r}: nvlink_domain={self.nvlink_domain} must be a multiple of gpus_per_node={self.gpus_per_node}"
            )

    def with_gpus_per_node(self, gpus_per_node: int) -> GPUSpec:
        """This GPU on hosts of ``gpus_per_node``: an NVLink domain that was the node follows the
        node (an HGX board of another size); a larger fabric (NVL72) is kept, so a node size that
        does not divide it is refused."""
        if gpus_per_node < 1:
            raise CostModelError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
        domain = gpus_per_node if self.nvlink_domain == self.gpus_per_node else self.nvlink_domain
        return replace(self, gpus_per_node=int(gpus_per_node), nvlink_domain=int(domain))


# Defaults for the ``cpu`` entry: a few-core server running fp32 torch matmuls reaches roughly
# 50-200 GFLOP/s and streams ~10-20 GB/s; we take the low end so untuned predictions are
# pessimistic rather than flattering. ``libra-calibrate profile --device cpu`` + ``fit`` replace
# these with this machine's measured operator timings.
CPU_DEFAULT_FLOPS = 1.0e11
CPU_DEFAULT_MEM_BW = 1.0e10
CPU_DEFAULT_INTRA_BW = 5.0e9  # shared-memory copies between processes on one host
CPU_DEFAULT_INTER_BW = 1.25e9  # 10 GbE between hosts


def _host_memory_bytes() -> int:
    """Physical memory of this machine (falls back to 8 GB where sysconf is unavailable)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return int(8 * GB)


def _cpu_spec() -> GPUSpec:
    return GPUSpec(
        name="cpu",
        memory_bytes=_host_memory_bytes(),
        hbm_bw=CPU_DEFAULT_MEM_BW,
        bf16_flops=CPU_DEFAULT_FLOPS,
        intra_node_bw=CPU_DEFAULT_INTRA_BW,
        inter_node_bw=CPU_DEFAULT_INTER_BW,
        gpus_per_node=1,
        pcie_bw=CPU_DEFAULT_MEM_BW,  # "host transfers" on a CPU device are memory copies
    )


GPUS: dict[str, GPUSpec] = {
    "a100": GPUSpec("a100", int(80 * GB), 2.039e12, 312e12, 300 * GB, 25 * GB, 8),
    "a800": GPUSpec("a800", int(80 * GB), 2.039e12, 312e12, 200 * GB, 25 * GB, 8),
    "h100": GPUSpec("h100", int(80 * GB), 3.35e12, 989e12, 450 * GB, 50 * GB, 8, 50 * GB),
    "h200": GPUSpec("h200", int(141 * GB), 4.8e12, 989e12, 450 * GB, 50 * GB, 8, 50 * GB),
    # B200 SXM: 180 GB HBM3e, 7.7 TB/s, 2,250 TFLOP/s dense bf16, NVLink 5 (8 per HGX board)
    "b200": GPUSpec("b200", int(180 * GB), 7.7e12, 2250e12, 900 * GB, 50 * GB, 8, 50 * GB),
    # GB200 NVL72: 186 GB HBM3e, 8.0 TB/s, 2,500 TFLOP/s; 4 GPUs per tray, 72 per NVLink domain
    "gb200": GPUSpec("gb200", int(186 * GB), 8.0e12, 2500e12, 900 * GB, 50 * GB, 4, 256 * GB, nvlink_domain=72),
    "cpu": _cpu_spec(),
}


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """The catalog entry for ``name`` (case-insensitive); a ``GPUSpec`` is returned unchanged.

    Unknown names raise ``CostModelError`` listing the valid ones, so a typo on the command line
    says what would work.
    """
    if isinstance(name, GPUSpec):
        return name
    key = str(name).strip().lower()
    # tolerate the aiconfigurator folder spelling ("h100_sxm") and vendor suffixes ("a100-80g")
    for suffix in ("_sxm", "-sxm", "-80g", "_80g", "-80gb", "-nvl72", "_nvl72"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    try:
        return GPUS[key]
    except KeyError:
        raise CostModelError(f"unknown GPU {name!r}; valid: {', '.join(sorted(GPUS))}") from None
