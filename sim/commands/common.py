"""What several ``libra-sim`` commands share: the largest cluster they accept, the positive-int
flag type, and the catalog's node size of a GPU.

Why a module of its own: ``plan``, ``replay`` and ``sweep`` (and the sweep's runner and cache)
used these from each other's private names, which made ``plan`` and ``replay`` import each other.
"""

from __future__ import annotations

import argparse

#: The largest cluster replay, plan and sweep accept (planner search time grows faster than linearly).
MAX_GPUS = 32768


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, with the value in the message otherwise."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def node_size(gpu: str) -> int:
    """The catalog's GPUs per node for ``gpu`` (8 when the name is not in the catalog: the
    evaluator then says what is)."""
    from cost_models.errors import CostModelError
    from cost_models.hardware import get_gpu

    try:
        return get_gpu(gpu).gpus_per_node
    except CostModelError:
        return 8
