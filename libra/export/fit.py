"""The nearest plan a framework can express, and its predicted cost.

A framework that cannot say a plan (two context buckets or two rollout TP degrees, streaming,
more staleness than it has a knob for, a colocated plan where it only disaggregates, a split that
is not whole nodes) gets the planner's best plan *within* what it can say: the same search,
restricted by ``SearchOptions`` (one bucket, no streaming, the staleness capped, no time-shared
plan, whole-node splits where the framework's pools must pack on nodes: the nearest such plan
the search can be steered to, possibly farther than a packable uneven split), over the same history and prompts, so its predicted cost is the
planner's own price, not an estimate of the difference.

A training strategy a framework's trainers cannot run as planned (its ZeRO stage: Megatron's
distributed optimizer is ZeRO-1, FSDP shards parameters, ZeRO-3) is replaced by the fastest
strategy on the same GPUs that they do run (``TrainerMap``) and that fits the memory model at the
sequence length the plan was checked at: the decision tree's own walk, unbounded, filtered, and
timed by its timer; the step is repriced with that training stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from libra.errors import UserError
from libra.export.target import Capabilities, ExportPlan, pool_shapes
from libra.planner.plan import Plan, TrainConfig
from libra.planner.search import Planner, SearchResult, step_time

#: a framework's map from a planned training strategy to (trainer name, the strategy it runs)
TrainerMap = Callable[[TrainConfig], tuple[str, TrainConfig]]


@dataclass
class Fitted:
    """The plan an emitter writes (``export``), what changed on the way (``notes``, one line
    each) and its predicted times (SIMULATED: the planner's cost model)."""

    export: ExportPlan
    notes: list[str]
    train_s: float
    step_s: float


def inexpressible(plan: Plan, caps: Capabilities, n_gpus: int, gpus_per_node: int) -> list[str]:
    """Why ``caps`` cannot say ``plan`` (empty: it can)."""
    why = []
    tps = sorted({i.tp for i in plan.instances})
    if len(plan.buckets) > 1 or len(tps) > 1:
        why.append(f"{len(plan.buckets)} context buckets on rollout TP {'/'.join(map(str, tps))} (one TP degree, no buckets)")
    if plan.colocated and not caps.colocated:
        why.append("a colocated (time-shared) plan (it disaggregates rollout and training)")
    if plan.colocated and caps.colocated and plan.n_train_gpus < plan.n_rollout_gpus:
        why.append(f"a time-shared plan training on {plan.n_train_gpus} of its {plan.n_rollout_gpus} GPUs (its colocated "
                   f"mode trains on every GPU it rolls out on)")
    if not plan.colocated and plan.mode == "sync" and not plan.streaming and not caps.split_sync:
        why.append("a disaggregated on-policy loop")
    if plan.streaming and not caps.streaming:
        why.append("sync + streaming (training on finished mini-batches while the rollout runs)")
    if plan.mode == "async" and plan.max_staleness > caps.max_staleness:
        why.append(f"async staleness {plan.max_staleness} (at most {caps.max_staleness})" if caps.max_staleness
                   else "an async loop")
    if (caps.whole_nodes and not plan.colocated and n_gpus > gpus_per_node
            and plan.n_rollout_gpus % gpus_per_node):
        why.append(f"{plan.n_rollout_gpus} rollout GPUs on {gpus_per_node}-GPU nodes (rollout gets whole nodes)")
    if caps.node_pools and not plan.colocated and plan.instances:
        tp = plan.instances[0].tp
        if pool_shapes(len(plan.instances) * tp, tp, plan.n_train_gpus, n_gpus, gpus_per_node) is None:
            why.append(f"a {plan.n_rollout_gpus}:{plan.n_train_gpus} split whose rollout and training pools (equal "
                       f"node shares) do not pack on {gpus_per_node}-GPU nodes")
    return why


def restricted(planner: Planner, caps: Capabilities) -> Planner:
    """A planner for the same cluster and evaluator whose search only visits plans ``caps`` can say."""
    o = planner.options
    k = min(o.max_staleness, caps.max_staleness)
    mode = "sync" if o.mode == "async" and k < 1 else o.mode  # with K 0 an unpinned search prices on-policy loops only
    n, gpn = planner.cluster.n_gpus, planner.cluster.gpus_per_node
    # whole-node splits always pack (node pools included; the packing test itself cannot steer the search)
    unit = gpn if (caps.whole_nodes or caps.node_pools) and n > gpn and n % gpn == 0 else o.unit
    opts = replace(o, max_buckets=1, max_staleness=k, mode=mode,
                   streaming=False if not caps.streaming else (None if o.streaming is None else o.streaming),
                   colocated=o.colocated and caps.colocated, colocated_subset=False, unit=unit)
    return Planner(planner.cluster, ev=planner.ev, options=opts)


def fit(planner: Planner, res: SearchResult, history: Sequence[Any], prompts: Any, caps: Capabilities,
        trainers: TrainerMap) -> Fitted:
    """The plan to emit for a framework with ``caps`` and trainers ``trainers``: the planner's own
    plan when the framework can say it, else the best one it can (see the module docstring)."""
    cl = planner.cluster
    plan = planner.to_plan(res)
    notes: list[str] = []
    why = inexpressible(plan, caps, cl.n_gpus, cl.gpus_per_node)
    if why:
        was = plan.predicted_step_s
        planner = restricted(planner, caps)
        res = planner.search(history, prompts)
        plan = planner.to_plan(res)
        left = inexpressible(plan, caps, cl.n_gpus, cl.gpus_per_node)
        if left:  # the restricted search is built to avoid these; say so rather than emit a wrong config
            raise AssertionError(f"restricted search still returned an inexpressible plan: {'; '.join(left)}")
        notes.append(f"cannot express {', '.join(why)}; emitting the nearest plan it can: {_loop(plan)}, "
                     f"predicted step {plan.predicted_step_s:.1f} s vs {was:.1f} s planned (SIMULATED)")
    _, seq, seq_max = planner.train_shape(res.stats)
    tokens = planner.train_shape(res.stats)[0]
    backend, train = trainers(plan.train)
    train_s, step_s = plan.predicted_train_s, plan.predicted_step_s
    if train != plan.train:
        alt = _nearest_strategy(planner, plan.n_train_gpus, tokens, seq, seq_max, trainers)
        if alt is None:
            raise UserError(f"no training strategy its trainers run fits on {plan.n_train_gpus} GPUs per Libra's memory "
                            f"model (the plan needs {plan.train}); try more GPUs or a bigger GPU")
        (backend, train), new = alt
        old = planner.tree_time(plan.train, tokens, seq)
        r, sync = plan.predicted_rollout_s, float(plan.notes.get("sync_s", 0.0))  # type: ignore[arg-type]
        train_s = plan.predicted_train_s + (new - old)
        f = float(plan.notes.get("rollout_factor", 1.0))  # type: ignore[arg-type]
        load, cohort = plan.notes.get("rollout_throughput_s"), plan.notes.get("rollout_cohort_s")
        pipe = float(plan.notes.get("pipelined_factor", 1.0))  # type: ignore[arg-type]
        load_s = float(load) * f * pipe if isinstance(load, (int, float)) else None
        cohort_s = float(cohort) * f * pipe if isinstance(cohort, (int, float)) else None
        k = plan.max_staleness
        step_s = (plan.predicted_step_s + step_time(plan.mode, r, train_s, sync, load_s, k, cohort_s)
                  - step_time(plan.mode, r, plan.predicted_train_s, sync, load_s, k, cohort_s))
        notes.append(f"its trainers cannot run the planned {_shape(plan.train)}; the fastest they run that fits: {backend} "
                     f"{_shape(train)}: training {train_s:.1f} s vs {plan.predicted_train_s:.1f} s, step {step_s:.1f} s (SIMULATED; "
                     f"the training stage repriced, the rest as planned)")
    export = ExportPlan(plan=plan, train=train, train_backend=backend, gpus_per_node=cl.gpus_per_node,
                        mini_batches=planner.options.mini_batches, n_trajectories=res.stats.n_trajectories, seq_max=seq_max)
    if not plan.colocated and export.rollout_gpus < plan.n_rollout_gpus:
        notes.append(f"{plan.n_rollout_gpus - export.rollout_gpus} of the plan's {plan.n_rollout_gpus} rollout GPUs make no "
                     f"whole TP-{export.rollout_tp} instance and stay idle, as planned")
    return Fitted(export, notes, train_s, step_s)


def _nearest_strategy(planner: Planner, n_gpus: int, tokens: int, seq: int, seq_max: int,
                      trainers: TrainerMap) -> tuple[tuple[str, TrainConfig], float] | None:
    """The fastest strategy on ``n_gpus`` that fits memory and that the framework's trainers run
    as it is (``trainers(cfg)`` returns it unchanged), timed as the decision tree times its
    leaves; None when none fits."""
    from libra.planner.decision_tree import enumerate_strategies, sequence_count, training_time_fn

    costs = planner.step_costs
    tree = enumerate_strategies(costs.ev, n_gpus, sequence_count(tokens, seq), seq_max, planner.cluster.gpus_per_node,
                                training_time_fn(costs, tokens, seq, planner.options.kl), bound=False)
    for t, cfg in tree.ranked:  # fastest first
        backend, runs = trainers(cfg)
        if runs == cfg:
            return (backend, cfg), float(t)
    return None


def _shape(t: TrainConfig) -> str:
    return (f"TP{t.tp} PP{t.pp} DP{t.dp}" + (f" EP{t.ep}" if t.ep > 1 else "") + f" ZeRO-{t.zero_stage} micro-batch {t.micro_batch}"
            + (" recompute" if t.recompute else ""))


def _loop(plan: Plan) -> str:
    layout = "colocated" if plan.colocated else f"{plan.n_rollout_gpus} rollout + {plan.n_train_gpus} training GPUs"
    loop = "async K=" + str(plan.max_staleness) if plan.mode == "async" else ("sync+streaming" if plan.streaming else "sync")
    return f"{layout}, {loop}, {len(plan.instances)} x TP{plan.buckets[0].tp}"
