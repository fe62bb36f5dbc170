"""Diagnostic: the rollout DP's load model against the simulator, layout by layout.

    .venv/bin/python experiments/dp_fidelity.py [--csv OUT.csv]

For generated workloads x clusters, and for one-bucket layouts of every usable TP on a quarter,
a half and all of the cluster's GPUs, it predicts the rollout makespan with the DP fed the step's
own trajectories (hindsight: what ``Planner.hindsight_rollout_s`` does, so the length forecast's
error is left out) and simulates that same layout alone (``sim.rollout.RolloutStage``,
work-conserving least-loaded routing, noise off). It prints simulated / predicted per layout and
the median, the mean absolute error and the spread (standard deviation of the log ratio) over all
of them. The spread is what ranks layouts wrongly (the median is corrected by the planner's
measured feedback, ``libra.planner.feedback``). Every number is SIMULATED or PREDICTED.

Measured in session 5 (117 layouts of six workloads x clusters, 2 cores, ~1.5 min; the old code
run with this script copied into a checkout of it):

| DP load model | median | mean abs. error | log-sd | range |
| --- | ---: | ---: | ---: | ---: |
| commit 373b7e5 (the tail at the average instance's batch) | 1.061 | 10.2% | 0.100 | 0.882..1.468 |
| + the tail's own instance's batch | 1.054 | 9.3% | 0.093 | 0.921..1.468 |
| + the others' prefill in the tail's iterations | 1.031 | 7.2% | 0.079 | 0.886..1.421 |
| + the step's start: first turns together, after the prompts (session 13) | 1.012 | 5.3% | 0.068 | 0.877..1.332 |
| + the trajectory that generates most as a third tail (session 19) | 1.000 | 5.7% | 0.079 | 0.790..1.332 |
| + the prompts at their admission batch's prefill rate (session 22, current) | 1.007 | 5.7% | 0.081 | 0.797..1.369 |

Session 19 added `--logs`: eight converted public logs (``LOG_CASES``; each replayed in an earlier
held-out grid), 119 more layouts, their steps' tool latencies as the replay draws them where the
log has none. Over all 236 layouts (2 cores, ~45 s):

| DP load model | median | mean abs. error | log-sd | range |
| --- | ---: | ---: | ---: | ---: |
| session 13's | 1.017 | 10.6% | 0.158 | 0.744..2.455 |
| + the third tail (session 19) | 1.000 | 4.3% | 0.067 | 0.744..1.332 |
| + the prompts at their admission batch's prefill rate (session 22, current) | 1.008 | 4.0% | 0.060 | 0.797..1.369 |

Session 22 (``RolloutDP.prefill_rates``): on the 119 log layouts alone the mean absolute error went
3.0% -> 2.2% and the log-sd 0.053 -> 0.028 (range 0.744..1.083 -> 0.958..1.147); the spread across
the layouts of one step, what ranks layouts, 0.032 -> 0.027 on average and 0.106 -> 0.060 at most
over the 20 steps; the generated workloads' rows are unchanged but for their maximum (2 cores,
~70 s; SIMULATED / PREDICTED).

The logs' error was the tail: where tool returns make most of the context (InterCode-SQL 1.49x
median, tau-bench airline 1.23x) the longest trajectory generates little and the one that
decodes longest was no tail (now 0.98x and 1.00x). On the generated workloads alone the third
tail over-predicts Search-R1-like steps by 5-10% where their critical path and load are close
(search-long-large 0.987 -> 0.951 median, search-drift 1.009 -> 0.972): the median is what the
planner's measured feedback corrects, the spread is not.

The residual is largest where the critical path binds on a loaded instance (Search-R1 steps 14
and 20 on 48 A800: 1.1-1.4x, more with fewer instances); the likely cause, not verified, is that
the critical trajectory's turns wait behind busy batches at each return from a tool, which the
DP's ``max(load, critical path)`` does not charge.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra.cluster import ClusterSpec  # noqa: E402
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig  # noqa: E402
from libra.planner.rollout_dp import BucketLayout, RolloutDP  # noqa: E402
from libra.planner.search import Planner, SearchOptions  # noqa: E402
from libra.planner.stats import compute_stats  # noqa: E402
from libra.scheduling.routers import LeastLoadedRouter  # noqa: E402
from libra.trace.latencies import resolve_latencies  # noqa: E402
from libra.trace.workload import generate_steps  # noqa: E402
from sim.costs import load_costs  # noqa: E402
from sim.loop import observed_step  # noqa: E402
from sim.noise import Noise  # noqa: E402
from sim.rollout import RolloutStage  # noqa: E402


@dataclass(frozen=True)
class Case:
    """A generated workload on a cluster, and which of its steps to check."""

    name: str
    workload: str
    steps: int
    batch: int
    group_size: int
    seed: int
    params: dict
    gpus: int
    gpu: str
    model: str
    check: tuple[int, ...]
    trace: str | None = None  # a converted real log (``experiments/data``) instead of a generated workload


CASES = (
    Case("math-drift", "math", 12, 256, 8, 1, {"max_context": 16384, "drift": 0.08}, 64, "b200", "qwen3-30b-a3b", (1, 6)),
    Case("search-long-large", "search", 5, 1280, 5, 0, {"max_context": 16384, "max_turns": 8}, 32, "h100", "qwen3-14b", (0, 1)),
    Case("search-drift", "search", 12, 256, 8, 1, {"max_context": 8192, "drift": 0.1}, 64, "b200", "qwen3-30b-a3b", (2, 4)),
    Case("swe", "swe", 5, 256, 8, 0, {"max_context": 32768}, 32, "h100", "qwen3-14b", (1,)),
    Case("math-long-large", "math", 5, 512, 8, 0, {"max_context": 32768}, 64, "h100", "qwen3-32b", (1,)),
    # the bundled Search-R1 trace's generator and seed (traces/README.md), two steps whose critical path binds
    Case("search-r1", "search", 21, 1280, 5, 0, {}, 48, "a800", "qwen3-8b", (14, 20)),
)

#: Converted public agent logs (``experiments/data``; every one replayed in an earlier held-out
#: grid): shapes the generators do not make (many short turns, long tool waits, mixed models).
LOG_CASES = (
    Case("intercode-sql", "agent", 0, 0, 0, 0, {}, 56, "a800", "qwen3-14b", (0, 1), "held_out_22/intercode-sql-spider-dev.jsonl.gz"),
    Case("medagentbench", "agent", 0, 0, 0, 0, {}, 32, "h200", "qwen3-32b", (0, 2), "held_out_19/medagentbench-jan17v1.jsonl.gz"),
    Case("fireact-hotpotqa", "agent", 0, 0, 0, 0, {}, 48, "h100", "qwen3-32b", (0,), "held_out/fireact-hotpotqa.jsonl.gz"),
    Case("mini-swe", "agent", 0, 0, 0, 0, {}, 32, "h200", "qwen3-32b", (1,), "held_out_4/mini-swe-agent-gemini-3-pro-swebench-verified.jsonl.gz"),
    Case("tau-airline", "agent", 0, 0, 0, 0, {}, 24, "h100", "qwen3-14b", (0,), "held_out_4/tau-bench-airline-gpt-4o.jsonl.gz"),
    Case("intercode-bash", "agent", 0, 0, 0, 0, {}, 40, "a800", "qwen3-8b", (0,), "held_out_11/intercode-bash-gpt-4.jsonl.gz"),
    Case("webshop", "agent", 0, 0, 0, 0, {}, 48, "b200", "qwen3-14b", (0,), "held_out_14/webshop-react-text-davinci-002.jsonl.gz"),
    Case("bfcl", "agent", 0, 0, 0, 0, {}, 32, "h100", "qwen3-8b", (0,), "held_out_26/bfcl-multi-turn-gpt-oss-120b.jsonl.gz"),
)


def case_steps(case: Case) -> list:  # type: ignore[type-arg]
    """The case's steps: generated, or read from its converted log."""
    if case.trace is None:
        return list(generate_steps(case.workload, case.steps, case.batch, case.group_size, case.seed, **case.params))
    from sim.replay import load_steps
    steps, _header = load_steps(str(Path(__file__).resolve().parent / "data" / case.trace))
    return list(steps)


