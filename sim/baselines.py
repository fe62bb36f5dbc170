"""The paper's baselines, as honest ``Policy`` objects the simulator drives like any other.

Each runs its best honest loop within the staleness class K the user allows (``--max-staleness``,
``SimConfig.max_staleness``), like Libra:

* ``verl-colocated``: verl's hybrid engine. Every GPU runs rollout (uniform TP, least-loaded
  routing), then every GPU trains; it pays both stage switches (engine sleep/wake, trainer
  offload/onload at the measured host-copy rates) and the CUDA-IPC weight hand-over, priced by
  ``StepCosts`` like every other plan. Synchronous in every class (rollout and training share
  every GPU: nothing can overlap).
* ``verl-static-uniform``: a fixed split of the cluster between rollout (uniform TP instances,
  least-loaded routing) and training; synchronous with K = 0, and with K >= 1 also priced with
  verl's one-step-off asynchronous loop (staleness 1), the faster estimate winning.
* ``areal-static-optimal``: the best fixed (split, homogeneous rollout TP, loop) **in
  hindsight**: it is handed the whole replayed trace and every feasible candidate is *replayed*
  (noise off; see ``_hindsight``), not ranked by an estimate (a shortlist of 4 ranked by the
  makespan lower bound missed a split 1.7x faster on a work-bound trace). AReaL is asynchronous
  by design, so it runs only in classes K >= 1 (``MIN_STALENESS``), at staleness K: for a fixed
  plan a larger bound only removes waits, so K is its best staleness in the class. It is an
  upper bound on what static tuning can do, not something a real run could know in advance,
  and it says so in its plan notes.

How the honest baselines choose (once, at their first plan, then fixed): they know the first
step's prompt lengths and nothing else, so they assume a **length prior** for the rest of each
trajectory (``PRIOR_GEN_TOKENS`` generated over ``PRIOR_TURNS`` turns, ``PRIOR_TOOL_TOKENS``
returned per tool call, ``PRIOR_TOOL_S`` per call, contexts up to ``PRIOR_MAX_CONTEXT``; the kind
of numbers a verl user writes in a config). Only rollout TPs whose KV cache holds the max context
are candidates (vLLM refuses a ``max_model_len`` above its KV capacity). For each candidate
(rollout GPUs in multiples of a node, every valid rollout TP) they predict the rollout with the
makespan lower bound of ``sim.bounds`` applied to the prior step and the training with the
policy core's decision tree (``libra.planner.decision_tree``), and pick the fastest synchronous
step. Any of ``--split``, ``--rollout-tp``, ``--train-tp``, ``--train-pp``, ``--train-ep``,
``--micro-batch`` pins that choice instead. A training backend's device limit
(``ClusterSpec.max_train_gpus``, ``--max-train-gpus``) bounds their training side exactly as it
bounds Libra's planner: splits give training at most that many GPUs (the rest roll out), and
``verl-colocated`` trains on that many of its GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.decision_tree import DecisionTree, enumerate_strategies, training_time_fn
from libra.planner.costs import nvlink_domain
from libra.planner.packing import place
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.pool.base import PoolPolicy
from libra.scheduling.base import RolloutScheduler
from libra.scheduling.routers import LeastLoadedRouter
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from libra.planner.bounds import step_bound
from sim.costs import SimCosts
from libra.trace.latencies import resolve_latencies

#: The length prior of the honest baselines (see the module docstring).
PRIOR_GEN_TOKENS = 8192
PRIOR_TURNS = 8
PRIOR_TOOL_TOKENS = 512
PRIOR_TOOL_S = 2.0
#: The honest baselines' max context (verl's ``max_prompt_length + max_response_length`` of a
#: typical agentic config): like vLLM, which refuses a ``max_model_len`` above its KV capacity,
#: they only consider rollout TPs whose KV cache holds this much.
PRIOR_MAX_CONTEXT = 32768
#: The hindsight baseline replays every candidate on this many evenly spaced steps of the trace
#: (the whole trace when it has no more), then its ``HINDSIGHT_FINALISTS`` fastest on the whole
#: trace (``StaticPolicy._hindsight``).
HINDSIGHT_STEPS = 4
HINDSIGHT_FINALISTS = 3
#: The smallest staleness class each baseline runs in (absent: 0, it can run on-policy).
MIN_STALENESS: dict[str, int] = {"areal-static-optimal": 1}


@dataclass(frozen=True)
class Pins:
    """Configuration fixed from the command line (None: the baseline chooses)."""

    split: tuple[int, int] | None = None
    rollout_tp: int | None = None
    train_tp: int | None = None
    train_pp: int | None = None
    train_ep: int | None = None
    micro_batch: int | None = None

    @classmethod
    def from_opts(cls, opts: dict[str, Any]) -> Pins:
        return cls(**{k: opts.get(k) for k in ("split", "rollout_tp", "train_tp", "train_pp", "train_ep", "micro_batch")})


def prior_step(prompt_tokens: np.ndarray, gen: int = PRIOR_GEN_TOKENS, turns: int = PRIOR_TURNS,
               tool_tokens: int = PRIOR_TOOL_TOKENS, tool_s: float = PRIOR_TOOL_S) -> StepArrays:
    """A stand-in step built from known prompts and the length prior (what an honest baseline
    can reason about before any rollout has run)."""
    per = max(1, gen // max(turns, 1))
    trajs = [
        Trajectory(
            id=f"prior-{i}", step=0, prompt_tokens=int(p),
            turns=tuple(Turn(per, "tool", tool_s, tool_tokens) for _ in range(turns - 1)) + (Turn(per, None),),
        )
        for i, p in enumerate(prompt_tokens)
    ]
    return StepArrays.from_trajectories(0, trajs)


def uniform_instances(
    n_gpus: int, tp: int, gpus_per_node: int, first_node: int = 0, nvlink_domain: int | None = None
) -> tuple[RolloutInstance, ...]:
    """``n_gpus // tp`` TP-``tp`` instances packed on the first NVLink domains (default: nodes;
    a GB200 rack, where one instance may span trays), one bucket (0)."""
    k = n_gpus // tp
    where = place(n_gpus, gpus_per_node, [tp] * k, nvlink_domain)
    if where is None or k == 0:
        raise UserError(f"{k} rollout instances of TP={tp} do not pack into {n_gpus} GPUs ({gpus_per_node} per node)")
    return tuple(RolloutInstance(id=i, tp=tp, bucket=0, node=first_node + n, first_gpu=g) for i, (n, g) in enumerate(where))


class _Chooser:
    """Shared search over (rollout GPUs, rollout TP, training strategy) for the baselines."""

    def __init__(self, cluster: ClusterSpec, costs: SimCosts, pins: Pins, kl: bool) -> None:
        self.cluster = cluster
        self.costs = costs
        self.pins = pins
        self.tree = DecisionTree(costs.step, cluster.gpus_per_node, kl=kl)
        self.kl = kl

    def rollout_tps(self, max_context: int) -> list[int]:
        """Rollout TPs to consider: valid, and (unless pinned) holding ``max_context`` tokens of
        KV; the largest valid TP if none does."""
        dom = nvlink_domain(getattr(self.costs.ev, "gpu", None), self.cluster.gpus_per_node)
        tps = [t for t in self.costs.ev.valid_rollout_tps() if t <= dom]
        if self.pins.rollout_tp is None and tps:
            holding = [t for t in tps if self.costs.kv_capacity(t) >= max_context + 1]
            tps = holding or [max(tps)]
        if self.pins.rollout_tp is not None:
            if self.pins.rollout_tp not in tps:
                raise UserError(f"--rollout-tp {self.pins.rollout_tp} is not usable for {self.cluster.model} on {self.cluster.gpu}; valid: {tps}")
            return [self.pins.rollout_tp]
        if not tps:
            raise UserError(f"{self.cluster.model} does not fit a rollout instance on {self.cluster.gpu} at any TP up to {self.cluster.gpus_per_node}")
        return tps

    def splits(self) -> list[int]:
        """Rollout GPU counts to consider: whole nodes (any count on a single node), never leaving
        training more GPUs than its backend can use (``ClusterSpec.max_train_gpus``, the same
        limit Libra's planner honours); when that limit cuts every node-aligned split, the split
        that gives training exactly the limit."""
        n, g = self.cluster.n_gpus, self.cluster.gpus_per_node
        cap = self.cluster.train_gpu_cap
        if self.pins.split is not None:
            r, t = self.pins.split
            if r + t != n or r < 1 or t < 1:
                raise UserError(f"--split {r}:{t} must be two positive GPU counts summing to --gpus {n}")
            if t > cap:
                raise UserError(f"--split {r}:{t} gives training {t} GPUs but its backend uses at most {cap} (--max-train-gpus); "
                                f"e.g. --split {n - cap}:{cap}")
            return [r]
        cands = [r for r in range(g, n, g)] or [r for r in range(1, n)]
        kept = [r for r in cands if n - r <= cap]
        if not kept and 1 <= cap < n:
            kept = [n - cap]
        return kept

    def train_gpus(self, rollout_gpus: int, colocated: bool) -> int:
        """GPUs training runs on: the rest of the cluster, or (colocated) every GPU its backend
        can use."""
        return self.cluster.train_gpu_cap if colocated else self.cluster.n_gpus - rollout_gpus

    def train_config(self, n_gpus: int, tokens: int, seq_len: int, seq_max: int) -> tuple[TrainConfig, float] | None:
        """The fastest training strategy on ``n_gpus`` honouring the pins (None: none fits).

        Unpinned: the decision tree's best. Pinned: every fitting leaf of the tree (no
        dominance pruning, a pinned shape may be one the tree would prune), filtered by the pins.
        """
        p = self.pins
        pinned = any(v is not None for v in (p.train_tp, p.train_pp, p.train_ep, p.micro_batch))
        if not pinned:
            res = self.tree.best(n_gpus, tokens, max(seq_len, 1), max(seq_max, 1))
            return (res.ranked[0][1], res.ranked[0][0]) if res.ranked else None
        res = enumerate_strategies(
            self.costs.ev, n_gpus, max(1, tokens // max(seq_len, 1)), max(seq_max, 1), self.cluster.gpus_per_node,
            training_time_fn(self.costs.step, tokens, max(seq_len, 1), self.kl), dominance=False,
        )
        for t, cfg in sorted(res.ranked, key=lambda r: r[0]):
            if all(want is None or getattr(cfg, f) == want for f, want in
                   (("tp", p.train_tp), ("pp", p.train_pp), ("ep", p.train_ep), ("micro_batch", p.micro_batch))):
                return cfg, t
        pins = ", ".join(f"{k}={v}" for k, v in (("tp", p.train_tp), ("pp", p.train_pp), ("ep", p.train_ep),
                                                 ("micro_batch", p.micro_batch)) if v is not None)
        fits = sorted({(c.tp, c.pp) for _, c in res.ranked})
        raise UserError(
            f"no training strategy with {pins} fits {n_gpus} GPUs for {self.cluster.model} on {self.cluster.gpu} "
            f"({res.why_none() if not res.ranked else 'these tp x pp fit: ' + ', '.join(f'{a}x{b}' for a, b in fits)})"
        )

    def no_fit_message(self, n_gpus: int, tokens: int, seq_len: int, seq_max: int) -> str:
        res = self.tree.best(n_gpus, tokens, max(seq_len, 1), max(seq_max, 1))
        return res.why_none()

    def rollout_estimate(self, steps: Sequence[tuple[StepArrays, np.ndarray]], tp: int, n_gpus: int) -> float:
        return float(sum(step_bound(s, lat, self.costs, [tp], n_gpus).bound_s for s, lat in steps))


def _train_shape(steps: Sequence[StepArrays]) -> tuple[int, int, int]:
    """(tokens per step, mean sequence length, longest sequence) over ``steps`` (mean step)."""
    tot = np.concatenate([s.total_tokens for s in steps]) if steps else np.array([1])
    return int(tot.sum() / max(len(steps), 1)), int(round(float(tot.mean()))), int(tot.max())


class StaticPolicy:
    """A fixed plan chosen once (see the module docstring); least-loaded routing, no pool."""

    sees_future = False

    def __init__(self, name: str, cluster: ClusterSpec, costs: SimCosts, pins: Pins, *, colocated: bool,
                 modes: Sequence[str], staleness: int, kl: bool = False, hindsight: Sequence[StepArrays] | None = None,
                 seed: int = 0, sim_config: Any = None) -> None:
        """``modes``: the loops it may run ("sync", "async"), the fastest estimate (or, in
        hindsight, replay) winning; ``staleness``: the bound its async loop runs with;
        ``sim_config``: the replay's ``SimConfig`` (the hindsight replays use its KV mode,
        mini-batches, KL and seed, with noise off)."""
        if not modes:
            raise ValueError(f"{name}: no loop mode to run")
        self.name = name
        self.cluster = cluster
        self.costs = costs
        self.pins = pins
        self.colocated = colocated
        self.modes = tuple(modes)
        self.staleness = staleness
        self.kl = kl
        self.hindsight = list(hindsight) if hindsight is not None else None
        self.seed = seed
        self.sim_config = sim_config
        self.hindsight_report: dict[str, Any] = {}
        self._plan: Plan | None = None

    # -- Policy
    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        if self._plan is None:
            self._plan = self._choose(prompt_tokens)
        return self._plan

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        return LeastLoadedRouter(plan)

    def pool(self, plan: Plan) -> PoolPolicy | None:
        return None

    # -- choice
    def _choose(self, prompt_tokens: np.ndarray) -> Plan:
        ch = _Chooser(self.cluster, self.costs, self.pins, self.kl)
        if self.hindsight is not None:
            steps = [(s, resolve_latencies(s, self.seed)) for s in self.hindsight]
            basis = "hindsight: searched over the whole replayed trace"
            max_context = max(int(s.total_tokens.max()) for s, _ in steps if s.n)
        else:
            gen, tool, top = PRIOR_GEN_TOKENS, PRIOR_TOOL_TOKENS, PRIOR_MAX_CONTEXT
            cap = self.cluster.max_context
            if cap is not None and cap < PRIOR_MAX_CONTEXT:
                # a known context limit (libra-run's max_context) is what its verl config would say:
                # the prior's response budget shrinks by the same factor as Libra's length prior
                scale = cap / PRIOR_MAX_CONTEXT
                gen, tool, top = max(PRIOR_TURNS, int(PRIOR_GEN_TOKENS * scale)), max(1, int(PRIOR_TOOL_TOKENS * scale)), cap
            ps = prior_step(prompt_tokens, gen=gen, tool_tokens=tool)
            steps = [(ps, resolve_latencies(ps, self.seed))]
            basis = f"first step's prompts + length prior ({gen} gen tokens over {PRIOR_TURNS} turns, max context {top})"
            max_context = max(top, int(prompt_tokens.max()) if len(prompt_tokens) else 0)
        tokens, seq_len, seq_max = _train_shape([s for s, _ in steps])
        n = self.cluster.n_gpus
        sc = self.costs.step  # the prices the replay charges (libra.planner.step_costs)
        fixed = sc.step_fixed_s(round(sum(s.n for s, _ in steps) / len(steps)))
        cands: list[tuple[float, int, int, TrainConfig, float, float, str]] = []
        if self.colocated:
            splits = [n]
        elif self.hindsight is not None and self.pins.split is None:
            splits = self._hindsight_splits(ch)
        else:
            splits = ch.splits()
        tried: list[str] = []
        for r in splits:
            t_gpus = ch.train_gpus(r, self.colocated)
            tc = ch.train_config(t_gpus, tokens, seq_len, seq_max)
            if tc is None:
                tried.append(f"{r}:{t_gpus} ({ch.no_fit_message(t_gpus, tokens, seq_len, seq_max)})")
                continue
            cfg, train_s = tc
            for tp in ch.rollout_tps(max_context):
                if r % tp:
                    continue
                roll = ch.rollout_estimate(steps, tp, r) / len(steps)
                inst = self._instances(r, tp)
                if self.colocated:  # both stage switches and the IPC hand-over
                    over = sc.colocated_overhead_s(cfg, inst)
                else:  # the weight push, over NVLink when training and rollout share a domain
                    over = sc.weight_sync_s(cfg, inst, sc.train_gpus(n, t_gpus, False, inst))
                stage = train_s + fixed  # the training stage plus the per-sample bookkeeping
                for mode in self.modes:  # the planner's formulas (libra.planner.search.step_time)
                    step_s = max(roll, stage + over) if mode == "async" else roll + stage + over
                    cands.append((step_s, r, tp, cfg, roll, stage, mode))
        if not cands:
            raise UserError(f"{self.name}: {self._what_would_fit(ch, tokens, seq_len, seq_max, tried)}")
        cands.sort(key=lambda c: (c[0], c[6] != "sync", c[1], c[2]))
        plans = [self._plan_for(*c, basis=basis) for c in cands]
        if self.hindsight is None or len(plans) == 1:
            return plans[0]
        return self._hindsight(plans)

    def _hindsight_splits(self, ch: _Chooser) -> list[int]:
        """Rollout GPU counts the hindsight search visits: the same grid as Libra's planner
        (training GPUs in steps of ``libra.planner.search.train_unit``: 1 GPU up to 4 nodes, half a
        node up to 16, whole nodes beyond; never more training GPUs than the backend uses), so a
        gain of Libra is never a finer split the baseline was not allowed."""
        from libra.planner.search import train_unit

        n, cap = self.cluster.n_gpus, self.cluster.train_gpu_cap
        unit = train_unit(n, self.cluster.gpus_per_node)
        trains = [t for t in range(unit, n, unit) if t <= cap]
        if not trains and 1 <= cap < n:
            trains = [cap]
        return [n - t for t in trains] or ch.splits()

    def _what_would_fit(self, ch: _Chooser, tokens: int, seq_len: int, seq_max: int, tried: list[str]) -> str:
        """Why nothing fits, and what would: the smallest training GPU count above the training
        backend's limit when that limit is what cuts every strategy, else the smallest cluster
        (whole nodes, up to 64)."""
        g = self.cluster.gpus_per_node
        head = f"no training strategy fits {self.cluster.model} on {self.cluster.n_gpus} x {self.cluster.gpu}"
        why = f" ({tried[-1]})" if tried else ""
        cap = self.cluster.train_gpu_cap
        if cap < self.cluster.n_gpus:
            top = self.cluster.n_gpus if self.colocated else self.cluster.n_gpus - 1
            for t in range(cap + 1, top + 1):
                tc = ch.train_config(t, tokens, seq_len, seq_max)
                if tc is not None:
                    cfg = tc[0]
                    return (f"{head} with training on at most {cap} GPU(s) (--max-train-gpus){why}; training needs {t} "
                            f"(e.g. tp={cfg.tp} pp={cfg.pp} dp={cfg.dp} zero={cfg.zero_stage}): try --max-train-gpus {t}")
        for nodes in range(1, 65):
            t = nodes * g
            tc = ch.train_config(t, tokens, seq_len, seq_max)
            if tc is not None:
                cfg = tc[0]
                total = t if self.colocated else t + g
                return (f"{head}{why}; training needs {t} GPUs (e.g. tp={cfg.tp} pp={cfg.pp} dp={cfg.dp} zero={cfg.zero_stage}"
                        f"{' recompute' if cfg.recompute else ''}): try --gpus {total}")
        return f"{head}{why}; nothing up to {64 * g} GPUs fits: use a larger-memory GPU"

    def _instances(self, r: int, tp: int) -> tuple[RolloutInstance, ...]:
        """``r // tp`` uniform TP-``tp`` instances on the first NVLink domains."""
        return uniform_instances(r, tp, self.cluster.gpus_per_node,
                                 nvlink_domain=nvlink_domain(getattr(self.costs.ev, "gpu", None), self.cluster.gpus_per_node))

    def _plan_for(self, step_s: float, r: int, tp: int, cfg: TrainConfig, roll: float, train_s: float, mode: str,
                  basis: str) -> Plan:
        n = self.cluster.n_gpus
        return Plan(
            n_rollout_gpus=r,
            n_train_gpus=self.cluster.train_gpu_cap if self.colocated else n - r,
            train=cfg,
            instances=self._instances(r, tp),
            buckets=(Bucket(0, tp, 0, None),),
            mode="async" if mode == "async" else "sync",
            max_staleness=self.staleness if mode == "async" else 0,
            colocated=self.colocated,
            predicted_rollout_s=roll,
            predicted_train_s=train_s,
            predicted_step_s=step_s,
            notes={"policy": self.name, "chosen_by": basis, "rollout_tp": tp,
                   "split": f"{r}:{n - r}" if not self.colocated else f"{n} colocated"},
        )

    def _hindsight(self, plans: list[Plan]) -> Plan:
        """Hindsight only: the fastest of ``plans`` (every feasible split x homogeneous rollout
        TP x allowed loop, ranked by the estimate) by *replay*, noise off, with the replay's own
        settings. Two stages, so the search stays a few times one replay:

        1. every candidate is replayed on up to ``HINDSIGHT_STEPS`` evenly spaced steps (the
           whole trace when it has no more, then the result is exact), in estimate order; a
           candidate is skipped without replaying when a *lower bound* of its sample time
           (``_sample_bound``: the rollout's makespan lower bound per step, the training and
           sync the replay charges exactly with noise off, and the loop's overlap at best)
           already reaches the fastest replayed (the bound's work term is an estimate of the best
           efficiency, ``sim.bounds``, so the cut is as safe as that estimate; the brute-force
           test checks it);
        2. the ``HINDSIGHT_FINALISTS`` fastest are replayed on the whole trace and the fastest
           is kept.

        Results are cached per (trace steps, plan, replay settings) in ``SimCosts.memo``, so a
        sweep or a repeated search in one process replays a candidate once. What it did is in
        ``hindsight_report`` and the plan's notes."""
        import time

        trace = self.hindsight or []
        k = min(HINDSIGHT_STEPS, len(trace))
        sample = [trace[round(i * (len(trace) - 1) / max(k - 1, 1))] for i in range(k)] if k > 1 else trace[:1]
        whole = len(sample) == len(trace)
        t0 = time.perf_counter()
        lats = [resolve_latencies(s, self.seed) for s in sample]
        scored: list[tuple[float, int, Plan]] = []
        pruned = 0
        for idx, plan in enumerate(plans):
            best = min((t for t, _, _ in scored), default=float("inf"))
            if self._sample_bound(plan, sample, lats) >= best:
                pruned += 1
                continue
            scored.append((self._replay_wall(plan, sample), idx, plan))
        scored.sort(key=lambda x: (x[0], x[1]))
        finalists = scored if whole else scored[:HINDSIGHT_FINALISTS]
        if whole:
            final = finalists
        else:
            final = sorted(((self._replay_wall(p, trace), i, p) for _, i, p in finalists), key=lambda x: (x[0], x[1]))
        wall, _, plan = final[0]
        self.hindsight_report = {
            "candidates": len(plans), "replayed": len(scored), "pruned_by_bound": pruned, "sample_steps": len(sample),
            "finalists": 0 if whole else len(finalists), "search_s": time.perf_counter() - t0, "best_wall_s": wall,
        }
        notes = dict(plan.notes)
        where = (f"all {len(trace)} steps" if whole else
                 f"{len(sample)} of its {len(trace)} steps, the {len(finalists)} fastest then on all of them")
        notes["chosen_by"] = (f"hindsight: every (split, TP, loop) over the whole trace ({len(plans)} candidates, "
                              f"{pruned} cut by a lower bound) replayed on {where}")
        notes["hindsight_candidates"] = len(plans)
        notes["hindsight_replayed"] = len(scored)
        return replace(plan, notes=notes, predicted_step_s=wall / max(len(trace), 1))

    def _sim_config(self, mode: str) -> Any:
        """The replay settings of a hindsight candidate: the replay's own, noise off, the
        candidate's loop, this baseline's staleness class."""
        from sim.loop import SimConfig

        base = self.sim_config if self.sim_config is not None else SimConfig(seed=self.seed)
        return replace(base, mode=mode, staleness=self.staleness if mode == "async" else None,
                       max_staleness=max(self.staleness, 0), streaming=False, noise_sigma=0.0, faults=(), gantt_step=None)

    def _replay_wall(self, plan: Plan, steps: Sequence[StepArrays]) -> float:
        """Simulated wall time of ``plan`` held fixed over ``steps`` (cached, see ``_hindsight``)."""
        from sim.loop import Simulator

        cfg = self._sim_config(plan.mode)
        key = ("hindsight-wall", _steps_digest(steps), _plan_key(plan),
               (cfg.mode, cfg.staleness, cfg.kl, cfg.kv_mode, cfg.seed, cfg.mini_batches))
        got = self.costs.memo.get(key)
        if got is None:
            got = self.costs.memo[key] = Simulator(steps, _FixedPlan(plan), self.cluster, self.costs, cfg).run().wall_s
        return float(got)  # type: ignore[arg-type]

    def _sample_bound(self, plan: Plan, steps: Sequence[StepArrays], lats: Sequence[np.ndarray]) -> float:
        """A lower bound of ``_replay_wall(plan, steps)``: each rollout at least its makespan
        lower bound (``sim.bounds``), each training stage and weight sync exactly what the
        replay charges with noise off (``StepCosts``), and in async mode the best overlap (the
        rollouts back to back, or the training chain back to back)."""
        sc = self.costs.step
        tp = plan.instances[0].tp if plan.instances else 1
        rolls = [step_bound(s, lat, self.costs, [tp], plan.n_rollout_gpus).bound_s for s, lat in zip(steps, lats)]
        gpus = sc.train_gpus(self.cluster.n_gpus, plan.n_train_gpus, plan.colocated, plan.instances)
        over = (sc.colocated_overhead_s(plan.train, plan.instances) if plan.colocated
                else sc.weight_sync_s(plan.train, plan.instances, gpus))
        trains = []
        for s in steps:
            tot = s.total_tokens
            seq = int(round(float(tot.mean()))) if s.n else 1
            trains.append(sc.train_s(plan.train, int(tot.sum()), seq, self.kl) + sc.step_fixed_s(s.n) + over)
        if plan.mode == "async":
            return max(sum(rolls) + trains[-1], rolls[0] + sum(trains))
        return sum(rolls) + sum(trains)


