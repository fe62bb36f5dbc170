"""Diagnostic: the planner's price of an async step that shared its engines, against the simulator,
under Libra's engines (step priority) and the baselines' (no priority).

    .venv/bin/python experiments/cohort_fidelity.py [--csv OUT.csv]

For a few traces (``CASES``), it replays Libra at K = 1 (continuous generation, noise off,
``libra-sim replay --policy libra``), records every step the simulator reports to the policy
(``Policy.observe``), and, for each async step that shared its engines, compares the rollout the
simulator measured (admission to last trajectory) with the load model's rollout of the same step
fed its own trajectories at the overlap the simulator measured (``Planner.hindsight_shared_s``:
the rollout alone and the staleness cycle mixed by the overlap). Two prices of the cycle:

* ``evicting``: both steps' parked KV presses on the engines (``SearchOptions.step_priority``
  False), what a router that lets a newer step's turn evict an older step's KV runs; the
  baselines' price, and Libra's until session 45;
* ``priority``: each step's parked KV evicted as one step's is, and the cycle at least the rollout
  alone once per wave of KV it needs (``RolloutDP.waves``), what Libra's routers run (the older
  step first: ``sim.instance``'s step priority); Libra's price since session 45.

It prints each step's measured rollout over each price (1.0: the price is right) and, per case and
overall, the geometric mean of ``|log ratio|``. MCPMark and the bundled SWE window outgrow the
engines' KV when two steps share them; the Negotiation log and the generated search steps do not
(controls: both prices must agree there). Every number is SIMULATED or PREDICTED. Results:
``experiments/results/cohort_fidelity/``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exp_common import write_csv  # noqa: E402
from libra.cluster import ClusterSpec  # noqa: E402
from libra.planner.feedback import StepOutcome  # noqa: E402
from libra.planner.search import Planner, SearchOptions  # noqa: E402
from libra.policies import PolicyOptions, resolve  # noqa: E402
from libra.policy_wrapper import PolicyWrapper  # noqa: E402
from sim.costs import load_costs  # noqa: E402
from sim.loop import SimConfig, Simulator  # noqa: E402
from sim.replay import load_steps  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One replay: a trace (and step window), a cluster, Libra at staleness K."""

    name: str
    trace: str
    steps: str | None
    gpus: int
    gpu: str
    model: str
    k: int = 1


CASES = (
    Case("mcpmark a100-46-32b", "experiments/data/held_out_38/mcpmark-community-mcp-agents-64k.jsonl.gz", None, 46, "a100", "qwen3-32b"),
    Case("mcpmark b200-26-l70b", "experiments/data/held_out_38/mcpmark-community-mcp-agents-64k.jsonl.gz", None, 26, "b200", "llama-3.1-70b"),
    Case("swe 10:14 h100-48-32b", "traces/swe-qwen3-14b.jsonl.gz", "10:14", 48, "h100", "qwen3-32b"),
    Case("negotiation h100-38-l70b", "experiments/data/held_out_42/negotiationarena-trading-4-models.jsonl.gz", None, 38, "h100", "llama-3.1-70b"),
    Case("search-r1 12:18 h100-32-8b", "traces/search-r1.jsonl.gz", "12:18", 32, "h100", "qwen3-8b"),
)


class Recording(PolicyWrapper):
    """The policy, with every step the simulator reports to it kept."""

    _own = ("inner", "outcomes")

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.outcomes: list[StepOutcome] = []

    def observe(self, outcome: Any) -> None:
        self.outcomes.append(outcome)
        super().observe(outcome)


def check(case: Case) -> list[dict[str, object]]:
    """One row per async step that shared its engines: measured, and each price of it."""
    steps = load_steps(str(ROOT / case.trace), case.steps)[0]
    cluster = ClusterSpec(case.gpus, case.gpu, case.model)
    costs = load_costs(case.gpu, case.model, cluster.gpus_per_node)
    config = SimConfig(max_staleness=case.k, noise_sigma=0.0, mini_batches=4, kv_mode="keep")
    options = PolicyOptions(ev=costs.ev, max_staleness=case.k, mini_batches=4, run_steps=len(steps), tool_kv="keep")
    pol = Recording(resolve("libra", cluster, options))
    Simulator(steps, pol, cluster, costs, config).run()
    prices = {name: Planner(cluster, costs.ev, SearchOptions(max_staleness=case.k, tool_kv="keep", step_priority=sp))
              for name, sp in (("evicting", False), ("priority", True))}
    rows: list[dict[str, object]] = []
    for o in pol.outcomes:
        if not o.overlapped or o.plan.mode != "async" or o.plan.colocated or o.overlap is None:
            continue
        row: dict[str, object] = {"case": case.name, "step": o.step, "split": f"{o.plan.n_rollout_gpus}:{o.plan.n_train_gpus}",
                                  "tps": "+".join(f"{t}x{n}" for t, n in sorted(Counter(i.tp for i in o.plan.instances).items(), reverse=True)), "overlap": round(float(o.overlap), 3),
                                  "measured_s": round(float(o.rollout_s), 1)}
        for name, planner in prices.items():
            model = float(planner.hindsight_shared_s(o))
            row[f"{name}_s"] = round(model, 1)
            row[f"{name}_ratio"] = round(float(o.rollout_s) / model, 3) if model > 0 else float("nan")
        rows.append(row)
    return rows


def _spread(ratios: list[float]) -> float:
    """The geometric mean of ``|log ratio|`` as a factor (1.0: every price exact)."""
    logs = [abs(math.log(r)) for r in ratios if r == r and r > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="also write every step's row here")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for case in CASES:
        got = check(case)
        rows.extend(got)
        for r in got:
            print(f"{r['case']:26s} step {r['step']:>3}  {r['split']:>6} TP {r['tps']:<6s} overlap {r['overlap']:.2f}  "
                  f"SIMULATED {r['measured_s']:>8} s  PREDICTED evicting {r['evicting_s']:>8} ({r['evicting_ratio']:.2f})  "
                  f"priority {r['priority_s']:>8} ({r['priority_ratio']:.2f})")
        print(f"{case.name:26s} spread (geomean |log ratio|, as a factor): evicting {_spread([float(r['evicting_ratio']) for r in got]):.3f}  "
              f"priority {_spread([float(r['priority_ratio']) for r in got]):.3f}  ({len(got)} steps)")
    print(f"{'all':26s} spread: evicting {_spread([float(r['evicting_ratio']) for r in rows]):.3f}  "
          f"priority {_spread([float(r['priority_ratio']) for r in rows]):.3f}  ({len(rows)} steps)")
    if args.csv and rows:
        write_csv(Path(args.csv), rows)


if __name__ == "__main__":
    main()
