"""How often a returning trajectory finds its parked KV evicted, against the planner's pressure.

With ``tool_kv: keep`` a trajectory in a tool call keeps its KV cached on its instance (evictable,
LRU first); a return whose KV was evicted prefills its whole context again (``sim.instance``).
The rollout DP prices that (``libra.planner.rollout_dp.kv_pressure``) from the pressure ``rho``:
the turn-averaged contexts of an instance's trajectories (``WorkloadStats.resident_ctx``, summed
over the steps whose rollouts start together, divided by the instance count) over its KV capacity.

This script replays fixed layouts (``verl-static-uniform`` with a pinned split and rollout TP: no
planner in the loop) of the bundled SWE trace, the workload whose trajectories park the most KV,
and prints per step the pressure and the replayed share of evicted tool returns next to
``kv_pressure(rho)``. Steps whose rollout started with no other step's (one step's pressure) and
steps that started together (async: the first K + 1 steps) are both counted; an async step that
started while an earlier one was still generating is marked ``overlap`` and left out of the fit
error (its pressure is not one of these two). These are the runs ``KV_PRESSURE_FREE`` and
``KV_PRESSURE_SCALE`` were fitted on.

    python experiments/kv_pressure.py --jobs 2

16 replays; 15 min 28 s at --jobs 1 on two cores shared with a sweep (session 17). Every time and
share printed is SIMULATED (libra-sim).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from cost_models.memory import kv_capacity_tokens
from libra.planner.rollout_dp import kv_pressure
from libra.planner.stats import compute_stats
from libra.trace.reader import TraceReader

ROOT = Path(__file__).resolve().parents[1]
SWE = "traces/swe-qwen3-14b.jsonl.gz"

#: (name, steps, gpus, gpu, model, split, rollout TP, K)
CONFIGS: tuple[tuple[str, str, int, str, str, str, int, int], ...] = (
    ("h100-32b-20x4-K1", "10:14", 48, "h100", "qwen3-32b", "20:28", 4, 1),
    ("h100-32b-24x8-K1", "10:14", 48, "h100", "qwen3-32b", "24:24", 8, 1),
    ("h100-32b-24x4-K1", "10:14", 48, "h100", "qwen3-32b", "24:24", 4, 1),
    ("h100-32b-16x8-K1", "10:14", 48, "h100", "qwen3-32b", "16:32", 8, 1),
    ("h100-32b-16x4-K1", "10:14", 48, "h100", "qwen3-32b", "16:32", 4, 1),
    ("h100-32b-32x4-K1", "10:14", 48, "h100", "qwen3-32b", "32:16", 4, 1),
    ("h100-32b-20x4-K0", "10:14", 48, "h100", "qwen3-32b", "20:28", 4, 0),
    ("h100-32b-12x4-K0", "10:14", 48, "h100", "qwen3-32b", "12:36", 4, 0),
    ("a100-14b-16x2-K1", "5:10", 48, "a100", "qwen3-14b", "16:32", 2, 1),
    ("a100-14b-16x1-K1", "5:10", 48, "a100", "qwen3-14b", "16:32", 1, 1),
    ("a100-14b-12x2-K1", "5:10", 48, "a100", "qwen3-14b", "12:36", 2, 1),
    ("a100-14b-8x2-K0", "5:10", 48, "a100", "qwen3-14b", "8:40", 2, 0),
    ("h100-8b-8x1-K1", "0:5", 32, "h100", "qwen3-8b", "8:24", 1, 1),
    ("h100-8b-8x2-K1", "0:5", 32, "h100", "qwen3-8b", "8:24", 2, 1),
    ("h100-8b-4x1-K2", "0:5", 32, "h100", "qwen3-8b", "4:28", 1, 2),
    ("h100-8b-12x1-K2", "0:5", 32, "h100", "qwen3-8b", "12:20", 1, 2),
)


def replay(cfg: tuple[str, str, int, str, str, str, int, int], out: Path) -> pd.DataFrame:
    """One fixed-layout replay's per-step table (``steps.csv``)."""
    name, steps, gpus, gpu, model, split, tp, k = cfg
    cmd = [sys.executable, "-m", "sim.cli", "replay", SWE, "--steps", steps, "--gpus", str(gpus), "--gpu", gpu, "--model", model,
           "--policy", "verl-static-uniform", "--split", split, "--rollout-tp", str(tp), "--max-staleness", str(k),
           "--noise", "0.03", "--mini-batches", "4", "--seed", "0", "--tool-kv", "keep", "--out", str(out / name)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return pd.read_csv(out / name / "steps.csv")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="replays run in parallel")
    args = ap.parse_args(argv)
    steps = {s.step: s for s in TraceReader(str(ROOT / SWE)).steps()}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        tables = list(pool.map(lambda c: replay(c, Path(tmp)), CONFIGS))
    rows = []
    for cfg, d in zip(CONFIGS, tables):
        name, _, _, gpu, model, split, tp, k = cfg
        m = int(split.split(":")[0]) // tp
        cap = kv_capacity_tokens(gpu, model, tp)
        for _, r in d.iterrows():
            together = d[d.rollout_start_s == r.rollout_start_s]
            earlier = d[(d.rollout_start_s < r.rollout_start_s) & (d.rollout_start_s + d.rollout_makespan_s > r.rollout_start_s)]
            resident = sum(float(compute_stats([steps[int(s)]], steps[int(s)].prompt_tokens).resident_ctx.sum()) for s in together.step)
            rho = resident / m / cap
            s = steps[int(r.step)]
            calls = int((s.tool_code >= 0).sum())
            rows.append({"config": name, "step": int(r.step), "K": k, "rho": rho, "overlap": len(earlier) > 0,
                         "evicted_share": r.evictions / max(calls, 1), "kv_pressure": float(kv_pressure(rho)),
                         "rollout_s": r.rollout_makespan_s, "prefill_Mtok": r.prefill_tokens / 1e6})
    t = pd.DataFrame(rows).sort_values("rho")
    pd.set_option("display.width", 200)
    print(t.round(3).to_string(index=False))
    fit = t[~t.overlap]
    err = (fit.kv_pressure - fit.evicted_share).abs()
    print(f"\n{len(fit)} steps fitted (of {len(t)}): mean |kv_pressure - replayed share| = {err.mean():.3f}, max {err.max():.3f}")
    print("SIMULATED: replayed shares and times are libra-sim's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
