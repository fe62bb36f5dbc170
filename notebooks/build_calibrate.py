"""Builds ``calibrate.ipynb`` from the cells below and executes it, so the committed notebook opens
with its tables and figures already there (rerun after editing a cell:
``.venv/bin/python notebooks/build_calibrate.py``; ``--no-execute`` writes the cells only). Kept as
code so the notebook's source is reviewable in diffs; ``tests/test_notebooks.py`` checks the
committed cells equal these and executes the notebook headless (kept under a minute: the
held-out operator report subsamples each family).

What it teaches: how to turn a folder of your own measurements into what the cost model uses
(an engine profile from end-to-end engine runs, operator tables from kernel benchmarks) and how
to read the errors before trusting a simulated number built on them. The measurements are the
bundled ones (``cost_models/data/measured/``); point ``ENGINE_CSV`` / ``OPERATOR_DIR`` at yours."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_what_if import notebook, write  # noqa: E402  (the same notebook shape and headless execution)

CELLS = [
    ("md", """# Calibrate the cost model from a measurement folder

The simulator's every number is built on two fitted layers of the cost model (`cost_models/`):

1. an **engine profile**: what an inference engine adds to each decode iteration beyond its
   kernels (per step, per sequence, per TP collective, a kernel scale), fitted on end-to-end
   request latencies (`libra-calibrate fit-engine RUNS.csv`);
2. **operator tables**: GEMM, attention prefill/decode, MoE and collective latencies fitted on
   kernel benchmarks of one GPU (`libra-calibrate fit --data DIR --gpu G`).

This notebook fits both from a measurement folder, then looks at the errors: held out by model
for the engine (what a model you have not measured gets) and held out by rows for the
operators. The measurements are the bundled published ones (`cost_models/data/measured/`, with
their licences); replace `ENGINE_CSV` and `OPERATOR_DIR` with your own runs. Fitted and
predicted times are **PREDICTED** by the cost model; the replay at the end is **SIMULATED**. CI
executes this notebook (`tests/test_notebooks.py`)."""),
    ("code", """from pathlib import Path
import tempfile
import numpy as np
import pandas as pd
%matplotlib inline
import matplotlib.pyplot as plt

from cost_models import CostEvaluator
from cost_models.calibration.sources import find_calibration_root
from cost_models.engines import fit as F
from cost_models.engines.registry import get_profile

ROOT = Path.cwd() if (Path.cwd() / "traces").exists() else Path.cwd().parent
MEASURED = find_calibration_root(None)            # cost_models/data/measured (or $LIBRA_CALIBRATION_DATA)
ENGINE_CSV = MEASURED / "engine" / "llm_inference_bench.csv"   # end-to-end runs: one row per (model, GPU, TP, batch, lengths)
OPERATOR_DIR = MEASURED / "aiconfigurator" / "h100_sxm"        # kernel benchmarks of one GPU (aiconfigurator layout)
GPU = "h100"
WORK = Path(tempfile.mkdtemp(prefix="libra-calibrate-"))       # where the fitted files go
print(f"engine runs: {ENGINE_CSV.relative_to(MEASURED)}; operator folder: {OPERATOR_DIR.relative_to(MEASURED)}")"""),
    ("md", """## 1. An engine profile from end-to-end runs

