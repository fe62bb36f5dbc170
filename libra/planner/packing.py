"""Placing rollout instances (TP groups) in NVLink domains without crossing a domain boundary.

A TP group needs NVLink between all its GPUs, so the bin is the NVLink domain: a node on HGX
boards (8 GPUs), a whole rack on GB200 NVL72 (72 GPUs over 18 trays of 4), where a TP-8
instance spans two trays. The node (``gpus_per_node``) stays the host and only names GPUs:
GPU ``g`` is local GPU ``g % gpus_per_node`` of node ``g // gpus_per_node``, and an instance is
written ``(node, first_gpu)`` of its first GPU, its ``tp`` GPUs consecutive from there (what
``sim`` books). ``place`` packs and names; ``placement_error`` is the check the simulator
applies to a plan's instances, so planner and simulator agree by construction.

Rollout GPUs are the first ``n_rollout`` GPUs of the cluster (domains 0, 1, ... filled in order;
training takes the rest), so rollout sees ``n_rollout // nvlink_domain`` full domains and at
most one partial one. ``pack`` assigns each item a bin and an offset by best-fit decreasing.

Why this is exact for the degrees the planner uses: valid TP degrees divide the domain size
(``cost_models.memory.tp_rule``: no holes); when they also form a divisibility chain (1, 2, 4,
8 on 8- or 72-GPU domains), item sizes are *divisible* and best-fit decreasing packs whenever
any packing exists (Coffman, Garey & Johnson, "Bin packing with divisible item sizes", 1987:
every bin's free space stays a multiple of the next item). For non-chain degrees (e.g. 2 and 3
on a 6-GPU node) it is a heuristic; the planner then only loses candidates, never returns an
invalid placement.
"""

from __future__ import annotations

from collections.abc import Sequence


def node_capacities(n_gpus: int, gpus_per_node: int) -> list[int]:
    """GPUs of each bin of ``gpus_per_node`` among the first ``n_gpus`` (full bins, then the
    partial one). Pass the NVLink domain to get the bins instances pack into."""
    caps = [gpus_per_node] * (n_gpus // gpus_per_node)
    if n_gpus % gpus_per_node:
        caps.append(n_gpus % gpus_per_node)
    return caps


def pack(capacities: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, int]] | None:
    """``(node, first_gpu)`` for each item of ``sizes`` (same order), or None if they do not fit.

    Best-fit decreasing: largest items first, each into the node with the least free space that
    still holds it (ties: lowest node).
    """
    import heapq

    top = max(capacities, default=0)
    by_free: list[list[int]] = [[] for _ in range(top + 1)]  # free GPUs -> heap of node ids
    for n, c in enumerate(capacities):
        by_free[c].append(n)
    for h in by_free:
        heapq.heapify(h)
    used = [0] * len(capacities)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    out: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    for i in order:
        s = sizes[i]
        f = next((f for f in range(s, top + 1) if by_free[f]), None)
        if f is None:
            return None
        n = heapq.heappop(by_free[f])
        out[i] = (n, used[n])
        used[n] += s
        heapq.heappush(by_free[f - s], n)
    return out


def fits(n_gpus: int, gpus_per_node: int, sizes: Sequence[int]) -> bool:
    """Whether instances of ``sizes`` GPUs pack into the first ``n_gpus`` GPUs, in bins of
    ``gpus_per_node`` (the NVLink domain, see the module docstring)."""
    if sum(sizes) > n_gpus:
        return False
    return pack(node_capacities(n_gpus, gpus_per_node), sizes) is not None


def place(n_gpus: int, gpus_per_node: int, sizes: Sequence[int], nvlink_domain: int | None = None) -> list[tuple[int, int]] | None:
    """``(node, first_gpu)`` of each instance of ``sizes`` packed into the NVLink domains
    (``nvlink_domain``, default the node) of the first ``n_gpus`` GPUs, or None if they do not
    fit. An instance's GPUs are consecutive, so one larger than a node continues on the next
    nodes of its domain."""
    dom = int(nvlink_domain or gpus_per_node)
    where = pack(node_capacities(n_gpus, dom), sizes)
    if where is None:
        return None
    return [divmod(d * dom + off, gpus_per_node) for d, off in where]


def instance_gpus(node: int, first_gpu: int, tp: int, gpus_per_node: int) -> tuple[int, ...]:
    """Global ids of the ``tp`` GPUs of an instance starting at local GPU ``first_gpu`` of
    ``node``."""
    g0 = node * gpus_per_node + first_gpu
    return tuple(range(g0, g0 + tp))


def placement_error(node: int, first_gpu: int, tp: int, gpus_per_node: int, nvlink_domain: int | None = None) -> str | None:
    """Why an instance at ``(node, first_gpu)`` with ``tp`` GPUs is not a valid placement (None:
    it is): its first GPU must be a GPU of that node and all its GPUs one NVLink domain's."""
    dom = int(nvlink_domain or gpus_per_node)
    if tp < 1 or node < 0 or first_gpu < 0 or first_gpu >= gpus_per_node:
        return f"TP={tp} from local GPU {first_gpu} of node {node} is not a GPU of a {gpus_per_node}-GPU node"
    g0 = node * gpus_per_node + first_gpu
    if g0 // dom != (g0 + tp - 1) // dom:
        what = f"{gpus_per_node}-GPU node" if dom == gpus_per_node else f"{dom}-GPU NVLink domain"
        return f"TP={tp} from local GPU {first_gpu} of node {node} (GPUs {g0}..{g0 + tp - 1}) does not fit one {what}"
    return None