def simulate(step, plan: Plan, costs, gpus_per_node: int) -> float:  # type: ignore[no-untyped-def]
    """The layout's rollout makespan in the simulator, alone, noise off."""
    env = simpy.Environment()
    stage = RolloutStage(env, step, plan, LeastLoadedRouter(plan, work_conserving=True), None, costs, Noise(0, 0.0),
                         resolve_latencies(step, 0), "keep", gpus_per_node)
    stage.start()
    env.run(until=stage.done)
    return float(stage.stats.makespan_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="also write every layout's row here")
    ap.add_argument("--logs", action="store_true", help="also the converted public logs (LOG_CASES)")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for case in CASES + (LOG_CASES if args.logs else ()):
        steps = case_steps(case)
        cl = ClusterSpec(case.gpus, case.gpu, case.model, 8, max_context=case.params.get("max_context"))
        planner = Planner(cl, options=SearchOptions())
        costs = load_costs(case.gpu, case.model, 8)
        for si in case.check:
            step = steps[si]
            # what the planner sees of the step: each tool call's latency as the replay draws it
            # where the log recorded none (``sim.loop.observed_step``)
            stats = compute_stats([observed_step(step, resolve_latencies(step, 0))], step.prompt_tokens, window=1)
            for tp in planner.table.usable_tps:
                for g in sorted({case.gpus // 4, case.gpus // 2, case.gpus}):
                    m = g // tp
                    if m < 1:
                        continue
                    dp = RolloutDP(stats, planner.table, 8, g, planner.tps, 1, planner.nvlink_domain)
                    layout = BucketLayout((tp,), ())
                    if not dp.feasible(layout):
                        continue
                    predicted, load, critical = dp.evaluate(layout, [m])
                    insts = tuple(RolloutInstance(i, tp, 0, node=(i * tp) // 8, first_gpu=(i * tp) % 8) for i in range(m))
                    plan = Plan(m * tp, case.gpus - m * tp, TrainConfig(1, 1, 1), insts, (Bucket(0, tp, 0, None),),
                                predicted_rollout_s=predicted)
                    simulated = simulate(step, plan, costs, 8)
                    row = {"case": case.name, "cluster": f"{case.gpus}x{case.gpu}", "model": case.model, "step": si,
                           "tp": tp, "instances": m, "predicted_s": round(predicted, 3), "load_s": round(load, 3), "critical_path_s": round(critical, 3),
                           "simulated_s": round(simulated, 3), "ratio": round(simulated / predicted, 4)}
                    rows.append(row)
                    print(f"{case.name:18s} {row['cluster']:8s} step {si} TP{tp}x{m:<3d} predicted {predicted:7.1f} s  "
                          f"SIMULATED {simulated:7.1f} s  ratio {simulated / predicted:.3f}", flush=True)
    r = np.array([row["ratio"] for row in rows])
    print(f"{len(r)} layouts: SIMULATED / PREDICTED median {np.median(r):.3f}, mean absolute error "
          f"{100 * np.mean(np.abs(r - 1)):.1f}%, log-sd {np.std(np.log(r)):.3f}, range {r.min():.3f}..{r.max():.3f}")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