def _steps_digest(steps: Sequence[StepArrays]) -> str:
    """A digest of what a replay of ``steps`` depends on (the cache key of a hindsight replay)."""
    import hashlib

    h = hashlib.sha1()
    for s in steps:
        h.update(str((s.step, s.n)).encode())
        for arr in (s.prompt_tokens, s.total_tokens, s.total_gen_tokens, s.tool_code):
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _plan_key(plan: Plan) -> tuple[object, ...]:
    """What makes two fixed plans replay the same."""
    return (plan.n_rollout_gpus, plan.n_train_gpus, plan.train, plan.instances, plan.colocated, plan.mode,
            plan.max_staleness, plan.streaming)


class _FixedPlan:
    """The same plan every step, least-loaded routing, no pool (for the hindsight replays)."""

    sees_future = False

    def __init__(self, plan: Plan) -> None:
        self.name = "hindsight-candidate"
        self._plan = plan

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        return self._plan

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        return LeastLoadedRouter(plan)

    def pool(self, plan: Plan) -> PoolPolicy | None:
        return None


def _costs(cluster: ClusterSpec, opts: dict[str, Any]) -> SimCosts:
    """The ground-truth cost wrapper passed in ``opts["costs"]``, or a fresh one."""
    c = opts.get("costs")
    if c is None:
        from sim.costs import load_costs

        c = load_costs(cluster.gpu, cluster.model, cluster.gpus_per_node, engine=cluster.engine)
    return c


