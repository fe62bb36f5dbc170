"""The replay API: a trace, a cluster and policy names in, ``RunResult``s out.

``libra-sim replay`` is a thin shell over this; experiments and notebooks call it directly::

    from sim.replay import load_steps, replay_policy
    steps = load_steps("traces/swe-qwen3-14b.jsonl.gz")
    res = replay_policy(steps, "verl-static-uniform", ClusterSpec(48, "a800", "qwen3-14b"))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policies import PolicyOptions, min_staleness, resolve
from libra.trace.columnar import StepArrays
from sim.costs import SimCosts, load_costs
from sim.hindsight import SimReplayer
from sim.loop import SimConfig, Simulator
from sim.metrics import RunResult


def parse_step_range(text: str | None) -> tuple[int | None, int | None]:
    """``A:B`` (trace step numbers, B exclusive; either side may be empty) -> (A, B)."""
    if not text:
        return None, None
    if ":" not in text:
        raise UserError(f"--steps {text!r}: expected A:B (e.g. 0:5, 3:, :10)")
    a, b = text.split(":", 1)
    try:
        lo = int(a) if a.strip() else None
        hi = int(b) if b.strip() else None
    except ValueError:
        raise UserError(f"--steps {text!r}: A and B must be integers (e.g. 0:5)") from None
    if lo is not None and hi is not None and hi <= lo:
        raise UserError(f"--steps {text!r}: B must be greater than A")
    return lo, hi


def load_steps(path: str, step_range: str | None = None, lenient: bool = False,
               skipped: list[Any] | None = None) -> tuple[list[StepArrays], Any]:
    """The trace's steps within ``step_range`` (``A:B``) and its header. With ``lenient``, invalid
    lines are skipped instead of failing; pass a list as ``skipped`` to get their
    ``SkipRecord``s (line, field, rule), so the caller can report them: a replay must not
    silently run on fewer trajectories than the file holds."""
    from libra.trace.reader import open_trace

    lo, hi = parse_step_range(step_range)
    reader = open_trace(path, lenient=lenient)
    steps = [s for s in reader.steps() if (lo is None or s.step >= lo) and (hi is None or s.step < hi)]
    if lenient and skipped is not None:
        skipped.extend(reader.skipped)
    if not steps:
        raise UserError(f"{path}: no trajectories" + (f" in steps {step_range}" if step_range else ""))
    return steps, reader.header


def replay_policy(
    steps: Sequence[StepArrays],
    policy: str,
    cluster: ClusterSpec,
    config: SimConfig | None = None,
    costs: SimCosts | None = None,
    progress: Callable[[int, int], None] | None = None,
    calibration: str | None = None,
    **opts: Any,
) -> RunResult:
    """Replay ``steps`` under the policy named ``policy`` (``libra.policies``, the one registry).
    ``opts`` are ``PolicyOptions`` fields for the policy (pins such as ``split=(24, 24)``,
    ``rollout_tp``...; an unknown one is a ``UserError``); ``seed``, ``kl``, ``mini_batches``, the
    staleness class ``max_staleness`` (``SimConfig.staleness_class``: every policy chooses its
    loop within it) and the loop overrides (``mode``, ``staleness``, ``streaming``) come from
    ``config``, the evaluator from ``costs``, and the simulator's what-if replay
    (``sim.hindsight.SimReplayer``, for the hindsight baseline) over ``steps``. A policy that
    cannot run in the class (``libra.policies.min_staleness``) is a ``UserError``. The result carries the class (``RunResult.max_staleness``) and the loop that
    ran (``RunResult.mode``). Without ``costs``, they are loaded for the cluster's GPU and
    model, fitted on ``calibration`` (a ``libra-calibrate fit`` file) when given, with the
    cluster's engine profile (``ClusterSpec.engine``)."""
    config = config or SimConfig()
    config.check()
    k = config.staleness_class
    need = min_staleness(policy)
    if k < need:
        raise UserError(f"{policy} is asynchronous by design and runs only with --max-staleness >= {need} "
                        f"(this replay's staleness class is K={k}: on-policy)")
    costs = costs or load_costs(cluster.gpu, cluster.model, cluster.gpus_per_node, calibration, engine=cluster.engine)
    options = PolicyOptions(ev=costs.ev, seed=config.seed, kl=config.kl > 0, staleness=config.staleness, max_staleness=k,
                            mode=config.mode, streaming=config.streaming, mini_batches=config.mini_batches,
                            run_steps=len(steps), continuous=config.continuous, tool_kv=config.kv_mode, hindsight=SimReplayer(steps, cluster, costs, config))
    pol = resolve(policy, cluster, options, **opts)
    sim = Simulator(steps, pol, cluster, costs, config)
    res = sim.run(progress)
    first = res.steps[0] if res.steps else None
    plan_notes = getattr(pol, "_plan", None)
    if plan_notes is not None:
        res.notes.update({k: v for k, v in plan_notes.notes.items() if isinstance(v, (str, int, float))})
        res.notes["colocated"] = plan_notes.colocated
    if first is not None:
        res.notes.setdefault("rollout_tps", first.rollout_tps)
    res.notes["sees_future"] = bool(getattr(pol, "sees_future", False))
    return res


def with_gantt(config: SimConfig, step: int) -> SimConfig:
    """``config`` recording the instance Gantt of trace step ``step``."""
    return replace(config, gantt_step=step)
