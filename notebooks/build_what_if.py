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
2. What would the planner do with 16, 48 or 128 GPUs, given the SWE trace's first steps?
3. How much does a bigger cluster shorten a replayed step, for a baseline and for Libra?"""),
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
    ("md", "## 3. Replay two steps at two cluster sizes (simulated)"),
    ("code", """steps2, _ = load_steps(TRACE, "0:2")
rows = []
for n in (48, 96):
    cluster = ClusterSpec(n, "a800", "qwen3-14b", engine=ENGINE)
    for name in ("verl-static-uniform", "libra"):
        res = replay_policy(steps2, name, cluster)
        rows.append({"gpus": n, "policy": name, "mean_step_s": round(res.mean_step_s, 1),
                     "tokens_per_s": round(res.throughput_tok_s, 1),
                     "completed": sum(s.completed for s in res.steps)})
replay = pd.DataFrame(rows)
display(replay)
assert (replay["completed"] == sum(s.n for s in steps2)).all()"""),
]


def build() -> nbformat.NotebookNode:
    """The notebook object from ``CELLS``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, src in CELLS:
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout_s: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel (in ``cwd``) and keep the outputs."""
    import nbclient

    nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


if __name__ == "__main__":
    import sys

    out = Path(__file__).with_name("what_if.ipynb")
    nb = build()
    if "--no-execute" not in sys.argv[1:]:
        nb = execute(nb, out.parent)
    nbformat.write(nb, out)
    print(f"wrote {out}" + ("" if "--no-execute" in sys.argv[1:] else " (executed, with outputs)"))
