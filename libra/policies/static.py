"""``StaticPolicy``: a fixed plan chosen once, the shape of every paper baseline.

The baselines (``libra.policies.verl``, ``libra.policies.areal``) are honest ``Policy`` objects
like Libra's, driven by both backends through the same calls: least-loaded routing, no elastic
pool, and one plan chosen at the first ``plan`` call and kept.

How they choose: they know the first step's prompt lengths and nothing else, so they assume the
baselines' length prior (``libra.policies.prior``) for the rest of each trajectory. Only rollout
TPs whose KV cache holds the max context are candidates (vLLM refuses a ``max_model_len`` above
its KV capacity). For each candidate (rollout GPUs in multiples of a node, every valid rollout
TP) they predict the rollout with the makespan lower bound (``libra.planner.bounds``) of the
prior step and the training with the policy core's decision tree
(``libra.planner.decision_tree``), both priced by the core's ``RolloutCosts``/``StepCosts``
(the prices a replay charges), and pick the fastest step in the loops they may run. Any of the
pins in ``PolicyOptions`` (``split``, ``rollout_tp``, ``train_tp``, ``train_pp``, ``train_ep``,
``micro_batch``; ``--split``... on the command line) fixes that choice instead. A training
backend's device limit (``ClusterSpec.max_train_gpus``, ``--max-train-gpus``) bounds their
training side exactly as it bounds Libra's planner: splits give training at most that many GPUs
(the rest roll out), and a colocated plan trains on that many of its GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.bounds import step_bound
from libra.planner.costs import make_evaluator, nvlink_domain
from libra.planner.decision_tree import DecisionTree, enumerate_strategies, sequence_count, training_time_fn
from libra.planner.packing import place
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.planner.rollout_costs import RolloutCosts
from libra.planner.search import declared_context
from libra.planner.settle import settle_training
from libra.policies.options import PolicyOptions
from libra.policies.prior import PRIOR_GEN_TOKENS, PRIOR_MAX_CONTEXT, PRIOR_TOOL_TOKENS, PRIOR_TURNS, prior_step
from libra.pool.base import PoolPolicy
from libra.scheduling.base import RolloutScheduler
from libra.scheduling.routers import LeastLoadedRouter
from libra.trace.columnar import StepArrays
from libra.trace.latencies import resolve_latencies


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


class Chooser:
    """Shared search over (rollout GPUs, rollout TP, training strategy) for the baselines."""

    def __init__(self, cluster: ClusterSpec, costs: RolloutCosts, options: PolicyOptions, kl: bool) -> None:
        self.cluster = cluster
        self.costs = costs
        self.options = options
        self.tree = DecisionTree(costs.step, cluster.gpus_per_node, kl=kl)
        self.kl = kl

    def rollout_tps(self, max_context: int) -> list[int]:
        """Rollout TPs to consider: valid, and (unless pinned) holding ``max_context`` tokens of
        KV; the largest valid TP if none does."""
        dom = nvlink_domain(getattr(self.costs.ev, "gpu", None), self.cluster.gpus_per_node)
        tps = [t for t in self.costs.ev.valid_rollout_tps() if t <= dom]
        if self.options.rollout_tp is None and tps:
            holding = [t for t in tps if self.costs.kv_capacity(t) >= max_context + 1]
            tps = holding or [max(tps)]
        if self.options.rollout_tp is not None:
            if self.options.rollout_tp not in tps:
                raise UserError(f"--rollout-tp {self.options.rollout_tp} is not usable for {self.cluster.model} on {self.cluster.gpu}; valid: {tps}")
            return [self.options.rollout_tp]
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
        if self.options.split is not None:
            r, t = self.options.split
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
        p = self.options
        if not p.pinned_training:
            res = self.tree.best(n_gpus, tokens, max(seq_len, 1), max(seq_max, 1))
            return (res.ranked[0][1], res.ranked[0][0]) if res.ranked else None
        res = enumerate_strategies(
            self.costs.ev, n_gpus, sequence_count(tokens, seq_len), max(seq_max, 1), self.cluster.gpus_per_node,
            training_time_fn(self.costs.step, tokens, max(seq_len, 1), self.kl), dominance=False,
            bound=False,  # the bound would cut pinned shapes slower than the unpinned best
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

    def train_alternatives(self, n_gpus: int, tokens: int, seq_len: int, seq_max: int) -> list[tuple[TrainConfig, float]]:
        """Every fitting training strategy (with its time) the tree ranks on ``n_gpus``, unbounded
        (the pinned one alone when training is pinned): a time-shared plan picks among them by
        training plus stage switches, since a strategy that trains faster may offload and reload
        far more state at every switch. Unbounded because the tree's branch and bound cuts the
        leaves slower to train, which may be the cheapest to switch (Libra's planner takes the
        same list, ``Planner._colocated``)."""
        if self.options.pinned_training:
            one = self.train_config(n_gpus, tokens, seq_len, seq_max)
            return [one] if one is not None else []
        res = self.tree.every_leaf(n_gpus, tokens, max(seq_len, 1), max(seq_max, 1))
        return [(cfg, t) for t, cfg in res.ranked]

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

    def __init__(self, name: str, cluster: ClusterSpec, options: PolicyOptions, *, colocated: bool,
                 modes: Sequence[str], staleness: int) -> None:
        """``modes``: the loops it may run ("sync", "async"), the fastest estimate winning;
        ``staleness``: the bound its async loop runs with. Prices come from ``options.ev`` (the
        evaluator the backend shares) or, without one, the cluster's own evaluator."""
        if not modes:
            raise ValueError(f"{name}: no loop mode to run")
        self.name = name
        self.cluster = cluster
        self.options = options
        ev = options.ev if options.ev is not None else make_evaluator(cluster)
        self.costs = RolloutCosts(ev, cluster.gpus_per_node)
        self.colocated = colocated
        self.modes = tuple(modes)
        self.staleness = staleness
        self.kl = options.kl
        self.seed = options.seed
        self._plan: Plan | None = None
        self._tree: DecisionTree | None = None  # for ``settle_training``

    # -- Policy
    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        """The plan chosen at the first call (from its prompts), the same ever after."""
        if self._plan is None:
            self._plan = self._choose(prompt_tokens)
        return self._plan

    def scheduler(self, plan: Plan, future: StepArrays | None = None) -> RolloutScheduler:
        """Least-loaded routing over the plan's one bucket."""
        return LeastLoadedRouter(plan)

    def pool(self, plan: Plan) -> PoolPolicy | None:
        """No elastic pool: the split is fixed."""
        return None

    def settle_training(self, plan: Plan, batch: StepArrays, seen: Sequence[StepArrays]) -> TrainConfig:
        """The micro-batch and recompute for ``batch`` within the plan's training layout
        (``libra.planner.settle``), as Libra's are: verl's dynamic batch size and AReaL's
        token-budget micro-batches set them per step from the batch, so a baseline sized once
        for a length prior is not held to that prior's micro-batches."""
        if self._tree is None:
            self._tree = DecisionTree(self.costs.step, self.cluster.gpus_per_node, kl=self.kl)
        return settle_training(self._tree, plan.train, batch, seen, declared_context(self.cluster), plan.train.n_gpus,
                               self.options.micro_batch)

    # -- choice
    def _choose(self, prompt_tokens: np.ndarray) -> Plan:
        ch = Chooser(self.cluster, self.costs, self.options, self.kl)
        steps, basis, max_context = self._basis(prompt_tokens)
        tokens, seq_len, seq_max = _train_shape([s for s, _ in steps])
        n = self.cluster.n_gpus
        # memory holds the longest context the run may bring, as Libra's planner's does
        # (``DecisionTree.memory_length``: the declared limit, when one is declared), checked on
        # the most training GPUs any of its plans has; hindsight knows lengths, not what may come
        splits = [n] if self.colocated else self._splits(ch)
        if splits:
            seq_max = ch.tree.memory_length(ch.train_gpus(min(splits), self.colocated), tokens, max(seq_len, 1), seq_max,
                                            declared_context(self.cluster))
        sc = self.costs.step  # the prices the replay charges (libra.planner.step_costs)
        fixed = sc.step_fixed_s(round(sum(s.n for s, _ in steps) / len(steps)))
        cands: list[tuple[float, int, int, TrainConfig, float, float, str]] = []
        tried: list[str] = []
        for r in splits:
            t_gpus = ch.train_gpus(r, self.colocated)
            tc = ch.train_config(t_gpus, tokens, seq_len, seq_max)
            if tc is None:
                tried.append(f"{r}:{t_gpus} ({ch.no_fit_message(t_gpus, tokens, seq_len, seq_max)})")
                continue
            cfg, train_s = tc
            alts = ch.train_alternatives(t_gpus, tokens, seq_len, seq_max) if self.colocated else [tc]
            for tp in ch.rollout_tps(max_context):
                if r % tp:
                    continue
                roll = ch.rollout_estimate(steps, tp, r) / len(steps)
                inst = self._instances(r, tp)
                if self.colocated:  # both stage switches and the IPC hand-over, which depend on the strategy
                    cfg, train_s = min(alts or [tc], key=lambda a: (a[1] + sc.colocated_overhead_s(a[0], inst), a[1]))
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
        return self._select(plans)

    # -- what a subclass changes (``libra.policies.areal``: the hindsight search)
    def _basis(self, prompt_tokens: np.ndarray) -> tuple[list[tuple[StepArrays, np.ndarray]], str, int]:
        """The steps the choice is estimated on (each with its resolved tool latencies), how to
        say so in the plan's notes, and the context the rollout TPs must hold: the first step's
        prompts with the length prior (``libra.policies.prior``), scaled into a known context
        limit (``ClusterSpec.max_context``)."""
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
        return steps, basis, max_context

    def _splits(self, ch: Chooser) -> list[int]:
        """Rollout GPU counts to try for a split plan (``Chooser.splits``: whole nodes, or the pin)."""
        return ch.splits()

    def _select(self, plans: list[Plan]) -> Plan:
        """The plan to keep among ``plans`` (sorted by the estimated step time): the fastest estimate."""
        return plans[0]

    def _what_would_fit(self, ch: Chooser, tokens: int, seq_len: int, seq_max: int, tried: list[str]) -> str:
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
