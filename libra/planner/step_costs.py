"""``StepCosts``: the one price list for everything in an RL step that is not the rollout itself.

Why one object: the planner predicts a step and the simulator charges it, and they used to price
it separately (the planner assumed NVLink for the weight sync on a one-node cluster while the
simulator always charged the network; the planner charged a plan transition the simulator never
did; the training-stage formula was written twice). Both now ask this object, with the same
evaluator, so with noise off the simulator charges exactly what the planner predicts:

* the **training stage**: the old-policy log-prob forward (and the reference model's with a KL
  term) plus the optimizer pass (``train_stage_s``), and the per-sample bookkeeping between
  rollout and training (``step_fixed_s``: reward, advantage, data movement);
* the **weight sync** of a split plan, over NVLink exactly when the training GPUs and every
  rollout instance sit in one NVLink domain, decided from the GPU placement
  (``train_gpu_ids`` is the placement rule the simulator executes);
* the **colocated stage switches** (engine sleep + trainer onload; trainer offload + engine
  wake) and the colocated IPC weight sync;
* **role changes** of the elastic pool (lending a rollout GPU to training and giving it back);
* the **plan transition** between the plan in force and a new one (``transition``): GPUs that
  change role, or whose instance changes, are busy for it before they start their new role;
* **KV migration** between instances.

It lives in the policy core because both sides import it (``sim`` may import ``libra``, never the
reverse). Every number comes from ``CostModel`` (``cost_models.CostEvaluator``); nothing here is a
constant of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from libra.planner.costs import CostModel, nvlink_domain, to_strategy
from libra.planner.packing import instance_gpus
from libra.planner.plan import Plan, RolloutInstance, TrainConfig, same_layout


#: Training-stage timings kept per ``StepCosts`` (the planner's rounded shapes repeat; the
#: simulator asks once per step and strategy).
STAGE_MEMO_MAX = 4096


@dataclass(frozen=True)
class Transition:
    """What moving from the plan in force to a new one costs.

    ``to_train_s``: the training side re-shards (its GPUs load the new strategy's state; charged
    when ``train_changed``). ``to_rollout_s``: every instance in ``moved`` (ids in the new plan)
    loads its weights before serving (GPUs of a role change work in parallel, so one GPU's time
    per direction). ``total_s`` is the planner's charge and what a replay records.
    """

    to_train_s: float = 0.0
    to_rollout_s: float = 0.0
    train_changed: bool = False
    moved: frozenset[int] = field(default_factory=frozenset)

    @property
    def total_s(self) -> float:
        return (self.to_train_s if self.train_changed else 0.0) + (self.to_rollout_s if self.moved else 0.0)


def new_instances(current: Plan, instances: Sequence[RolloutInstance]) -> frozenset[int]:
    """Ids of the ``instances`` that no instance of ``current`` ran on the same GPUs at the same
    TP: the ones that load their weights before serving."""
    old = {(i.node, i.first_gpu, i.tp) for i in current.instances}
    return frozenset(i.id for i in instances if (i.node, i.first_gpu, i.tp) not in old)


def train_gpu_ids(n_gpus: int, n_train: int, colocated: bool, instances: Sequence[RolloutInstance], gpus_per_node: int) -> tuple[int, ...]:
    """The GPUs a plan trains on: the first ``n_train`` (colocated), else the first ``n_train``
    GPUs no rollout instance uses. The simulator books exactly these; the planner prices the
    weight sync from them."""
    if colocated:
        return tuple(range(min(n_train, n_gpus)))
    used = {g for i in instances for g in instance_gpus(i.node, i.first_gpu, i.tp, gpus_per_node)}
    out: list[int] = []
    g = 0
    while len(out) < n_train and g < n_gpus:
        if g not in used:
            out.append(g)
        g += 1
    return tuple(out)


class StepCosts:
    """Step costs for one evaluator (one GPU kind and model); memoized per argument set."""

    def __init__(self, ev: CostModel, gpus_per_node: int | None = None) -> None:
        self.ev = ev
        gpu = getattr(ev, "gpu", None)
        self.gpus_per_node = int(gpus_per_node or getattr(gpu, "gpus_per_node", 8))
        self.nvlink_domain = nvlink_domain(gpu, self.gpus_per_node)
        self._strategy: dict[TrainConfig, Any] = {}
        self._stage: dict[tuple[TrainConfig, int, int], tuple[float, float]] = {}
        self._memo: dict[tuple[object, ...], float] = {}

    def strategy(self, cfg: TrainConfig) -> Any:
        """``cfg`` as the evaluator's TrainStrategy (cached)."""
        s = self._strategy.get(cfg)
        if s is None:
            s = self._strategy[cfg] = to_strategy(cfg)
        return s

    # ---- training stage ----------------------------------------------------------------------
    def _fwd_upd(self, cfg: TrainConfig, tokens: int, seq_len: int) -> tuple[float, float]:
        key = (cfg, tokens, seq_len)
        v = self._stage.get(key)
        if v is None:
            if len(self._stage) >= STAGE_MEMO_MAX:  # a long replay asks once per step: keep the memo bounded
                self._stage.clear()
            s = self.strategy(cfg)
            v = self._stage[key] = (float(self.ev.forward_s(s, tokens, seq_len)), float(self.ev.train_iter_s(s, tokens, seq_len)))
        return v

    def update_s(self, cfg: TrainConfig, tokens: int, seq_len: int) -> float:
        """The optimizer pass alone (a lower bound of the stage, for branch and bound)."""
        return 0.0 if tokens <= 0 else self._fwd_upd(cfg, tokens, max(1, seq_len))[1]

    def train_stage_s(self, cfg: TrainConfig, tokens: int, seq_len: int, kl: bool) -> tuple[float, float]:
        """(forward passes, update) of one RL step's training over ``tokens`` in sequences of
        ``seq_len``: the old-policy log-probs (twice with ``kl``: the reference model's too),
        then one optimizer pass."""
        if tokens <= 0:
            return 0.0, 0.0
        fwd, upd = self._fwd_upd(cfg, tokens, max(1, seq_len))
        return fwd * (2.0 if kl else 1.0), upd

    def train_s(self, cfg: TrainConfig, tokens: int, seq_len: int, kl: bool) -> float:
        """The whole training stage: forward passes plus update."""
        fwd, upd = self.train_stage_s(cfg, tokens, seq_len, kl)
        return fwd + upd

    def step_fixed_s(self, n_samples: int) -> float:
        """Per-step bookkeeping between rollout and training for ``n_samples`` trajectories."""
        key = ("fixed", int(n_samples))
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.step_fixed_s(int(n_samples)))
        return v

    # ---- placement -------------------------------------------------------------------------------
    def same_domain(self, gpus: Iterable[int]) -> bool:
        """Whether all ``gpus`` (global ids) sit in one NVLink domain."""
        return len({int(g) // self.nvlink_domain for g in gpus}) <= 1

    def train_gpus(self, n_gpus: int, n_train: int, colocated: bool, instances: Sequence[RolloutInstance]) -> tuple[int, ...]:
        """``train_gpu_ids`` with this object's node size."""
        return train_gpu_ids(n_gpus, n_train, colocated, instances, self.gpus_per_node)

    def sync_same_domain(self, train_gpus: Sequence[int], instances: Sequence[RolloutInstance]) -> bool:
        """Whether the weight sync stays on NVLink: training and every instance in one domain."""
        gpus = list(train_gpus)
        for i in instances:
            gpus.extend(instance_gpus(i.node, i.first_gpu, i.tp, self.gpus_per_node))
        return self.same_domain(gpus)

    # ---- weight sync -------------------------------------------------------------------------------
    def weight_sync_s(self, cfg: TrainConfig, instances: Sequence[RolloutInstance], train_gpus: Sequence[int]) -> float:
        """Pushing the trained weights from ``cfg``'s trainer on ``train_gpus`` to every instance
        (NCCL broadcast; NVLink when all of them share one domain)."""
        if not instances:
            return 0.0
        tps = tuple(sorted(i.tp for i in instances))
        same = self.sync_same_domain(train_gpus, instances)
        key = ("sync", cfg, tps, same)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.weight_sync_s(n_train_gpus=cfg.n_gpus, rollout_tps=list(tps), same_node=same,
                                                              strategy=self.strategy(cfg)))
        return v

    # ---- colocated plans -------------------------------------------------------------------------
    def switch_to_train_s(self, cfg: TrainConfig, rollout_tp: int) -> float:
        """A colocated GPU leaving rollout: the engine sleeps, the trainer onloads its state."""
        key = ("to_train", cfg, rollout_tp)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.stage_switch_s("train", rollout_tp, self.strategy(cfg)))
        return v

    def switch_to_rollout_s(self, cfg: TrainConfig, rollout_tp: int) -> float:
        """A colocated GPU going back to rollout: the trainer offloads, the engine wakes."""
        key = ("to_rollout", cfg, rollout_tp)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.stage_switch_s("rollout", rollout_tp, self.strategy(cfg)))
        return v

    def colocated_sync_s(self, cfg: TrainConfig, instances: Sequence[RolloutInstance]) -> float:
        """The colocated weight sync: the trainer's tensors handed to the engines on the same
        GPUs through CUDA IPC (per-tensor cost, no network), then pushed (NCCL, as a split's
        ``weight_sync_s``) to the engines on GPUs the trainer does not use: a time-shared plan
        trains on the first ``cfg.n_gpus`` GPUs (``train_gpu_ids``), fewer than it rolls out
        on when the backend's cap or memory says so (``Planner._colocated_train``)."""
        if not instances:
            return 0.0
        # an instance's GPUs are contiguous (``instance_gpus``): inside the trainer's first
        # ``cfg.n_gpus`` exactly when its last one is
        inside = tuple(i for i in instances if i.node * self.gpus_per_node + i.first_gpu + i.tp <= cfg.n_gpus)
        outside = tuple(i for i in instances if i.node * self.gpus_per_node + i.first_gpu + i.tp > cfg.n_gpus)
        push = self.weight_sync_s(cfg, outside, tuple(range(cfg.n_gpus))) if outside else 0.0
        if not inside:
            return push
        tps = tuple(sorted(i.tp for i in inside))
        key = ("ipc", cfg, tps)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.weight_sync_s(n_train_gpus=cfg.n_gpus, rollout_tps=list(tps), same_node=True,
                                                              mode="ipc", strategy=self.strategy(cfg)))
        return v + push

    def colocated_overhead_s(self, cfg: TrainConfig, instances: Sequence[RolloutInstance]) -> float:
        """Everything a colocated step adds to rollout + training: both switches (at the
        largest instance TP) and the IPC sync."""
        rtp = max((i.tp for i in instances), default=1)
        return self.switch_to_train_s(cfg, rtp) + self.switch_to_rollout_s(cfg, rtp) + self.colocated_sync_s(cfg, instances)

    # ---- elastic pool ------------------------------------------------------------------------------
    def lend_s(self, cfg: TrainConfig, rollout_tp: int) -> float:
        """A rollout GPU of a TP-``rollout_tp`` instance joining ``cfg``'s training: the engine
        sleeps, the training shard loads from host memory."""
        key = ("lend", cfg, rollout_tp)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.role_change_s("train", rollout_tp, self.strategy(cfg)))
        return v

    def build_s(self, cfg: TrainConfig) -> float:
        """The trainer re-built in ``cfg``'s layout before its first optimizer step (the run's
        first training, ``libra.planner.settle.first_layout``): each GPU loads only its bf16
        weight shard, as no gradient or optimizer state exists yet (``trainer_build_s``). A
        re-shard after an update moves the whole training state (``lend_s``)."""
        key = ("build", cfg)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.trainer_build_s(self.strategy(cfg)))
        return v

    def return_s(self, cfg: TrainConfig, rollout_tp: int) -> float:
        """A lent GPU going back to rollout: offload ``cfg``'s training state, wake the engine
        with its weights."""
        key = ("return", cfg, rollout_tp)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.role_change_s("rollout", rollout_tp, self.strategy(cfg), True))
        return v

    def engine_start_s(self, rollout_tp: int) -> float:
        """A GPU that holds no training state starting a TP-``rollout_tp`` engine: it loads the
        weights (an instance of a new plan that no instance of the old one ran)."""
        key = ("engine", rollout_tp)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.ev.role_change_s("rollout", rollout_tp, None, False))
        return v

    def round_trip_s(self, cfg: TrainConfig, rollout_tp: int) -> float:
        """Lending a GPU now and getting it back for the next step."""
        return self.lend_s(cfg, rollout_tp) + self.return_s(cfg, rollout_tp)

    # ---- plan transitions ------------------------------------------------------------------------
    def transition(
        self, current: Plan | None, n_train: int, train: TrainConfig, instances: Sequence[RolloutInstance]
    ) -> Transition:
        """The transition from ``current`` to a candidate with ``n_train`` training GPUs running
        ``train`` and rollout ``instances`` (nothing without a current plan, or after a
        colocated one, whose every GPU already reloads between stages).

        The training side re-shards when its GPU count or layout changes (``lend_s``: a GPU
        loading the new strategy's shard); the layout is TP x PP x DP, EP and the ZeRO stage
        (``libra.planner.plan.same_layout``). A new micro-batch size or recompute flag moves
        nothing between GPUs and costs nothing: real trainers set both per step (verl's dynamic
        batch size), and every step settles them for its own batch (``libra.planner.settle``).
        Charging them as a re-shard had kept a first plan's knobs, sized for a 64K-token prior,
        on a trace of 4K-token sequences (6.6 s of training per step where 1.8 s would do,
        SIMULATED). An instance of the new plan moves when no instance of
        the old one had the same GPUs and TP; moved instances load their weights before serving
        (``return_s`` at the largest moved TP, offloading the old training state when one of
        them sits on a GPU that trained).
        """
        if current is None or current.colocated:
            return Transition()
        train_changed = n_train != current.n_train_gpus or not same_layout(train, current.train)
        moved = new_instances(current, instances)
        to_train = self.lend_s(train, 1) if train_changed else 0.0
        to_rollout = 0.0
        if moved:
            rtp = max(i.tp for i in instances if i.id in moved)
            span = current.n_rollout_gpus + current.n_train_gpus  # the old plan's cluster
            old_train = set(train_gpu_ids(span, current.n_train_gpus, False, current.instances, self.gpus_per_node))
            trained = any(g in old_train for i in instances if i.id in moved
                          for g in instance_gpus(i.node, i.first_gpu, i.tp, self.gpus_per_node))
            to_rollout = self.return_s(current.train, rtp) if trained else self.engine_start_s(rtp)
        return Transition(to_train, to_rollout, train_changed, moved)

    def shared_to_async(self, current: Plan, instances: Sequence[RolloutInstance]) -> Transition:
        """The rollout side of an async split that follows the time-shared plan ``current``
        when that plan's last training moves onto the split's training GPUs
        (``Policy.training_plan``): the split's rollout starts at once on its GPUs, no engine
        switch back in between, and every instance that none of ``current``'s engines ran
        (same GPUs and TP) starts its engine first (``engine_start_s``, at the largest such TP;
        its GPUs held no training state). The training side trains the split's layout, priced
        with the training (``libra.planner.settle``), so ``to_train_s`` is 0."""
        moved = new_instances(current, instances)
        if not moved:
            return Transition()
        rtp = max(i.tp for i in instances if i.id in moved)
        return Transition(0.0, self.engine_start_s(rtp), False, moved)

    # ---- KV migration -----------------------------------------------------------------------------
    def kv_migration_s(self, tokens: int, tp_src: int, tp_dst: int, same_node: bool) -> float:
        """Moving a sequence's KV between instances over NVLink or the network."""
        return float(self.ev.kv_migration_s(tokens, tp_src, tp_dst, same_node))
