"""Diagnostic: every rollout layout the planner considers, forced, on the same split, simulated.

    .venv/bin/python experiments/forced_layouts.py [--steps 0:6] [--gpus 48] [--mode async] [--router cmlfq]

For each layout the rollout DP enumerates (one or two buckets, TP per bucket, interior bound),
with the DP's own best instance counts for the rollout GPUs Libra's plan gives rollout, the step
is replayed with Libra's plan otherwise unchanged (training strategy, split). Prints the DP's
predicted rollout makespan next to the simulated one and the lower bound. It answers "is there a
heterogeneous layout the planner misses?" by brute force in the simulator. SIMULATED numbers.
It uses the trace's steps only as replayed steps; the layouts come from the planner's
statistics of completed steps (the same as Libra), so nothing here sees the future either.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.planner.stats import compute_stats
from libra.policies import LibraPolicy
from sim.costs import load_costs
from sim.loop import SimConfig, Simulator
from sim.replay import load_steps


class ForcedLayout(LibraPolicy):
    """Libra's plan with the rollout layout replaced by ``layout`` (DP's best counts)."""

    def __init__(self, cluster: ClusterSpec, layout_key: tuple, router: str, **opts: Any) -> None:
        super().__init__(cluster, "forced", router, False, 2, **opts)
        self.layout_key = layout_key
        self.used: list[str] = []

    def plan(self, cluster, history, prompt_tokens):  # type: ignore[no-untyped-def]
        plan = super().plan(cluster, history, prompt_tokens)
        if plan.colocated or not history:
            self.used.append("libra")
            return plan
        stats = compute_stats(history[-self.window:], prompt_tokens)
        dp = self.planner.rollout_dp(stats)
        tps, rank = self.layout_key
        cands = [c for c in dp._all_curves() if c.layout.tps == tps]
        scored = []
        for c in cands:
            r = dp._best_counts(c, plan.n_rollout_gpus)
            if r is not None:
                scored.append((r[0], c, r[1]))
        if len(scored) <= rank:
            self.used.append("libra")
            return plan
        scored.sort(key=lambda x: x[0])
        _, c, counts = scored[rank]
        ch = dp._materialize(c, counts, plan.n_rollout_gpus)
        self.used.append(f"{ch.layout.tps}{ch.layout.bounds}x{ch.counts} pred {ch.makespan_s:.0f}")
        new = replace(plan, instances=ch.instances, buckets=ch.buckets, predicted_rollout_s=ch.makespan_s)
        self._models[id(new)] = self._models.pop(id(plan))
        return new


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="traces/swe-qwen3-14b.jsonl.gz")
    ap.add_argument("--steps", default="0:6")
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--mode", default="async")
    ap.add_argument("--router", default="cmlfq")
    ap.add_argument("--layouts", default="8;4;2;4,8;2,8;2,4;8,8")
    a = ap.parse_args()
    cl = ClusterSpec(a.gpus, "a800", "qwen3-14b")
    costs = load_costs(cl.gpu, cl.model, cl.gpus_per_node, engine=cl.engine)
    steps, _ = load_steps(a.trace, a.steps)
    print("SIMULATED. layout | rank | mean rollout s (steps>=1) | mean LB | ratio | step | migrations, refused | preemptions, evictions | queue wait per trajectory | plan of the last step")
    for spec in a.layouts.split(";"):
        tps = tuple(int(x) for x in spec.split(","))
        for rank in ((0,) if len(tps) == 1 else (0, 1, 2)):
            pol = ForcedLayout(cl, (tps, rank), a.router, ev=costs.ev, mode=a.mode, max_staleness=1)
            res = Simulator(steps, pol, cl, costs, SimConfig(mode=a.mode, seed=0)).run()
            ro = np.mean([s.rollout_makespan_s for s in res.steps[1:]])
            lb = np.mean([s.lower_bound_s for s in res.steps[1:]])
            st = np.mean([s.step_s for s in res.steps[1:]])
            tail = res.steps[1:]
            print(f"{tps} r{rank} | rollout {ro:.1f} | LB {lb:.1f} | {ro / lb:.3f} | step {st:.1f} | migr {sum(s.migrations for s in tail)}"
                  f" refused {sum(s.migrations_refused for s in tail)} | preempt {sum(s.preemptions for s in tail)}"
                  f" evict {sum(s.evictions for s in tail)} | queue s/traj {sum(s.queue_wait_s for s in tail) / sum(s.n_traj for s in tail):.1f}"
                  f" | {pol.used[-1]}", flush=True)


if __name__ == "__main__":
    main()
