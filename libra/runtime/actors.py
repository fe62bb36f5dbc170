"""Ray actors: rollout engines, training workers and the tool server, with their placement.

Each rollout instance is one ``EngineActor`` in its own ``STRICT_PACK`` placement group of
``tp`` one-device bundles (``engine_layout``: the TP group never crosses a node; on GPUs with
TP >= 2 the actor takes no GPU itself and vLLM's Ray executor starts one worker per bundle, as
verl and OpenRLHF place vLLM). The trainer's workers share one placement group (``PACK``) and
rendezvous at the rank-0 worker's node (``rendezvous``). A bundle is ``{"GPU": 1}`` on GPU clusters and ``{"CPU": 1}`` for CPU
workers; actors and tasks outside those groups (the tool server, the driver's helpers) ask for
``num_cpus=0``, since a placement group may hold every CPU and a task asking for one would wait
forever.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

RESOURCE_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}


def make_group(n: int, use_gpu: bool, strategy: str, frac: float = 1.0, timeout_s: float = 60.0,
               bundles: list[dict[str, float]] | None = None) -> PlacementGroup:
    """A placement group of ``n`` one-device bundles (or the given ``bundles``), ready (or a clear
    error after ``timeout_s``). ``frac`` < 1 shares each device between roles (a colocated plan:
    rollout and training time-share the same devices)."""
    from libra.errors import UserError

    bundle = {"GPU": frac} if use_gpu else {"CPU": frac}
    specs = [dict(b) for b in bundles] if bundles is not None else [dict(bundle) for _ in range(n)]
    n = len(specs)
    pg = placement_group(specs, strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        kind = "GPUs" if use_gpu else "CPU workers"
        raise UserError(f"Ray could not place {n} {kind} together ({strategy}) within {timeout_s:.0f} s; the cluster has "
                        f"{ray.cluster_resources()} (lower 'devices' or the plan's TP)")
    return pg


def _in_group(pg: PlacementGroup, bundle: int | None = None, capture: bool = False) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=-1 if bundle is None else bundle,
                                            placement_group_capture_child_tasks=capture)


@ray.remote(max_restarts=0)
class EngineActor:
    """One rollout instance: an engine (see ``engines``) behind Ray calls."""

    def __init__(self, instance: int, kind: str, model_dir: str, opts: dict[str, Any], env: dict[str, str] | None = None,
                 unset_visible_devices: bool = False) -> None:
        os.environ.update(RESOURCE_ENV)
        os.environ.update(env or {})
        if unset_visible_devices:  # the actor holds no GPU; vLLM's Ray workers each get theirs from a bundle
            for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
                os.environ.pop(var, None)
        from libra.runtime.engines import make_engine

        self.instance = instance
        self.engine = make_engine(kind, model_dir, **opts)
        self.helper: Any = None  # a GradHelper while lent to training
        # the policy version of the weights it holds (``staleness``): 0 for the model folder's,
        # set by every weight load; reported with each turn it generates
        self.version = 0

    def generate(self, requests: list[Any]) -> list[Any]:
        """One engine call; every result carries the call's wall time in ``extra["call_s"]``
        (the engine's busy time: a batched engine's per-request times overlap) and the policy
        version it was generated with in ``extra["version"]`` (weights load between calls: an
        actor runs one call at a time, so one call is one version)."""
        import time
        from dataclasses import replace

        t0 = time.perf_counter()
        outs = self.engine.generate(requests)
        call_s = time.perf_counter() - t0
        return [replace(r, instance=self.instance, extra={**r.extra, "call_s": call_s, "version": self.version}) for r in outs]

    def prefill(self, traj_id: str, context: tuple[int, ...]) -> tuple[int, float]:
        return self.engine.prefill(traj_id, context)

    def drop(self, traj_ids: list[str]) -> int:
        return self.engine.drop(traj_ids)

    def load_state_dict(self, state: dict[str, Any], version: int | None = None) -> float:
        """Load new weights (``version``: their policy version; None keeps the count)."""
        secs = self.engine.load_state_dict(state)
        if version is not None:
            self.version = int(version)
        return secs

    def sleep(self) -> int:
        """Release the engine's device memory for a colocated trainer (``wake`` undoes it)."""
        fn = getattr(self.engine, "sleep", None)
        return int(fn()) if fn is not None else 0

    def wake(self) -> None:
        fn = getattr(self.engine, "wake", None)
        if fn is not None:
            fn()

    def weight_sync_kind(self) -> bool:
        """True when this engine receives weights by NCCL broadcast (vLLM on GPUs)."""
        return bool(getattr(self.engine, "nccl_sync", False))

    def join_weight_group(self, master: str, port: int, offset: int, world: int) -> None:
        """vLLM on GPUs: this instance's workers join the trainer's NCCL broadcast group."""
        self.engine.join_weight_group(master, port, offset, world)

    def receive_weights(self, meta: dict[str, list[Any]], version: int | None = None) -> float:
        """vLLM on GPUs: receive the trainer's broadcast (blocks until it has arrived)."""
        secs = self.engine.receive_weights(meta)
        if version is not None:
            self.version = int(version)
        return secs

    def weight_version(self) -> int:
        """The policy version of the weights this engine holds."""
        return self.version

    def cached_tokens(self) -> int:
        return self.engine.cached_tokens()

    # ---- lent to training (the elastic pool): a gradient helper (``helper``) -----------------
    def join_training(self, opts: dict[str, Any], behaviour: dict[str, Any] | None) -> float:
        """Build the trainable copy of the policy and load the step-start behaviour weights
        (None: the model folder's, which the trainer started from). Runs while training goes
        on (the driver never waits for it); returns seconds."""
        import time

        from libra.runtime.helper import GradHelper

        t0 = time.perf_counter()
        self.helper = GradHelper(**opts)
        self.helper.load(None, behaviour)
        return time.perf_counter() - t0

    def helper_load(self, current: dict[str, Any], version: int) -> float:
        """Load the trainer's current weights (``version``: its optimizer steps this step)."""
        return self.helper.load(current, None, version)

    def helper_grad(self, samples: list[Any], current: dict[str, Any] | None = None, version: int = 0) -> Any:
        """A ``GradShard`` of ``samples`` (loading ``current`` first when the trainer moved on)."""
        if current is not None:
            self.helper.load(current, None, version)
        return self.helper.grad(samples)

    def leave_training(self) -> None:
        """Back to rollout: free the trainable copy (the engine's weights are synced next)."""
        self.helper = None

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        close = getattr(self.engine, "shutdown", None)
        if close is not None:
            close()

    def crash(self) -> None:
        """Die abruptly (fault injection: a worker lost mid-step)."""
        os._exit(1)


