"""``areal-static-optimal``: the best fixed (split, homogeneous rollout TP, loop) **in hindsight**.

It is handed the whole replayed trace and every feasible candidate is *replayed* (noise off), not
ranked by an estimate (a shortlist of 4 ranked by the makespan lower bound missed a split 1.7x
faster on a work-bound trace). Replaying needs a simulator, so the policy takes one injected:
``PolicyOptions.hindsight``, a ``libra.policies.hindsight.HindsightReplayer`` that ``sim``
supplies (``sim.hindsight.SimReplayer``); the core never imports ``sim``. Without one
(``libra-run``) it is refused before any work starts (``HINDSIGHT_NEEDED``).

AReaL is asynchronous by design, so it runs only in staleness classes K >= 1
(``MIN_STALENESS``), at staleness K: for a fixed plan a larger bound only removes waits, so K is
its best staleness in the class. It is an upper bound on what static tuning can do, not
something a real run could know in advance, and it says so in its plan notes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.bounds import step_bound
from libra.planner.plan import Plan
from libra.policies.hindsight import HindsightReplayer
from libra.policies.options import PolicyOptions, options_for
from libra.policies.static import Chooser, StaticPolicy
from libra.trace.columnar import StepArrays
from libra.trace.latencies import resolve_latencies

NAME = "areal-static-optimal"
#: The smallest staleness class it runs in (asynchronous by design).
MIN_STALENESS = 1
#: The hindsight search replays every candidate on this many evenly spaced steps of the trace
#: (the whole trace when it has no more), then its ``HINDSIGHT_FINALISTS`` fastest on the whole
#: trace (``HindsightStaticPolicy._select``).
HINDSIGHT_STEPS = 4
HINDSIGHT_FINALISTS = 3
#: Why it cannot run without a replayer, and what to do instead (the factory's and the
#: registry's refusal: ``libra.policies.registry.check_backend``).
HINDSIGHT_NEEDED = (
    f"{NAME} needs hindsight replay: it picks its (split, TP, loop) by replaying every candidate over the "
    f"whole trace, which only the simulator can do; run it in libra-sim (`libra-sim replay TRACE --policy {NAME} "
    f"--max-staleness 1`), or for a fixed split without hindsight use verl-static-uniform (libra-sim: --split/--rollout-tp; "
    f"libra-run: split: R:T)"
)


class HindsightStaticPolicy(StaticPolicy):
    """A ``StaticPolicy`` whose choice is searched over the whole trace by replay."""

    def __init__(self, name: str, cluster: ClusterSpec, options: PolicyOptions, replayer: HindsightReplayer, *,
                 modes: Sequence[str], staleness: int, colocated: bool = False) -> None:
        super().__init__(name, cluster, options, colocated=colocated, modes=modes, staleness=staleness)
        self.replayer = replayer
        self.trace: list[StepArrays] = list(replayer.steps)
        #: what the search did (candidates, replayed, pruned_by_bound, sample_steps, finalists, search_s, best_wall_s)
        self.hindsight_report: dict[str, Any] = {}

    def _basis(self, prompt_tokens: np.ndarray) -> tuple[list[tuple[StepArrays, np.ndarray]], str, int]:
        """Every step of the trace, with its tool latencies: hindsight knows them all."""
        steps = [(s, resolve_latencies(s, self.seed)) for s in self.trace]
        basis = "hindsight: searched over the whole replayed trace"
        max_context = max(int(s.total_tokens.max()) for s, _ in steps if s.n)
        return steps, basis, max_context

    def _splits(self, ch: Chooser) -> list[int]:
        """Rollout GPU counts the hindsight search visits (a pinned split: that one): the same
        grid as Libra's planner (``libra.planner.search.split_counts`` in steps of ``train_unit``: 1
        GPU up to 4 nodes, half a node up to 16, whole nodes beyond, and the counts leaving rollout
        a multiple of the step; never more training GPUs than the backend uses), so a gain of Libra
        is never a finer split the baseline was not allowed."""
        if self.options.split is not None:
            return ch.splits()
        from libra.planner.search import split_counts, train_unit

        n, cap = self.cluster.n_gpus, self.cluster.train_gpu_cap
        unit = train_unit(n, self.cluster.gpus_per_node)
        trains = [t for t in split_counts(n, unit) if t <= cap]
        if not trains and 1 <= cap < n:
            trains = [cap]
        return [n - t for t in trains] or ch.splits()

    def _select(self, plans: list[Plan]) -> Plan:
        """The fastest of ``plans`` (every feasible split x homogeneous rollout TP x allowed loop,
        ranked by the estimate) by *replay*, noise off, with the replay's own settings. Two
        stages, so the search stays a few times one replay:

        1. every candidate is replayed on up to ``HINDSIGHT_STEPS`` evenly spaced steps (the
           whole trace when it has no more, then the result is exact), in estimate order; a
           candidate is skipped without replaying when a *lower bound* of its sample time
           (``_sample_bound``: the rollout's makespan lower bound per step, the training and
           sync the replay charges exactly with noise off, and the loop's overlap at best)
           already reaches the fastest replayed (the bound's work term is an estimate of the best
           efficiency, ``libra.planner.bounds``, so the cut is as safe as that estimate; the
           brute-force test checks it);
        2. the ``HINDSIGHT_FINALISTS`` fastest are replayed on the whole trace and the fastest
           is kept.

        The replayer may cache results (the simulator's does, per trace steps, plan and replay
        settings), so a sweep or a repeated search in one process replays a candidate once. What
        it did is in ``hindsight_report`` and the plan's notes."""
        if len(plans) == 1:
            return plans[0]
        trace = self.trace
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
            scored.append((self._wall(plan, sample), idx, plan))
        scored.sort(key=lambda x: (x[0], x[1]))
        finalists = scored if whole else scored[:HINDSIGHT_FINALISTS]
        if whole:
            final = finalists
        else:
            final = sorted(((self._wall(p, trace), i, p) for _, i, p in finalists), key=lambda x: (x[0], x[1]))
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

    def _wall(self, plan: Plan, steps: Sequence[StepArrays]) -> float:
        """The replayer's wall time of ``plan`` held fixed over ``steps`` at this policy's staleness."""
        return float(self.replayer.wall_s(plan, steps, self.staleness))

    def _sample_bound(self, plan: Plan, steps: Sequence[StepArrays], lats: Sequence[np.ndarray]) -> float:
        """A lower bound of ``_wall(plan, steps)``: each rollout at least its makespan lower bound
        (``libra.planner.bounds``), each training stage and weight sync exactly what the replay
        charges with noise off (``StepCosts``), and in async mode the best overlap (the rollouts'
        work back to back on the engines they share, or the training chain back to back)."""
        sc = self.costs.step
        tp = plan.instances[0].tp if plan.instances else 1
        bounds = [step_bound(s, lat, self.costs, [tp], plan.n_rollout_gpus) for s, lat in zip(steps, lats)]
        rolls = [b.bound_s for b in bounds]
        gpus = sc.train_gpus(self.cluster.n_gpus, plan.n_train_gpus, plan.colocated, plan.instances)
        over = (sc.colocated_overhead_s(plan.train, plan.instances) if plan.colocated
                else sc.weight_sync_s(plan.train, plan.instances, gpus))
        trains = []
        for s in steps:
            tot = s.total_tokens
            seq = int(round(float(tot.mean()))) if s.n else 1
            trains.append(sc.train_s(plan.train, int(tot.sum()), seq, self.kl) + sc.step_fixed_s(s.n) + over)
        if plan.mode == "async":  # rollouts overlap on the engines (continuous generation): their work adds up
            return max(sum(b.work_s for b in bounds) + trains[-1], rolls[0] + sum(trains))
        return sum(rolls) + sum(trains)


def areal_static_optimal(cluster: ClusterSpec, options: PolicyOptions | None = None, **kwargs: Any) -> HindsightStaticPolicy:
    """The best fixed (split, TP) in hindsight over the whole trace, asynchronous at the class's
    staleness K (>= 1: ``MIN_STALENESS``). Needs ``options.hindsight`` (``HINDSIGHT_NEEDED``)."""
    o = options_for(NAME, options, **kwargs)
    if o.hindsight is None:
        raise UserError(HINDSIGHT_NEEDED)
    # the replay API always passes the class; a direct call without it means K = max(1, staleness)
    k = int(o.max_staleness) if o.max_staleness is not None else max(MIN_STALENESS, int(o.staleness or 1))
    if k < MIN_STALENESS:
        raise UserError(f"{NAME} is asynchronous by design and runs only with --max-staleness >= {MIN_STALENESS} "
                        f"(this replay's staleness class is K={k}: on-policy)")
    modes = (o.mode,) if o.mode else ("async",)
    return HindsightStaticPolicy(NAME, cluster, o, o.hindsight, modes=modes, staleness=int(o.staleness or k))
