"""Cost-evaluator fidelity: predicted vs measured end-to-end engine runs (``libra-calibrate report --engine all``).

    .venv/bin/python experiments/fidelity.py [--out experiments/results]

For each bundled engine profile (``vllm-2024``, ``trtllm-2024``) the measured requests it was
fitted on (cost_models/data/measured/engine/, screened as in the fit), predicted three ways:
leave-one-model-out (``cv``: the profile refitted without the row's model, what a user's new
model gets), the shipped profile (in-sample), and the pre-profile constants. Writes every row's
prediction and the report's per-GPU and TP table. The measurements are measured (published
benchmark runs); the predictions are the cost model's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exp_common import Context, Figure, Section, finish_figure, pyplot, script_main, sha256_file, write_csv

NAME = "fidelity"
TITLE = "Cost-evaluator fidelity: engine profiles vs measured end-to-end runs"
PROFILES = ("vllm-2024", "trtllm-2024")


def inputs(size: str) -> dict[str, Any]:
    from cost_models.calibration.sources import find_calibration_root

    root = find_calibration_root(None)
    return {"profiles": PROFILES, "data": sha256_file(root / "engine" / "llm_inference_bench.csv")
            if (root / "engine" / "llm_inference_bench.csv").is_file() else str(root)}


def run(ctx: Context) -> Section:
    from cost_models.engines import report as R

    rows, tables, cv = [], [], {}
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PROFILES), figsize=(4.8 * len(PROFILES), 4.0), squeeze=False)
    for ax, name in zip(axes[0], PROFILES):
        profile, cells, feat = R.engine_report(name)
        preds = R.predictions(feat, profile)
        tables.append(R.to_markdown(name, cells))
        for i, r in enumerate(feat.rows):
            rows.append({"profile": name, "gpu": r.gpu, "model": r.model_name, "tp": r.tp, "batch": r.batch,
                         "measured_s": float(feat.value[i]), **{f"pred_{w}_s": float(p[i]) for w, p in preds.items()}})
        allc = next(c for c in cells if c.gpu == "all" and c.tp == "all")
        cv[name] = allc
        lo, hi = float(feat.value.min()), float(feat.value.max())
        for w, marker in (("constants", "x"), ("cv", "o")):
            ax.scatter(feat.value, preds[w], s=8, marker=marker, alpha=0.6, label=f"{w} (MAPE {allc.mape[w]:.1f}%)")
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured request latency, s")
        ax.set_ylabel("predicted latency, s (SIMULATED cost model)")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    finish_figure(fig, ctx.dir / "fidelity.png", "Cost-model fidelity: PREDICTED vs measured engine runs (inputs of every SIMULATED number)")
    write_csv(ctx.dir / "fidelity_rows.csv", rows)
    summary = "; ".join(f"`{n}` leave-one-model-out MAPE {c.mape['cv']:.1f}% (constants {c.mape['constants']:.1f}%), "
                        f"median TP speed-up error {c.speedup_err['cv'] or float('nan'):.1f}%, median pred/measured {c.ratio['cv']:.2f}"
                        for n, c in cv.items())
    body = summary + ".\n\n" + "\n".join(tables)
    fig_ = Figure("fidelity.png", "PREDICTED vs measured engine runs (the cost model under every SIMULATED number)",
                  "Each measured request (published vLLM / TensorRT-LLM benchmark runs, A100 and H100, TP 1-4) against the "
                  "cost model's prediction for a model the profile was not fitted on (cv, circles) and with the pre-profile "
                  "constants (crosses); the diagonal is a perfect prediction. Every SIMULATED number in this page is built "
                  "on these predictions.")
    return Section(NAME, TITLE, "How far the cost evaluator's rollout times are from measured engine runs.", [fig_], body, {},
                   ["fidelity_rows.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
