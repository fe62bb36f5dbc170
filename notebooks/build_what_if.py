"""Builds ``what_if.ipynb`` from the cells below and executes it, so the committed notebook opens
with its tables and figure already there (rerun after editing a cell:
``.venv/bin/python notebooks/build_what_if.py``; ``--no-execute`` writes the cells only). Kept as
code so the notebook's source is reviewable in diffs; ``tests/test_notebooks.py`` checks the
committed cells equal these and executes the notebook headless.

Figures are drawn with matplotlib's inline backend (``%matplotlib inline``), which shows them in
Jupyter and stores them as PNG outputs when executed headless; forcing ``Agg`` would hide them."""

from __future__ import annotations

from pathlib import Path

import nbformat

CELLS = [
    ("md", """# What if? Libra's cost model, planner and simulator from Python

Every number in this notebook is **simulated** or **predicted** by the calibrated cost model
(`cost_models`), not measured on GPUs. CI executes this notebook (`tests/test_notebooks.py`),
so it stays in step with the code. It answers three what-if questions for Qwen3-14B on A800s:

1. How do rollout decode time and KV capacity change with the TP degree?
2. What would the planner do with 16, 48 or 128 GPUs, given the SWE trace's first steps, and
   which candidates did it reject (with their predicted step times)?
3. How much does a bigger cluster shorten a replayed step, for a baseline and for Libra?
4. What do the rollout instances do during one step (the Gantt)?
5. A small sweep over one axis (the GPU kind) on a generated workload.

To use your own trace, set `TRACE` below to its path (any trace in the Libra format, e.g. from
`libra-sim convert`); to generate one instead, see section 5 (`libra.trace.workload`)."""),
    ("code", """from pathlib import Path
import numpy as np
import pandas as pd
%matplotlib inline
import matplotlib.pyplot as plt

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from sim.replay import load_steps, replay_policy

ROOT = Path.cwd() if (Path.cwd() / "traces").exists() else Path.cwd().parent
TRACE = str(ROOT / "traces" / "swe-qwen3-14b.jsonl.gz")
# The inference engine's per-iteration overhead (docs/cost-model.md, "Engine profiles"):
# "vllm-2024" (the default), "trtllm-2024", "constants" (the pre-profile assumptions) or a
# `libra-calibrate fit-engine` JSON file of your own engine's runs. Every cell below uses it.
ENGINE = "vllm-2024"
ev = CostEvaluator("a800", "qwen3-14b", engine=ENGINE)"""),
    ("md", "## 1. Decode time and KV capacity per TP degree (predicted)"),
    ("md", """Every sequence here is at an 8K context, so a batch of B holds B x 8,192 tokens of KV
cache. An instance can only run a batch whose KV fits its capacity: those that do not fit are
left blank in the table (and out of the figure) rather than given a decode time for a batch that
could never be resident."""),
    ("code", """CTX = 8192  # every sequence at 8K context
kv = pd.DataFrame({"tp": [1, 2, 4, 8], "kv_capacity_tokens": [int(ev.kv_capacity_tokens(t)) for t in (1, 2, 4, 8)]})
kv["max_batch_at_8k"] = kv["kv_capacity_tokens"] // CTX
rows = []
for tp, cap in zip(kv["tp"], kv["kv_capacity_tokens"]):
    for batch in (1, 16, 64, 256):
        fits = batch * CTX <= cap
        t = float(ev.decode_s(int(tp), batch, batch * CTX)) if fits else np.nan
        rows.append({"tp": int(tp), "batch": batch, "fits_kv": fits, "decode_ms": 1e3 * t, "tok_per_s_per_gpu": batch / t / tp})
decode = pd.DataFrame(rows)
display(kv)
display(decode.pivot(index="batch", columns="tp", values="decode_ms").round(2))
over = decode[~decode["fits_kv"]]
print("batches above the instance's KV capacity (blank above): " + ", ".join(f"TP-{r.tp} x {r.batch}" for r in over.itertuples()))
assert (decode.dropna().groupby("tp")["decode_ms"].apply(lambda s: s.is_monotonic_increasing)).all()"""),
    ("md", """Higher TP cuts a single sequence's decode latency (the long tail's critical path) and holds
more sequences per instance, but at a batch that fits both, it lowers tokens/s per GPU. Libra's
planner *may* mix TP degrees (one per context bucket) to trade these off; whether it does is the
cost model's call, and section 2 shows what it picks here."""),
    ("code", """fig, ax = plt.subplots(figsize=(5.5, 3.2))
for tp, g in decode.dropna().groupby("tp"):
    ax.plot(g["batch"], g["tok_per_s_per_gpu"], marker="o", label=f"TP={tp} (max batch {int(kv.set_index('tp').loc[tp, 'max_batch_at_8k'])})")
ax.set_xscale("log"); ax.set_xlabel("batch (8K context each; only batches whose KV fits)"); ax.set_ylabel("decode tok/s per GPU")
ax.set_title("PREDICTED decode throughput, Qwen3-14B on A800", fontsize=9)
ax.legend(fontsize=7); fig.tight_layout()
plt.show()"""),
    ("md", "## 2. The planner's choice for several cluster sizes (predicted)"),
    ("code", """steps, header = load_steps(TRACE, "0:3")
from libra.policies import POLICIES
history, upcoming = steps[:2], steps[2]
plans = []
for n in (16, 48, 128):
    cluster = ClusterSpec(n, "a800", "qwen3-14b", engine=ENGINE)
    policy = POLICIES["libra"](cluster, ev=ev, mode="async")
    plan = policy.plan(cluster, history, upcoming.prompt_tokens)
    tps = sorted((i.tp for i in plan.instances), reverse=True)
    plans.append({"gpus": n, "rollout_gpus": plan.n_rollout_gpus, "train_gpus": plan.n_train_gpus,
                  "train": f"tp{plan.train.tp} pp{plan.train.pp} dp{plan.train.dp}",
                  "rollout_tps": " ".join(map(str, tps)), "buckets": len(plan.buckets),
                  "pred_rollout_s": round(plan.predicted_rollout_s, 1), "pred_step_s": round(plan.predicted_step_s, 1)})
plans = pd.DataFrame(plans)
display(plans)
assert (plans["rollout_gpus"] + plans["train_gpus"] <= plans["gpus"]).all()
mixed = [int(r.gpus) for r in plans.itertuples() if len(set(r.rollout_tps.split())) > 1]
print("plans mixing TP degrees: " + (", ".join(f"{n} GPUs" for n in mixed) if mixed else
      "none: every plan here uses one TP degree (homogeneous); the planner found no mix worth it on this trace (README)"))"""),
    ("md", """### Why this plan: the candidates the planner rejected (predicted)

The planner's search (`Planner.search`) prices every (training GPUs, training strategy, rollout
layout, loop) candidate it did not cut by the lower bound. It ranks them by `rank_s`, the
expected step with the rollout's prediction uncertain (`Candidate.rank`), and among those within
a small tolerance of the best it prefers the less stale loop; so a candidate with a lower point
prediction (`pred_step_s`) can still lose. Here for 48 GPUs: every priced candidate, its
predicted times and its rank against the chosen one."""),
    ("code", """from libra.planner.search import Planner, SearchOptions
cluster48 = ClusterSpec(48, "a800", "qwen3-14b", engine=ENGINE)
res = Planner(cluster48, ev, SearchOptions(max_staleness=1)).search(history, upcoming.prompt_tokens)
cands = pd.DataFrame([{"split R:T": "time-shared" if c.colocated else f"{48 - c.n_train}:{c.n_train}", "loop": c.loop,
                       "train": f"tp{c.train.tp} pp{c.train.pp} dp{c.train.dp}",
                       "rollout": "+".join(f"TP{t}x{m}" for t, m in zip(c.rollout.layout.tps, c.rollout.counts)),
                       "pred_rollout_s": round(c.rollout_s, 1), "pred_train_s": round(c.train_s, 1),
                       "pred_step_s": round(c.step_s, 1), "rank_s": round(c.rank()[0], 1)} for c in res.candidates]).sort_values("rank_s")
cands["x_chosen"] = (cands["rank_s"] / res.best.rank()[0]).round(3)
print(f"{len(res.candidates)} candidates priced, {res.skipped} splits cut by the lower bound; chosen: "
      f"{'time-shared' if res.best.colocated else f'{48 - res.best.n_train}:{res.best.n_train}'} {res.best.loop}, "
      f"predicted step {res.best.step_s:.1f} s")
display(cands.head(12))
from libra.planner.search import TIE_TOLERANCE
assert res.best.rank()[0] <= cands["rank_s"].min() * (1 + TIE_TOLERANCE) + 0.1  # the plan is the best ranked, up to the tie rule"""),
    ("md", "## 3. Replay two steps at two cluster sizes (simulated)"),
    ("code", """from sim.loop import SimConfig
steps2, _ = load_steps(TRACE, "0:2")
rows, runs = [], {}
for n in (48, 96):
    cluster = ClusterSpec(n, "a800", "qwen3-14b", engine=ENGINE)
    for name in ("verl-static-uniform", "libra"):
        res = runs[(n, name)] = replay_policy(steps2, name, cluster, SimConfig(gantt_step=1))  # section 4 draws step 1
        rows.append({"gpus": n, "policy": name, "mean_step_s": round(res.mean_step_s, 1),
                     "tokens_per_s": round(res.throughput_tok_s, 1),
                     "completed": sum(s.completed for s in res.steps)})
replay = pd.DataFrame(rows)
display(replay)
assert (replay["completed"] == sum(s.n for s in steps2)).all()"""),
    ("md", """## 4. The Gantt of one step (simulated)

`SimConfig(gantt_step=N)` (`libra-sim replay --gantt-step N`) records what every rollout instance
ran during step N: one bar per busy interval, darker for a larger batch. Idle gaps are GPUs
waiting (for tools, for the tail); instances that go quiet early are what the elastic pool could
lend."""),
    ("code", """g = runs[(48, "libra")]  # recorded by section 3's replay (SimConfig(gantt_step=1))
ids = sorted({x[0] for x in g.gantt})
peak = max(x[4] for x in g.gantt) or 1
fig, ax = plt.subplots(figsize=(7, 0.25 * len(ids) + 1.2))
for iid, tp, a, b, batch in g.gantt:
    ax.barh(ids.index(iid), b - a, left=a, color=plt.cm.Blues(0.3 + 0.7 * batch / peak), height=0.8)
ax.set_yticks(range(len(ids)), [f"inst {i} (TP{next(x[1] for x in g.gantt if x[0] == i)})" for i in ids], fontsize=6)
ax.set_xlabel("simulated time, s"); ax.set_title(f"SIMULATED: libra's rollout instances in step {g.gantt_step} ({g.mode})", fontsize=9)
fig.tight_layout(); plt.show()
busy = pd.DataFrame(g.gantt, columns=["instance", "tp", "start_s", "end_s", "batch"])
print(f"{len(ids)} instances, {len(busy)} busy intervals; mean batch {busy['batch'].mean():.1f}")"""),
    ("md", """## 5. A small sweep over one axis: the GPU kind (simulated)

A generated workload (`libra.trace.workload`, what `libra-sim gen` writes: here a small
Search-R1-like batch) replayed on 16 GPUs of three kinds, Libra against the on-policy baselines.
Change `AXIS` to sweep something else (the grid version of this is `libra-sim sweep GRID.yaml`,
docs/simulator.md "Sweeps"; `experiments/run_all.py` runs the big ones)."""),
    ("code", """from libra.trace.workload import generate_steps, make_params
gen = list(generate_steps(make_params("search", max_context=4096), 2, 128, 8, 0))  # 2 steps x 128 trajectories
AXIS = ("a800", "h100", "b200")
rows = []
for gpu in AXIS:
    cl = ClusterSpec(16, gpu, "qwen3-8b", max_context=4096, engine=ENGINE)
    for name in ("verl-colocated", "verl-static-uniform", "libra"):
        r = replay_policy(gen, name, cl)
        rows.append({"gpu": gpu, "policy": name, "mean_step_s": round(r.mean_step_s, 2), "tokens_per_s": round(r.throughput_tok_s)})
sweep = pd.DataFrame(rows)
display(sweep.pivot(index="gpu", columns="policy", values="tokens_per_s"))
best = sweep[sweep.policy != "libra"].groupby("gpu")["tokens_per_s"].max()
print("libra / best baseline: " + ", ".join(f"{g} {sweep[(sweep.gpu == g) & (sweep.policy == 'libra')]['tokens_per_s'].iloc[0] / best[g]:.2f}x" for g in AXIS))"""),
]


def notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A Python 3 notebook of ``(kind, source)`` cells, kind "md" or code (shared by the builders)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, src in cells:
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    return nb


def build() -> nbformat.NotebookNode:
    """The notebook object from ``CELLS``."""
    return notebook(CELLS)


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout_s: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel (in ``cwd``) and keep the outputs."""
    import nbclient

    nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def write(nb: nbformat.NotebookNode, name: str, argv: list[str]) -> None:
    """Execute ``nb`` headless (unless ``--no-execute`` is in ``argv``) and write it beside this
    file as ``name`` (shared by the builders)."""
    out = Path(__file__).with_name(name)
    run = "--no-execute" not in argv
    if run:
        nb = execute(nb, out.parent)
    nbformat.write(nb, out)
    print(f"wrote {out}" + (" (executed, with outputs)" if run else ""))


if __name__ == "__main__":
    import sys

    write(build(), "what_if.ipynb", sys.argv[1:])
