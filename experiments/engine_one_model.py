"""Diagnostic: an engine profile fitted on ONE model's runs at several TP degrees (what a user
measures), for every (engine, model, GPU) of the Argonne bench measured at two or more TP
degrees. Measured data (``cost_models/data/measured/engine``), not SIMULATED.

    .venv/bin/python experiments/engine_one_model.py [--data-root DIR] [--out FILE.md]

Per subset: the TP degrees, the terms fitted and those not identifiable (kept at the default
profile's values, ``libra-calibrate fit-engine``'s rule), the held-out error of the fit on its own
rows (leave-one-configuration-out: each batch/length held out with all its TP degrees), and how
the one-model profile predicts the bench's OTHER models of the same engine (every GPU): median
|TP speed-up error| and whole-request MAPE, beside the bundled multi-model profile on the same
rows (in-sample for it: it was fitted on them, so it is the bar, not a held-out number).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENGINES = {"vLLM": "vllm-2024", "TensorRT-LLM": "trtllm-2024"}


def evaluate(root: Any = None, engines: Sequence[str] = tuple(ENGINES)) -> list[dict[str, Any]]:
    from cost_models.calibration.sources import find_calibration_root
    from cost_models.engines import fit as F
    from cost_models.engines.measurements import read_measurements
    from cost_models.engines.registry import BENCH_CSV, get_profile

    path = find_calibration_root(root) / BENCH_CSV
    out = []
    for engine in engines:
        bundled_name = ENGINES[engine]
        rows, _ = read_measurements(path, only_engine=engine, skip_unknown=True)
        rows, _ = F.screen(rows)
        bundled = get_profile(bundled_name)
        for model, gpu in sorted({(r.model_name, r.gpu) for r in rows}):
            sub = [r for r in rows if r.model_name == model and r.gpu == gpu]
            tps = sorted({r.tp for r in sub})
            if len(tps) < 2:
                continue
            fit = F.fit_profile(sub, "one-model")
            p = fit.profile
            cv = p.source[p.source["cross_validation"].split(" ")[0].replace("-", "_")]
            others = [r for r in rows if r.model_name != model]
            feat = F.features(others)
            mine = F.score(others, F.predict(feat, p.kernel_scale, p.terms), feat.value)
            ref = F.score(others, F.predict(feat, bundled.kernel_scale, bundled.terms), feat.value)
            out.append({"engine": engine, "model": model, "gpu": gpu, "rows": len(sub), "tps": tps,
                        "fitted": p.source["terms_fitted"], "not_identifiable": list(p.source["not_identifiable"]),
                        "cv_mape": cv["mape_pct"], "cv_speedup": cv["speedup_err_median_pct"],
                        "others_rows": len(others), "others_speedup": mine.speedup_err, "others_mape": mine.mape,
                        "bundled_speedup": ref.speedup_err, "bundled_mape": ref.mape})
    return out


def to_markdown(rs: list[dict[str, Any]]) -> str:
    lines = ["| engine | model | GPU | rows | TPs | fitted | not identifiable (kept at the default's) | own held out: speed-up / MAPE "
             "| other models: speed-up / MAPE | bundled on them (in-sample) |",
             "|---|---|---|---:|---|---|---|---:|---:|---:|"]
    for r in rs:
        lines.append(f"| {r['engine']} | {r['model'].split('/')[-1]} | {r['gpu']} | {r['rows']} | {', '.join(map(str, r['tps']))} | "
                     f"{', '.join(r['fitted'])} | {', '.join(r['not_identifiable']) or '-'} | "
                     f"{r['cv_speedup']:.1f} % / {r['cv_mape']:.1f} % | {r['others_speedup']:.1f} % / {r['others_mape']:.1f} % | "
                     f"{r['bundled_speedup']:.1f} % / {r['bundled_mape']:.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", help="measured-data root (default: the bundled copy, cost_models/data/measured)")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    text = to_markdown(evaluate(args.data_root))
    print(text, end="")
    if args.out:
        Path(args.out).write_text("`python experiments/engine_one_model.py`\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