@ray.remote(max_restarts=0)
class TrainWorker:
    """One data-parallel training worker running a ``Learner``; rank 0 also hands out weights.
    Built in two calls: the actor, then ``setup`` with the rendezvous that rank 0's
    ``rendezvous()`` returned (its node IP and a port free there)."""

    def __init__(self, rank: int, world: int, learner_opts: dict[str, Any]) -> None:
        os.environ.update(RESOURCE_ENV)
        self.rank, self.world, self.learner_opts = rank, world, learner_opts
        self.learner: Any = None

    def rendezvous(self) -> tuple[str, int]:
        """This worker's node IP and a free port on it (asked of rank 0)."""
        from libra.runtime.rendezvous import node_address

        return node_address()

    def device_env(self) -> dict[str, str]:
        """The torch.distributed environment ``setup`` sets (without the rendezvous)."""
        from libra.runtime.rendezvous import local_rank

        gpus = ray.get_gpu_ids() if self.learner_opts.get("device", "cpu") == "cuda" else []
        lr = local_rank(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), self.rank)
        return {"RANK": str(self.rank), "LOCAL_RANK": str(lr), "WORLD_SIZE": str(self.world), "LOCAL_WORLD_SIZE": str(self.world)}

    def setup(self, master: str, port: int) -> int:
        """Join the process group at ``master:port`` and build the learner; returns the pid."""
        os.environ.update(self.device_env(), MASTER_ADDR=master, MASTER_PORT=str(port))
        if self.learner_opts.get("backend") == "deepspeed" and self.learner_opts.get("device", "cpu") == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from libra.runtime.trainer import Learner

        self.learner = Learner(rank=self.rank, world=self.world, local_rank=int(os.environ["LOCAL_RANK"]), **self.learner_opts)
        return os.getpid()

    def info(self) -> dict[str, Any]:
        """Where this worker met its group and how its learner was built (tests, logs)."""
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        ln = self.learner
        return {**{k: os.environ.get(k) for k in keys}, "built_partitioned": bool(getattr(ln, "built_partitioned", False)),
                "bf16": bool(getattr(ln, "bf16", False)), "zero_stage": getattr(ln, "zero_stage", None),
                "frozen_partitioned": ln is not None and ln.ref is not None and ln.zero3_partitioned(ln.ref)}

    def train_step(self, samples: list[Any], die_after: int | None = None, max_staleness: int | None = None) -> dict[str, float]:
        return self.learner.train_step(samples, die_after, max_staleness)

    def begin_step(self) -> float:
        return self.learner.begin_step()

    def train_minibatch(self, samples: list[Any], helpers: list[Any] | None = None, scale: float = 1.0, die: bool = False) -> dict[str, float]:
        return self.learner.train_minibatch(samples, helpers or (), scale, die)

    def end_step(self) -> int:
        return self.learner.end_step()

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def weight_meta(self) -> dict[str, list[Any]]:
        return self.learner.weight_meta()

    def broadcast_weights(self, master: str | None = None, port: int = 0, world: int = 0) -> float:
        return self.learner.broadcast_weights(master, port, world)

    def save_checkpoint(self, ckpt_dir: str) -> str:
        return self.learner.save_checkpoint(ckpt_dir)

    def load_checkpoint(self, ckpt_dir: str) -> int:
        return self.learner.load_checkpoint(ckpt_dir)

    def pid(self) -> int:
        return os.getpid()

    def crash(self) -> None:
        os._exit(1)


