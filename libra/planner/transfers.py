"""Weight sync and plan-transition costs of a candidate plan, priced by ``StepCosts`` (the same
object the simulator charges with, so a replay with noise off charges what these predict).

* ``weight_sync_s``: after training, the new weights go to every rollout instance (NCCL
  broadcast; NVLink only when the training GPUs, placed as the simulator places them
  (``step_costs.train_gpu_ids``), and every rollout instance share one NVLink domain: a node, or
  a GB200 NVL72 rack).
* ``transition_s``: switching from the plan in force to another (``StepCosts.transition``):
  the trainer re-shards when its GPU count or strategy changes, and instances whose GPUs or TP
  are new load their weights (GPUs of a role change work in parallel, so one GPU's time per
  direction). Nothing changes: 0. Async mode adds a wait (below) that the simulator does not
  charge as a cost: it happens there by itself, because those GPUs are still training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.costs import CostModel
from libra.planner.plan import Plan, RolloutInstance, TrainConfig
from libra.planner.step_costs import StepCosts


def _costs(ev: CostModel | StepCosts, cluster: ClusterSpec) -> StepCosts:
    return ev if isinstance(ev, StepCosts) else StepCosts(ev, cluster.gpus_per_node)


def weight_sync_s(
    ev: CostModel | StepCosts, cluster: ClusterSpec, n_train: int, train: TrainConfig | None, instances: Sequence[RolloutInstance]
) -> float:
    """Seconds to push trained weights into ``instances``. With ``train`` None (strategy not
    chosen yet) it returns 0, the trivial lower bound the search's branch and bound uses."""
    if not instances or train is None:
        return 0.0
    sc = _costs(ev, cluster)
    return sc.weight_sync_s(train, instances, sc.train_gpus(cluster.n_gpus, n_train, False, instances))


def transition_s(
    ev: CostModel | StepCosts,
    cluster: ClusterSpec,
    current: Plan | None,
    n_train: int,
    train: TrainConfig,
    instances: Sequence[RolloutInstance],
    mode: str = "sync",
    in_force_train_s: float | None = None,
) -> float:
    """One-off cost of moving from ``current`` to the candidate (0 without a current plan).

    Async mode: GPUs that move from training to rollout are still training the previous step
    (its training overlaps this rollout) and serve rollout only once it ends, so the move also
    costs that training's time: ``in_force_train_s``, the in-force layout's training re-priced
    on the statistics the search plans from, or, without it, the time predicted when the plan
    was made (``current.predicted_train_s``): the rollout work placed on those instances waits
    that long. Measured before this charge: a 32:16 -> 36:12 move on the SWE trace (48 A800s)
    made one rollout 711 s instead of ~460 s.

    Why re-priced: a plan made from the prior carries the prior's training time, and a short
    log's trainings run a small fraction of it. Charging the prior's 427 s where the step
    trained in 24 s priced the move off a first 8:40 split at 142 s a step, and Libra kept it a
    step longer (held_out_32 bfcl-gptoss/h200-48-l70b/K1, SIMULATED).

    From a time-shared plan to an async split: the engine starts of the split's new instances
    (``StepCosts.shared_to_async``), as the simulator charges them when the time-shared step's
    training moves onto the split's training GPUs (``Simulator._adopt``).
    """
    if current is None:
        return 0.0
    if current.colocated and mode == "async":  # the time-shared training moves onto the split's GPUs
        return _costs(ev, cluster).shared_to_async(current, instances).total_s
    cost = _costs(ev, cluster).transition(current, n_train, train, instances).total_s
    wait = float(current.predicted_train_s) if in_force_train_s is None else float(in_force_train_s)
    if mode == "async" and not current.colocated and n_train < current.n_train_gpus and np.isfinite(wait):
        cost += wait
    return cost
