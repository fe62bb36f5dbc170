"""Diagnostic: the async pipeline's shared rollouts against the load model, step by step.

    .venv/bin/python experiments/pipeline_fidelity.py [--csv OUT.csv]

For a few traces on pinned layouts (``CASES``: a split and one rollout TP degree), it replays the
async loop at K = 1 with continuous generation (``libra-sim replay --policy verl-static-uniform
--split R:T --rollout-tp TP --mode async``, noise off) and, per step, compares the rollout the
simulator measured (admission to last trajectory, sharing the engines with its neighbours) with
the load model fed the step's own trajectories (hindsight, the replay's tool latencies): the
rollout alone ``R`` and the staleness cycle's cohort ``Co`` (the step's trajectories twice over,
admitted together, one step's tail). It also prints how much of the step's span other steps'
rollouts overlapped, split by whether they were admitted with or after it (``later``: their
fresh prompts share the engines with this step's tail) or before it (``earlier``: this step
meets their tails), and where the measurement lands between ``R`` and ``Co``:
``(measured - R) / (Co - R)``. ``libra.planner.pipeline.shared_rollout_s`` interpolates
linearly in the total overlap. Every number is SIMULATED or PREDICTED.

Measured in session 29 (2 cores, 46 s; the rows behind docs/simulator.md, Session 29):

* a step overlapped by steps admitted with or after it measures about the cohort or more: 0.85-1.40
  of the way from ``R`` to ``Co`` on the bundled math window (0.92 and 1.11 at 57-62% overlap,
  where the linear mix says 0.57-0.62), 0.33-2.37 on Search-R1, 0.73-1.38 on InterCode SQL's
  later steps; one that only meets earlier steps' tails measures little above ``R``: -0.08 to
  0.27 of the way at 66-90% overlap (math, Search-R1, InterCode SQL), where the linear mix says
  0.66-0.90. The overlap's direction matters; the linear mix does not see it;
* the two steps admitted together at the pipeline's start (its fill) measure 3.9-5.4 times the way
  to ``Co`` on InterCode SQL (1,449 trajectories a step on 8-9 H100 rollout GPUs: twice that
  outnumbers the running slots, and parked KV is evicted): the cohort model under-prices such a
  fill by 1.6-2.2x;
* where every trajectory has a slot the cohort is close: the math window at TP 4 x 4, 365 s
  measured against 369-377 s; at TP 8 x 2 (256 slots an instance for 512 trajectories) 420 s
  against 385-392 s.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models import CostEvaluator  # noqa: E402
from libra.cluster import ClusterSpec  # noqa: E402
from libra.planner.rollout_dp import BucketLayout  # noqa: E402
from libra.planner.search import Planner, SearchOptions  # noqa: E402
from libra.planner.stats import compute_stats  # noqa: E402
from libra.trace.latencies import resolve_latencies  # noqa: E402
from sim.loop import observed_step  # noqa: E402
from sim.replay import load_steps  # noqa: E402


@dataclass(frozen=True)
class Case:
    """A trace (or a window of it) on a cluster, with a pinned split and rollout TP."""

    name: str
    trace: str  # relative to the repository root
    steps: str | None  # "a:b", or None for every step
    gpus: int
    gpu: str
    model: str
    split: str  # "R:T"
    tp: int


CASES = (
    Case("math 47:52 TP4", "traces/math-tool.jsonl.gz", "47:52", 32, "gb200", "llama-3.1-70b", "16:16", 4),
    Case("math 47:52 TP8", "traces/math-tool.jsonl.gz", "47:52", 32, "gb200", "llama-3.1-70b", "16:16", 8),
    Case("search-r1 12:18", "traces/search-r1.jsonl.gz", "12:18", 32, "h100", "qwen3-8b", "16:16", 2),
    Case("intercode-sql TP1", "experiments/data/held_out_22/intercode-sql-spider-dev.jsonl.gz", None, 28, "h100", "qwen3-14b", "9:19", 1),
    Case("intercode-sql TP2", "experiments/data/held_out_22/intercode-sql-spider-dev.jsonl.gz", None, 28, "h100", "qwen3-14b", "8:20", 2),
    Case("tau2-retail", "experiments/data/held_out_9/tau2-retail-gpt-4.1.jsonl.gz", None, 32, "h200", "qwen3-14b", "16:16", 4),
)


def replay(case: Case, out: Path) -> list[dict[str, str]]:
    """The pinned async replay's per-step rows (``steps.csv``), noise off."""
    cmd = [sys.executable, "-m", "sim.cli", "replay", str(ROOT / case.trace), "--gpus", str(case.gpus), "--gpu", case.gpu,
           "--model", case.model, "--policy", "verl-static-uniform", "--split", case.split, "--rollout-tp", str(case.tp),
           "--mode", "async", "--max-staleness", "1", "--noise", "0", "--mini-batches", "4", "--kl", "0", "--tool-kv", "keep",
           "--out", str(out)]
    if case.steps:
        cmd += ["--steps", case.steps]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    with open(out / "steps.csv") as f:
        return list(csv.DictReader(f))


