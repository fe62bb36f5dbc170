"""Libra's policies and their ablations: one planner, a router, an optional elastic pool.

| name | planner | router | elastic pool |
| --- | --- | --- | --- |
| ``libra`` | one bucket, one TP degree | least-loaded (work-conserving), tool-time rebalancing within the bucket | no |
| ``libra-homogeneous`` | the same as ``libra`` | least-loaded (work-conserving), no rebalancing: ``libra`` without ``libra.scheduling.rebalance`` (its ablation) | no |
| ``libra-hetero`` | heterogeneous TP buckets | reactive MLFQ (move once outgrown) | no |
| ``libra-cmlfq`` | heterogeneous TP buckets | C-MLFQ | no |
| ``libra-full`` | heterogeneous TP buckets | C-MLFQ | yes (the paper's full Libra) |
| ``no-migration`` | heterogeneous | C-MLFQ decisions, moves re-prefill (no KV transfer) | yes |
| ``reactive-mlfq`` | heterogeneous | reactive MLFQ | yes |
| ``length-predictor`` | heterogeneous | predicted final length (trained on past steps, noisy) | yes |
| ``hindsight-routing`` | heterogeneous | true final lengths, balanced by true work: hindsight, ``sees_future`` | yes |

Why ``libra`` carries only the planner (issue 22): measured with pinned layouts on workloads
built to have the physics where they should pay (docs/results.md, "Which mechanisms pay"),
heterogeneous TP with a causal router never beat the best homogeneous layout by more than 3%
(hindsight routing did, 1.18x, on a reasoning-tail trace whose tails are single runaway turns
no causal signal announces), C-MLFQ beat reactive MLFQ only on heterogeneous layouts that
themselves lost to the best homogeneous one, and the elastic pool lent 0 GPU-seconds. The
mechanisms stay available (``libra-hetero``, ``libra-cmlfq``, ``libra-full`` and the router
ablations) so that claim can be re-measured.

Every factory is ``(cluster, options: PolicyOptions | None = None, **kwargs) -> LibraPolicy``
(``libra.policies.options``; keywords are applied to ``options``). What Libra reads:
``max_staleness`` (K, default 0: on-policy; the planner picks the fastest loop it allows: sync,
sync + streaming, async up to K; without it, ``mode="async"`` means K = ``staleness`` or 1),
``mode`` (pins the loop), ``streaming`` (pins streaming in sync mode), ``mini_batches``,
``replan``, ``drift_threshold``, ``join``, ``seed`` and ``lp_sigma`` (length-predictor noise),
``window``, ``kl``, ``ev``. The baselines' pins and ``hindsight`` do not concern it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.assumed_cap import forced_launch, may_assume_cap, needs_assumed_cap, plan_at_assumed_caps
from libra.planner.costs import CostModel, make_evaluator
from libra.planner.feedback import StepOutcome
from libra.planner.plan import Plan, TrainConfig, same_layout
from libra.planner.search import Planner, Replanner, SearchOptions, declared_context
from libra.planner.transfers import weight_sync_s
from libra.planner.pipeline import pipeline_run_s
from libra.planner.settle import first_layout, outgrown_training, settle_training, streamed_relayout
from libra.policies.options import PolicyOptions, options_for
from libra.pool.base import PoolPolicy
from libra.pool.elastic import ElasticPool
from libra.scheduling.base import RolloutScheduler
from libra.scheduling.cmlfq import CMLFQScheduler, NoMigrationScheduler
from libra.scheduling.history_model import RemainingWorkModel
from libra.scheduling.routers import LeastLoadedRouter, LengthPredictorRouter, OracleRouter, ReactiveMLFQRouter
from libra.trace.columnar import StepArrays

ROUTERS: tuple[str, ...] = ("least-loaded", "least-loaded-rebalance", "reactive", "cmlfq", "no-migration", "length-predictor", "oracle")
#: ``ASSUMED_CAPS`` and ``HEDGE_REGRET_CAP``, the first step's assumed context caps, live in
#: ``libra.planner.assumed_cap``, whose rule ``libra-sim plan`` prints too.


class LibraPolicy:
    """A Libra planner + router + optional elastic pool (see the module table)."""

    def __init__(self, cluster: ClusterSpec, name: str, router: str, elastic: bool, max_buckets: int,
                 options: PolicyOptions | None = None, **kwargs: Any) -> None:
        o = options_for(name, options, **kwargs)
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}")
        self.name = name
        self.sees_future = router == "oracle"
        self.router = router
        self.elastic = elastic
        self.options = o
        self.join = o.join
        self.seed = o.seed
        self.lp_sigma = o.lp_sigma
        self.window = o.window
        if o.max_staleness is not None:
            k = o.max_staleness
        elif o.staleness is not None:  # callers written before the class existed
            k = o.staleness
        else:
            k = 1 if o.mode == "async" else 0
        self._options = SearchOptions(
            mode=o.mode,
            max_staleness=int(k),
            streaming=o.streaming,
            mini_batches=o.mini_batches,
            max_buckets=max_buckets,
            window=self.window,
            kl=o.kl,
            run_steps=o.run_steps,
            continuous=o.continuous,
            micro_batch=o.micro_batch,
            tool_kv=o.tool_kv,
            # every router Libra runs serves the older steps first on shared engines
            # (``WorkConserving.step_priority``): the cycle is priced as those engines run it
            step_priority=True,
        )
        self._cluster: ClusterSpec | None = None
        self._ev: CostModel | None = o.ev
        self._replanner: Replanner | None = None
        self._models: dict[int, tuple[Plan, RemainingWorkModel]] = {}
        self._last_model = RemainingWorkModel()
        self._trained = False  # whether a training was settled yet (the first may change the layout)
        self._relayout: tuple[TrainConfig, TrainConfig] | None = None  # (planned, moved to) by the first training
        self._provisional: list[Plan] = []  # the plans made before the first training (``_relaid``)
        self._measured_rollout_s: dict[int, float] = {}  # step -> its measured rollout, until the first training
        self._setup(cluster)

    def _setup(self, cluster: ClusterSpec) -> None:
        if self._ev is None or (self._cluster is not None and (cluster.gpu, cluster.model) != (self._cluster.gpu, self._cluster.model)):
            self._ev = make_evaluator(cluster)
        self._cluster = cluster
        self._trained, self._relayout = False, None  # a new cluster is a new run
        self._provisional = []
        self._measured_rollout_s: dict[int, float] = {}
        planner = Planner(cluster, self._ev, self._options)
        self._replanner = Replanner(
            planner, policy=self.options.replan, threshold=self.options.drift_threshold
        )

    @property
    def planner(self) -> Planner:
        assert self._replanner is not None
        return self._replanner.planner

    # ---- Policy ------------------------------------------------------------------------------
    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        """Plan the next step from completed steps; fit the router's model on the same history."""
        if cluster != self._cluster:
            self._setup(cluster)
        assert self._replanner is not None
        current = self._replanner.current
        if current is not None and self._relaid(current) is not current.train:
            # the trainer holds the layout the first training moved to (on the plan's idle
            # rollout GPUs too, ``first_layout``): staying is staying there
            self._replanner.current = current.with_training(self._relaid(current))
        try:
            plan = self._replanner.plan(history, prompt_tokens)
        except UserError:
            if not may_assume_cap(history, cluster.max_context):
                raise  # measured steps or a declared limit: nothing fits what will happen
            plan = self._plan_assuming_cap(cluster, history, prompt_tokens)
        else:
            if needs_assumed_cap(float(plan.notes.get("hedge_regret", 1.0)), history, cluster.max_context):
                plan = self._plan_assuming_cap(cluster, history, prompt_tokens, incumbent=plan)
        if not self._trained:
            self._provisional.append(plan)
        model = RemainingWorkModel.fit(history, window=max(self.window, 4))
        self._last_model = model
        self._models[id(plan)] = (plan, model)
        while len(self._models) > 8:
            self._models.pop(next(iter(self._models)))
        return plan

    def observe(self, outcome: StepOutcome) -> None:
        """A step the backend ran, as it measured it: the planner learns how far its rollout
        predictions were off for that layout kind (``libra.planner.feedback``)."""
        if self._replanner is not None:
            self._replanner.planner.observe(outcome)
        if not self._trained:  # the first training's re-layout prices its step with it (``settle_training``)
            self._measured_rollout_s[outcome.step] = float(outcome.rollout_s)

    def _plan_assuming_cap(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray,
                           incumbent: Plan | None = None) -> Plan:
        """The first step when no context limit is declared and the length prior's own cap
        (65,536 tokens, a guess) does not serve: nothing fits it (``incumbent`` None), or it fits
        only a launch whose worst-case regret over the prior scenarios exceeds
        ``HEDGE_REGRET_CAP`` (a cap the cluster fits only on an extreme split, the prior's 64K held
        by 32 of 36 H100s for Qwen3-32B, turns every split class into that split, whose rollout
        every short scenario prices at several times its best). Planned again at the assumed caps
        (``libra.planner.assumed_cap.plan_at_assumed_caps``, the rule ``libra-sim plan`` prints
        too), flagged ``notes["assumed_max_context"]``."""
        assert self._ev is not None and self._replanner is not None

        def plan_at(cap: int) -> Plan:
            cand = Planner(dataclasses.replace(cluster, max_context=cap), self._ev, self._options).plan(history, prompt_tokens)
            return dataclasses.replace(cand, notes={**cand.notes, "assumed_max_context": cap, "replanned": True})

        best, _ = plan_at_assumed_caps(plan_at, lambda p: float(p.notes.get("hedge_regret", 1.0)), incumbent,
                                       forced=lambda p: forced_launch(p.notes.get("holding_splits"), p.colocated,
                                                                       self._options.max_staleness >= 1))
        if best is not incumbent:
            self._replanner.current = best
        return best

    def _model_for(self, plan: Plan) -> RemainingWorkModel:
        got = self._models.get(id(plan))
        return got[1] if got is not None and got[0] is plan else self._last_model

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        """The router for a step. Only the oracle takes ``future`` (and requires it)."""
        if future is not None and not self.sees_future:
            raise ValueError(f"policy {self.name} does not see the future; do not pass the step's StepArrays")
        if self.router == "oracle":
            if future is None:
                raise ValueError("the oracle (hindsight placement) needs the step's true future (scheduler(plan, future=step))")
            return OracleRouter(plan, future)
        if self.router in ("least-loaded", "least-loaded-rebalance"):
            table = self.planner.table if self.router == "least-loaded-rebalance" else None
            return LeastLoadedRouter(plan, work_conserving=True, table=table)
        if self.router == "reactive":
            return ReactiveMLFQRouter(plan)
        if self.router == "length-predictor":
            return LengthPredictorRouter(plan, self._model_for(plan), sigma=self.lp_sigma, seed=self.seed)
        cls = NoMigrationScheduler if self.router == "no-migration" else CMLFQScheduler
        return cls(plan, self._model_for(plan), ev=self._ev, table=self.planner.table)

    def streamed_knobs(self, plan: Plan, longest: int, seen: Sequence[StepArrays] = ()) -> TrainConfig | None:
        """The strategy a streamed step of ``plan`` trains a mini-batch holding a ``longest``-token
        sequence with: the plan's, or its layout at a smaller micro-batch that holds it (a
        token-budget trainer's micro-batches), else with activation recompute, else the fastest
        other layout on the same training GPUs that holds it, ranked on the last complete step of
        ``seen`` (a re-shard, charged by the backend; ``libra.planner.settle.streamed_relayout``);
        None when none does. A user's micro-batch pin is kept where a strategy holding the
        sequence allows it."""
        return streamed_relayout(self.planner.tree, plan.train, longest, seen, self.options.micro_batch)

    def settle_training(self, plan: Plan, batch: StepArrays, seen: Sequence[StepArrays]) -> TrainConfig:
        """The micro-batch and recompute for ``batch``, the step about to train, within the
        plan's training layout (``libra.planner.settle``): the plan sized them for a forecast
        batch (the first step's, a length prior), and the batch is known now.

        The run's first training may change the layout too (``first_layout``: nothing has been
        trained, and the layout was sized for a prior), and a split's may lay over the rollout
        GPUs no engine runs on (``Plan.idle_rollout_gpus``): the strategy returned then has more
        GPUs than the plan gives training, and the backend trains on those too. A plan made
        before that, in the old layout on the same GPUs (at K >= 1 the next step is planned
        before the first trains), trains in the new one; the next search starts from it
        (``plan``)."""
        planner = self.planner
        train = self._relaid(plan)
        cfg = settle_training(planner.tree, train, batch, seen, declared_context(planner.cluster),
                              planner.cluster.train_gpu_cap, self.options.micro_batch)
        if not self._trained:
            # each strategy's price: the steps it is paid over, run in the plan's loop with this
            # step's rollout as the backend measured it (``observe``, called before its training
            # starts; else the load model's hindsight prediction), the strategy's training and its
            # weight sync (time-shared: its switches and IPC hand-over, which depend on the
            # layout), and the re-shard in the first (``pipeline_run_s``)
            rollout = self._measured_rollout_s.get(batch.step, float("nan"))
            if rollout != rollout:
                rollout = planner.hindsight_rollout_s(plan, batch)
            rollout = rollout if rollout == rollout else 0.0

            steps = int(round(planner.amortize_over(0)))
            staleness = max(1, plan.max_staleness)

            def run_price(strategy: TrainConfig, train_s: float, reshard_s: float) -> float:
                if plan.colocated:
                    sync = planner.step_costs.colocated_overhead_s(strategy, plan.instances)
                else:  # a strategy on the plan's idle rollout GPUs too pushes from those as well
                    sync = weight_sync_s(planner.step_costs, planner.cluster, max(plan.n_train_gpus, strategy.n_gpus), strategy,
                                         plan.instances)
                return pipeline_run_s(plan.mode, staleness, rollout, train_s + sync, steps, reshard_s)

            # a split's rollout GPUs that run no engine may train too (the backend books them)
            new = first_layout(planner.tree, cfg, batch, seen, declared_context(planner.cluster), planner.cluster.train_gpu_cap,
                               steps, self.options.micro_batch, run_price, spare_gpus=plan.idle_rollout_gpus)
            if new is not cfg:
                self._relayout = (plan.train, new)
                cfg = new
        self._trained = True
        return cfg

    def oversized_training(self, plan: Plan, batch: StepArrays, seen: Sequence[StepArrays]) -> TrainConfig | None:
        """The strategy ``batch`` trains with when no strategy on ``plan``'s training GPUs holds
        its longest sequence (``libra.planner.settle.outgrown_training``): in an async loop on
        fewer of them, else on the fewest more, taken from rollout for this training; in a
        synchronous one (its rollout is over) the fastest on any count, the extra GPUs' return to
        rollout included; None when no count the training backend can use holds it. The next
        plans hold that sequence (the planner checks memory at the longest sequence measured), so
        this is paid once."""
        planner = self.planner
        return outgrown_training(planner.tree, self._relaid(plan), batch, seen, declared_context(planner.cluster),
                                 planner.cluster.train_gpu_cap, self.options.micro_batch, rollout_idle=plan.mode != "async",
                                 rollout_tp=max((i.tp for i in plan.instances), default=1))

    def training_plan(self, plan: Plan, latest: Plan) -> Plan:
        """The plan a step's training runs under when a later step's plan (``latest``) exists by
        the time it starts: ``latest`` when it is a split that gives training at least as many
        GPUs (its move is then made for this training too: the backend re-shards once, now,
        instead of at the later step's training), else the step's own ``plan``.

        Why: at K >= 1 the next plan is made as a rollout ends, from the measured step, and a
        move of GPUs to training left them idle until the later step trained. MedAgentBench on
        40 A800 (Llama-3.1-8B, K=1) ran its first two steps on the prior's 24:16, moved to 12:28
        at step 2, and trained step 1 on 16 GPUs in 17.5 s while the 12 GPUs the move gave
        training sat free (0.906x of areal-static-optimal, held_out_31, SIMULATED). A move
        towards rollout is not taken early: the rollout holds those GPUs.

        A time-shared step's training moves to a later async split's training GPUs too: its
        rollout has ended, so every GPU is free, and the next rollout, already planned on the
        split's rollout GPUs, can start while it trains, where the time-shared training would
        hold them until it and both engine switches are done. ToRA GSM8K on 34 A100 (Qwen3-32B,
        K=1) launched time-shared and moved to 10:24 at step 1, whose rollout then waited 27 s
        for step 0's time-shared training and switches (0.771x of areal-static-optimal,
        held_out_43, SIMULATED). Not towards a sync split: its rollout waits for this step's
        weights anyway, and on fewer GPUs the training only takes longer."""
        if latest.colocated:
            return plan
        if plan.colocated:
            return latest if latest.mode == "async" else plan
        if latest.n_train_gpus < plan.n_train_gpus:
            return plan
        return latest

    def _relaid(self, plan: Plan) -> TrainConfig:
        """``plan``'s training strategy, or the layout the first training moved it to when
        ``plan`` was made before that training and still carries the old one
        (``settle_training``). A plan made after it chose its layout knowing the one the trainer
        holds (``plan`` re-bases the search on it), so a move back is the planner's, priced as
        a transition: mapping it too had the trainer keep a layout the planner left (a time-shared
        plan on 24 A800s kept TP 1 x PP 2 x DP 12, 108 s a step, where the plan's PP 1 x DP 24
        trains in 103 s; intercode-sql, K=0, SIMULATED)."""
        if self._relayout is not None and any(p is plan for p in self._provisional):
            old, new = self._relayout
            if same_layout(plan.train, old) and (new.n_gpus == plan.train.n_gpus or plan.over_idle_rollout_gpus(new)):
                return new
        return plan.train

    def pool(self, plan: Plan) -> PoolPolicy | None:
        """The elastic pool for the step, or None (fixed split, or a time-shared plan)."""
        if not self.elastic or plan.colocated:
            return None
        return ElasticPool(plan, ev=self._ev, join=self.join)


