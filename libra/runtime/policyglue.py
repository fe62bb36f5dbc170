"""The policy core as the runtime uses it: resolving a policy name (Libra's, or a simulator
baseline), the cluster it plans for, and plan adjustments a run config may pin.

Baselines live in ``sim.baselines``; importing ``sim`` here (lazily, only for a baseline name)
is the one place the runtime reaches into the simulator package, because the issue asks that
``--policy`` accept the same names as ``libra-sim replay``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.plan import Bucket, Plan, RolloutInstance
from libra.policy import Policy


def known_policies() -> list[str]:
    """Every policy name ``make_policy`` accepts: the simulator's (baselines included) when the
    simulator is installed, then the core's own."""
    from libra.policies import POLICIES

    known = list(POLICIES)
    try:
        from sim.policies import policy_names
    except ImportError:  # the simulator's baselines are not installed: Libra's own policies only
        return known
    return list(dict.fromkeys([*policy_names(), *known]))


def make_policy(name: str, cluster: ClusterSpec, ev: Any, seed: int, kl: bool) -> Policy:
    """The named policy, sharing ``ev`` (the run's cost evaluator)."""
    from libra.policies import POLICIES

    if name in POLICIES:
        return POLICIES[name](cluster, ev=ev, seed=seed, kl=kl)
    try:
        from sim.policies import policy_names, resolve
    except ImportError:
        raise UserError(f"policy {name!r} is unknown; known: {', '.join(POLICIES)}") from None
    if name not in policy_names():
        raise UserError(f"policy {name!r} is unknown; known: {', '.join(policy_names())}")
    from sim.costs import SimCosts

    # the run's evaluator, so a simulator baseline plans with the run's calibration too
    costs = SimCosts(ev, gpus_per_node=cluster.gpus_per_node)
    return resolve(name, cluster, costs=costs, seed=seed, kl=1.0 if kl else 0.0)


def pin_plan(plan: Plan, split: tuple[int, int] | None, bounds: list[int] | None, per_node: int) -> Plan:
    """``plan`` with a pinned ROLLOUT:TRAIN split (TP-1 rollout instances on the rollout side, a
    DP trainer on the rest) and/or forced bucket boundaries (instances dealt round-robin)."""
    if split is not None:
        r, t = split
        insts = tuple(RolloutInstance(i, 1, 0, i // per_node, i % per_node) for i in range(r))
        plan = replace(plan, n_rollout_gpus=r, n_train_gpus=t, instances=insts, colocated=False,
                       buckets=(Bucket(0, 1, 0, None),), train=replace(plan.train, tp=1, pp=1, dp=t))
    if bounds:
        n_b = min(len(bounds) + 1, len(plan.instances))
        edges = [0, *bounds[: n_b - 1], None]
        tps = sorted(i.tp for i in plan.instances)
        buckets = tuple(Bucket(b, tps[min(b, len(tps) - 1)], edges[b], edges[b + 1]) for b in range(n_b))  # type: ignore[arg-type]
        insts = tuple(replace(inst, bucket=k % n_b) for k, inst in enumerate(sorted(plan.instances, key=lambda i: (i.tp, i.id))))
        plan = replace(plan, buckets=buckets, instances=tuple(sorted(insts, key=lambda i: i.id)))
    return plan


def plan_shape(plan: Plan) -> tuple[Any, ...]:
    """What the actors depend on: instances (id, tp, node), trainer size, colocation."""
    return (tuple((i.id, i.tp, i.node) for i in plan.instances), plan.n_train_gpus, plan.train.dp, plan.colocated)


def pool_summary(steps: int, steps_with_pool: int, consulted: int, consulted_training: int, lent: int, streaming: bool = False,
                 declined: int = 0) -> str:
    """The run's one line on the elastic pool: how often it was consulted (``steps_with_pool``:
    steps whose policy had a pool; a colocated plan has none), of that how often with training
    running, what it lent, and why it lent nothing when it did not.

    The pool lends an idle rollout instance only while training is running
    (``PoolObservation.training_running``): a lent device must have an update to join. Without
    ``streaming`` the loop trains only after the rollout, so every consultation happens with
    training stopped and the pool cannot lend; with it, training runs while the tail drains and
    whether it lends is the pool's own rules (grace, last instance of a bucket, payoff against the
    role-change round trip). ``declined``: role changes the trainer could not take (deepspeed).
    The line says which, from the counts, rather than leave a ``lent`` column unexplained.
    """
    if steps_with_pool == 0:
        return f"elastic pool: the policy has none in {steps} step(s); no worker lent"
    head = (f"elastic pool: consulted {consulted} times in {steps_with_pool} of {steps} step(s) "
            f"({consulted_training} with training running), lent {lent} worker(s)") if streaming else \
        f"elastic pool: consulted {consulted} times in {steps_with_pool} of {steps} step(s), lent {lent} worker(s)"
    if declined:
        head += f", declined {declined} role change(s) (the trainer could not take helpers: deepspeed, or a trainer restart pending)"
    if lent == 0 and consulted > 0 and consulted_training == 0:
        if streaming:
            return head + ": no streamed mini-batch was running when it was consulted"
        return (head + ": it lends only while training runs, and with streaming off libra-run's synchronous loop trains only "
                "after rollout ends, so training was never running when it was consulted")
    if lent == 0 and consulted == 0:
        return head + ": no rollout event consulted it"
    if lent == 0 and declined == 0 and streaming:
        return head + ": its rules (idle for grace_s, not a bucket's last instance, remaining rollout worth the role-change round trip) never held"
    return head


def plan_from_prior(plan: Plan, measured_steps: int) -> bool:
    """Whether the plan's predictions rest on a length prior rather than measured steps: the
    planner says so (``notes['from_prior']``); a policy that does not (the static baselines plan
    once, from their own prior) is on a prior while no step has been measured."""
    prior = plan.notes.get("from_prior")
    return bool(prior) if prior is not None else measured_steps == 0


def describe_plan(plan: Plan, measured_steps: int | None = None) -> str:
    """One log line: the split, rollout instances and buckets, the training strategy and the
    plan's predictions, and where they come from: a step planned from the length prior (no step
    measured yet) is a guess for trajectories of the prior's length, often far off the first
    measured step, and the line says so rather than print it like a measured-history one."""
    if plan.colocated:
        split = f"colocated on {plan.n_rollout_gpus} devices"
    else:
        split = f"split {plan.n_rollout_gpus}:{plan.n_train_gpus}"
    buckets = ", ".join(f"b{b.index} TP{b.tp} [{b.min_context}, {'inf' if b.max_context is None else b.max_context})" for b in plan.buckets)
    tps = "/".join(str(i.tp) for i in plan.instances)
    t = plan.train
    prior = plan.notes.get("from_prior")
    if measured_steps is not None:
        prior = plan_from_prior(plan, measured_steps)
    origin = "" if prior is None else (" (from measured steps)" if not prior else
                                       " (a guess from the length prior: no step measured yet, so it assumes prior-length "
                                       "trajectories; later steps are planned from measured ones)")
    return (f"{split}; rollout instances TP {tps}; buckets {buckets}; training TP{t.tp} PP{t.pp} DP{t.dp} ZeRO-{t.zero_stage}; "
            f"predicted rollout {plan.predicted_rollout_s:.2f} s, train {plan.predicted_train_s:.2f} s{origin}")
