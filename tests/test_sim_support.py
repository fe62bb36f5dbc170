"""Test doubles and small hand-made steps for the simulator tests (no tests of its own).

``FakeEvaluator`` is a TEST DOUBLE of ``cost_models.CostEvaluator``: simple closed-form costs
with the same method names, so instance-level tests can check the simulator's arithmetic
against a naive loop without depending on calibration data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.policies.static import uniform_instances
from libra.scheduling.base import InstanceLoad, Route, TrajectoryObservation, least_loaded
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from sim.costs import SimCosts


@dataclass
class _Mem:
    fits: bool = True

    def summary(self) -> str:
        return "fits"


class FakeEvaluator:
    """TEST DOUBLE: affine decode, linear prefill, tiny configurable KV cache."""

    def __init__(self, kv_tokens: int = 100_000, max_seqs: int = 64) -> None:
        self.kv_tokens = kv_tokens
        self.max_seqs = max_seqs
        self.model = type("M", (), {"params_total": 1_000_000_000, "name": "fake"})()
        self.gpu = type("G", (), {"name": "fake", "gpus_per_node": 8})()

    def decode_coeffs(self, tp: Any, batch: Any) -> tuple[float, float]:
        return 0.01 / tp + 0.0002 * batch, 2e-7 / tp

    def prefill_s(self, tp: Any, new_tokens: Any, cached_tokens: Any = 0, batch: Any = 1) -> float:
        return (1e-4 * new_tokens + 1e-9 * new_tokens * cached_tokens) * batch / tp + 0.005

    def kv_capacity_tokens(self, tp: int) -> int:
        return self.kv_tokens * tp

    def max_running_seqs(self, tp: int) -> int:
        return self.max_seqs

    def train_iter_s(self, strategy: Any, tokens: int, seq_len: int) -> float:
        return 3e-5 * tokens / strategy.n_gpus + 1.0

    def forward_s(self, strategy: Any, tokens: int, seq_len: int) -> float:
        return 1e-5 * tokens / strategy.n_gpus + 0.2

    def weight_sync_s(self, n_train_gpus: Any = None, train_tp: Any = None, train_pp: Any = None, rollout_tps: Any = (),
                      same_node: bool = False, mode: str = "broadcast", strategy: Any = None) -> float:
        return 0.3 if mode == "ipc" else 0.5

    def kv_migration_s(self, tokens: float, tp_src: int, tp_dst: int, same_node: bool = True) -> float:
        return 1e-5 * tokens + 0.001

    def role_change_s(self, to: str, rollout_tp: int = 1, strategy: Any = None, offload_previous: bool = True) -> float:
        return 2.0

    def trainer_build_s(self, strategy: Any = None) -> float:
        return 0.5

    def stage_switch_s(self, to: str, rollout_tp: int = 1, strategy: Any = None) -> float:
        return 1.5

    def step_fixed_s(self, n_samples: int) -> float:
        return 1e-3 * n_samples

    def valid_rollout_tps(self) -> list[int]:
        return [1, 2, 4, 8]

    def train_memory(self, strategy: Any, seq_len: int, suggest: bool = True) -> _Mem:
        return _Mem()


def fake_costs(**kw: Any) -> SimCosts:
    return SimCosts(FakeEvaluator(**kw))  # type: ignore[arg-type]


def make_step(step: int, n: int, seed: int = 0, turns: tuple[int, int] = (1, 5), gen: tuple[int, int] = (5, 200),
              tool_nan: bool = False, trailing_tool_every: int = 0) -> StepArrays:
    """``n`` random multi-turn trajectories (tool 'bash' between turns)."""
    rng = np.random.default_rng([seed, step])
    trajs = []
    for i in range(n):
        k = int(rng.integers(turns[0], turns[1] + 1))
        ts = []
        for t in range(k):
            last = t == k - 1
            trailing = last and trailing_tool_every and i % trailing_tool_every == 0
            lat = None if tool_nan else float(rng.uniform(0.05, 3.0))
            if last and not trailing:
                ts.append(Turn(int(rng.integers(gen[0], gen[1])), None))
            else:
                ts.append(Turn(int(rng.integers(gen[0], gen[1])), "bash", lat, int(rng.integers(0, 300)), "ok"))
        trajs.append(Trajectory(id=f"s{step}-t{i}", step=step, prompt_tokens=int(rng.integers(50, 1500)), turns=tuple(ts),
                                group=f"g{i // 4}", reward=float(rng.random()), finish="tool_limit" if ts[-1].tool else "stop"))
    return StepArrays.from_trajectories(step, trajs)


class OneBucketRouter:
    """A minimal router for tests: one bucket, least-loaded, stays put on tool calls."""

    def __init__(self, migrate_to: int | None = None) -> None:
        self.finished: list[str] = []
        self.migrate_to = migrate_to

    def admit(self, obs: TrajectoryObservation) -> int:
        return 0

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        if self.migrate_to is not None and obs.turns_done % 2 == 1:
            return Route(self.migrate_to if obs.bucket == 0 else 0, True)
        return Route(obs.bucket if obs.bucket is not None else 0, False)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        self.finished.append(obs.traj_id)

    def choose_instance(self, bucket: int, loads: Any, obs: Any = None) -> int:
        return least_loaded([l for l in loads if l.bucket == bucket] or loads)


def simple_plan(n_inst: int = 2, tp: int = 2, n_gpus: int = 16, train_gpus: int | None = None, two_buckets: bool = False) -> Plan:
    insts = []
    for i in range(n_inst):
        g = i * tp
        insts.append(RolloutInstance(i, tp, (i % 2) if two_buckets else 0, node=g // 8, first_gpu=g % 8))
    rg = n_inst * tp
    tg = train_gpus if train_gpus is not None else n_gpus - rg
    buckets = (Bucket(0, tp, 0, 4000), Bucket(1, tp, 4000, None)) if two_buckets else (Bucket(0, tp, 0, None),)
    return Plan(rg, tg, TrainConfig(1, 1, tg), tuple(insts), buckets)


class FixedPolicy:
    """A test policy: the same plan every step, ``OneBucketRouter``, optional pool."""

    name = "fixed-test"
    sees_future = False

    def __init__(self, plan: Plan, pool: Any = None, migrate_to: int | None = None) -> None:
        self._plan = plan
        self._pool = pool
        self.migrate_to = migrate_to
        self.histories: list[int] = []

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
        self.histories.append(len(history))
        return self._plan

    def scheduler(self, plan: Plan, future: Any = None) -> OneBucketRouter:
        return OneBucketRouter(self.migrate_to)

    def pool(self, plan: Plan) -> Any:
        return self._pool


def loads_ok(loads: list[InstanceLoad]) -> bool:
    return all(l.kv_tokens_used <= l.kv_tokens_capacity for l in loads)


def one_bucket_plan(n_rollout: int, tp: int, n_gpus: int) -> Plan:
    """A split plan of ``n_rollout // tp`` TP-``tp`` instances in one bucket, the rest training
    (TP 1, ZeRO-3, activation recompute, so that it holds the long sequences of the steps it is
    replayed on): a layout to replay alone against the rollout DP's prediction of it."""
    n_train = n_gpus - n_rollout
    return Plan(n_rollout_gpus=n_rollout, n_train_gpus=n_train, train=TrainConfig(tp=1, pp=1, dp=n_train, zero_stage=3, recompute=True),
                instances=uniform_instances(n_rollout, tp, 8), buckets=(Bucket(0, tp, 0, None),))
