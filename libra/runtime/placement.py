"""The Ray actors a plan's shape needs, placed on devices and kept in step with the trainer.

One ``EngineActor`` per rollout instance, in a placement group of one bundle of ``tp`` devices
(``STRICT_PACK``: a TP group never crosses a node), and the trainer workers (one per DP rank for
DeepSpeed, one for the torch trainer) in one ``PACK`` group; a colocated plan puts both on the
same devices at half a device each. ``place`` (re)creates them only when the plan's shape
(``policyglue.plan_shape``) changes, checkpointing the trainer first so its state survives;
``respawn`` replaces a dead engine in its own group with the current weights; ``sync_weights``
gathers the trainer's weights (every rank: ZeRO-3 gathers) and loads them into every engine,
with their policy version (``version``: RL steps trained into them; ``staleness``).

The asynchronous loop syncs from its training thread while the driver's rollout runs: a lock
makes a sync and a respawn one after the other (a respawned engine either is in the sync's list
or loads the new weights itself), and ``restart_trainers`` replaces a dead trainer group alone,
leaving the engines (and the rollout on them) running.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from libra.errors import UserError
from libra.planner.plan import Plan
from libra.runtime.engine_choice import engine_kind


class Actors:
    """The run's engines and trainer workers (see the module docstring)."""

    def __init__(self, cfg: Any, model_dir: str, ckpt: str, ev: Any, log: Any) -> None:
        self.cfg, self.model_dir, self.ckpt, self.ev, self.log = cfg, model_dir, ckpt, ev, log
        self.use_gpu = cfg.device == "cuda"
        self.engines: dict[int, Any] = {}
        self.instances: dict[int, Any] = {}  # the rollout's view of each engine (rollout_state.Instance)
        self.trainers: list[Any] = []
        self.groups: list[Any] = []
        self.shape: Any = None
        self.weights_ref: Any = None  # the trainer's last weights in the object store (file path; helpers)
        self.synced = False  # the engines hold trained weights (not the model folder's)
        self.wgroup: tuple[str, int, int] | None = None  # the NCCL broadcast group (GPU vLLM path)
        self.nccl_mode: bool | None = None  # whether this placement syncs over NCCL (decided at first sync)
        self.slots: dict[int, tuple[Any, int]] = {}  # instance -> (its placement group, its first bundle)
        self.asleep = False  # a colocated plan's engines released their GPU memory for training
        self.plan: Plan | None = None
        self.engine_kind: str | None = None  # set when engines are first started
        self.version = 0  # the policy version the engines hold (RL steps trained into weights_ref)
        self.trainer_group: Any = None  # the trainer workers' placement group (restart_trainers)
        self._lock = threading.RLock()  # sync_weights vs respawn (the async loop syncs from its training thread)

    def engine_opts(self) -> dict[str, Any]:
        cfg = self.cfg
        self.engine_kind = kind = engine_kind(cfg)
        if kind == "torch":
            return {"device": cfg.device, "seed": cfg.seed, "max_context": cfg.max_context, "threads": cfg.threads}
        colocated = self.plan is not None and self.plan.colocated  # a colocated trainer shares the GPU
        return {"device": cfg.device, "seed": cfg.seed, "max_context": cfg.max_context, "kv_gib": cfg.vllm_kv_gib,
                "gpu_util": 0.5 if colocated else 0.9, "sleep_mode": colocated}

    def learner_opts(self, plan: Plan) -> dict[str, Any]:
        cfg = self.cfg
        return {"model_dir": self.model_dir, "backend": cfg.trainer, "zero_stage": cfg.zero_stage or plan.train.zero_stage,
                "lr": cfg.lr, "clip": cfg.clip, "kl_coef": cfg.kl_coef, "mini_batches": cfg.mini_batches,
                "seed": cfg.seed, "device": cfg.device, "threads": cfg.threads, "temperature": cfg.temperature,
                "behaviour_cap": cfg.behaviour_weight_cap}

    def train_world(self, plan: Plan) -> int:
        """Trainer workers: the plan's DP for DeepSpeed, one for the torch trainer."""
        return max(1, plan.train.dp) if self.cfg.trainer == "deepspeed" else 1

    def teardown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for h in list(self.engines.values()):
            try:
                ray.get(h.shutdown.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(h)
        for h in self.trainers:
            ray.kill(h)
        for pg in self.groups:
            remove_placement_group(pg)
        self.engines, self.trainers, self.groups = {}, [], []
        self.wgroup, self.nccl_mode, self.asleep = None, None, False

    def place(self, plan: Plan, from_checkpoint_only: bool = False) -> float:
        """(Re)create actors for ``plan``'s shape; returns seconds spent (0 when unchanged).
        ``from_checkpoint_only``: the trainer died, do not try to checkpoint it first."""
        import ray

        from libra.runtime.actors import make_engine_group, make_group, start_engine, start_trainers
        from libra.runtime.policyglue import plan_shape
        from libra.runtime.rollout_state import Instance

        self.plan = plan
        shape = plan_shape(plan)
        if shape == self.shape:
            return 0.0
        t0 = time.perf_counter()
        if self.trainers and not from_checkpoint_only:  # keep the trainer's state across the re-placement
            self.checkpoint()
        self.teardown()
        opts = self.engine_opts()
        self.instances = {}
        frac = 0.5 if plan.colocated else 1.0
        world = self.train_world(plan)
        self.slots = {}
        tpg = None
        if plan.colocated:
            # one group for both roles: instance i's TP ranks and trainer rank r take half of the
            # same one-device bundles, so the roles share GPUs by construction (verl's hybrid engine)
            n = max(sum(i.tp for i in plan.instances), world)
            tpg = make_group(n, self.use_gpu, "PACK")
            self.groups.append(tpg)
            off = 0
            for inst in plan.instances:
                self.slots[inst.id] = (tpg, off)
                off += inst.tp
        for inst in plan.instances:
            if inst.id not in self.slots:
                pg = make_engine_group(inst.tp, self.use_gpu, self.engine_kind or "torch", frac)
                self.groups.append(pg)
                self.slots[inst.id] = (pg, 0)
            pg, first = self.slots[inst.id]
            h = start_engine(pg, inst.id, self.engine_kind, self.model_dir, opts, self.use_gpu, inst.tp, frac, first)
            self.engines[inst.id] = h
            self.instances[inst.id] = Instance(inst.id, inst.tp, inst.bucket, inst.node, h, kv_capacity=self.kv_capacity(inst.tp))
        if tpg is None:
            tpg = make_group(world, self.use_gpu, "PACK", frac)
            self.groups.append(tpg)
            self.trainer_group = tpg
        else:
            self.trainer_group = None  # colocated: the roles share one group
        self.trainers, trainer_ready = start_trainers(tpg, world, self.learner_opts(plan), self.use_gpu, frac)
        try:
            ray.get([h.pid.remote() for h in self.engines.values()])
        except ray.exceptions.RayActorError as exc:  # an engine that cannot start is a setup problem, not a crash
            tps = sorted({i.tp for i in plan.instances})
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ("Error" in ln or "error" in ln) and "further information" not in ln),
                       lines[-1] if lines else type(exc).__name__)
            hint = "; --engine torch runs without vLLM" if self.engine_kind == "vllm" else ""
            raise UserError(f"the {self.engine_kind} rollout engine could not start for the plan's instances (TP {tps}): {why}{hint}") from None
        ray.get(trainer_ready)
        done = ray.get([w.load_checkpoint.remote(self.ckpt) for w in self.trainers])[0]
        if done or self.synced:
            self.sync_weights(done)
        self.shape = shape
        return time.perf_counter() - t0

    def restart_trainers(self, plan: Plan) -> int:
        """A trainer worker died (asynchronous loop): replace the trainer group alone, from the
        last checkpoint, leaving the engines and the rollout on them running. Returns the
        checkpoint's ``step_done`` (0: none) once the new group has loaded it."""
        import ray
        from ray.util.placement_group import remove_placement_group

        from libra.runtime.actors import make_group, start_trainers

        if plan.colocated or self.trainer_group is None:
            raise RuntimeError("restart_trainers is for split plans (a colocated plan's trainer shares the engines' group)")
        for h in self.trainers:
            ray.kill(h)
        self.groups = [g for g in self.groups if g is not self.trainer_group]
        remove_placement_group(self.trainer_group)
        world = self.train_world(plan)
        self.trainer_group = make_group(world, self.use_gpu, "PACK")
        self.groups.append(self.trainer_group)
        self.trainers, ready = start_trainers(self.trainer_group, world, self.learner_opts(plan), self.use_gpu)
        ray.get(ready)
        done = ray.get([w.load_checkpoint.remote(self.ckpt) for w in self.trainers])[0]
        with self._lock:
            self.wgroup = None  # the NCCL broadcast group had the dead rank 0 in it
        return int(done)

    def kv_capacity(self, tp: int) -> int:
        try:
            return int(self.ev.kv_capacity_tokens(tp)) or (1 << 20)
        except Exception:
            return 1 << 20

    def respawn(self, inst: Any) -> Any:
        """A replacement engine for a dead instance, in the same placement group, current weights."""
        import ray

        from libra.runtime.actors import start_engine

        assert self.plan is not None
        pg, first = self.slots[inst.id]
        h = start_engine(pg, inst.id, self.engine_kind, self.model_dir, self.engine_opts(), self.use_gpu, inst.tp,
                         0.5 if self.plan.colocated else 1.0, first)
        with self._lock:  # not between a sync's engine list and its loads (the async loop's training thread)
            self.engines[inst.id] = h
            if self.nccl_mode:  # a new member: rebuild the broadcast group around it and send the weights
                self.wgroup = None
                if self.synced:
                    self.sync_weights(self.version)
            elif self.weights_ref is not None:
                ray.get(h.load_state_dict.remote(self.weights_ref, self.version))
        self.log(f"rollout instance {inst.id} died; replaced (pid {ray.get(h.pid.remote())}), its trajectories re-queued")
        return h

    def sync_weights(self, version: int | None = None) -> float:
        """The trainer's weights into every engine; seconds spent. GPUs with vLLM: an NCCL
        broadcast from trainer rank 0 into every engine worker (``weight_broadcast``); otherwise
        the state dict through the object store into each engine (a safetensors file for vLLM).
        ``version``: the weights' policy version (None: one more than the engines had). An
        engine that died meanwhile is skipped (the rollout respawns it with these weights)."""
        with self._lock:
            return self._sync_weights(self.version + 1 if version is None else int(version))

    def _sync_weights(self, version: int) -> float:
        import ray

        t0 = time.perf_counter()
        self.wake_engines()
        if self.nccl_mode is None:
            # not for colocated plans: NCCL refuses two ranks on one GPU (their trainer rank 0 shares
            # a GPU with an engine worker); they take the file path (CUDA IPC is not implemented)
            colocated = self.plan is not None and self.plan.colocated
            self.nccl_mode = bool(self.use_gpu and self.engine_kind == "vllm" and self.engines and not colocated
                                  and all(ray.get([h.weight_sync_kind.remote() for h in self.engines.values()])))
        if self.nccl_mode:
            self._broadcast(version)
            if self.cfg.trainer == "torch":  # lent gradient helpers load the step's weights from the object store
                self.weights_ref = ray.put(ray.get(self.trainers[0].state_dict.remote()))
        else:
            states = ray.get([w.state_dict.remote() for w in self.trainers])  # every rank (ZeRO-3 gathers)
            self.weights_ref = ray.put(states[0])
            for ref in [h.load_state_dict.remote(self.weights_ref, version) for h in list(self.engines.values())]:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    pass  # died (a rollout fault): its replacement loads weights_ref (respawn)
        self.version = version
        self.synced = True
        return time.perf_counter() - t0

    def sleep_engines(self) -> float:
        """A colocated plan's engines release their device memory before training (vLLM sleep
        mode on GPUs; the torch engine moves its weights to the host); seconds spent."""
        import ray

        t0 = time.perf_counter()
        ray.get([h.sleep.remote() for h in self.engines.values()])
        self.asleep = True
        return time.perf_counter() - t0

    def wake_engines(self) -> None:
        """Engines back on their devices (before the weight sync that follows training)."""
        import ray

        if self.asleep:
            ray.get([h.wake.remote() for h in self.engines.values()])
            self.asleep = False

    def _broadcast(self, version: int) -> None:
        """One NCCL broadcast of the policy; builds the group first when there is none."""
        import ray

        from libra.runtime.weight_broadcast import group_layout

        ids = sorted(self.engines)
        joins: list[Any] = []
        init: tuple[Any, ...] = ()
        if self.wgroup is None:
            master, port = ray.get(self.trainers[0].rendezvous.remote())
            world, offsets = group_layout([self.instances[i].tp for i in ids])
            joins = [self.engines[i].join_weight_group.remote(master, port, off, world) for i, off in zip(ids, offsets)]
            self.wgroup = init = (master, port, world)
        meta = ray.get(self.trainers[0].weight_meta.remote())
        recv = [self.engines[i].receive_weights.remote(meta, version) for i in ids]
        send = [w.broadcast_weights.remote(*(init if r == 0 else ())) for r, w in enumerate(self.trainers)]
        ray.get(joins + send + recv)

    def final_state(self) -> dict[str, Any]:
        """The trainer's current weights on the driver (the held-out evaluation's)."""
        import ray

        if self.weights_ref is not None and not self.nccl_mode:
            return ray.get(self.weights_ref)
        return ray.get([w.state_dict.remote() for w in self.trainers])[0]  # every rank (ZeRO-3 gathers)

    def checkpoint(self) -> float:
        """Every trainer worker saves to the run's checkpoint folder; seconds spent."""
        import ray

        t0 = time.perf_counter()
        ray.get([w.save_checkpoint.remote(self.ckpt) for w in self.trainers])
        return time.perf_counter() - t0
