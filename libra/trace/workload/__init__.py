"""Synthetic agentic RL workloads: seeded, vectorized generators of Libra traces.

Three workload models share one generative engine (``engine.py``) and differ in their
calibrated defaults: ``swe`` (R2E-Gym-like SWE agent, ``bash``), ``search`` (Search-R1-like,
``search``) and ``math`` (ReTool/ToRA-like, ``python``). Typical use::

    from libra.trace.workload import generate, generate_steps, WORKLOADS
    for traj in generate("swe", steps=2, batch=16, group_size=8, seed=0, error_effect=2.0): ...
    for step in generate_steps("math", 10, 512, 8, 0): ...   # columnar, fast

The same arguments always give the same trajectories (NumPy PCG64 with explicit seeding).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from libra.errors import UserError
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, TraceHeader
from libra.trace.workload.engine import RunShape, simulate, to_trajectories
from libra.trace.workload import math_tool, search, swe
from libra.trace.workload.params import DOCS, Target, WorkloadParams

#: Bump when the same arguments would produce different trajectories.
GENERATOR_VERSION = "1"

#: Workload name -> its parameter dataclass (instantiate with no arguments for the defaults).
WORKLOADS: dict[str, type[WorkloadParams]] = {
    "swe": swe.SweParams,
    "search": search.SearchParams,
    "math": math_tool.MathParams,
}

#: Workload name -> the published figures its defaults are calibrated to (with test bands).
WORKLOAD_TARGETS: dict[str, tuple[Target, ...]] = {
    "swe": swe.TARGETS,
    "search": search.TARGETS,
    "math": math_tool.TARGETS,
}

__all__ = ["DOCS", "GENERATOR_VERSION", "WORKLOADS", "WORKLOAD_TARGETS", "Target", "WorkloadParams", "generate", "generate_steps",
           "make_params", "trace_header"]


def make_params(workload: str, **params: Any) -> WorkloadParams:
    """The workload's default parameters with ``params`` overriding some (validated)."""
    try:
        cls = WORKLOADS[workload]
    except KeyError:
        raise UserError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}") from None
    return cls().replace(**params) if params else cls()


def generate_steps(workload: str | WorkloadParams, steps: int, batch: int, group_size: int, seed: int,
                   first_step: int = 0, **params: Any) -> Iterator[StepArrays]:
    """Generate ``steps`` RL steps of ``batch`` trajectories each, as columnar ``StepArrays``.

    ``workload`` is a name from ``WORKLOADS`` (then ``params`` override its defaults) or a
    ready ``WorkloadParams``. Steps are numbered from ``first_step``.
    """
    p = workload if isinstance(workload, WorkloadParams) else make_params(workload, **params)
    if isinstance(workload, WorkloadParams) and params:
        p = p.replace(**params)
    return simulate(p, RunShape(steps=steps, batch=batch, group_size=group_size, seed=seed, first_step=first_step))


def generate(workload: str, steps: int, batch: int, group_size: int, seed: int,
             **params: Any) -> Iterator[Trajectory]:
    """Generate trajectories (row form), step by step; see ``generate_steps`` for the arguments."""
    for sa in generate_steps(workload, steps, batch, group_size, seed, **params):
        yield from to_trajectories(sa)


def trace_header(params: WorkloadParams, steps: int, batch: int, group_size: int, seed: int,
                 first_step: int = 0) -> TraceHeader:
    """The header a generated trace carries: workload, model hint, generator version, every parameter."""
    return TraceHeader(
        workload=params.workload,
        model=params.model_hint,
        source=f"libra-sim gen (libra.trace.workload v{GENERATOR_VERSION}): synthetic {params.description}",
        metadata={
            "generator": "libra.trace.workload",
            "generator_version": GENERATOR_VERSION,
            "steps": steps,
            "batch": batch,
            "group_size": group_size,
            "seed": seed,
            "first_step": first_step,
            "tool": params.tool_name,
            "params": params.as_dict(),
        },
    )
