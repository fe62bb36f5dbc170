"""What a policy knows about the cluster it plans for."""

from __future__ import annotations

from dataclasses import dataclass

from libra.errors import UserError


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous GPU cluster: ``n_gpus`` GPUs of one catalog kind, ``gpus_per_node`` a node.

    ``gpu`` and ``model`` are catalog names of ``cost_models`` (or a config.json path for the
    model). A TP group never crosses an NVLink domain (the node on HGX boards; the GPU spec's
    ``nvlink_domain``, 72 GPUs over 4-GPU trays, on GB200 NVL72). ``max_context``: the longest context a
    trajectory may reach when the workload has a hard limit (a run's context cap); before any step
    has completed, the planner's length prior is scaled into it rather than planning for
    trajectories that cannot exist. None: unknown (the prior is used as documented).

    ``max_train_gpus``: the most devices the training backend can use, e.g. 1 for a
    single-process trainer (``libra-run --trainer torch``). Planners never give training more, so
    the devices a bigger split would leave idle go to rollout instead; a colocated plan trains on
    ``train_gpu_cap`` of its devices. None: no limit (the backend runs any TP x PP x DP).

    ``engine``: the inference-engine profile the rollout is timed with (``cost_models.engines``:
    a bundled name such as ``vllm-2024``, or a profile JSON file). None: the cost model's default.

    ``max_response_tokens``, ``max_turns``: the workload's other declared limits (generated
    tokens per trajectory, turns per trajectory; a trace header's keys), and ``workload``: its
    declared kind (``swe``, ``search``, ``math``; a trace header's ``workload``). Like
    ``max_context`` they shape the first step's length prior (``libra.planner.stats.PriorSpec``);
    None: unknown. ``group_size``: GRPO samples per prompt (a trace header's ``group_size``, a
    run's configuration): the prior's trajectories come in groups of it, as a streamed update
    trains on whole groups; None: unknown (each prior trajectory its own group).
    """

    n_gpus: int
    gpu: str
    model: str
    gpus_per_node: int = 8
    max_context: int | None = None
    max_train_gpus: int | None = None
    engine: str | None = None
    max_response_tokens: int | None = None
    max_turns: int | None = None
    workload: str | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.max_train_gpus is not None and self.max_train_gpus < 1:
            raise UserError(f"max_train_gpus must be a positive device count or unset, got {self.max_train_gpus}")

    @property
    def n_nodes(self) -> int:
        """Nodes, the last one possibly partial."""
        return -(-self.n_gpus // self.gpus_per_node)

    @property
    def train_gpu_cap(self) -> int:
        """The most devices a plan may give training: ``max_train_gpus`` clipped to the cluster."""
        return self.n_gpus if self.max_train_gpus is None else min(self.n_gpus, self.max_train_gpus)
