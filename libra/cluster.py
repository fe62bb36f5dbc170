"""What a policy knows about the cluster it plans for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous GPU cluster: ``n_gpus`` GPUs of one catalog kind, ``gpus_per_node`` a node.

    ``gpu`` and ``model`` are catalog names of ``cost_models`` (or a config.json path for the
    model). A TP group never crosses a node boundary. ``max_context``: the longest context a
    trajectory may reach when the workload has a hard limit (a run's context cap); before any step
    has completed, the planner's length prior is scaled into it rather than planning for
    trajectories that cannot exist. None: unknown (the prior is used as documented).
    """

    n_gpus: int
    gpu: str
    model: str
    gpus_per_node: int = 8
    max_context: int | None = None

    @property
    def n_nodes(self) -> int:
        """Nodes, the last one possibly partial."""
        return -(-self.n_gpus // self.gpus_per_node)