`fit_csv` reads the runs (the same reader as `libra-calibrate fit-engine`), drops rows faster than
streaming the weights once per token allows (measurement errors), and chooses which overhead
terms to fit by **leave-one-model-out**: for every subset of terms it refits without one model
and predicts that model, and keeps the subset with the lowest held-out error. The table shows
the best subsets it compared (MAPE: mean |predicted / measured - 1| of request latency; TP
speed-up error: median error of the speed-up of TP t over the lowest TP measured, what the
planner's TP choice depends on)."""),
    ("code", """# "your runs": the H100 vLLM rows of the bundled benchmark (the bundled vllm-2024 profile was fitted on A100 and H100)
runs = pd.read_csv(ENGINE_CSV)
mine_csv = WORK / "my_runs.csv"
runs[runs["gpu"].str.contains("H100") & (runs["engine"] == "vLLM")].to_csv(mine_csv, index=False)
print(f"{len(pd.read_csv(mine_csv))} of {len(runs)} rows kept: {mine_csv.name}")
fit = F.fit_csv(mine_csv, "my-vllm-h100", skip_unknown=True,
                engine="vLLM (my runs)", description="fitted in notebooks/calibrate.ipynb")
prof = fit.profile
ranked = pd.DataFrame([{"terms": " + ".join(c.terms) + (" + kernel_scale" if c.fit_scale else ""),
                        "held-out MAPE %": round(c.cv.mape, 1), "held-out TP speed-up err %": round(c.cv.speedup_err, 1),
                        "in-sample MAPE %": round(c.insample.mape, 1)} for c in fit.ranked[:6]])
display(ranked)
print(f"chosen: {ranked.iloc[0]['terms']}; rows used {len(fit.features.rows)}, models {sorted(set(map(str, fit.features.models)))}")
from cost_models.engines.profile import TERMS
print("fitted terms (s):", {t: f"{getattr(prof, t):.3g}" for t in TERMS if getattr(prof, t)}, f"kernel_scale {prof.kernel_scale:.3f}")"""),
    ("md", """### Its errors, row by row

Each measured request against the prediction for a model the profile was **not** fitted on
(leave-one-model-out), next to the bundled `vllm-2024` profile (fitted on A100 and H100 rows) and
to no profile at all (the kernels alone): a profile that only fits in-sample would show here."""),
    ("code", """feat = fit.features
terms = fit.chosen.terms
cv = F.lomo_predictions(feat, terms, fit.chosen.fit_scale)
bundled = get_profile("vllm-2024")
from cost_models.engines.report import profile_predictions
from cost_models.engines.registry import constants_profile
rows = pd.DataFrame({"model": feat.models, "tp": [r.tp for r in feat.rows], "batch": [r.batch for r in feat.rows],
                     "kind": [r.kind for r in feat.rows], "measured_s": feat.value, "held_out_s": cv, "bundled_s": profile_predictions(feat, bundled),
                     "constants_s": profile_predictions(feat, constants_profile())})
for c in ("held_out", "bundled", "constants"):
    rows[f"{c}_err_%"] = 100 * (rows[f"{c}_s"] / rows["measured_s"] - 1)
by = rows.groupby(["model", "tp"])[["held_out_err_%", "bundled_err_%", "constants_err_%"]].apply(lambda g: g.abs().mean()).round(1)
display(by)
fig, ax = plt.subplots(figsize=(5, 4))
for c, m in (("constants", "x"), ("bundled", "^"), ("held_out", "o")):
    ax.scatter(rows["measured_s"], rows[f"{c}_s"], s=10, marker=m, alpha=0.6,
               label=f"{c} (MAPE {rows[f'{c}_err_%'].abs().mean():.1f}%)")
lim = [rows["measured_s"].min(), rows["measured_s"].max()]
ax.plot(lim, lim, "k-", lw=0.6); ax.set_xscale("log"); ax.set_yscale("log")
ax.set_xlabel("measured, s (request latency or time per output token)"); ax.set_ylabel("PREDICTED, s")
ax.set_title(f"PREDICTED vs measured, vLLM on {GPU.upper()}", fontsize=9); ax.legend(fontsize=7)
plt.show()
assert rows["held_out_err_%"].abs().mean() < rows["constants_err_%"].abs().mean()  # the profile must beat no profile"""),
    ("md", """### Use it

The profile is a JSON file (`libra-engine-profile` v1): pass it as `--engine FILE` to `libra-sim`
or `engine=` to the evaluator. Here: the decode iteration it predicts per TP against the bundled
profile (what the planner will see when it weighs TP degrees)."""),
    ("code", """path = WORK / "my-vllm-h100.json"
prof.save(path)
mine = CostEvaluator(GPU, "qwen3-14b", engine=str(path))
ref = CostEvaluator(GPU, "qwen3-14b", engine="vllm-2024")
use = pd.DataFrame([{"tp": tp, "batch": b, "mine_ms": 1e3 * float(mine.decode_s(tp, b, b * 4096)),
                     "vllm-2024_ms": 1e3 * float(ref.decode_s(tp, b, b * 4096))} for tp in (1, 2, 4) for b in (1, 32)])
use["ratio"] = (use["mine_ms"] / use["vllm-2024_ms"]).round(3)
display(use.round(2))"""),
    ("md", """## 2. Operator tables from kernel benchmarks

`fit_folder` (what `libra-calibrate fit --data DIR --gpu G` runs) fits one table per operator
family found in the folder. The held-out report then refits each family on 80% of its rows and
predicts the other 20% (`random`), or predicts the largest shapes from the smaller ones
(`extrapolation`), next to the roofline alone. Subsampled to 600 rows per family here so the
notebook stays quick (`libra-calibrate report` runs them all)."""),
    ("code", """from cost_models.calibration.fit import fit_folder
from cost_models.calibration import report as CR

calib = fit_folder(OPERATOR_DIR, GPU)
calib_path = calib.save(WORK / f"{GPU}-calibration.json")
print(f"fitted families: {', '.join(sorted(calib.families))}; wrote {calib_path.name} ({calib_path.stat().st_size / 1024:.0f} KiB)")
frames = CR.family_rows(MEASURED, GPU)
scores = [CR.score(GPU, fam, f, kind, 0) for fam, f in frames.items() if fam in ("gemm", "attn_decode", "attn_prefill")
          for kind in CR.SPLITS]
rep = CR.to_frame(scores)[["family", "split", "n_train", "n_test", "mape", "p90", "roofline_mape"]]
display(rep.round(3))"""),
    ("code", """from cost_models.operators.fitted import FittedOperators
from cost_models.hardware import get_gpu

ops = FittedOperators(get_gpu(GPU), calib)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
for ax, fam in zip(axes, ("gemm", "attn_decode")):
    f = frames[fam].sample(n=min(1500, len(frames[fam])), random_state=0)
    pred = CR.predict(ops, fam, f)
    meas = f["latency_s"].to_numpy()
    ax.scatter(meas, pred, s=4, alpha=0.4)
    lim = [meas.min(), meas.max()]; ax.plot(lim, lim, "k-", lw=0.6)
    ax.set_xscale("log"); ax.set_yscale("log"); ax.set_title(f"{fam} on {GPU.upper()} (in-sample)", fontsize=9)
    ax.set_xlabel("measured, s"); ax.set_ylabel("PREDICTED, s")
plt.tight_layout(); plt.show()"""),
    ("md", """## 3. A replay with your calibration (SIMULATED)

`libra-sim replay TRACE --calibration FILE` (here `replay_policy(..., calibration=...)`) runs the
simulator on your operator tables instead of the bundled ones: the same trace, one step, both
ways. A large difference means your GPU (or your measurement) differs from the bundled one."""),
    ("code", """from libra.cluster import ClusterSpec
from sim.replay import load_steps, replay_policy

steps, _ = load_steps(str(ROOT / "traces" / "search-r1.jsonl.gz"), "0:1")
cluster = ClusterSpec(8, GPU, "qwen3-8b", max_context=4096)
out = []
for label, cal in (("bundled calibration", None), ("this notebook's", str(calib_path))):
    r = replay_policy(steps, "libra", cluster, calibration=cal)
    out.append({"operators": label, "step_s": round(r.mean_step_s, 2), "gen_tok_s": round(r.throughput_tok_s),
                "completed": r.completed})
display(pd.DataFrame(out))
print("SIMULATED: one step of the Search-R1 trace on 8 H100, Qwen3-8B")
assert abs(out[1]["step_s"] / out[0]["step_s"] - 1) < 0.01, 'a fit of the bundled folder should reproduce the bundled calibration'"""),
]


def build() -> nbformat.NotebookNode:
    """The notebook object from ``CELLS``."""
    return notebook(CELLS)


if __name__ == "__main__":
    write(build(), "calibrate.ipynb", sys.argv[1:])
