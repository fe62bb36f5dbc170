"""The RL loop of ``libra-run``: plan, roll out, train, sync weights, checkpoint, record.

GRPO within the staleness class ``max_staleness`` K the user allows (0: on-policy; the policy is
built with it and chooses its loop within it, as in ``libra-sim --max-staleness K``). Before each step the policy core plans the split of the devices
(``Policy.plan`` on the completed steps' measured trajectories; a user's pin of split/bucket
bounds is part of that policy, ``libra.policies.pinned``); actors are (re)placed when the
plan's shape changes; the rollout is routed by the policy's scheduler (``rollout``); the trainer
workers update on the step's trajectories; the new weights go to every rollout instance.

The loop is the plan's (``Plan.streaming``, the policy's choice; the ``streaming`` key pins it,
as ``libra-sim --streaming/--no-streaming`` do; ``update.streams``). Streamed (never for
colocated plans, which time-share devices), the update runs inside the rollout stage: each
mini-batch trains as soon as its GRPO groups have finished (``streaming``), still on-policy
(the engines keep the step's weights until the sync after the last mini-batch). Training is
then running while the rollout drains, so the elastic pool can lend idle instances, which join
as gradient helpers (torch trainer; ``helper``).

Asynchronous (a plan with ``mode == "async"``, staleness k <= K; never colocated): the update of
step j runs on a background thread (``async_loop.TrainingPipeline``) while the driver plans and
rolls out step j+1; the rollout of step j waits only until the engines hold the weights of step
j-1-k's update (``staleness``), and later weights reach the engines between their calls while it
runs (a trajectory continues on them; each turn records the version that generated it). The
loss corrects for the off-policy samples with the engines' behaviour log-probs (decoupled PPO,
``grpo``). A step's ``steps.csv`` row is written when its update is done (its sync, for the step
time). A plan that is not async, or one that changes the actors' shape, first waits for the
updates in flight.

Faults: a rollout worker that dies mid-step is replaced and its trajectories continue elsewhere
(``rollout``); a trainer worker that dies is replaced by a fresh group that resumes from the last
checkpoint and redoes the step's update (``update``); SIGINT/SIGTERM stop the run cleanly
(engines shut down, Ray stopped, nothing left in /dev/shm by us).

This file is the loop and the run's life cycle; its parts are one file each: ``preflight``
(checks before anything starts), ``engine_choice`` (engine, engine profile, trainer devices),
``ray_session`` (Ray and the tool actor), ``placement`` (the actors of a plan's shape, weight
sync, checkpoints), ``update`` (the step's update, batch or streamed, trainer restarts),
``step_row`` (a step's ``steps.csv`` row and log line), ``resume`` (where a run left off).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.feedback import StepOutcome
from libra.planner.plan import same_layout
from libra.runtime.config import RunConfig
from libra.runtime.engine_choice import engine_profile, max_train_gpus
from libra.runtime.preflight import check_backends, check_context_window, check_ray_address
from libra.scheduling.recorder import DecisionLog, recorded
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory

__all__ = ["Interrupted", "Runner", "check_ray_address"]


class Interrupted(Exception):
    """The run was asked to stop (SIGINT/SIGTERM)."""


def _log(msg: str) -> None:
    print(f"[libra-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


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
        check_context_window(cfg, self.model_dir, self.model_cfg)
        check_backends(cfg)
        # the run's context cap is a hard limit: the first step's length prior is scaled into it;
        # the torch trainer is one worker, so the planner gives training one device and the rest
        # to rollout (deepspeed runs the plan's DP: no limit)
        self.engine_profile = self._engine_profile()
        self.cluster = ClusterSpec(cfg.devices, cfg.gpu_name, self.model_cfg, cfg.per_node, max_context=cfg.max_context,
                                   max_train_gpus=self._max_train_gpus(), engine=self.engine_profile)
        self.actors: Any = None  # placement.Actors, once Ray is up
        self.updater: Any = None  # update.Updater, with the actors
        self.trajectories: list[Trajectory] = []
        self.history: list[StepArrays] = []
        self.rows: list[dict[str, Any]] = []
        self._warned_idle_train = False
        self._stop = False
        self.pipeline: Any = None  # async_loop.TrainingPipeline, from the first async step on
        self._pending: dict[int, dict[str, Any]] = {}  # async steps rolled out, their update not done yet
        self._last_end = 0.0  # run clock: when the last recorded step's weights reached the engines

    def _engine_profile(self) -> str | None:
        """The engine profile the planner and the fidelity replay time rollouts with
        (``engine_choice.engine_profile``)."""
        return engine_profile(self.cfg)

    def _max_train_gpus(self) -> int | None:
        """The most devices the training backend uses: the torch trainer is a single worker."""
        return max_train_gpus(self.cfg)

    # ---- signals -----------------------------------------------------------------------------
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

    # ---- per-step pieces ---------------------------------------------------------------------
    def _tune_pool(self, pool: Any) -> Any:
        """Apply the run's ``pool_*`` keys to the step's elastic pool (None keeps its defaults)."""
        if pool is not None:
            for attr, v in (("grace_s", self.cfg.pool_grace_s), ("min_tail_s", self.cfg.pool_min_tail_s),
                            ("payoff_factor", self.cfg.pool_payoff_factor)):
                if v is not None and hasattr(pool, attr):
                    setattr(pool, attr, float(v))
        return pool

    def _episodes(self, step: int) -> list[Any]:
        from libra.runtime.chat_format import for_tokenizer
        from libra.runtime.episode import Episode
        from libra.runtime.tasks import TaskSet

        tasks = TaskSet(self.cfg.tasks, seed=self.cfg.seed).batch(step, self.cfg.prompts_per_step)
        fmt = for_tokenizer(self.tokenizer)  # a chat model's template with tools, or the tiny policy's format
        eps = []
        for p, t in enumerate(tasks):
            ids = fmt.prompt_ids(t.question)
            for g in range(self.cfg.group_size):
                eps.append(Episode(f"s{step}-p{p}-r{g}", step, f"s{step}-p{p}", t, ids, self.cfg.max_tool_calls, self.cfg.max_new_tokens,
                                   self.cfg.max_context, self.cfg.temperature, seed=self.cfg.seed * 1_000_003 + step * 10_007 + p * 101 + g,
                                   fmt=fmt))
        return eps

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

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the configured steps; returns a summary. Always tears Ray down."""
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is first imported
        import ray
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar for every model load (already imported: the env is too late)

        from cost_models import CostEvaluator
        from libra.runtime.config import config_warnings
        from libra.runtime.placement import Actors
        from libra.runtime.policyglue import make_policy, pool_summary
        from libra.runtime.ray_session import describe_ray, start_ray
        from libra.runtime.resume import resume_records
        from libra.runtime.update import Updater

        cfg = self.cfg
        for w in config_warnings(cfg):
            self.log(f"warning: {w}")
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        try:
            self.ev = CostEvaluator(cfg.gpu_name, self.model_cfg, calibration=cfg.calibration, gpus_per_node=cfg.per_node,
                                    engine=self.engine_profile)
        except Exception as exc:
            raise UserError(f"cost evaluator for {cfg.gpu_name} / {self.model_cfg}: {exc}") from None
        # the run's pin of split/bucket bounds is part of the policy (``libra.policies.pinned``), so the
        # plan it returns, the plan recorded and the plan executed are one object
        policy = recorded(make_policy(cfg.policy, self.cluster, self.ev, cfg.seed, cfg.kl_coef > 0, streaming=cfg.streaming,
                                      mini_batches=cfg.mini_batches, split=cfg.split_pair(), bucket_bounds=cfg.bucket_bounds,
                                      per_node=cfg.per_node, run_steps=cfg.steps, max_staleness=cfg.max_staleness), self.decisions)
        self.actors = Actors(cfg, self.model_dir, self.ckpt, self.ev, self.log)
        self.updater = Updater(cfg, self.actors, self.model_dir, self.log)
        t_run = time.perf_counter()
        first = 0
        summary: dict[str, Any] = {}
        final_state: Any = None
        # for the elastic pool's line: steps rolled out, of them with a pool, consultations, of
        # them with training running, workers lent
        self._pool_counts = [0, 0, 0, 0, 0]
        self._declined = 0  # role changes the trainer could not take (deepspeed: no helpers)
        self._streamed_any = False
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
            self.tools, self.isolation = start_ray(cfg)
            self.log(f"Ray up: {describe_ray(cfg, ray.cluster_resources())}; sandbox network isolation: {self.isolation}")
            self._check_stop()
            if cfg.resume:
                got = resume_records(self.out, self.ckpt, self.log)
                first = got.done
                if got.done:
                    self.trajectories, self.history, self.rows = got.trajectories, got.history, got.rows
            for step in range(first, cfg.steps):
                self._step(step, policy, t_run)
            self._drain(t_run)
            actors = self.actors
            final_state = actors.final_state() if (cfg.eval_tasks and self.rows and actors.synced) else None
            self.log(pool_summary(*self._pool_counts, streaming=self._streamed_any, declined=self._declined))
            if self.pipeline is not None:
                summary["async"] = self._async_summary()
            summary = {**summary, "steps": len(self.rows), "wall_s": time.perf_counter() - t_run, "rows": self.rows, "out": self.out,
                       "engine": actors.engine_kind, "isolation": getattr(self, "isolation", None),
                       "pool": {**dict(zip(("steps", "steps_with_pool", "consulted", "consulted_training", "lent"), self._pool_counts)),
                                "declined": self._declined, "streaming": self._streamed_any}}
        except (Interrupted, SystemError) as exc:
            # a second signal inside C code (ray.get) surfaces as SystemError chained to Interrupted
            if isinstance(exc, SystemError) and not (self._stop and isinstance(exc.__context__ or exc.__cause__, Interrupted)):
                raise
            self.log("interrupted: stopping cleanly")
            summary = {"interrupted": True, "steps": len(self.rows), "out": self.out}
        finally:
            try:
                if self.pipeline is not None:
                    self.pipeline.close()
                self.actors.teardown()
            finally:
                if ray.is_initialized():
                    ray.shutdown()
                for s, h in old.items():
                    signal.signal(s, h)
        self._report(summary, heldout, final_state)
        return summary

    def _step(self, step: int, policy: Any, t_run: float) -> None:
        """One RL step: plan, (re)place actors, roll out (the update streamed into it, after it,
        or, asynchronous, handed to the training pipeline), checkpoint, record (trace,
        ``steps.csv``, the log line; an async step's when its update is done)."""
        from libra.runtime.grpo import Sample, group_advantages
        from libra.runtime.policyglue import describe_plan
        from libra.runtime.rollout import Rollout
        from libra.runtime.staleness import StalenessError, required_version
        from libra.runtime.tiny_model import encode
        from libra.runtime.update import loop_name, streams

        cfg, actors, updater = self.cfg, self.actors, self.updater
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        enc = lambda text: encode(self.tokenizer, text)  # noqa: E731
        self._check_stop()
        t_step = time.perf_counter()
        eps = self._episodes(step)
        t0 = time.perf_counter()
        plan = policy.plan(self.cluster, list(self.history), np.array([len(e.prompt_ids) for e in eps], np.int64))
        k = self._plan_staleness(plan)
        self.plan = plan
        plan_s = time.perf_counter() - t0
        loop = loop_name(plan, cfg.streaming)
        whose = "the plan's" if cfg.streaming is None or k else f"pinned by streaming: {str(cfg.streaming).lower()}"
        bound = f", staleness {k} of K={cfg.max_staleness}" if k else ""
        self.log(f"step {step} ({step + 1}/{cfg.steps}) plan ({cfg.policy}): {describe_plan(plan, len(self.history))}; "
                 f"loop {loop}{bound} ({whose})")
        if self.pipeline is not None:
            from libra.runtime.policyglue import plan_shape

            if k == 0 or plan_shape(plan) != actors.shape:  # on-policy, or new actors: the updates in flight first
                self._drain(t_run)  # (and their rows, so steps.csv stays in step order)
        setup_s = actors.place(plan)
        self._check_stop()
        # planners give the torch trainer one device (ClusterSpec.max_train_gpus); a pinned split may still give more
        if cfg.trainer == "torch" and not plan.colocated and plan.n_train_gpus > 1 and not self._warned_idle_train:
            self._warned_idle_train = True
            how = f"split {cfg.split} gives" if cfg.split_pair() is not None else "the plan gives"
            self.log(f"{how} training {plan.n_train_gpus} devices (DP {plan.train.dp}); the torch trainer is one worker "
                     f"and uses 1, so {plan.n_train_gpus - 1} idle (trainer: deepspeed runs the plan's DP)")
        wait_s = 0.0
        if k:  # the rollout of this step may run on weights at most k versions old, never older
            need = required_version(step, k)
            if self.pipeline is not None:
                wait_s = self.pipeline.wait_version(need, self._check_stop)
            if actors.version < need:
                raise StalenessError(f"step {step}: the engines hold version {actors.version}, the rollout needs >= {need} (K={k})")
            self._finalize_async(t_run)
        sched = policy.scheduler(plan)
        pool = self._tune_pool(policy.pool(plan))
        kills = [(float(f.get("at_s", 1.0)), int(f.get("instance", 0))) for f in cfg.faults if f["kill"] == "rollout" and f["step"] == step]
        streamer = updater.streamer(len(eps), step) if streams(plan, cfg.streaming) else None
        t_roll = time.perf_counter()
        version_at_start = actors.version
        ro = Rollout(plan, actors.instances, self.tools, sched, decode, enc, ev=self.ev, pool=pool, max_batch=cfg.max_batch,
                     respawn=actors.respawn, faults=kills, training=streamer).run(eps)
        self._pool_counts = [a + b for a, b in zip(self._pool_counts, (1, pool is not None, ro.pool_consulted, ro.pool_consulted_training,
                                                                       len(ro.lent)))]
        self._declined += ro.lend_declined
        for at_s, victim in ro.faults_unfired:
            self.log(f"fault injection: the kill of rollout instance {victim} at {at_s:g} s of step {step} never fired "
                     f"(it generated nothing after {at_s:g} s; the stage took {ro.makespan_s:.2f} s)")
        self._check_stop()
        rewards = [e.reward for e in eps]
        # what this run measured of the step, for a policy that learns from it (libra.planner.feedback;
        # libra-sim reports its simulated rollout the same way, as the rollout ends)
        trajs = [e.to_trajectory() for e in eps]
        self.history.append(StepArrays.from_trajectories(step, trajs))
        observe = getattr(policy, "observe", None)
        if observe is not None:
            # with each trajectory's finish: the order its GRPO groups completed in prices the
            # streamed loop (``libra.planner.feedback.CompletionOrder``)
            fin = np.array([ro.finish_s.get(e.traj_id, np.nan) for e in eps], np.float64)
            observe(StepOutcome(step, plan, self.history[-1], float(ro.makespan_s), finish_s=fin if np.isfinite(fin).all() else None))
        if streamer is None:  # a complete batch: the policy settles its training knobs for it (libra.planner.settle)
            plan = self._settle(policy, plan, step)
        info = {"plan": plan, "eps": eps, "ro": ro, "rewards": rewards, "trajs": trajs, "plan_s": plan_s, "setup_s": setup_s,
                "t_step": t_step, "k": k, "wait_s": wait_s, "rollout_start": t_roll - t_run, "rollout_end": time.perf_counter() - t_run,
                "version_at_start": version_at_start}
        if k:
            self._submit_async(step, info, t_run)
            return
        stream = None
        if streamer is not None:
            self._streamed_any = True
            tr, sync_s, stream = updater.finish_streamed(plan, streamer, ro.makespan_s, step)
        else:
            adv = group_advantages(rewards, [e.group for e in eps])
            samples = [Sample(tuple(e.context), tuple(e.gen_mask), float(a), version=e.sample_version, traj_id=e.traj_id)
                       for e, a in zip(eps, adv)]
            tr, sync_s = updater.train(plan, samples, step)
        ck_s = self._checkpoint(step)
        self._record(step, info, tr, sync_s, ck_s, stream, time.perf_counter() - t_step, None, t_run)

    def _settle(self, policy: Any, plan: Any, step: int) -> Any:
        """``plan`` with the training knobs (micro-batch, recompute) the policy settles for this
        step's batch, the one libra-sim trains with too (``Policy.settle_training``; Libra's first
        training may also settle another layout on the same GPUs, or over the plan's rollout GPUs that
        run no engine, logged as such). This run's trainers set neither knob from the plan (they cut micro-batches
        at a token budget, ``grpo.LOGPROB_TOKENS``, much as the settled knobs do, and run no
        activation recompute), so the settled values are logged, not executed."""
        settle = getattr(policy, "settle_training", None)
        if settle is None:
            return plan
        cfg = settle(plan, self.history[-1], list(self.history))
        if cfg == plan.train:
            return plan
        if plan.over_idle_rollout_gpus(cfg):
            # Libra's first training may lay over the rollout devices no engine runs on
            # (libra.planner.settle.first_layout); this run's trainers keep their own devices
            self.log(f"step {step}: training settled on {cfg.n_gpus} devices, the plan's {plan.n_train_gpus} and "
                     f"{cfg.n_gpus - plan.n_train_gpus} of its rollout devices that run no engine (TP {cfg.tp} x PP {cfg.pp} x "
                     f"DP {cfg.dp}; recorded, not executed: this run's trainers keep their own devices and layout)")
            cfg = dataclasses.replace(plan.train, micro_batch=cfg.micro_batch, recompute=cfg.recompute)
        if cfg.n_gpus != plan.train.n_gpus:
            raise RuntimeError(f"policy {self.cfg.policy} settled step {step}'s training on {cfg.n_gpus} GPUs, not its plan's {plan.train.n_gpus}")
        if not same_layout(cfg, plan.train):  # Libra's first training may re-lay its GPUs (libra.planner.settle.first_layout)
            self.log(f"step {step}: training layout settled for the batch: TP {cfg.tp} x PP {cfg.pp} x DP {cfg.dp}, EP {cfg.ep}, "
                     f"ZeRO-{cfg.zero_stage} (planned TP {plan.train.tp} x PP {plan.train.pp} x DP {plan.train.dp}, EP {plan.train.ep}, "
                     f"ZeRO-{plan.train.zero_stage}; recorded, not executed: this run's trainers keep their own layout)")
        self.log(f"step {step}: training knobs settled for the batch: micro-batch {cfg.micro_batch}, "
                 f"recompute {'on' if cfg.recompute else 'off'} (planned {plan.train.micro_batch}, "
                 f"{'on' if plan.train.recompute else 'off'}; recorded, not executed by this trainer)")
        return dataclasses.replace(plan, train=cfg)

    def _plan_staleness(self, plan: Any) -> int:
        """The staleness bound the step runs with: 0 for a sync plan, the plan's for an async one
        (at least 1, at most the run's K). An async plan outside the class, or a colocated one, is
        a core bug (the policy was built with K), not the user's."""
        cfg = self.cfg
        if plan.mode != "async":
            return 0
        k = max(1, int(plan.max_staleness))
        if k > cfg.max_staleness:
            raise RuntimeError(f"policy {cfg.policy} planned an async loop with staleness {k} in staleness class K={cfg.max_staleness}")
        if plan.colocated:
            raise RuntimeError(f"policy {cfg.policy} planned an async loop on a colocated plan (rollout and training share every device)")
        return k

    def _checkpoint(self, step: int) -> float:
        """The trainer's checkpoint after ``step``'s update, when one is due; seconds."""
        from libra.runtime.recording import prune_checkpoints

        cfg = self.cfg
        if not (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
            return 0.0
        ck_s = self.actors.checkpoint()
        prune_checkpoints(self.ckpt, cfg.keep_checkpoints)
        return ck_s

    def _submit_async(self, step: int, info: dict[str, Any], t_run: float) -> None:
        """Hand an async step's update to the training pipeline (started on first use)."""
        from libra.runtime.async_loop import TrainingPipeline, TrainJob
        from libra.runtime.grpo import Sample, group_advantages

        eps = info["eps"]
        adv = group_advantages(info["rewards"], [e.group for e in eps])
        samples = [Sample(tuple(e.context), tuple(e.gen_mask), float(a), tuple(e.behaviour_logp), e.sample_version, e.traj_id)
                   for e, a in zip(eps, adv)]
        if self.pipeline is None:
            self.pipeline = TrainingPipeline(self.updater, self.actors, self._checkpoint, lambda: time.perf_counter() - t_run, self.log)
        self.pipeline.submit(TrainJob(step, info["plan"], samples, {e.traj_id: list(e.turn_versions) for e in eps}, info["k"]))
        self._pending[step] = info
        # the trace as soon as the rollout ends: the update writes its checkpoint before the step's
        # row is recorded, and a run stopped in between resumes from that checkpoint with the
        # step's trajectories in its history (``resume`` cuts the trace back to the checkpoint)
        from libra.runtime.recording import write_run_trace

        cfg = self.cfg
        pending = [t for s in sorted(self._pending) for t in self._pending[s]["trajs"]]
        write_run_trace(os.path.join(self.out, "trace.jsonl"), self.trajectories + pending, self.model_dir, cfg.gpu_name, cfg.devices,
                        cfg.policy, max_context=cfg.max_context)
        self._finalize_async(t_run)

    def _finalize_async(self, t_run: float) -> None:
        """Record the async steps whose update is done, in step order."""
        if self.pipeline is None:
            return
        for done in self.pipeline.take_done():
            info = self._pending.pop(done.step)
            self._record(done.step, info, done.stats, done.sync_s, done.checkpoint_s, None, None, done, t_run)

    def _drain(self, t_run: float) -> None:
        """Wait for every update in flight (async) and record those steps."""
        if self.pipeline is None:
            return
        self.pipeline.drain(self._check_stop)
        self._finalize_async(t_run)
        left = self.pipeline.ledger.untrained()
        if left or self._pending:
            raise RuntimeError(f"async loop: {len(left)} trajectory(ies) rolled out but never trained (e.g. {left[:3]}); "
                               f"steps pending {sorted(self._pending)}")

    def _async_summary(self) -> dict[str, Any]:
        """What the run's async steps trained, for the summary (and tests): trajectories rolled
        out and trained (each exactly once: the ledger refuses a second time), the largest
        staleness trained on."""
        led = self.pipeline.ledger
        stale = [int(r["staleness_max"]) for r in self.rows if r.get("loop") == "async"]
        return {"rolled_out": len(led.rolled_out), "trained": len(led.trained), "untrained": len(led.untrained()),
                "max_staleness_observed": max(stale, default=0), "max_staleness": self.cfg.max_staleness}

    def _record(self, step: int, info: dict[str, Any], tr: dict[str, float], sync_s: float, ck_s: float, stream: Any,
                step_s: float | None, done: Any, t_run: float) -> None:
        """A finished step's records: the trace, its ``steps.csv`` row, the log line. ``done``
        (an async step's ``async_loop.TrainDone``): its step time is from the previous step's
        end to its own (the simulator's ``step_s``)."""
        from libra.runtime.policyglue import plan_from_prior
        from libra.runtime.recording import progress, write_run_trace, write_steps_csv
        from libra.runtime.staleness import version_stats
        from libra.runtime.step_row import step_done_line, step_row

        cfg, ro, plan, eps = self.cfg, info["ro"], info["plan"], info["eps"]
        now = time.perf_counter() - t_run
        if done is not None:
            end = done.end_s
            # the simulator's step time: from the previous step's end (the first: this step's start)
            step_s = end - (self._last_end if self._last_end > 0 else info["t_step"] - t_run)
            vs = done.versions
            # what of its update ran while a later rollout did (the overlap the async loop buys)
            later = [p for s, p in self._pending.items() if s > step]
            overlap = sum(max(0.0, min(done.end_s, p["rollout_end"]) - max(done.start_s, p["rollout_start"])) for p in later)
            # the interval the simulator prices (planning and placing actors are free there)
            async_cols = {"train_start_s": done.start_s, "wait_s": info["wait_s"], "async_overlap_s": overlap,
                          "async_step_s": end - max(self._last_end, info["rollout_start"])}
        else:
            end = now
            # on-policy: the update trained the version the rollout started with
            vs = version_stats(info["version_at_start"], [e.turn_versions for e in eps])
            async_cols = {"train_start_s": float("nan"), "wait_s": 0.0, "async_overlap_s": 0.0, "async_step_s": float("nan")}
        self._last_end = end
        self.trajectories += info["trajs"]
        pending = [t for s in sorted(self._pending) for t in self._pending[s]["trajs"]]  # async steps still training
        row = step_row(cfg, step, plan, eps, ro, tr, len(self.actors.trainers), self.updater.restarts, info["plan_s"], info["setup_s"],
                       sync_s, ck_s, float(step_s), info["rewards"], stream)
        row.update(loop=("async" if done is not None else ("sync+streaming" if stream is not None else "sync")), staleness_k=info["k"],
                   policy_version=vs.policy_version, sample_version_min=vs.sample_version_min, sample_version_max=vs.sample_version_max,
                   staleness_max=vs.staleness_max, staleness_mean=vs.staleness_mean, mixed_version_trajs=vs.mixed_trajectories,
                   rollout_start_s=info["rollout_start"], rollout_end_s=info["rollout_end"], step_end_s=end, **async_cols)
        row["plan_from_prior"] = int(plan_from_prior(plan, step))
        self.rows.append(row)
        write_run_trace(os.path.join(self.out, "trace.jsonl"), self.trajectories + pending, self.model_dir, cfg.gpu_name, cfg.devices,
                        cfg.policy, max_context=cfg.max_context)
        write_steps_csv(os.path.join(self.out, "steps.csv"), self.rows)
        elapsed = time.perf_counter() - t_run
        # the ETA leaves out actor set-up (step 0's, ~10x a later step; re-placements are occasional)
        times = [float(r["step_s"]) - float(r.get("setup_s") or 0.0) for r in self.rows]
        self.log(step_done_line(step, cfg.steps, row, ro, sync_s, info["setup_s"], float(step_s), stream is not None,
                                progress(elapsed, times, cfg.steps - step - 1)))

    def _report(self, summary: dict[str, Any], heldout: dict[str, Any], final_state: Any) -> None:
        """After Ray is down: the final weights' held-out evaluation, ``heldout.json``, the plots,
        and the side-by-side with ``libra-sim replay`` (``fidelity.csv``), into ``summary``."""
        from libra.runtime.recording import plot_fidelity, plot_steps, replay_fidelity

        cfg = self.cfg
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
                # the same policy as the run's: its pin, loop pin, seed, KL and mini-batches (so each step is
                # compared with the simulation of the same plan)
                fid = replay_fidelity(self.out, os.path.join(self.out, "trace.jsonl"), self.rows, cfg.devices, cfg.per_node, cfg.gpu_name,
                                      self.model_cfg, cfg.policy, calibration=cfg.calibration, streaming=cfg.streaming,
                                      mini_batches=cfg.mini_batches, max_context=cfg.max_context,
                                      max_train_gpus=self._max_train_gpus(), engine_profile=self.engine_profile,
                                      split=cfg.split_pair(), bucket_bounds=cfg.bucket_bounds, seed=cfg.seed, kl_coef=cfg.kl_coef,
                                      max_staleness=cfg.max_staleness)
                summary["fidelity"] = fid
                if fid:
                    plot_fidelity(self.out, fid)
            except Exception as exc:  # the run itself succeeded; say why the comparison did not
                self.log(f"replay comparison failed: {exc}")
                summary["fidelity_error"] = str(exc)
