"""What the emitters share: what a framework can express (``Capabilities``), the plan handed to an
emitter (``ExportPlan``), and what it returns (``Emitted``).

Why a module of its own: the registry, the nearest-plan search (``fit.py``) and every emitter
need these types, and the emitters must not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.planner.plan import Plan, TrainConfig


@dataclass(frozen=True)
class Capabilities:
    """The plans a framework's configuration can say.

    ``colocated``: rollout and training time-share the GPUs (verl's hybrid engine);
    ``split_sync``: disaggregated on-policy; ``streaming``: on-policy with training on finished
    mini-batches while the rollout runs; ``max_staleness``: the largest async staleness bound it
    has a knob for (0: no async loop); ``whole_nodes``: a disaggregated split must give the
    rollout whole nodes once the cluster has more than one. Every framework here runs one rollout
    TP degree for all instances and has no context buckets, so a plan with two buckets or two TP
    degrees is never expressible. ``node_pools``: rollout and training are each a pool of
    ``nodes x GPUs per node`` (verl's ``nnodes``/``n_gpus_per_node``, slime's actor nodes), one
    Ray placement group per node share, which must pack onto the cluster's nodes.
    """

    colocated: bool
    split_sync: bool
    streaming: bool
    max_staleness: int
    whole_nodes: bool = False
    node_pools: bool = False


@dataclass(frozen=True)
class ExportPlan:
    """A plan as an emitter needs it: the planner's ``plan`` (one bucket, one TP by the time an
    emitter sees it), the training strategy the framework will actually run (``train``: the
    plan's, or its nearest expressible one, see ``fit.py``), the cluster's node size, the
    optimizer steps per RL step (``mini_batches``, the planner's ``SearchOptions.mini_batches``),
    the trajectories planned for and the longest sequence the plan's memory was checked at."""

    plan: Plan
    train: TrainConfig
    train_backend: str  # "fsdp" or "megatron": which of the framework's trainers runs ``train``
    gpus_per_node: int
    mini_batches: int
    n_trajectories: int
    seq_max: int

    @property
    def rollout_tp(self) -> int:
        return self.plan.buckets[0].tp

    @property
    def n_instances(self) -> int:
        return len(self.plan.instances)

    @property
    def rollout_gpus(self) -> int:
        """GPUs the rollout engines occupy (instances x TP; a disaggregated plan may leave a few
        of its rollout GPUs idle when they do not make up a whole instance)."""
        return self.n_instances * self.rollout_tp


@dataclass
class Emitted:
    """One framework configuration: ``keys`` in order (dotted config keys, or launch flags for
    slime, each with its value; ``True`` for a bare flag), the ``text`` a user runs or pastes,
    the ``schema`` names it is validated against, and ``notes`` (what could not be said exactly)."""

    framework: str
    layout: str
    keys: dict[str, object]
    text: str
    schemas: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def plan_pools(x: "ExportPlan", framework: str) -> tuple[tuple[int, int] | None, tuple[int, int]]:
    """``(rollout pool, training pool)`` as (nodes, GPUs per node) for the frameworks whose pools
    are placement groups (verl, slime): a colocated plan has one pool, the training one (rollout
    None); a split plan's come from ``pool_shapes`` (``fit.py`` re-plans splits that have none
    before they reach an emitter, so None there is a bug, raised naming the framework)."""
    p = x.plan
    if p.colocated:
        return None, node_shape(p.n_train_gpus, x.gpus_per_node)
    shapes = pool_shapes(x.rollout_gpus, x.rollout_tp, p.n_train_gpus, x.rollout_gpus + p.n_train_gpus, x.gpus_per_node)
    if shapes is None:
        raise ValueError(f"{framework}: no node pools for {x.rollout_gpus} rollout + {p.n_train_gpus} training GPUs")
    return shapes

def node_shape(n_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) that make ``n_gpus`` as the frameworks' resource pools take them
    (``nnodes x n_gpus_per_node``): one node when it fits, whole nodes when ``n_gpus`` is a
    multiple of the node, else the fewest nodes with an equal share each (12 on 8-GPU nodes: 2 x 6)."""
    if n_gpus <= gpus_per_node:
        return 1, n_gpus
    for nodes in range(-(-n_gpus // gpus_per_node), n_gpus + 1):
        if n_gpus % nodes == 0 and n_gpus // nodes <= gpus_per_node:
            return nodes, n_gpus // nodes
    return n_gpus, 1  # unreachable: nodes = n_gpus always divides


def pool_shapes(n_rollout: int, rollout_tp: int, n_train: int, n_gpus: int, gpus_per_node: int
                ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``((nodes, GPUs per node) of the rollout pool, (nodes, GPUs per node) of the training
    pool)`` for frameworks whose pools are ``nnodes x n_gpus_per_node`` placement groups (verl,
    slime): equal shares of at most a node, a rollout share a multiple of the rollout TP (an
    engine never spans two shares), both pools packing onto the cluster's nodes; the fewest
    shares first. None when no such shapes exist."""
    from libra.planner.packing import fits

    def shapes(n: int, unit: int) -> list[tuple[int, int]]:
        return [(n // g, g) for g in range(min(n, gpus_per_node), 0, -1) if n % g == 0 and g % unit == 0]

    best = None
    for rn, rg in shapes(n_rollout, rollout_tp):
        for tn, tg in shapes(n_train, 1):
            if (best is None or rn + tn < best[0]) and fits(n_gpus, gpus_per_node, [rg] * rn + [tg] * tn):
                best = (rn + tn, (rn, rg), (tn, tg))
    return None if best is None else (best[1], best[2])