def verl_colocated(cluster: ClusterSpec, **opts: Any) -> StaticPolicy:
    """verl hybrid engine: all GPUs roll out, then all train (offload/reload in between)."""
    pins = Pins.from_opts(opts)
    if pins.split is not None:
        raise UserError("verl-colocated uses every GPU for both stages; --split does not apply")
    return StaticPolicy("verl-colocated", cluster, _costs(cluster, opts), pins, colocated=True, modes=("sync",), staleness=0,
                        kl=bool(opts.get("kl")), seed=int(opts.get("seed", 0)), sim_config=opts.get("sim_config"))


def _class(opts: dict[str, Any]) -> int:
    """The staleness class K of the replay (``max_staleness``; callers written before the class
    existed pass only ``staleness``)."""
    k = opts.get("max_staleness")
    if k is None:
        k = opts.get("staleness") if opts.get("mode") == "async" else 0
    return max(0, int(k or 0))


def verl_static_uniform(cluster: ClusterSpec, **opts: Any) -> StaticPolicy:
    """A fixed rollout/training split with uniform TP, least-loaded routing: synchronous, or with
    K >= 1 verl's one-step-off async (staleness 1) when its estimate is faster."""
    k = _class(opts)
    modes = (opts["mode"],) if opts.get("mode") else (("sync", "async") if k >= 1 else ("sync",))
    return StaticPolicy("verl-static-uniform", cluster, _costs(cluster, opts), Pins.from_opts(opts), colocated=False, modes=modes,
                        staleness=int(opts.get("staleness") or 1) if k >= 1 else 0, kl=bool(opts.get("kl")),
                        seed=int(opts.get("seed", 0)), sim_config=opts.get("sim_config"))


