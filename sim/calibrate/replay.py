"""A logged run replayed in the simulator: the same layout (``RunShape``), steps of the logged
sizes, the predicted time of every stage per step (noise off: the cost model's own prediction).

The logs carry each step's length statistics, not its trajectories, so a step is rebuilt from
them: ``trajectories`` single-turn trajectories whose response lengths follow a lognormal with
the logged mean (exactly) and, when the log has it, a spread whose largest of ``n`` draws is the
logged maximum; prompts of the logged mean length. That is the one assumption of the replay (the
rollout's tail depends on the real lengths); multi-turn tool calls are not in step logs and are
not replayed.

Stages compared (``STAGES``): ``gen`` is the simulator's rollout makespan; ``log_prob`` its
forward passes (the old policy's, and the reference model's with a KL term: verl logs those as
``old_log_prob`` + ``ref``); ``update`` the optimizer pass; ``sync`` the weight push plus, for a
colocated run, the two stage switches (verl's ``update_weights`` wakes the engine and loads the
weights); ``step`` the step's wall time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.packing import place
from libra.planner.plan import Bucket, Plan, RolloutInstance
from libra.scheduling.routers import LeastLoadedRouter
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from sim.calibrate.logs import LENGTH_KEYS, STAGE_KEYS, StepLog
from sim.calibrate.run_config import RunShape

STAGES: tuple[str, ...] = ("gen", "log_prob", "update", "sync", "step")


@dataclass(frozen=True)
class StageTimes:
    """One step's seconds per stage (NaN: not logged)."""

    step: int
    gen: float
    log_prob: float
    update: float
    sync: float
    step_s: float
    fixed: float = float("nan")  # predicted per-step bookkeeping (step_fixed_s), for the fit

    def get(self, stage: str) -> float:
        return self.step_s if stage == "step" else float(getattr(self, stage))


def logged_times(log: StepLog) -> StageTimes:
    """A logged step's stages (``log_prob`` adds verl's ``timing_s/ref`` when logged)."""
    def g(stage: str) -> float:
        v = log.first(STAGE_KEYS[stage])
        return float("nan") if v is None else v
    ref = log.values.get("timing_s/ref")
    lp = g("log_prob") + (ref if ref is not None and math.isfinite(ref) else 0.0)
    return StageTimes(log.step, g("gen"), lp, g("update"), g("sync"), g("step"))


def synth_step(log: StepLog, n: int, group_size: int = 1) -> StepArrays:
    """The step rebuilt from its logged lengths (see the module docstring); trajectories in
    GRPO groups of ``group_size`` (a streamed loop trains on finished groups)."""
    mean = log.first(LENGTH_KEYS["response_mean"])
    if mean is None or mean <= 0:
        raise UserError(f"{log.where}: step {log.step} has no response length ({' or '.join(LENGTH_KEYS['response_mean'])}) "
                        "to replay it with")
    hi = log.first(LENGTH_KEYS["response_max"])
    lo = log.first(LENGTH_KEYS["response_min"])
    prompt = log.first(LENGTH_KEYS["prompt_mean"]) or 0.0
    z = NormalDist().inv_cdf(1.0 - 0.5 / n) if n > 1 else 0.0
    sigma = 0.5  # no logged maximum: a moderate spread (stated in the module docstring)
    if hi is not None and hi > mean and z > 0:
        # ln(max / mean) = sigma * z - sigma^2 / 2: the smaller root
        r = math.log(hi / mean)
        disc = z * z - 2.0 * r
        sigma = (z - math.sqrt(disc)) if disc > 0 else z
    elif hi is not None and hi <= mean:
        sigma = 0.0
    q = np.array([NormalDist(0.0, 1.0).inv_cdf((i + 0.5) / n) for i in range(n)])
    lengths = np.exp(sigma * q)
    lengths *= mean / lengths.mean()
    lengths = np.clip(lengths, max(1.0, lo or 1.0), hi if hi is not None and hi >= mean else None)
    lengths *= mean / lengths.mean()  # the clip moved the mean: restore it
    gen = np.maximum(1, np.rint(lengths)).astype(np.int64)
    gen = gen[np.random.default_rng(log.step).permutation(n)]  # groups mix short and long, not sorted blocks (seeded)
    trajs = [Trajectory(f"s{log.step}-{i}", log.step, max(1, int(round(prompt))), (Turn(int(g), None),), group=f"s{log.step}-g{i // max(1, group_size)}")
             for i, g in enumerate(gen)]
    return StepArrays.from_trajectories(log.step, trajs)


def fixed_plan(shape: RunShape, gpus_per_node: int) -> Plan:
    """The run's layout as a ``Plan``: ``n_rollout_gpus // rollout_tp`` instances packed on the
    first GPUs, one bucket, the run's training strategy and loop."""
    tp = shape.rollout_tp
    k = shape.n_rollout_gpus // tp
    if k < 1:
        raise UserError(f"the run's {shape.n_rollout_gpus} rollout GPUs hold no TP-{tp} instance")
    spots = place(shape.n_rollout_gpus, gpus_per_node, [tp] * k)
    if spots is None:
        raise UserError(f"{k} TP-{tp} rollout instances do not pack on {shape.n_rollout_gpus} GPUs of {gpus_per_node}-GPU nodes")
    inst = tuple(RolloutInstance(i, tp, 0, node, first) for i, (node, first) in enumerate(spots))
    return Plan(n_rollout_gpus=shape.n_rollout_gpus, n_train_gpus=shape.train.n_gpus, train=shape.train, instances=inst,
                buckets=(Bucket(0, tp, 0, None),), mode=shape.mode, max_staleness=shape.max_staleness,  # type: ignore[arg-type]
                streaming=shape.streaming, colocated=shape.colocated, notes={"planner": "from-logs (the run's own layout)"})


class FixedPlanPolicy:
    """The logged run's plan every step, least-loaded routing, no pool: what the run did."""

    sees_future = False

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        return self._plan

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> Any:
        return LeastLoadedRouter(plan)

    def pool(self, plan: Plan) -> None:
        return None


def simulate(shape: RunShape, steps: Sequence[StepArrays], cluster: ClusterSpec, costs: Any, noise: float = 0.0,
             seed: int = 0) -> list[StageTimes]:
    """The run replayed (``noise`` 0: the prediction); one ``StageTimes`` per step, SIMULATED."""
    from sim.loop import SimConfig, Simulator

    plan = fixed_plan(shape, cluster.gpus_per_node)
    # the run's own configuration, which ran: not refused by the memory model (``train_memory_check``)
    cfg = SimConfig(noise_sigma=noise, seed=seed, mini_batches=shape.mini_batches, kl=1.0 if shape.kl else 0.0,
                    max_staleness=shape.max_staleness, train_memory_check=False)
    res = Simulator(steps, FixedPlanPolicy(plan), cluster, costs, cfg).run()
    out = []
    for s, m in zip(steps, res.steps):
        sync = m.sync_s + (m.switch_s if shape.colocated else 0.0)
        out.append(StageTimes(m.step, m.rollout_makespan_s, m.forward_s, m.update_s, sync, m.step_s,
                              float(costs.step.step_fixed_s(s.n))))
    return out
