"""The policy core as the runtime uses it: resolving a policy name (any in the one registry,
``libra.policies``: Libra's, its ablations', the baselines'), refusing up front the policies a
real run cannot execute, the options it is built with (the run's loop options and its pin of split/bucket bounds, which
the core applies: ``libra.policies.pinned``), and the plan's log line.

It imports only the core: the runtime and the simulator are two backends of the same policies
and never import each other. A real run offers no capability beyond the observations
(``RUNTIME_OFFERS`` is empty): it cannot hand the ``oracle`` a step's future, nor replay the
trace for ``areal-static-optimal``'s hindsight search, so ``check_policy`` refuses both with the
registry's reason when the configuration is read (``libra.runtime.config``), before Ray starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libra.cluster import ClusterSpec
from libra.planner.plan import Plan
from libra.policies import PlanPin, PolicyOptions, check_backend, policy_names, resolve
from libra.policy import Policy

#: What ``libra-run`` offers a policy beyond the observations (``libra.policies.CAPABILITIES``): nothing.
RUNTIME_OFFERS: frozenset[str] = frozenset()


def known_policies() -> list[str]:
    """Every policy name the registry knows (``check_policy`` says which a real run cannot run)."""
    return list(policy_names())


def check_policy(name: str) -> None:
    """``UserError`` if ``name`` is unknown or needs what a real run cannot offer (the step's
    future, hindsight replay), with the reason and what to run instead."""
    check_backend(name, RUNTIME_OFFERS, "libra-run")


def make_policy(name: str, cluster: ClusterSpec, ev: Any, seed: int, kl: bool, *, streaming: bool | None = None,
                mini_batches: int = 4, split: tuple[int, int] | None = None, bucket_bounds: Sequence[int] | None = None,
                per_node: int = 1, run_steps: int | None = None, max_staleness: int = 0) -> Policy:
    """The named policy, sharing ``ev`` (the run's cost evaluator, so a baseline plans with the
    run's calibration too), with the run's loop options: ``streaming`` (None: the policy chooses
    whether a split plan streams, True/False: the user pinned it, as ``libra-sim --streaming``
    does) and ``mini_batches`` (the optimizer steps per RL step the streamed loop is priced
    with), and the run's pin of ``split``/``bucket_bounds`` as part of the policy
    (``libra.policies.pinned``): the plan it returns is the pinned plan the run executes and
    records; ``run_steps`` the run's length (a plan change is amortized over at most the steps
    left); ``max_staleness`` the staleness class K (0: on-policy loops only; K >= 1: the policy
    may plan the asynchronous loop, with staleness <= K, as ``libra-sim --max-staleness K``). The
    async loop it prices is libra-run's: each step's rollout a batch whose tail gates the next
    (``PolicyOptions.continuous`` False; ``libra-sim --async-generation per-step``)."""
    check_policy(name)
    pin = PlanPin(split, tuple(bucket_bounds) if bucket_bounds else None, per_node)
    return resolve(name, cluster, PolicyOptions(ev=ev, seed=seed, kl=kl, max_staleness=int(max_staleness), streaming=streaming,
                                                mini_batches=mini_batches, pin=pin, run_steps=run_steps, continuous=False))


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
        return (head + ": it lends only while training runs, and in steps that do not stream (the plan's loop, or streaming: "
                "false) libra-run's synchronous loop trains only after rollout ends, so training was never running when it was consulted")
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
    pin = plan.notes.get("pinned")
    pinned = f"; pinned ({pin}): the predictions are those of the plan the policy chose before the pin" if pin else ""
    return (f"{split}; rollout instances TP {tps}; buckets {buckets}; training TP{t.tp} PP{t.pp} DP{t.dp} ZeRO-{t.zero_stage}; "
            f"predicted rollout {plan.predicted_rollout_s:.2f} s, train {plan.predicted_train_s:.2f} s{origin}{pinned}")