def areal_static_optimal(cluster: ClusterSpec, **opts: Any) -> StaticPolicy:
    """The best fixed (split, TP) in hindsight over the whole trace, asynchronous at the class's
    staleness K (>= 1: ``MIN_STALENESS``)."""
    trace = opts.get("trace_steps")
    if not trace:
        raise UserError("areal-static-optimal searches in hindsight and needs the replayed trace (trace_steps)")
    # the replay API always passes the class; a direct call without it means the legacy K = 1
    k = int(opts["max_staleness"]) if opts.get("max_staleness") is not None else max(1, int(opts.get("staleness") or 1))
    if k < MIN_STALENESS["areal-static-optimal"]:
        raise UserError("areal-static-optimal is asynchronous by design and runs only with --max-staleness >= 1 "
                        "(this replay's staleness class is K=0: on-policy)")
    modes = (opts["mode"],) if opts.get("mode") else ("async",)
    return StaticPolicy("areal-static-optimal", cluster, _costs(cluster, opts), Pins.from_opts(opts), colocated=False, modes=modes,
                        staleness=int(opts.get("staleness") or k), kl=bool(opts.get("kl")), hindsight=trace,
                        seed=int(opts.get("seed", 0)), sim_config=opts.get("sim_config"))


#: name -> factory(cluster, **opts); opts: costs (SimCosts), seed, kl, max_staleness (the class
#: K), staleness (the async bound to run with, <= K), mode (a loop override), sim_config (the
#: replay's ``SimConfig``), trace_steps (hindsight only) and the pins of ``Pins``.
BASELINES = {
    "verl-colocated": verl_colocated,
    "verl-static-uniform": verl_static_uniform,
    "areal-static-optimal": areal_static_optimal,
}