def _factory(name: str, router: str, elastic: bool, max_buckets: int = 2) -> Callable[..., LibraPolicy]:
    def make(cluster: ClusterSpec, options: PolicyOptions | None = None, **kwargs: Any) -> LibraPolicy:
        return LibraPolicy(cluster, name, router, elastic, max_buckets, options, **kwargs)

    make.__doc__ = f"Policy {name!r}: router {router}, elastic pool {'on' if elastic else 'off'}."
    return make


#: Libra and its ablations, name -> factory, in the order ``--compare`` lists them (the registry,
#: ``libra.policies.registry``, puts the baselines first).
LIBRA_POLICIES: dict[str, Callable[..., LibraPolicy]] = {
    "libra": _factory("libra", "least-loaded-rebalance", False, max_buckets=1),
    "libra-homogeneous": _factory("libra-homogeneous", "least-loaded", False, max_buckets=1),
    "libra-full": _factory("libra-full", "cmlfq", True),
    "libra-hetero": _factory("libra-hetero", "reactive", False),
    "libra-cmlfq": _factory("libra-cmlfq", "cmlfq", False),
    "no-migration": _factory("no-migration", "no-migration", True),
    "reactive-mlfq": _factory("reactive-mlfq", "reactive", True),
    "length-predictor": _factory("length-predictor", "length-predictor", True),
    # hindsight ROUTING on the planner's own layout, not an upper bound (it inherits Libra's
    # layout and balances by a heuristic; issue 22 measured it 6% below libra on one trace): it
    # was called ``oracle``, a name that promised a bound it is not
    "hindsight-routing": _factory("hindsight-routing", "oracle", True),
}
