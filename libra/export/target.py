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
    degrees is never expressible.
    """

    colocated: bool
    split_sync: bool
    streaming: bool
    max_staleness: int
    whole_nodes: bool = False


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
