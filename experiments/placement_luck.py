"""Placement luck at K >= 1: how far an admission order alone moves Libra / baseline on one trace.

    python experiments/placement_luck.py [--orders 0,1,2,3,4] [--out experiments/results/placement_luck]
    python experiments/placement_luck.py --workload math --steps 8 --batch 256 --group-size 8 --gen-seed 91 \\
        --param max_context=16384 --gpus 72 --gpu h200 --model qwen3-14b --max-staleness 2 \\
        --baseline areal-static-optimal --name "held_out_8 math-c, K=2" --out experiments/results/placement_luck/held_out_8_math-c_K2

Why: two of the held-out losses of issue 22 run the *same* plan as the baseline they lose to
(held_out_7 ``math-a/b200-40-30b/K1``, 0.940; held_out_8 ``math-c/h200-72-14b/K2``, 0.968). Under
the same plan the only difference is which instance each trajectory lands on: Libra's
work-conserving placement (fewest sequences per slot) against the baselines' least-loaded one
(least KV in use). Neither sees a length. By default this generates held_out_7's math workload
(``exp_common.generated_trace``), then permutes the admission order of whole GRPO groups within
each step (same trajectories, same groups; only the order in which they arrive), and replays Libra
and the baseline on each order with the sweeps' settings (``exp_common.run_replay``: 3% noise,
4 mini-batches, no KL, tool KV kept). If the ratio moves by more than the 3% tie band from order
alone, a single trace in a single order cannot separate two honest placements. Every number it
prints is SIMULATED.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from exp_common import ReplaySpec, generated_trace, run_replay

from libra.trace.columnar import StepArrays
from libra.trace.workload.engine import to_trajectories


def permute_groups(steps: list[StepArrays], seed: int) -> list[StepArrays]:
    """``steps`` with their GRPO groups in a seeded random order within each step (seed 0: as is)."""
    if not seed:
        return steps
    rng = random.Random(seed)
    out = []
    for sa in steps:
        groups: dict[Any, list[Any]] = {}
        for t in to_trajectories(sa):
            groups.setdefault(t.group, []).append(t)
        keys = list(groups)
        rng.shuffle(keys)
        out.append(StepArrays.from_trajectories(sa.step, [t for k in keys for t in groups[k]]))
    return out


def _param(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, float(value)


def replay_orders(steps: list[StepArrays], header: Any, trace: str, a: argparse.Namespace) -> list[tuple[Any, ...]]:
    """(order, libra s/step, its plan, baseline s/step, its plan, ratio) per admission order."""
    rows = []
    for seed in (int(s) for s in a.orders.split(",")):
        order = permute_groups(steps, seed)
        rec = {p: run_replay(ReplaySpec(trace, None, a.gpus, a.gpu, a.model, p, a.max_staleness), loaded=(order, header))
               for p in ("libra", a.baseline)}
        for p, r in rec.items():
            if r["status"] != "ok":
                raise SystemExit(f"order {seed}: {p} failed: {r['error']}")
        (ls, lp), (bs, bp) = ((rec[p]["mean_step_s"], f"{rec[p]['split']} {rec[p]['rollout_tps']}") for p in ("libra", a.baseline))
        rows.append((seed, ls, lp, bs, bp, bs / ls))
        print(f"order {seed}: libra {ls:.1f} s ({lp}), {a.baseline} {bs:.1f} s ({bp}) per step, "
              f"libra / baseline {bs / ls:.3f}x (SIMULATED)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from sim.replay import load_steps

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", default="0,1,2,3,4", help="admission-order seeds (0: the generated order)")
    ap.add_argument("--out", default="experiments/results/placement_luck", help="where summary.md goes")
    ap.add_argument("--workload", default="math")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=288)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--gen-seed", type=int, default=83, help="the generator's seed")
    ap.add_argument("--param", action="append", default=None, help="a workload parameter NAME=VALUE (repeatable; "
                    "default max_context=20480, with the other defaults: held_out_7's math-a)")
    ap.add_argument("--gpus", type=int, default=40)
    ap.add_argument("--gpu", default="b200")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--max-staleness", type=int, default=1, help="the staleness class K")
    ap.add_argument("--baseline", default="verl-static-uniform", help="the policy Libra is compared with")
    ap.add_argument("--name", default="held_out_7 math-a, K=1", help="the workload's name in the summary")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(_param(p) for p in (a.param or ["max_context=20480"]))
    with tempfile.TemporaryDirectory(prefix="placement_luck_") as tmp:  # the trace is regenerated, not kept
        trace = generated_trace(Path(tmp), a.workload, a.steps, a.batch, a.group_size, a.gen_seed, **params)
        steps, header = load_steps(trace)
        rows = replay_orders(steps, header, trace, a)
    lo, hi = min(r[5] for r in rows), max(r[5] for r in rows)
    ml, mb = (sum(r[i] for r in rows) / len(rows) for i in (1, 3))
    given = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    lines = [f"# Placement luck at K >= 1: {a.name} (SIMULATED)", "",
             f"`python experiments/placement_luck.py {given}`".replace(" `", "`") + ": "
             f"{a.workload} x {a.steps} steps of {a.batch} (group {a.group_size}, seed {a.gen_seed}, {params}) on {a.gpus} "
             f"{a.gpu}, {a.model}, K={a.max_staleness}. Each row permutes the admission order of whole GRPO groups within "
             "each step (order 0: as generated). Plans as split R:T and rollout TP x instances.", "",
             f"| order | libra s/step | its plan | {a.baseline} s/step | its plan | libra / baseline |",
             "| ---: | ---: | --- | ---: | --- | ---: |"]
    lines += [f"| {s} | {ls:.1f} | {lp} | {bs:.1f} | {bp} | {r:.3f}x |" for s, ls, lp, bs, bp, r in rows]
    lines += ["", f"Range {lo:.3f}x .. {hi:.3f}x; mean step {ml:.1f} s against {mb:.1f} s. Every number is SIMULATED."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"range {lo:.3f}x .. {hi:.3f}x; mean {ml:.1f} s against {mb:.1f} s; wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
