"""Simulator performance: replay cost of the bundled SWE trace, and how it grows.

Prints, for each measurement: CPU seconds of the replay (the figure to compare: on a shared
machine wall time includes other jobs' time slices; the simulator is single-threaded, so CPU
seconds are its one-core wall time), wall seconds, simulated seconds per CPU second, events
(instance intervals + tool calls) per step, and peak RSS. Run on one core::

    taskset -c 0 .venv/bin/python benchmarks/sim_replay.py            # everything
    taskset -c 0 .venv/bin/python benchmarks/sim_replay.py --quick    # bundled trace only

Scaling runs replicate the bundled trace's first step ``k`` times (ids made unique) and pin the
baseline's configuration (``--split`` and ``--rollout-tp`` equivalents) so that only the
simulator's own cost is measured, not the baseline's configuration search.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libra.cluster import ClusterSpec  # noqa: E402
from libra.trace.columnar import StepArrays  # noqa: E402
from sim.costs import load_costs  # noqa: E402
from sim.loop import SimConfig  # noqa: E402
from sim.replay import load_steps, replay_policy  # noqa: E402

TRACE = ROOT / "traces" / "swe-qwen3-14b.jsonl.gz"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scaled(step: StepArrays, k: int, new_step: int) -> StepArrays:
    """``step``'s trajectories repeated ``k`` times, as step ``new_step``."""
    n = step.n
    off = step.turn_offsets
    nt = np.diff(off)
    offsets = np.concatenate([[0], np.cumsum(np.tile(nt, k))])
    tile = lambda a: np.tile(a, k)  # noqa: E731
    return StepArrays(
        step=new_step,
        ids=tuple(f"{i}-x{j}" for j in range(k) for i in step.ids),
        groups=tuple(f"{g}-x{j}" if g is not None else None for j in range(k) for g in step.groups),
        prompt_tokens=tile(step.prompt_tokens), turn_offsets=offsets.astype(np.int64),
        gen_tokens=tile(step.gen_tokens), tool_tokens=tile(step.tool_tokens), tool_latency_s=tile(step.tool_latency_s),
        tool_code=tile(step.tool_code), outcome_code=tile(step.outcome_code), reward=tile(step.reward),
        finish_code=tile(step.finish_code), tool_names=step.tool_names,
    ) if k > 1 else replace(step, step=new_step) if n else step


def measure(label: str, steps: list[StepArrays], policy: str, gpus: int, **pins: object) -> dict[str, float]:
    cluster = ClusterSpec(gpus, "a800", "qwen3-14b")
    costs = load_costs("a800", "qwen3-14b")
    t, c = time.perf_counter(), time.process_time()
    res = replay_policy(steps, policy, cluster, SimConfig(seed=0), costs=costs, **pins)
    wall = time.perf_counter() - t
    cpu = time.process_time() - c
    events = sum(s.events for s in res.steps) / len(res.steps)
    row = {
        "wall_s": wall, "cpu_s": cpu, "sim_s_per_cpu_s": res.wall_s / cpu, "events_per_step": events,
        "traj_per_step": sum(s.n for s in steps) / len(steps), "peak_rss_mb": peak_rss_mb(),
        "mean_step_s": res.mean_step_s,
    }
    print(f"{label:<44} cpu {cpu:7.2f} s (wall {wall:6.1f})  simulated s per cpu s {row['sim_s_per_cpu_s']:7.0f}  events/step {events:8.0f}  "
          f"traj/step {row['traj_per_step']:7.0f}  peak RSS {row['peak_rss_mb']:6.0f} MB  step {res.mean_step_s:7.1f} s", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the bundled trace, one policy")
    ap.add_argument("--policies", default="verl-static-uniform", help="comma-separated policies for the bundled trace")
    args = ap.parse_args()
    t = time.perf_counter()
    steps, _ = load_steps(str(TRACE))
    print(f"read {TRACE.name}: {len(steps)} steps x {steps[0].n} trajectories in {time.perf_counter() - t:.2f} s")
    for p in args.policies.split(","):
        measure(f"bundled trace, {p}, 48 GPUs", steps, p, 48)
    if args.quick:
        return 0
    base = steps[0]
    print("-- growth with trajectories (48 GPUs, 24:24 split, rollout TP 4, 3 steps)")
    for k in (1, 2, 4, 8):
        measure(f"{k * base.n} trajectories/step", [scaled(base, k, s) for s in range(3)], "verl-static-uniform", 48,
                split=(24, 24), rollout_tp=4)
    print("-- growth with GPUs (4096 trajectories/step, half the GPUs roll out at TP 4, 1 step)")
    for gpus in (48, 512, 4096):
        measure(f"{gpus} GPUs, {8 * base.n} trajectories/step", [scaled(base, 8, 0)], "verl-static-uniform",
                gpus, split=(gpus // 2, gpus - gpus // 2), rollout_tp=4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
