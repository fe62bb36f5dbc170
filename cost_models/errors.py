"""Errors of the cost evaluator. ``cost_models`` imports nothing of the rest of Libra, so it has
its own user-error class; the CLIs print it on one line with no traceback."""

from __future__ import annotations


class CostModelError(ValueError):
    """Bad input to the cost evaluator: an unknown GPU or model, a bad shape, an infeasible
    strategy. The message names what would work."""
