"""Builds ``what_if.ipynb`` from the cells below (the notebook is committed; rerun this after
editing a cell). Kept as code so the notebook's source is reviewable in diffs."""

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
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cost_models import CostEvaluator
from libra.cluster import ClusterSpec
from sim.replay import load_steps, replay_policy

ROOT = Path.cwd() if (Path.cwd() / "traces").exists() else Path.cwd().parent
TRACE = str(ROOT / "traces" / "swe-qwen3-14b.jsonl.gz")
ev = CostEvaluator("a800", "qwen3-14b")"""),
    ("md", "## 1. Decode time and KV capacity per TP degree (predicted)"),
    ("code", """rows = []
for tp in (1, 2, 4, 8):
    for batch in (1, 16, 64, 256):
        ctx = batch * 8192  # every sequence at 8K context
        rows.append({"tp": tp, "batch": batch, "decode_ms": 1e3 * float(ev.decode_s(tp, batch, ctx)),
                     "tok_per_s_per_gpu": batch / float(ev.decode_s(tp, batch, ctx)) / tp})
decode = pd.DataFrame(rows)
kv = pd.DataFrame({"tp": [1, 2, 4, 8], "kv_capacity_tokens": [ev.kv_capacity_tokens(t) for t in (1, 2, 4, 8)]})
display(decode.pivot(index="batch", columns="tp", values="decode_ms").round(2))
display(kv)
assert (decode.groupby("tp")["decode_ms"].apply(lambda s: s.is_monotonic_increasing)).all()"""),
    ("md", """Higher TP cuts a single sequence's decode latency (the long tail's critical path) but
lowers tokens/s per GPU at large batch: this trade-off is why Libra mixes TP degrees."""),
    ("code", """fig, ax = plt.subplots(figsize=(5, 3))
for tp, g in decode.groupby("tp"):
    ax.plot(g["batch"], g["tok_per_s_per_gpu"], marker="o", label=f"TP={tp}")
ax.set_xscale("log"); ax.set_xlabel("batch (8K context each)"); ax.set_ylabel("decode tok/s per GPU")
ax.legend(); fig.tight_layout()"""),
    ("md", "## 2. The planner's choice for several cluster sizes (predicted)"),
    ("code", """steps, header = load_steps(TRACE, "0:3")
from libra.policies import POLICIES
history, upcoming = steps[:2], steps[2]
plans = []
for n in (16, 48, 128):
    cluster = ClusterSpec(n, "a800", "qwen3-14b")
    policy = POLICIES["libra"](cluster, ev=ev, mode="async")
    plan = policy.plan(cluster, history, upcoming.prompt_tokens)
    tps = sorted((i.tp for i in plan.instances), reverse=True)
    plans.append({"gpus": n, "rollout_gpus": plan.n_rollout_gpus, "train_gpus": plan.n_train_gpus,
                  "train": f"tp{plan.train.tp} pp{plan.train.pp} dp{plan.train.dp}",
                  "rollout_tps": " ".join(map(str, tps)), "buckets": len(plan.buckets),
                  "pred_rollout_s": round(plan.predicted_rollout_s, 1), "pred_step_s": round(plan.predicted_step_s, 1)})
plans = pd.DataFrame(plans)
display(plans)
assert (plans["rollout_gpus"] + plans["train_gpus"] <= plans["gpus"]).all()"""),
    ("md", "## 3. Replay two steps at two cluster sizes (simulated)"),
    ("code", """steps2, _ = load_steps(TRACE, "0:2")
rows = []
for n in (48, 96):
    cluster = ClusterSpec(n, "a800", "qwen3-14b")
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


if __name__ == "__main__":
    out = Path(__file__).with_name("what_if.ipynb")
    nbformat.write(build(), out)
    print(f"wrote {out}")
