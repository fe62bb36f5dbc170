"""How often the next step's longest generation stays within the planner's tail scenarios.

For every step transition of each trace given (a window of up to ``DEFAULT_WINDOW`` steps
before it, as the planner pools), the planner's upper tail scenarios (``TAIL_SCENARIOS``' 5/8
and 7/8) ask a quantile of the next step's longest trajectory. Where that quantile lies beyond
the window's own longest, ``compute_stats`` extrapolates it (``beyond_window_stretch`` with the
window's ``tail_index``); below, the window answers it. This script prints, per trace, how often
the next step's longest generation was at most each scenario's value (its coverage, nominally
5/8 and 7/8) and the mean stretch over the window's longest, then the totals.

    python experiments/tail_extrapolation_coverage.py experiments/data/held_out_11/*.jsonl.gz traces/*.jsonl.gz

Reads traces only; no replay. Numbers are the traces' own (token counts), not simulated.
"""

from __future__ import annotations

import argparse

import numpy as np

from libra.planner.stats import DEFAULT_WINDOW, beyond_window_stretch, tail_index
from libra.trace.reader import TraceReader

SCENARIOS = (0.625, 0.875)


def generated_per_trajectory(step: object) -> np.ndarray:
    """Each trajectory's generated tokens (all its turns)."""
    return np.add.reduceat(step.gen_tokens, step.turn_offsets[:-1]).astype(np.float64)  # type: ignore[attr-defined]


def scenario_value(window: np.ndarray, n: int, u: float) -> float:
    """The ``u`` quantile of the next ``n``-trajectory step's longest generation, as the planner
    prices it: the pooled quantile ``u ** (1/n)`` within the window, extrapolated beyond it."""
    m = len(window)
    q = u ** (1.0 / n)
    if u <= m / (m + n):
        return float(np.quantile(window, q, method="higher"))
    return float(window.max()) * beyond_window_stretch(u, n, m, tail_index(window))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--max-steps", type=int, default=12, help="steps read per trace (default 12)")
    args = ap.parse_args()
    total = {u: [] for u in SCENARIOS}
    stretch = {u: [] for u in SCENARIOS}
    print(f"{'trace':44s} {'transitions':>11s} " + " ".join(f"cover@{u:g}" for u in SCENARIOS) + "  " +
          " ".join(f"stretch@{u:g}" for u in SCENARIOS) + "  worst next/seen")
    for path in args.traces:
        steps = [generated_per_trajectory(s) for s in list(TraceReader(path).steps())[: args.max_steps]]
        cov = {u: [] for u in SCENARIOS}
        st = {u: [] for u in SCENARIOS}
        worst = 0.0
        for k in range(1, len(steps)):
            window = np.concatenate(steps[max(0, k - DEFAULT_WINDOW):k])
            nxt = float(steps[k].max())
            worst = max(worst, nxt / float(window.max()))
            for u in SCENARIOS:
                v = scenario_value(window, len(steps[k]), u)
                cov[u].append(nxt <= v)
                st[u].append(v / float(window.max()))
        for u in SCENARIOS:
            total[u] += cov[u]
            stretch[u] += st[u]
        name = path.split("/")[-1][:44]
        print(f"{name:44s} {len(cov[SCENARIOS[0]]):11d} " + " ".join(f"{np.mean(cov[u]):9.2f}" for u in SCENARIOS) + "  " +
              " ".join(f"{np.mean(st[u]):11.2f}" for u in SCENARIOS) + f"  {worst:15.2f}")
    print(f"{'all':44s} {len(total[SCENARIOS[0]]):11d} " + " ".join(f"{np.mean(total[u]):9.2f}" for u in SCENARIOS) + "  " +
          " ".join(f"{np.mean(stretch[u]):11.2f}" for u in SCENARIOS))


if __name__ == "__main__":
    main()
