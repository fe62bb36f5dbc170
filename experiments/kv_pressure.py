"""How often a returning trajectory finds its parked KV evicted, against the planner's pressure.

With ``tool_kv: keep`` a trajectory in a tool call keeps its KV cached on its instance (evictable,
LRU first); a return whose KV was evicted prefills its whole context again (``sim.instance``).
The rollout DP prices that (``libra.planner.rollout_dp.kv_pressure``) from the pressure ``rho``:
the KV an instance's trajectories hold at once (``WorkloadStats.resident_ctx``, their
turn-averaged contexts, times ``WorkloadStats.inflight_ratio``, the share of those in flight
together at the peak), summed over the steps whose rollouts start together, divided by the
instance count, over its KV capacity.

This script replays fixed layouts of the bundled SWE trace (``verl-static-uniform`` with a pinned
split and rollout TP: no planner in the loop), the workload whose trajectories park the most KV,
and, as a check on a trace the constants are not fitted on, MCPMark's Llama-3.1-70B steps on 42
B200 (Libra's planner pinned to a split and layout, ``CHECKS``). It prints per step the pressure
and the replayed share of evicted tool returns next to ``kv_pressure(rho)``, the mean error on the
SWE steps and on the check, and the least-squares fit of ``KV_PRESSURE_FREE`` and
``KV_PRESSURE_SCALE`` on the SWE steps. Steps whose rollout started with no other step's (one
step's pressure) and steps that started together (async: the first K + 1 steps) are both counted;
an async step that started while an earlier one was still generating is marked ``overlap`` and
left out of the fit and the errors (its pressure is not one of these two).

    python experiments/kv_pressure.py --jobs 2

20 replays; 11 min at --jobs 2 on two cores (session 39). Every time and share printed is
SIMULATED (libra-sim).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
from scipy.optimize import least_squares

from cost_models.memory import kv_capacity_tokens
from libra.planner.rollout_dp import KV_PRESSURE_FREE, KV_PRESSURE_SCALE, kv_pressure
from libra.planner.stats import compute_stats
from libra.trace.reader import TraceReader

ROOT = Path(__file__).resolve().parents[1]
SWE = "traces/swe-qwen3-14b.jsonl.gz"

MCPMARK = "experiments/data/held_out_38/mcpmark-community-mcp-agents-64k.jsonl.gz"

#: Layouts of a trace the constants were *not* fitted on, printed as a check: MCPMark's
#: Llama-3.1-70B cohort of two steps (K = 1) on 42 B200, where three TP-4 instances thrash and four
#: do not (``libra.planner.stats.INFLIGHT_DECODE_S_PER_TOKEN``). (name, trace, steps, gpus, gpu,
#: model, split, rollout TP, K)
CHECKS: tuple[tuple[str, str, str, int, str, str, str, int, int], ...] = (
    ("mcpmark-l70b-12x4-K1", MCPMARK, "0:4", 42, "b200", "llama-3.1-70b", "12:28", 4, 1),
    ("mcpmark-l70b-16x4-K1", MCPMARK, "0:4", 42, "b200", "llama-3.1-70b", "16:26", 4, 1),
    ("mcpmark-l70b-22x2-K1", MCPMARK, "0:4", 42, "b200", "llama-3.1-70b", "22:20", 2, 1),
    ("mcpmark-l70b-8x4-K0", MCPMARK, "0:4", 42, "b200", "llama-3.1-70b", "8:32", 4, 0),
)

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


def replay(cfg: tuple[str, str, str, int, str, str, str, int, int], out: Path) -> pd.DataFrame:
    """One fixed-layout replay's per-step table (``steps.csv``)."""
    name, trace, steps, gpus, gpu, model, split, tp, k = cfg
    if trace == SWE:
        pin = ["--policy", "verl-static-uniform", "--split", split, "--rollout-tp", str(tp)]
    else:  # Libra's planner pinned to the layout (its training strategy holds 70B's long sequences on any split)
        pin = ["--policy", "libra", "--plan-split", split, "--layout", f"{int(split.split(':')[0]) // tp}x{tp}",
               "--mode", "async" if k else "sync"]
    cmd = [sys.executable, "-m", "sim.cli", "replay", trace, "--steps", steps, "--gpus", str(gpus), "--gpu", gpu, "--model", model,
           *pin, "--max-staleness", str(k),
           "--noise", "0.03", "--mini-batches", "4", "--seed", "0", "--tool-kv", "keep", "--out", str(out / name)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return pd.read_csv(out / name / "steps.csv")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="replays run in parallel")
    args = ap.parse_args(argv)
    runs = [(name, SWE, *rest) for name, *rest in CONFIGS] + list(CHECKS)
    traces = {tr: {s.step: s for s in TraceReader(str(ROOT / tr)).steps()} for tr in {r[1] for r in runs}}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        tables = list(pool.map(lambda c: replay(c, Path(tmp)), runs))
    rows = []
    for cfg, d in zip(runs, tables):
        name, trace, _, _, gpu, model, split, tp, k = cfg
        steps = traces[trace]
        m = int(split.split(":")[0]) // tp
        cap = kv_capacity_tokens(gpu, model, tp)
        for _, r in d.iterrows():
            together = d[d.rollout_start_s == r.rollout_start_s]
            earlier = d[(d.rollout_start_s < r.rollout_start_s) & (d.rollout_start_s + d.rollout_makespan_s > r.rollout_start_s)]
            held = 0.0  # what the steps admitted together hold at once (``RolloutDP.evicted_share``)
            for j in together.step:
                st = compute_stats([steps[int(j)]], steps[int(j)].prompt_tokens)
                held += float(st.resident_ctx.sum()) * st.inflight_ratio
            rho = held / m / cap
            s = steps[int(r.step)]
            calls = int((s.tool_code >= 0).sum())
            rows.append({"config": name, "step": int(r.step), "K": k, "rho": rho, "overlap": len(earlier) > 0,
                         "check": trace != SWE, "evicted_share": r.evictions / max(calls, 1), "kv_pressure": float(kv_pressure(rho)),
                         "rollout_s": r.rollout_makespan_s, "prefill_Mtok": r.prefill_tokens / 1e6})
    t = pd.DataFrame(rows).sort_values("rho")
    pd.set_option("display.width", 200)
    print(t.round(3).to_string(index=False))
    for label, part in (("fitted (SWE)", t[~t.overlap & ~t.check]), ("check (not fitted)", t[~t.overlap & t.check])):
        err = (part.kv_pressure - part.evicted_share).abs()
        print(f"\n{label}: {len(part)} steps, mean |kv_pressure - replayed share| = {err.mean():.3f}, max {err.max():.3f}")
    fit = t[~t.overlap & ~t.check]
    best = least_squares(lambda p: kv_pressure(fit.rho.to_numpy(), p[0], p[1]) - fit.evicted_share.to_numpy(),
                         x0=[KV_PRESSURE_FREE, KV_PRESSURE_SCALE], bounds=([0.3, 0.05], [3.0, 3.0]))
    print(f"least-squares fit on the SWE steps: KV_PRESSURE_FREE = {best.x[0]:.2f}, KV_PRESSURE_SCALE = {best.x[1]:.2f} "
          f"(in force: {KV_PRESSURE_FREE}, {KV_PRESSURE_SCALE})")
    print("SIMULATED: replayed shares and times are libra-sim's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