@ray.remote(num_cpus=0, max_concurrency=16)
class ToolActor:
    """The tool server: a threaded actor running up to 16 tool calls at once (each python call is
    its own sandboxed subprocess, so threads only wait)."""

    def __init__(self, opts: dict[str, Any]) -> None:
        from libra.runtime.tools import ToolBox

        self.box = ToolBox(**opts)

    def call(self, name: str, args: str) -> Any:
        return self.box.call(name, args)

    def isolation(self) -> str:
        return self.box.sandbox.network_isolation


def make_engine_group(tp: int, use_gpu: bool, kind: str, frac: float = 1.0) -> PlacementGroup:
    """The placement group of one TP-``tp`` instance: ``tp`` one-device bundles on one node."""
    from libra.runtime.engine_layout import engine_layout

    lay = engine_layout(tp, use_gpu, kind, frac)
    return make_group(tp, use_gpu, lay.strategy, bundles=list(lay.bundles))


def engine_actor_options(pg: PlacementGroup, tp: int, use_gpu: bool, kind: str, frac: float = 1.0,
                         first_bundle: int = 0) -> dict[str, Any]:
    """``EngineActor.options(...)`` for an instance in ``pg`` (``engine_layout``): its resources,
    its first bundle, and child tasks (vLLM's Ray workers) captured into the group."""
    from libra.runtime.engine_layout import engine_layout

    lay = engine_layout(tp, use_gpu, kind, frac, first_bundle)
    return {"scheduling_strategy": _in_group(pg, lay.actor_bundle, lay.capture_child_tasks), **lay.actor_resources}


def start_engine(pg: PlacementGroup, instance: int, kind: str, model_dir: str, opts: dict[str, Any], use_gpu: bool, tp: int,
                 frac: float = 1.0, first_bundle: int = 0) -> Any:
    """An ``EngineActor`` for the instance's group (``make_engine_group``, or a colocated plan's
    shared group from ``first_bundle``), laid out by ``engine_layout``: on GPUs with TP >= 2
    vLLM's Ray executor puts one worker in each of the instance's bundles."""
    from libra.runtime.engine_layout import engine_layout

    lay = engine_layout(tp, use_gpu, kind, frac, first_bundle)
    if kind == "vllm":
        opts = {**opts, "tp": tp, "executor": lay.executor}  # vLLM shards the model over the group's tp devices
    else:
        opts = {**opts, "threads": (opts.get("threads") or 1) * tp}  # the torch engine: tp CPU threads
    return EngineActor.options(**engine_actor_options(pg, tp, use_gpu, kind, frac, first_bundle)).remote(
        instance, kind, model_dir, opts, lay.env, lay.unset_visible_devices)


def start_trainers(pg: PlacementGroup, world: int, learner_opts: dict[str, Any], use_gpu: bool,
                   frac: float = 1.0) -> tuple[list[Any], list[Any]]:
    """``world`` ``TrainWorker``s, one per bundle of ``pg``, and the refs of their ``setup`` (wait on
    them): they rendezvous at the rank-0 worker's node IP on a port free there."""
    res = {"num_gpus": frac} if use_gpu else {"num_cpus": frac}
    workers = [TrainWorker.options(scheduling_strategy=_in_group(pg, r), **res).remote(r, world, learner_opts) for r in range(world)]
    master, port = ray.get(workers[0].rendezvous.remote())
    return workers, [w.setup.remote(master, port) for w in workers]
