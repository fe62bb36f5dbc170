"""Placing rollout instances (TP groups) on nodes without crossing a node boundary.

Rollout GPUs are the first ``n_rollout`` GPUs of the cluster (nodes 0, 1, ... filled in order;
training takes the rest), so rollout sees ``n_rollout // gpus_per_node`` full nodes and at most
one partial node. ``pack`` assigns each instance a node and a first GPU by best-fit decreasing.

Why this is exact for the degrees the planner uses: valid TP degrees divide the node size
(``valid_tp_degrees``); when they also form a divisibility chain (1, 2, 4, 8 on 8-GPU nodes),
item sizes are *divisible* and best-fit decreasing packs whenever any packing exists (Coffman,
Garey & Johnson, "Bin packing with divisible item sizes", 1987: every bin's free space stays a
multiple of the next item). For non-chain degrees (e.g. 2 and 3 on a 6-GPU node) it is a
heuristic; the planner then only loses candidates, never returns an invalid placement.
"""

from __future__ import annotations

from collections.abc import Sequence


def node_capacities(n_gpus: int, gpus_per_node: int) -> list[int]:
    """GPUs of each node among the first ``n_gpus`` (full nodes, then the partial one)."""
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
    """Whether instances of ``sizes`` GPUs pack into the first ``n_gpus`` GPUs."""
    if sum(sizes) > n_gpus:
        return False
    return pack(node_capacities(n_gpus, gpus_per_node), sizes) is not None
