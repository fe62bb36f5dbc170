"""The RL loop on the simulated cluster: plan, rollout, train, sync, step after step.

Modes (the plan's ``mode``/``streaming``/``max_staleness``: the policy chooses its loop within the
staleness class ``SimConfig.max_staleness`` K the user allows; ``SimConfig.mode``/``streaming``
override it, checked against K):

* **sync** (on-policy): rollout of step j starts when step j-1's weights are synced; then
  training of j, then weight sync. Colocated plans (verl's hybrid engine) run rollout on every
  GPU, switch to training (``StepCosts.switch_to_train_s``: the engine sleeps, the trainer
  onloads its state), train on every GPU, switch back (``switch_to_rollout_s``: the trainer
  offloads, the engine wakes) and hand the weights over through CUDA IPC
  (``colocated_sync_s``; this replaces the weight push).
* **sync + streaming** (``streaming=True``): training of step j starts on mini-batches of
  completed GRPO groups while the rollout's tail still runs (``sim.training.Feed``); rollout
  weights stay at version j until the sync after the last mini-batch, so it stays on-policy.
* **async** with bounded staleness K (AReaL, NeMo RL async GRPO, verl fully_async): continuous
  generation (``sim.engines``). A step whose plan keeps the previous step's instances runs on
  the same engines: its prompts are admitted once every trajectory of the previous step has been
  seated in a batch and the weights of step j-1-K are synced, so they fill the slots the
  previous step's tail frees instead of waiting for its last trajectory; the rollout of j+1 also
  overlaps the training of j. Training j starts when rollout j and training/sync j-1 are done.
  A plan that changes the instances (or a step with faults, an elastic pool or the recorded
  Gantt) runs on its own instances, its rollout starting when the previous one is done. Per-step
  metrics stay per step (the instances count each step's share); the planner is not taught by a
  rollout that shared its engines (``StepOutcome.overlapped``). Steady state: the slowest of the
  engines' throughput, train + sync, and (K + 1 rollouts sharing the engines + train + sync) /
  (K + 1), what ``libra.planner.search.step_time`` prices.

Each step's plan comes from ``policy.plan(cluster, history, prompt_tokens)`` where ``history``
holds the steps whose rollout has finished (their trajectories are then fully known), oldest
first; it is made when the step's rollout may start (after a shared async step: once that step's
trajectories are all seated and its staleness gate is open). Every non-rollout cost is ``SimCosts.step`` (``libra.planner.step_costs.StepCosts``), the
planner's own price list. A plan that differs from the previous step's (split, training
strategy, instance placement or TP) pays its transition (``StepCosts.transition``): the moved
instances' GPUs are booked but idle for its rollout side before they serve, and the training GPUs
for its training side (the re-shard) before the training starts; ``StepMetrics.transition_s``
records it. GPUs are booked in a ``GpuLedger`` for every use, so nothing is ever double-booked; a
rollout instance whose GPUs an earlier step's training still needs waits until that training
and its weight sync are done (async mode with a plan that moved the split): the training books
them first, even when both ask at the same instant.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.bounds import step_bound
from libra.planner.costs import nvlink_domain
from libra.planner.decision_tree import fits_in_memory, memory_report, report_line
from libra.planner.feedback import StepOutcome
from libra.planner.packing import instance_gpus, placement_error
from libra.planner.plan import Plan, TrainConfig, same_layout
from libra.planner.step_costs import Transition, train_gpu_ids
from libra.policy import Policy
from libra.pool.base import RoleChange
from libra.trace.columnar import StepArrays
from libra.trace.latencies import resolve_latencies
from sim.costs import SimCosts
from sim.engines import Engines, layout
from sim.instance import Instance, InvariantViolation, SimulationError
from sim.ledger import GpuLedger
from sim.metrics import RunResult, StepMetrics
from sim.noise import Noise
from sim.rollout import RolloutStage, RolloutStats
from sim.training import Feed, TrainJob, TrainStats


@dataclass(frozen=True, slots=True)
class Fault:
    """``--fail-gpu STEP:SECONDS:GPU``: GPU ``gpu`` fails ``at_s`` into step ``step``'s rollout
    and stays out for the rest of that rollout."""

    step: int
    at_s: float
    gpu: int


@dataclass(frozen=True)
class SimConfig:
    """How to replay (everything but the policy and the trace).

    ``max_staleness`` is the staleness class K: how many weight versions behind the rollout may
    run, what the RL algorithm tolerates (0: on-policy). Every policy runs within it; a plan that
    asks for more is a ``SimulationError``. ``None`` (callers written before the class existed)
    means 0, or, with the ``mode="async"`` override, ``staleness`` (default 1). ``mode`` and
    ``streaming`` override the plan's loop (None: the plan's own); async with K = 0, streaming
    with async, and a ``staleness`` above K are ``UserError``s (``check``).
    """

    mode: str | None = None  # "sync" | "async" | None: the plan's own mode
    staleness: int | None = None  # async: None = the plan's max_staleness (at most K)
    max_staleness: int | None = None  # the staleness class K (see the class docstring)
    kl: float = 0.0
    kv_mode: str = "keep"
    seed: int = 0
    noise_sigma: float = 0.03
    mini_batches: int = 4
    faults: tuple[Fault, ...] = ()
    gantt_step: int | None = None  # trace step number whose instance Gantt to record
    streaming: bool | None = None  # sync mode: train on completed groups while the tail runs (None: the plan's)
    #: async: consecutive steps share the engines (continuous generation, as AReaL and NeMo RL run
    #: it; ``sim.engines``); False: each step's rollout is a batch whose tail gates the next one
    #: (libra-run's async loop, whose runs are replayed so); the planner prices the same choice
    #: (``SearchOptions.continuous``)
    continuous: bool = True
    #: refuse a training whose strategy does not hold the step's longest sequence in memory (a
    #: real trainer runs out of memory; ``Simulator._holds``). False only to replay a published
    #: run's own configuration (it ran: the memory model has no CPU offload or context
    #: parallelism, so it may not fit one that did; ``sim.calibrate.replay``)
    train_memory_check: bool = True

    @property
    def staleness_class(self) -> int:
        """K (see the class docstring)."""
        if self.max_staleness is not None:
            return int(self.max_staleness)
        if self.mode == "async":
            return int(self.staleness) if self.staleness is not None else 1
        return 0

    def check(self) -> None:
        """The one-line errors of an override the staleness class does not allow."""
        k = self.staleness_class
        if k < 0:
            raise UserError(f"--max-staleness must be >= 0, got {k}")
        if self.mode not in (None, "sync", "async"):
            raise UserError(f"--mode must be sync or async, got {self.mode!r}")
        if self.staleness is not None and self.staleness < 0:
            raise UserError(f"--staleness must be >= 0, got {self.staleness}")
        if self.mode == "async" and k < 1:
            raise UserError("--mode async needs --max-staleness K >= 1 (the staleness the RL algorithm tolerates); "
                            "with K = 0 only on-policy loops run (sync, --streaming)")
        if self.staleness is not None and self.staleness > k:
            raise UserError(f"--staleness {self.staleness} exceeds --max-staleness {k}; raise --max-staleness or lower --staleness")
        if self.streaming and self.mode == "async":
            raise UserError("--streaming is a synchronous loop (mini-batches of the step's own rollout); drop --mode async or --streaming")


def observed_step(step: StepArrays, latencies: np.ndarray) -> StepArrays:
    """``step`` as a policy sees it once its rollout is over: with the tool latencies the replay
    ran (``latencies``, ``resolve_latencies``) in place of the trace's nulls.

    Why: a real run measures every tool call (libra-run's episodes record each call's latency), so
    the planner of a later step knows them. Every converted public log but tau2-retail records no
    latency; the replay draws each missing one from its tool family (lognormal, capped at the
    timeout) while the planner, handed the trace's nulls, priced every call at the default
    latency. Its rollout forecast fell below the steps' own critical paths (MedAgentBench, 48
    B200, Qwen3-14B, K=1: 6.75 s forecast, critical paths 8.2-11.9 s; SIMULATED)."""
    missing = np.isnan(step.tool_latency_s) & (step.tool_code >= 0)
    if not missing.any():
        return step
    lat = step.tool_latency_s.copy()
    lat[missing] = np.asarray(latencies, np.float64)[missing]
    return dataclasses.replace(step, tool_latency_s=lat)


class Simulator:
    """Replays ``steps`` under ``policy`` on ``cluster``; ``run()`` returns a ``RunResult``."""

    def __init__(self, steps: Sequence[StepArrays], policy: Policy, cluster: ClusterSpec, costs: SimCosts, config: SimConfig) -> None:
        config.check()
        if config.kv_mode not in ("keep", "release"):
            raise UserError(f"--tool-kv must be keep or release, got {config.kv_mode!r}")
        self.steps = list(steps)
        self.policy = policy
        self.cluster = cluster
        self.costs = costs
        self.cfg = config
        self.gpn = cluster.gpus_per_node
        known = {s.step for s in self.steps}
        for f in config.faults:
            if f.step not in known:
                raise UserError(f"--fail-gpu {f.step}:{f.at_s}:{f.gpu}: step {f.step} is not in the replayed steps ({min(known)}..{max(known)})")
            if not 0 <= f.gpu < cluster.n_gpus:
                raise UserError(f"--fail-gpu {f.step}:{f.at_s}:{f.gpu}: GPU must be in 0..{cluster.n_gpus - 1}")

    # ------------------------------------------------------------------ plan checks
    def _instance_gpus(self, plan: Plan) -> list[tuple[int, ...]]:
        out = []
        # a TP group must stay on one NVLink domain (a node, or a GB200 NVL72 rack): the
        # planner's own placement rule (libra.planner.packing), so the two agree
        dom = nvlink_domain(getattr(self.costs.ev, "gpu", None), self.gpn)
        for ri in plan.instances:
            why = placement_error(ri.node, ri.first_gpu, ri.tp, self.gpn, dom)
            if why is not None:
                raise SimulationError(f"plan instance {ri.id}: {why}")
            g = instance_gpus(ri.node, ri.first_gpu, ri.tp, self.gpn)
            if g[-1] >= self.cluster.n_gpus:
                raise SimulationError(f"plan instance {ri.id} uses GPU {g[-1]}, beyond the cluster's {self.cluster.n_gpus}")
            out.append(g)
        flat = [x for g in out for x in g]
        if len(set(flat)) != len(flat):
            raise SimulationError("plan places two rollout instances on the same GPU")
        return out

    def _train_gpus(self, plan: Plan, inst_gpus: list[tuple[int, ...]]) -> tuple[int, ...]:
        n = self.cluster.n_gpus
        if plan.train.n_gpus > plan.n_train_gpus:
            raise SimulationError(f"plan's training strategy needs {plan.train.n_gpus} GPUs but gives training {plan.n_train_gpus}")
        gpus = train_gpu_ids(n, plan.n_train_gpus, plan.colocated, plan.instances, self.gpn)  # the planner's rule
        if len(gpus) < plan.n_train_gpus:
            used = sum(len(g) for g in inst_gpus)
            raise SimulationError(f"plan gives training {plan.n_train_gpus} GPUs but only {len(gpus)} are left after rollout's {used}")
        return gpus

    # ------------------------------------------------------------------ run
    def run(self, progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Replay every step; ``progress(done, total)`` is called as steps finish."""
        env = simpy.Environment()
        self.env = env
        self.ledger = GpuLedger(env, self.cluster.n_gpus)
        seed = self.cfg.seed
        self.noise_roll = Noise(seed, self.cfg.noise_sigma, stream=1)
        self.noise_train = Noise(seed, self.cfg.noise_sigma, stream=2)
        self.noise_xfer = Noise(seed, self.cfg.noise_sigma, stream=3)
        n = len(self.steps)
        self.rollout_done = [env.event() for _ in range(n)]
        self.synced = [env.event() for _ in range(n)]
        # a step's training has its GPUs decided (``_adopt`` ran): rollouts waiting on a
        # time-shared step's GPUs re-check which of them it trains on (``_acquire_after``)
        self._train_placed = [env.event() for _ in range(n)]
        self._admitted: list[simpy.Event | None] = [None] * n  # shared engines: the step's trajectories all seated
        self._engines_of: list[Engines | None] = [None] * n
        self._history_idx: list[int] = []
        self._train_gpu_sets: dict[int, frozenset[int]] = {}
        self.history: list[StepArrays] = []
        self.running_job: TrainJob | None = None
        self.train_segments: list[tuple[float, float, int]] = []
        self.metrics: list[StepMetrics | None] = [None] * n
        self._prev_plan: Plan | None = None
        self._transitions: list[Transition] = [Transition()] * n
        self._planned_train: list[Any] = [None] * n  # each step's plan's training strategy, before any settling
        self._plans: list[Plan | None] = [None] * n  # each step's plan, as the policy made it
        self._latest_planned = -1  # the last step planned (the driver plans in order)
        self._train_split: list[int | None] = [None] * n  # training GPUs a step trained on, when a later plan's (``_adopt``)
        self._rollout_split: list[int | None] = [None] * n  # its rollout GPUs, when its training took idle ones (``_take_idle_rollout_gpus``)
        self._held_train: tuple[Plan, Any] | None = None  # (plan, strategy) of the last training: what the trainer holds
        self._charged: list[list[float]] = [[0.0, 0.0] for _ in range(n)]  # transition charged: rollout side, training side
        self._step_loop: list[tuple[str, int]] = [("sync", 0)] * n  # (loop that ran, staleness)
        self._progress = progress
        self._done = 0
        self.result = RunResult(policy=getattr(self.policy, "name", "?"), mode="", max_staleness=self.cfg.staleness_class)
        self._loops: list[str] = []
        env.process(self._driver())
        env.run()
        missing = [self.steps[j].step for j in range(n) if self.metrics[j] is None]
        if missing:
            raise SimulationError(f"replay stalled: steps {missing[:5]} never finished (a plan kept GPUs booked?)")
        self.result.steps = [m for m in self.metrics if m is not None]
        self.result.mode = "/".join(dict.fromkeys(self._loops))  # the loop(s) that ran, in order of first use
        self.result.staleness = max((m.staleness for m in self.result.steps), default=0)
        self.result.wall_s = env.now
        return self.result

    def _driver(self) -> Generator[Any, Any, None]:
        env = self.env
        for j, step in enumerate(self.steps):
            prev_eng = self._engines_of[j - 1] if j > 0 else None
            if j > 0:
                # async on shared engines: the next step's prompts may follow as soon as every
                # trajectory of this one is seated (continuous generation), or when its rollout
                # ends where its plan staggers the pipeline's fill (``Plan.stagger_fill``: it
                # rolls out alone); else its tail gates it
                prev_plan = self._plans[j - 1]
                staggers = prev_plan is not None and prev_plan.stagger_fill
                yield self._admitted[j - 1] if prev_eng is not None and not staggers else self.rollout_done[j - 1]
                k_prev = self._step_loop[j - 1][1]
                if prev_eng is not None and j - 1 - k_prev >= 0:
                    yield self.synced[j - 1 - k_prev]  # the staleness gate if the plan stays: plan with what it lets be known
            plan = self.policy.plan(self.cluster, tuple(self.history), step.prompt_tokens.copy())
            self._plans[j] = plan
            self._latest_planned = j
            mode = self.cfg.mode or plan.mode
            if mode not in ("sync", "async"):
                raise SimulationError(f"policy {self.result.policy}: plan mode {mode!r} is neither sync nor async")
            k_class = self.cfg.staleness_class
            if mode == "async":
                k = self.cfg.staleness if self.cfg.staleness is not None else max(1, plan.max_staleness)
                if k > k_class or k < 1:
                    raise SimulationError(f"policy {self.result.policy} planned async with staleness {k}, outside the staleness "
                                          f"class K={k_class} (--max-staleness)")
            else:
                k = 0
            if j - 1 - k >= 0:
                yield self.synced[j - 1 - k]
            if plan.colocated and mode == "async":
                raise UserError(f"policy {self.result.policy} is colocated: it cannot run --mode async (rollout and training share every GPU)")
            # continuous generation (``sim.engines``): an async step without faults or elastic pool
            # runs on engines it may share with its neighbours; the next step adopts them when its
            # plan keeps the same instances. A recorded Gantt observes them and changes nothing
            # (it used to turn sharing off for its step: `--out` ran another simulation, 250.5 s
            # against 267.5 s per step for verl-static-uniform on a never-lose SWE trace)
            eng: Engines | None = None
            shareable = self.cfg.continuous and mode == "async" and not self.cfg.faults
            pool_asked = shareable
            if shareable:
                pool = self.policy.pool(plan)
                shareable = pool is None
            adopt = (shareable and prev_eng is not None and not prev_eng.closing
                     and prev_eng.key == layout(plan.instances))
            if prev_eng is not None and not adopt:  # a new layout: today's loop, after the old rollout's tail
                prev_eng.closing = True
                if prev_eng.idle:
                    self._retire(prev_eng)
                yield self.rollout_done[j - 1]
            if adopt:
                eng = prev_eng
            elif shareable:
                eng = Engines(step.step, layout(plan.instances))
            self._engines_of[j] = eng
            inst_gpus = self._instance_gpus(plan)
            train_gpus = self._train_gpus(plan, inst_gpus)
            trans = self.costs.step.transition(self._prev_plan, plan.n_train_gpus, plan.train, plan.instances)
            # after a time-shared step whose training may move onto this split's GPUs: the
            # engines this split starts anew (charged only if it does move, ``_acquire_after``)
            shared = (self.costs.step.shared_to_async(self._prev_plan, plan.instances)
                      if self._prev_plan is not None and self._prev_plan.colocated and mode == "async" and not plan.colocated else None)
            self._prev_plan = plan
            self._transitions[j] = trans
            self._planned_train[j] = plan.train
            load = trans.to_rollout_s * self.noise_xfer.factor() if trans.moved else 0.0
            self._charged[j][0] = load
            sched = self.policy.scheduler(plan, future=step) if getattr(self.policy, "sees_future", False) else self.policy.scheduler(plan)
            if not pool_asked:
                pool = None if plan.colocated else self.policy.pool(plan)
            lat = resolve_latencies(step, self.cfg.seed)
            total = step.total_tokens
            want_stream = plan.streaming if self.cfg.streaming is None else self.cfg.streaming
            streaming = bool(want_stream) and mode == "sync" and not plan.colocated
            loop = "async" if mode == "async" else ("sync+streaming" if streaming else "sync")
            self._loops.append(loop)
            self._step_loop[j] = (loop, k)
            feed = Feed(env, step.n, float(total.sum()), self.cfg.mini_batches) if streaming else None
            job = TrainJob(
                env, plan.train, train_gpus, int(total.sum()), int(round(float(total.mean()))) if step.n else 1,
                self.costs, self.noise_train, self.cfg.kl > 0, self.cfg.mini_batches, feed=feed, n_samples=step.n,
            )
            tot_list = total.tolist()
            on_group = (lambda rows, feed=feed, tot=tot_list: feed.add(len(rows), sum(tot[r] for r in rows))) if feed else None
            stage = RolloutStage(
                env, step, plan, sched, pool, self.costs, self.noise_roll, lat, self.cfg.kv_mode, self.gpn,
                record_gantt=(self.cfg.gantt_step == step.step),
                on_role_change=lambda st, inst, ch, job=job: self._role_change(st, inst, ch, job),
                training_state=lambda: (self.running_job is not None, self.running_job.n_gpus if self.running_job else 0),
                on_group_done=on_group,
                engines=eng,
            )
            self._admitted[j] = stage.admitted
            # GPUs an earlier step's training still needs (async, a plan that moved the split
            # towards rollout) go to that training first: its job was decided before this plan,
            # and without this the new rollout instance, asking at the same instant, could win
            # the booking and stall that training for a whole rollout (seen: +507 s on one step).
            blocking = [(i, gs) for i, gs in self._train_gpu_sets.items() if i < j and not self.synced[i].triggered]
            self._train_gpu_sets[j] = frozenset(train_gpus)
            if adopt and trans.moved:
                raise InvariantViolation(f"step {step.step} adopted the previous step's engines but its transition moves instances {trans.moved}")
            for inst in ([] if adopt else stage.instances.values()):
                inst.started = False
                ahead = [i for i, gs in blocking if gs.intersection(inst.gpus)]
                deferred = [i for i in ahead if self._may_move_training(i)]
                waits = [self.synced[i] for i in ahead if i not in deferred]
                delay = load if inst.id in trans.moved else 0.0  # a moved instance loads its weights first
                if not ahead:  # what the router may know of when it starts: the predicted load, not the noisy one
                    inst.ready_at = env.now + (trans.to_rollout_s if inst.id in trans.moved else 0.0)
                start_s = shared.to_rollout_s if shared is not None and inst.id in shared.moved else 0.0
                if ahead or delay > 0:
                    env.process(self._acquire_after(waits, inst, ("rollout", step.step, inst.id), delay, deferred, start_s, j))
                else:
                    ev = self.ledger.acquire(inst.gpus, ("rollout", step.step, inst.id))
                    ev.callbacks.append(lambda _e, inst=inst: inst.start())
            for f in self.cfg.faults:
                if f.step == step.step:
                    ev = env.timeout(f.at_s)
                    ev.callbacks.append(lambda _e, f=f, stage=stage: self._fault(stage, f))
            stage.start()
            if feed is not None:
                train = env.process(self._train(j, step, plan, job, feed.ready[0]))
            else:
                train = None
            env.process(self._finish_step(j, step, plan, stage, job, lat, mode, train))
        last = self._engines_of[-1] if self.steps else None
        if last is not None:
            last.closing = True
            if last.idle:
                self._retire(last)

    def _retire(self, eng: Engines) -> None:
        """No step runs on ``eng`` and none will: its instances stop and their GPUs are released
        (the booking of the step that created them). Once: the last two steps on closing engines
        may end at the same instant, and each end sees them closing and idle."""
        if eng.retired:
            return
        for inst in eng.instances.values():
            if inst.busy or not inst.empty:
                raise InvariantViolation(f"rollout engines retired with instance {inst.id} still working")
            self.ledger.release(inst.gpus, ("rollout", eng.owner_step, inst.id))
            inst.alive = False
        eng.retired = True

    def _may_move_training(self, i: int) -> bool:
        """Whether step ``i``'s training, not placed yet, may still leave the GPUs its plan gave
        it: a time-shared plan's training that a later split may take over (``_adopt``)."""
        plan = self._plans[i]
        return (plan is not None and plan.colocated and not self._train_placed[i].triggered
                and getattr(self.policy, "training_plan", None) is not None)

    def _acquire_after(self, waits: list[simpy.Event], inst: Instance, owner: tuple[str, int, int],
                       delay_s: float = 0.0, deferred: Sequence[int] = (), start_s: float = 0.0,
                       j: int = 0) -> Generator[Any, Any, None]:
        """Book ``inst``'s GPUs once the earlier trainings in ``waits`` are done, keep them
        ``delay_s`` for a plan transition (the instance loads its weights), then start it.
        ``deferred``: earlier time-shared steps whose training may move to a later split's
        training GPUs (``_may_move_training``); once each is placed, ``inst`` waits for it only
        if it still trains on one of ``inst``'s GPUs, and when one moved, ``inst`` first starts
        its engine (``start_s``: ``StepCosts.shared_to_async``; no engine switch back woke it),
        charged to step ``j``'s transition."""
        if deferred:
            yield self.env.all_of([self._train_placed[i] for i in deferred])
            waits = list(waits) + [self.synced[i] for i in deferred if self._train_gpu_sets[i].intersection(inst.gpus)]
            if start_s > 0 and any(self._train_split[i] is not None for i in deferred):
                start = start_s * self.noise_xfer.factor()
                delay_s += start
                self._charged[j][0] = max(self._charged[j][0], start)  # instances start in parallel: one's time
        if waits:
            yield self.env.all_of(waits)
        yield self.ledger.acquire(inst.gpus, owner)
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        inst.start()

    def _owner(self, stage: RolloutStage, inst: Instance) -> tuple[str, int, int]:
        return ("rollout", stage.step.step, inst.id)

    def _role_change(self, stage: RolloutStage, inst: Instance, change: RoleChange, pending: TrainJob) -> None:
        target = self.running_job or pending
        gpus = inst.gpus
        self.ledger.transfer(gpus, self._owner(stage, inst), ("loan", id(target)))
        load = self.costs.to_train_s(inst.tp, target.base_cfg) * self.noise_xfer.factor()
        back = self.costs.to_rollout_s(inst.tp, target.base_cfg) * self.noise_xfer.factor()
        target.lend(gpus, load, change.join == "sync", back)

    def _fault(self, stage: RolloutStage, f: Fault) -> None:
        if stage.done.triggered:
            raise UserError(
                f"--fail-gpu {f.step}:{f.at_s}:{f.gpu}: step {f.step}'s rollout ended {stage.stats.makespan_s:.1f} s in; "
                "pick SECONDS below that"
            )
        for inst in stage.instances.values():
            if inst.alive and f.gpu in inst.gpus:
                if not inst.started:
                    break
                owner = self._owner(stage, inst)
                stage.stats.fault_requeued += stage.remove_instance(inst)
                others = tuple(g for g in inst.gpus if g != f.gpu)
                if others:
                    self.ledger.release(others, owner)
                self.ledger.transfer((f.gpu,), owner, ("failed", f.step))
                stage.done.callbacks.append(lambda _e: self.ledger.release((f.gpu,), ("failed", f.step)))
                return
        live = sorted(g for x in stage.instances.values() if x.alive and x.started for g in x.gpus)
        raise UserError(
            f"--fail-gpu {f.step}:{f.at_s}:{f.gpu}: GPU {f.gpu} serves no rollout instance at {f.at_s} s of step {f.step}; "
            f"faults are modelled on rollout GPUs, e.g. GPU {live[0] if live else 0}"
        )

    def _train(self, j: int, step: StepArrays, plan: Plan, job: TrainJob, start: simpy.Event) -> Generator[Any, Any, tuple[TrainStats, float, float, float]]:
        """Training, then the weight push (or the colocated switches) of step ``j``."""
        env = self.env
        yield start
        if j > 0:
            yield self.synced[j - 1]
        plan, adopted = self._adopt(j, plan, job)
        self._train_placed[j].succeed()
        owner = ("train", step.step)
        yield self.ledger.acquire(job.gpus, owner)
        held = self._held_train  # (plan, layout) the trainer holds; None before the first training
        settle = getattr(self.policy, "settle_training", None)
        if settle is not None and job.feed is None:  # a complete batch: its micro-batch and recompute are set for it
            cfg = settle(plan, step, tuple(self.history))
            spare = plan.over_idle_rollout_gpus(cfg)
            if (cfg.n_gpus != plan.train.n_gpus and not spare) or (plan.colocated and self._unplanned_relayout(plan, cfg, held, step)):
                raise SimulationError(f"policy {self.result.policy} settled step {step.step}'s training on {cfg}, not on its plan's "
                                      f"{plan.n_train_gpus} training GPUs ({plan.train}) or those and its {plan.idle_rollout_gpus} "
                                      f"rollout GPUs that run no engine: a split change is a plan transition")
            if spare:
                yield from self._take_idle_rollout_gpus(j, step, plan, job, cfg, owner)
            job.settle(cfg)
            plan = plan.with_training(cfg)
        streamed_knobs = getattr(self.policy, "streamed_knobs", None)
        if job.feed is not None and streamed_knobs is not None and self.cfg.train_memory_check and not self._holds(plan.train, step):
            # a streamed step brought a sequence its plan's knobs cannot hold: the trainer forms
            # smaller micro-batches for it, or re-shards onto another layout of the same GPUs
            # (``Policy.streamed_knobs``), charged here for every mini-batch of the step, never
            # less than per-mini-batch knobs would cost; a new layout's re-shard is the layout
            # change charged below
            cfg = streamed_knobs(plan, int(step.total_tokens.max()), tuple(self.history))
            if cfg is not None and cfg.n_gpus == plan.train.n_gpus and self._holds(cfg, step):
                job.settle(cfg)
                plan = dataclasses.replace(plan, train=cfg)
        extra: tuple[int, ...] = ()  # GPUs taken from rollout for a batch the plan's cannot hold
        if self.cfg.train_memory_check and not self._holds(plan.train, step):
            plan, extra = yield from self._outgrown(j, step, plan, job)
        trans = self._transitions[j]
        if held is not None and plan.colocated == held[0].colocated:
            # split to split, or time-shared to time-shared: the trainer re-shards when it trains
            # another layout or GPU count than it holds (a plan transition, or a layout a policy
            # settled at its first training: ``Policy.settle_training``)
            changed = plan.n_train_gpus != held[0].n_train_gpus or not same_layout(plan.train, held[1])
        else:  # the first training (the planned layout was loaded at start), or a move between split and time-shared
            changed = trans.train_changed or (held is None and not same_layout(plan.train, self._planned_train[j]))
        self._held_train = (plan, plan.train)
        if changed:  # re-shard for the new strategy
            if adopted is not None and self._transitions[adopted].train_changed and same_layout(plan.train, self._planned_train[adopted]):
                base = self._transitions[adopted].to_train_s  # the later plan's move, priced as the planner priced it
            elif trans.train_changed and same_layout(plan.train, self._planned_train[j]):
                base = trans.to_train_s
            elif held is None:  # the first training re-lays before any update: weights only (``StepCosts.build_s``)
                base = self.costs.step.build_s(plan.train)
            else:
                base = self.costs.step.lend_s(plan.train, 1)
            if base > 0:
                reshard = base * self.noise_xfer.factor()
                self._charged[j][1] = reshard
                yield env.timeout(reshard)
        switch_in = switch_out = 0.0
        tps = [ri.tp for ri in plan.instances]
        rtp = max(tps) if tps else 1
        sc = self.costs.step
        own = self._plans[j]
        if plan.colocated:
            switch_in = sc.switch_to_train_s(plan.train, rtp) * self.noise_xfer.factor()
            yield env.timeout(switch_in)
        elif adopted is not None and own is not None and own.colocated:
            # a time-shared step's training on a split's GPUs: their engines (the time-shared
            # plan's) sleep and the trainer onloads, as its own switch would; none switches back
            own_rtp = max((ri.tp for ri in own.instances), default=1)
            switch_in = sc.switch_to_train_s(plan.train, own_rtp) * self.noise_xfer.factor()
            yield env.timeout(switch_in)
        self.running_job = job
        ts: TrainStats = yield env.process(job.run())
        self.running_job = None
        self.train_segments.extend(ts.segments)
        if plan.colocated:
            switch_out = sc.switch_to_rollout_s(plan.train, rtp) * self.noise_xfer.factor()
            sync = sc.colocated_sync_s(plan.train, plan.instances) * self.noise_xfer.factor()
            yield env.timeout(switch_out + sync)
        else:
            sync = self.costs.weight_sync_s(plan.train, plan.instances, job.gpus) * self.noise_xfer.factor()
            yield env.timeout(sync)
        self.ledger.release(tuple(g for g in job.gpus if g not in extra), owner)
        if extra:  # they go back to rollout: the training state offloads, the engine wakes
            back = sc.return_s(plan.train, rtp) * self.noise_xfer.factor()
            ev = env.timeout(back)
            ev.callbacks.append(lambda _e, g=extra, o=("outgrown", step.step): self.ledger.release(g, o))
        for loan in job.loans:
            self.ledger.transfer(loan.gpus, ("loan", id(job)), ("return", id(job)))
            ev = env.timeout(loan.return_s)
            ev.callbacks.append(lambda _e, g=loan.gpus, o=("return", id(job)): self.ledger.release(g, o))
        return ts, switch_in, switch_out, sync

    def _take_idle_rollout_gpus(self, j: int, step: StepArrays, plan: Plan, job: TrainJob, cfg: TrainConfig,
                                owner: tuple[str, int]) -> Generator[Any, Any, None]:
        """Step ``j``'s training on ``cfg``'s GPUs: its plan's training GPUs and the plan's rollout
        GPUs that no instance runs on (``Plan.idle_rollout_gpus``), the next ones by the planner's
        rule (``train_gpu_ids``), booked like the rest for the training; a policy settled that
        layout (``Policy.settle_training``: ``libra.planner.settle.first_layout`` at the first
        training; a later step under a plan made before it trains there too). The re-shard is
        the caller's layout-change charge; the next plan's transition starts from the split
        trained (the GPUs taken hold training state when an engine moves there). Why: no engine
        runs on those GPUs, so a real trainer can take them without moving any rollout
        (held_out_54 fever-react/h100-42-l70b/K1: two of 18 rollout GPUs idle beside two TP-8
        engines for the run, SIMULATED)."""
        n_gpus = cfg.n_gpus
        gpus = train_gpu_ids(self.cluster.n_gpus, n_gpus, False, plan.instances, self.gpn)
        mine = set(job.gpus)
        extra = tuple(g for g in gpus if g not in mine)
        if len(gpus) != n_gpus or len(extra) != n_gpus - len(mine):
            raise SimulationError(f"policy {self.result.policy} settled step {step.step}'s training on {n_gpus} GPUs, but its plan "
                                  f"leaves {len(gpus)} without an engine")
        yield self.ledger.acquire(extra, owner)  # free unless another plan's engine still runs there
        job.gpus = tuple(job.gpus) + extra
        self._train_gpu_sets[j] = frozenset(job.gpus)
        self._train_split[j] = n_gpus
        self._rollout_split[j] = plan.n_rollout_gpus - len(extra)  # the idle ones now train
        prev = self._prev_plan  # the plan last started, made before this training on the same split: re-based as the policy's
        if prev is not None and not prev.colocated and prev.instances == plan.instances and prev.n_train_gpus == plan.n_train_gpus:
            self._prev_plan = prev.with_training(cfg)

    def _adopt(self, j: int, plan: Plan, job: TrainJob) -> tuple[Plan, int | None]:
        """Step ``j``'s training on the latest plan's training GPUs and layout, when the policy
        asks for it (``Policy.training_plan``) and those GPUs are free now; else ``plan``.
        Returns the plan the training runs under and the index of the adopted plan (None).
        A time-shared step's training may adopt a later split: it then trains as the split's
        does (no engine switches, the split's weight push), and the later rollout's instances
        need not wait for it (``_acquire_after``).

        Why: at K >= 1 a step's training may start after a later step's plan moved the split
        (the next rollout already runs on the new layout), and the GPUs the move gave training
        stood idle until that later step trained: MedAgentBench on 40 A800 (Llama-3.1-8B, K=1)
        trained step 1 on the first plan's 16 GPUs in 17.5 s while the 12 GPUs step 2's plan had
        moved to training sat free (held_out_31, 0.906x of areal-static-optimal, SIMULATED). The
        re-shard the move costs is charged here instead of at the later step's training (the
        trainer then holds that layout), at the price the planner gave the move."""
        ask = getattr(self.policy, "training_plan", None)
        i = self._latest_planned
        if ask is None or i <= j or job.feed is not None:
            return plan, None
        latest = self._plans[i]
        assert latest is not None
        if latest.colocated or (latest.n_train_gpus == plan.n_train_gpus and same_layout(latest.train, plan.train)):
            return plan, None
        want = ask(plan, latest)
        if want is plan or want == plan:
            return plan, None
        if want is not latest and want != latest:
            raise SimulationError(f"policy {self.result.policy} asked step {self.steps[j].step} to train under a plan that is "
                                  f"neither its own nor the latest (step {self.steps[i].step}'s)")
        gpus = self._train_gpus(latest, self._instance_gpus(latest))
        if not self.ledger.is_free(gpus):
            return plan, None  # a rollout (or a loan) still holds some: train where planned
        job.gpus = gpus
        job.settle(latest.train)
        self._train_gpu_sets[j] = frozenset(gpus)
        self._train_split[j] = latest.n_train_gpus
        # a time-shared step's training becomes a split's: no engine switches, the split's push
        return dataclasses.replace(plan, n_rollout_gpus=latest.n_rollout_gpus, n_train_gpus=latest.n_train_gpus, train=latest.train,
                                   instances=latest.instances, colocated=False), i

    def _outgrown(self, j: int, step: StepArrays, plan: Plan, job: TrainJob) -> Generator[Any, Any, tuple[Plan, tuple[int, ...]]]:
        """Step ``j``'s complete batch brought a sequence no strategy of its plan's training GPUs
        holds: the policy picks a strategy on another GPU count that does
        (``Policy.oversized_training``), and the training runs it, on fewer of its own GPUs, or
        on its own plus rollout GPUs it takes once they are free (the rollout engines holding
        them retire when their rollouts end; no new step starts on them). Returns the plan the
        training runs under and the GPUs taken from rollout, which go back after the training
        (``StepCosts.return_s``, charged by the caller). The re-shard into the new strategy and
        back at the next training are the caller's layout-change charges. A streamed step is not
        streamed: its training waits for the complete batch (the rollout's end) first, so its
        streamed overlap is lost whole, a charge at least that of streaming the mini-batches
        before the long one. A time-shared plan's training, on every GPU, may run on fewer of them
        the same way (its engines' switches are priced at the strategy it trains). Without the
        hook, or no strategy that holds it: the step fails, as a real trainer runs out of memory.

        Why: at K >= 1 a plan is made before the batch it trains exists, and a later step can
        bring a longer sequence than any before: MiniSWE on 44 A800 (Qwen3-14B, K=1) brought
        89,978 tokens at step 3 to a plan whose 20 training GPUs hold none (16, 24 and 28 do),
        and the run stopped where verl-colocated and areal-static-optimal ran (held_out_35,
        SIMULATED). A streamed one: ToolBench DFSDT on 38 H200 / Llama-3.1-70B (K = 0) brought a
        44,924-token sequence at streamed step 2 that no layout of its 16 training GPUs holds
        (32 do), and the run stopped where verl-static-uniform ran (held_out_49, SIMULATED). A
        time-shared one (refused until session 45): on 38 H100 only TP 1 and 2 lay Llama-3.1-70B
        over all 38 GPUs, none holds SWE-agent's 35,968-token step where 32 of them at TP 4 do,
        and Libra's time-shared launch stopped at step 0 (held_out_53 sweagent-rep/h100-38-l70b/K1
        on session 45's cohort price, SIMULATED)."""
        ask = getattr(self.policy, "oversized_training", None)
        if ask is None:
            raise SimulationError(self._oom_message(step, plan))
        if job.feed is not None:
            yield self.env.all_of(job.feed.ready)
            job.feed = None
        cfg = ask(plan, step, tuple(self.history))
        if cfg is None or not self._holds(cfg, step) or cfg.n_gpus > self.cluster.n_gpus:
            raise SimulationError(self._oom_message(step, plan))
        own = tuple(job.gpus)
        extra: tuple[int, ...] = ()
        if cfg.n_gpus > len(own):
            mine = set(own)
            others = [g for g in range(self.cluster.n_gpus) if g not in mine]
            others.sort(key=lambda g: (not self.ledger.is_free((g,)), -g))  # free ones first
            extra = tuple(sorted(others[: cfg.n_gpus - len(own)]))
            taken = set(extra)
            for eng in dict.fromkeys(e for e in self._engines_of if e is not None and not e.retired):
                if any(taken.intersection(inst.gpus) for inst in eng.instances.values()):
                    eng.closing = True  # no later step adopts them; they retire once idle
                    if eng.idle:
                        self._retire(eng)
            self._train_gpu_sets[j] = frozenset(own + extra)
            yield self.ledger.acquire(extra, ("outgrown", step.step))
            job.gpus = own + extra
        job.settle(cfg)
        self._train_split[j] = max(len(own), cfg.n_gpus)
        return dataclasses.replace(plan, n_train_gpus=max(plan.n_train_gpus, cfg.n_gpus), train=cfg), extra

    def _unplanned_relayout(self, plan: Plan, cfg: TrainConfig, held: tuple[Plan, TrainConfig] | None, step: StepArrays) -> bool:
        """Whether a time-shared ``plan``'s settled ``cfg`` is a layout change the plan did not
        make (a transition, refused). Allowed: the plan's layout or the one its trainer holds; any
        layout at the first training (``libra.planner.settle.first_layout``); one that holds a
        batch the held layout cannot (``memory_relayout``); and one that holds a batch the planned
        layout cannot when the plan moves off the held layout anyway (the re-shard is charged
        either way). Refusing that last case stopped Workbench on 38 H100 / Llama-3.1-70B, a
        time-shared plan moving to TP 1 x DP 38 whose batch brought 17,382 tokens it held at
        16,896 (held_out_53, K = 0 and 1, SIMULATED). The memory checks run only when the layouts
        differ."""
        if held is None or same_layout(cfg, plan.train) or same_layout(cfg, held[1]):
            return False
        if not self._holds(held[1], step):
            return False
        return same_layout(plan.train, held[1]) or self._holds(plan.train, step)

    def _holds(self, train: TrainConfig, step: StepArrays) -> bool:
        """Whether ``train`` holds ``step``'s longest sequence (prompt, generated and returned
        tokens) in each GPU's memory: the cost model's check, the one the planner's strategies
        pass (``libra.planner.decision_tree.fits_in_memory``)."""
        return not step.n or fits_in_memory(self.costs.step.ev, train, int(step.total_tokens.max()))

    def _oom_message(self, step: StepArrays, plan: Plan) -> str:
        """Why a training cannot run: a real trainer runs out of memory on it. Before this check
        the simulator charged no out-of-memory, and policies trained sequences no strategy of
        their layout holds (held_out_31: 49.8K-token sequences of Llama-3.1-70B on 72 H100)."""
        need = int(step.total_tokens.max())
        rep = memory_report(self.costs.step.ev, plan.train, need, suggest=True)
        return (f"policy {self.result.policy} cannot train step {step.step}: its longest sequence ({need:,} tokens) does "
                f"not fit in memory on its {plan.train.n_gpus} training GPUs ({report_line(rep, str(plan.train))}), "
                f"where a real trainer fails (the simulator refuses it rather than run it at no cost); use GPUs with "
                f"more memory, more training GPUs, or a trace with shorter sequences")

    def _finish_step(
        self, j: int, step: StepArrays, plan: Plan, stage: RolloutStage, job: TrainJob, lat: np.ndarray, mode: str,
        train: simpy.Process | None,
    ) -> Generator[Any, Any, None]:
        rs: RolloutStats = yield stage.done
        eng = self._engines_of[j]
        if eng is None:
            for inst in stage.instances.values():
                if inst not in stage._retired:
                    self.ledger.release(inst.gpus, self._owner(stage, inst))
        elif eng.closing and eng.idle:
            self._retire(eng)
        # what a real run measured of its trajectories: each tool call's latency as the replay ran
        # it (``lat``: the trace's, or the seeded draw where the trace has none), as libra-run's
        # episodes record theirs; the trace's nulls would leave the planner the default latency
        # for every call of a log that recorded none (``observed_step``)
        seen = observed_step(step, lat)
        # oldest first (with shared engines a short step may end before its predecessor)
        at = bisect.bisect(self._history_idx, j)
        self._history_idx.insert(at, j)
        self.history.insert(at, seen)
        # what a real run knows once its rollout ended: how long it took (the next plan, made as
        # this rollout ends, may learn from it; the training time is not known yet in async mode)
        observe = getattr(self.policy, "observe", None)
        if observe is not None:
            observe(StepOutcome(step.step, plan, seen, float(rs.makespan_s), overlapped=stage.overlapped, finish_s=rs.finish_s.copy(),
                                overlap=stage.overlap if stage.overlapped else None))
        self.rollout_done[j].succeed()
        if train is None:
            train = self.env.process(self._train(j, step, plan, job, self.rollout_done[j]))
        ts, switch_in, switch_out, sync = yield train
        self.synced[j].succeed()
        self._record(j, step, plan, rs, ts, lat, switch_in, switch_out, sync)
        self._done += 1
        if self._progress:
            self._progress(self._done, len(self.steps))

    def _overlap_train(self, a: float, b: float) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) * g for t0, t1, g in self.train_segments)

    def _record(
        self, j: int, step: StepArrays, plan: Plan, rs: RolloutStats, ts: TrainStats, lat: np.ndarray, switch_in: float,
        switch_out: float, sync: float,
    ) -> None:
        env = self.env
        n = self.cluster.n_gpus
        tps = [ri.tp for ri in plan.instances]
        bound = step_bound(step, lat, self.costs, tps or [1], plan.n_rollout_gpus)
        prev_end = self.metrics[j - 1].step_end_s if j > 0 and self.metrics[j - 1] else 0.0
        step_s = env.now - prev_end
        switch = switch_in + switch_out
        pre = switch_in + self._charged[j][1]  # the colocated switch and a transition's re-shard precede training
        train_window = env.now - ts.start_s + pre
        # Rollout busy GPU-seconds inside a training window are pro-rated over the rollout's
        # window (instances do not record every interval): this step's own tail when streaming,
        # the next step's rollout in async mode (subtracted when that step is recorded).
        idle_r = n * rs.makespan_s - rs.busy_gpu_s - self._overlap_train(rs.start_s, rs.end_s)
        idle_t = n * train_window - ts.busy_gpu_s
        t_a = ts.start_s - pre
        own = max(0.0, min(env.now, rs.end_s) - max(t_a, rs.start_s))  # streaming: this rollout's tail
        if rs.makespan_s > 0 and own > 0:
            idle_t -= rs.busy_gpu_s * own / rs.makespan_s
        if j > 0 and self.metrics[j - 1] is not None:
            # this rollout overlapped the previous training window: take its share back out
            pm = self.metrics[j - 1]
            a, b = pm.train_start_s, pm.step_end_s
            ov = max(0.0, min(b, rs.end_s) - max(a, rs.start_s))
            if rs.makespan_s > 0 and ov > 0:
                pm.idle_gpu_s_train = max(0.0, pm.idle_gpu_s_train - rs.busy_gpu_s * ov / rs.makespan_s)
        reward = step.reward[np.isfinite(step.reward)]
        gen = int(step.total_gen_tokens.sum())
        if rs.gen_tokens != gen:
            raise SimulationError(f"step {step.step}: generated {rs.gen_tokens} tokens, trace says {gen} (simulator bug)")
        completed = int(np.isfinite(rs.finish_s).sum())
        self.metrics[j] = StepMetrics(
            step=step.step,
            n_traj=step.n,
            completed=completed,
            rollout_start_s=rs.start_s,
            rollout_makespan_s=rs.makespan_s,
            lower_bound_s=bound.bound_s,
            critical_path_s=bound.critical_path_s,
            work_bound_s=bound.work_s,
            train_start_s=ts.start_s - pre,
            train_s=ts.duration_s,
            forward_s=ts.forward_s,
            update_s=ts.update_s,
            join_pause_s=ts.pause_s,
            switch_s=switch,
            sync_s=sync,
            transition_s=sum(self._charged[j]),
            prep_s=ts.prep_s,
            step_end_s=env.now,
            step_s=step_s,
            gen_tokens=rs.gen_tokens,
            trained_tokens=int(step.total_tokens.sum()),
            prefill_tokens=rs.prefill_tokens,
            gen_tok_s=rs.gen_tokens / step_s if step_s > 0 else 0.0,
            trained_tok_s=int(step.total_tokens.sum()) / step_s if step_s > 0 else 0.0,
            idle_gpu_s_rollout=max(0.0, idle_r),
            idle_gpu_s_train=max(0.0, idle_t),
            preemptions=rs.preemptions,
            evictions=rs.evictions,
            queue_wait_s=rs.queue_wait_s,
            migrations=rs.migrations,
            migration_wait_s=rs.migration_wait_s,
            migrations_refused=rs.migrations_refused,
            role_changes=rs.role_changes,
            train_joins=ts.joins,
            fault_requeued=rs.fault_requeued,
            events=rs.intervals + int((step.tool_code >= 0).sum()),
            n_rollout_gpus=self._rollout_split[j] if self._rollout_split[j] is not None else plan.n_rollout_gpus,
            n_train_gpus=self._train_split[j] if self._train_split[j] is not None else plan.n_train_gpus,
            rollout_tps="/".join(f"{tp}x{tps.count(tp)}" for tp in sorted(set(tps))),
            predicted_rollout_s=plan.predicted_rollout_s,
            predicted_train_s=plan.predicted_train_s,
            predicted_step_s=plan.predicted_step_s,
            mode=self._step_loop[j][0],
            staleness=self._step_loop[j][1],
            mean_reward=float(reward.mean()) if len(reward) else float("nan"),
            peak_kv_fraction=rs.peak_kv_fraction,
        )
        if rs.gantt:
            self.result.gantt = rs.gantt
            self.result.gantt_step = step.step
