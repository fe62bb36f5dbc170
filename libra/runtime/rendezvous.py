"""Where the trainer's process group meets, and which device a training worker drives.

Why: Ray gives each ``TrainWorker`` one GPU and sets ``CUDA_VISIBLE_DEVICES`` to it, so inside
the actor that GPU is ``cuda:0``; DeepSpeed calls ``torch.cuda.set_device(LOCAL_RANK)``, so
``LOCAL_RANK`` must be the GPU's index among the visible devices (0 here), not the DP rank
("invalid device ordinal" on ranks >= 1 otherwise). The rendezvous address is the rank-0
worker's node IP with a port free on that node, found by the rank-0 worker itself, so workers on
other nodes reach it (127.0.0.1 only works on one machine). Pure functions; the worker calls them.
"""

from __future__ import annotations

import socket


def local_rank(gpu_ids: list[int | str], visible: str | None, rank: int) -> int:
    """The device index a worker passes to ``set_device``: the position of its first Ray GPU among
    ``CUDA_VISIBLE_DEVICES`` (``visible``; 0 when Ray shows the actor one GPU), the physical id when
    visibility is not restricted (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``), and on CPU
    workers (no GPU ids) the DP ``rank`` as before (the CPU accelerator binds no device)."""
    if not gpu_ids:
        return rank
    first = str(gpu_ids[0]).strip()
    if not visible:
        return int(first)
    shown = [v.strip() for v in visible.split(",") if v.strip()]
    if first not in shown:
        raise ValueError(f"Ray gave this worker GPU {first} but CUDA_VISIBLE_DEVICES={visible!r} does not show it")
    return shown.index(first)


def free_port(host: str = "") -> int:
    """A TCP port free on this host (bound on all interfaces, so other nodes can connect)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def node_address() -> tuple[str, int]:
    """This node's IP as Ray knows it (reachable from the other nodes) and a port free here:
    the rendezvous of a process group whose rank 0 runs here."""
    import ray

    return ray.util.get_node_ip_address(), free_port()