def check(case: Case, tmp: Path) -> list[dict[str, object]]:
    """One row per step: measured span, the model's ``R`` and ``Co``, the overlap by direction."""
    rows = replay(case, tmp / case.name.replace(" ", "_").replace(":", "-"))
    steps, _ = load_steps(str(ROOT / case.trace))
    if case.steps:
        a, b = map(int, case.steps.split(":"))
        steps = steps[a:b]
    cluster = ClusterSpec(case.gpus, case.gpu, case.model)
    planner = Planner(cluster, CostEvaluator(case.gpu, case.model), SearchOptions(max_staleness=1, tool_kv="keep", window=1))
    layout, m = BucketLayout((case.tp,), ()), int(case.split.split(":")[0]) // case.tp
    admit = [float(r["rollout_start_s"]) for r in rows]
    span = [float(r["rollout_makespan_s"]) for r in rows]
    end = [a + s for a, s in zip(admit, span)]
    out: list[dict[str, object]] = []
    for j, (row, step) in enumerate(zip(rows, steps)):
        seen = observed_step(step, resolve_latencies(step, 0))  # the latencies the replay ran (seed 0)
        alone = float(planner.rollout_dp(compute_stats([seen], seen.prompt_tokens, window=1)).scenario_makespan(layout, [m], 0.0))
        twice = compute_stats([seen], np.tile(seen.prompt_tokens, 2), window=1, tail_of=len(seen.prompt_tokens))
        cohort = float(planner.rollout_dp(twice).scenario_makespan(layout, [m], 0.0))
        others = [i for i in range(len(rows)) if i != j and admit[i] < end[j] and end[i] > admit[j]]
        later = sum(min(end[i], end[j]) - admit[i] for i in others if admit[i] >= admit[j] - 1e-6) / span[j]
        earlier = sum(min(end[i], end[j]) - admit[j] for i in others if admit[i] < admit[j] - 1e-6) / span[j]
        linear = alone + max(0.0, cohort - alone) * min(1.0, later + earlier)
        way = (span[j] - alone) / (cohort - alone) if cohort - alone > 1e-6 else float("nan")
        out.append({"case": case.name, "step": int(row["step"]), "admitted_s": round(admit[j], 1), "measured_s": round(span[j], 1),
                    "alone_s": round(alone, 1), "cohort_s": round(cohort, 1), "overlap_later": round(later, 2),
                    "overlap_earlier": round(earlier, 2), "linear_mix_s": round(linear, 1), "way_to_cohort": round(way, 2)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="also write every step's row here")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            for r in check(case, Path(tmp)):
                rows.append(r)
                print(f"{r['case']:18s} step {r['step']:>3}  admitted {r['admitted_s']:>7}  SIMULATED {r['measured_s']:>7} s  "
                      f"PREDICTED alone {r['alone_s']:>7}  cohort {r['cohort_s']:>7}  overlap later {r['overlap_later']:.2f} "
                      f"earlier {r['overlap_earlier']:.2f}  linear mix {r['linear_mix_s']:>7}  way to cohort {r['way_to_cohort']}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
