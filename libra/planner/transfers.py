"""Weight sync and plan-transition costs of a candidate plan (from the cost evaluator).

* ``weight_sync_s``: after training, the new weights go to every rollout instance
  (``CostEvaluator.weight_sync_s``, broadcast form; NVLink only when training and all rollout
  instances share one NVLink domain: a node, or a GB200 NVL72 rack).
* ``transition_s``: switching from the plan in force to another costs role changes
  (``CostEvaluator.role_change_s``, one GPU through host memory; GPUs of a role change in
  parallel, so the charge is one GPU's time per direction that occurs): GPUs that move from
  rollout to training load a training shard; GPUs that move to rollout (or whose instance TP
  changes) load rollout weights and start with an empty KV cache; a changed training strategy
  re-shards the trainer (a training-side role change). Nothing changes: 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.costs import CostModel, nvlink_domain, to_strategy
from libra.planner.plan import Plan, RolloutInstance, TrainConfig


def weight_sync_s(
    ev: CostModel, cluster: ClusterSpec, n_train: int, train: TrainConfig | None, instances: Sequence[RolloutInstance]
) -> float:
    """Seconds to push trained weights into ``instances``. With ``train`` None (strategy not
    chosen yet) it returns 0, the trivial lower bound the search's branch and bound uses."""
    if not instances:
        return 0.0
    if train is None:
        return 0.0
    same_node = cluster.n_gpus <= nvlink_domain(getattr(ev, "gpu", None), cluster.gpus_per_node)  # one NVLink domain
    tps = [i.tp for i in instances]
    return float(ev.weight_sync_s(n_train_gpus=n_train, rollout_tps=tps, same_node=same_node, strategy=to_strategy(train)))


def transition_s(
    ev: CostModel,
    cluster: ClusterSpec,
    current: Plan | None,
    n_train: int,
    train: TrainConfig,
    instances: Sequence[RolloutInstance],
    mode: str = "sync",
) -> float:
    """One-off cost of moving from ``current`` to the candidate (0 without a current plan).

    Async mode: GPUs that move from training to rollout are still training the previous step
    (its training overlaps this rollout) and serve rollout only once it ends, so the move also
    costs the in-force plan's predicted training time (``current.predicted_train_s``): the
    rollout work placed on those instances waits that long. Measured before this charge: a
    32:16 -> 36:12 move on the SWE trace (48 A800s) made one rollout 711 s instead of ~460 s.
    """
    if current is None:
        return 0.0
    if current.colocated:  # every GPU switches role twice per step anyway: the layout is free to change
        return 0.0
    cost = 0.0
    new_tps = Counter(i.tp for i in instances)
    old_tps = Counter(i.tp for i in current.instances)
    if n_train > current.n_train_gpus or train != current.train:
        cost += float(ev.role_change_s("train", strategy=to_strategy(train)))  # type: ignore[attr-defined]
    if n_train < current.n_train_gpus or new_tps != old_tps:
        changed = (new_tps - old_tps) or new_tps
        cost += float(ev.role_change_s("rollout", rollout_tp=max(changed)))  # type: ignore[attr-defined]
    if mode == "async" and n_train < current.n_train_gpus and np.isfinite(current.predicted_train_s):
        cost += float(current.predicted_train_s)
    return cost
