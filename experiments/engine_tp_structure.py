"""Diagnostic: does a TP-scaling structure other than the engine profile's generalize better to
model families it was not fitted on? Measured data (the Argonne bench in
``cost_models/data/measured/engine``), not SIMULATED.

    .venv/bin/python experiments/engine_tp_structure.py [--data-root DIR] [--out FILE.md]

Why: held-out engine families err 32-63 % in TP speed-up (issue 17: batch-1 Llama-2-70B TP2->TP8
measured 1.22x, predicted 2.67x). The profile's per-iteration TP terms are a cost per extra TP
worker, ``per_worker_s * (tp - 1)``, and a latency per all-reduce that does not depend on TP,
``per_collective_s * 2 L``. A ring all-reduce of a small (batch-1) message is latency bound with
``2 (tp - 1)`` steps, and a tree's grows with ``log2 tp``; so two candidate structures add a term
per all-reduce that grows with TP:

- ``ring``: ``per_ar_rank_s * 2 L * (tp - 1)`` per iteration;
- ``log``:  ``per_ar_rank_s * 2 L * log2(tp)`` per iteration.

Each structure goes through the shipping pipeline (``cost_models.engines.fit``: non-negative least
squares in relative error; which terms, chosen by leave-one-model-out over every subset) inside a
leave-one-FAMILY-out loop: the model families (Llama-2, Llama-3, Qwen2, Mistral/Mixtral) are held
out one at a time, the term choice and fit use only the other families, and the held-out family's
TP speed-ups (over the lowest TP measured for the same GPU, batch and lengths) and whole-request
latencies are scored. ``ring (forced)`` / ``log (forced)`` always include the new term (no
selection), which shows what the data say of it when it must be used. Also printed, not used to
choose: each structure's prediction for the issue's batch-1 Llama-2-70B H100 TP2->TP8 case (the
bench has TP 1-4 only), and each engine's fit on the OTHER engine's rows (leave-one-engine-out: a
profile applied to an engine it was not fitted on, the issue's "other engines"). A structure is
adopted only if its held-out error drops.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

ENGINES = ("vLLM", "TensorRT-LLM")
STRUCTURES = ("profile", "ring", "log", "ring (forced)", "log (forced)")
FAMILIES = (("llama-2", "Llama-2"), ("llama-3", "Llama-3"), ("qwen2", "Qwen2"), ("mistral", "Mistral/Mixtral"),
            ("mixtral", "Mistral/Mixtral"))
ISSUE_CASE = ("meta-llama/Llama-2-70b-hf", "h100", 1, 1024, 2, 8, 1.22)  # model, gpu, batch, length, tp lo, tp hi, measured


def family(model_name: str) -> str:
    """The model family of a bench model name (what is held out together)."""
    low = model_name.lower()
    for key, name in FAMILIES:
        if key in low:
            return name
    return model_name


def design(feat: Any, structure: str) -> tuple[np.ndarray, list[str]]:
    """The count columns of ``structure``: the profile's TERMS, plus the per-all-reduce-per-rank
    term of ``ring``/``log``."""
    from cost_models.engines.profile import TERMS

    cols, names = [feat.counts], list(TERMS)
    kind = structure.split(" ")[0]
    if kind in ("ring", "log"):
        extra = []
        for r in feat.rows:
            n = 1.0 if r.kind == "tpot" else float(r.output_len)
            grow = (r.tp - 1) if kind == "ring" else np.log2(r.tp)
            extra.append(n * 2.0 * r.model.n_layers * grow)
        cols.append(np.array(extra)[:, None])
        names.append("per_ar_rank_s")
    return np.hstack(cols), names


def solve(K: np.ndarray, C: np.ndarray, y: np.ndarray, cols: Sequence[int], fit_scale: bool) -> tuple[float, np.ndarray]:
    """``cost_models.engines.fit.solve`` on an arbitrary count matrix (relative-error NNLS)."""
    A = C[:, list(cols)] / y[:, None]
    if fit_scale:
        A, target = np.column_stack([K / y, A]), np.ones_like(y)
    else:
        target = 1.0 - K / y
    norm = np.sqrt((A**2).sum(axis=0))
    norm[norm == 0] = 1.0
    x, _ = nnls(A / norm, target)
    x = x / norm
    return (float(x[0]), x[1:]) if fit_scale else (1.0, x)


def objective(rows: Sequence[Any], pred: np.ndarray, y: np.ndarray) -> float:
    from cost_models.engines import fit as F

    return F.score(rows, pred, y).objective


def choose_and_fit(K: np.ndarray, C: np.ndarray, y: np.ndarray, rows: Sequence[Any], names: list[str],
                   forced: str | None) -> tuple[list[int], bool, float, np.ndarray]:
    """The shipping term choice (leave-one-model-out over every subset containing ``step_s``, and
    ``forced`` if given), then the fit on all of ``rows``."""
    models = np.array([r.model_name for r in rows])
    optional = [j for j in range(1, len(names)) if names[j] != forced]
    must = [0] + ([names.index(forced)] if forced else [])
    best: tuple[Any, ...] | None = None
    for k in range(len(optional) + 1):
        for extra in itertools.combinations(optional, k):
            cols = sorted([*must, *extra])
            for fs in (False, True):
                pred = np.full(len(y), np.nan)
                for m in np.unique(models):
                    h = models == m
                    s, c = solve(K[~h], C[~h], y[~h], cols, fs)
                    pred[h] = s * K[h] + C[h][:, cols] @ c
                key = (round(objective(rows, pred, y), 6), len(cols) + fs)
                if best is None or key < best[0]:
                    best = (key, cols, fs)
    assert best is not None
    _, cols, fs = best
    s, c = solve(K, C, y, cols, fs)
    return cols, fs, s, c


def evaluate(root: Any = None, engines: Sequence[str] = ENGINES) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per engine, structure and held-out family: median |speed-up error| and MAPE (%), the terms
    chosen; and per engine and structure the issue case's predicted speed-up (fit on all rows)."""
    from cost_models.calibration.sources import find_calibration_root
    from cost_models.engines import fit as F
    from cost_models.engines.measurements import Measurement, bundled_config, read_measurements
    from cost_models.engines.registry import BENCH_CSV
    from cost_models.models import get_model

    path = find_calibration_root(root) / BENCH_CSV
    model, gpu, batch, length, lo, hi, _ = ISSUE_CASE
    spec = get_model(bundled_config(model))
    probe = F.features([Measurement(spec, gpu, tp, batch, length, length, "latency", 1.0) for tp in (lo, hi)])
    table, case = [], []
    data: dict[str, Any] = {}
    fits: dict[tuple[str, str], tuple[list[int], bool, float, np.ndarray]] = {}
    for engine in engines:
        rows, _ = read_measurements(path, only_engine=engine, skip_unknown=True)
        rows, _ = F.screen(rows)
        feat = F.features(rows)
        data[engine] = (rows, feat)
        fams = np.array([family(r.model_name) for r in rows])
        for structure in STRUCTURES:
            C, names = design(feat, structure)
            forced = "per_ar_rank_s" if "forced" in structure else None
            all_sp: list[float] = []
            all_ape: list[float] = []
            for fam in sorted(set(fams)):
                h = fams == fam
                train = [r for r, keep in zip(rows, ~h) if keep]
                cols, fs, s, c = choose_and_fit(feat.kernel_s[~h], C[~h], feat.value[~h], train, names, forced)
                held = [r for r, keep in zip(rows, h) if keep]
                pred = s * feat.kernel_s[h] + C[h][:, cols] @ c
                sp = [abs(e) * 100 for *_, e in F.speedup_errors(held, pred)]
                ape = list(np.abs(pred / feat.value[h] - 1) * 100)
                all_sp += sp
                all_ape += ape
                table.append({"engine": engine, "structure": structure, "family": fam, "rows": int(h.sum()), "speedup_rows": len(sp),
                              "speedup_err_pct": float(np.median(sp)) if sp else float("nan"), "mape_pct": float(np.mean(ape)),
                              "terms": [names[j] for j in cols] + (["kernel_scale"] if fs else [])})
            table.append({"engine": engine, "structure": structure, "family": "all (held out)", "rows": len(rows),
                          "speedup_rows": len(all_sp), "speedup_err_pct": float(np.median(all_sp)),
                          "mape_pct": float(np.mean(all_ape)), "terms": []})
            cols, fs, s, c = fits[(engine, structure)] = choose_and_fit(feat.kernel_s, C, feat.value, rows, names, forced)
            Cp, _ = design(probe, structure)
            p = s * probe.kernel_s + Cp[:, cols] @ c
            case.append({"engine": engine, "structure": structure, "speedup": float(p[0] / p[1]),
                         "terms": {names[j]: float(v) for j, v in zip(cols, c)}, "kernel_scale": s})
    # leave-one-ENGINE-out: each engine's fit (all its rows) on the other engine's rows
    for entry in case:
        for other in [e for e in engines if e != entry["engine"]]:
            rows, feat = data[other]
            cols, fs, s, c = fits[(entry["engine"], entry["structure"])]
            C, _ = design(feat, entry["structure"])
            pred = s * feat.kernel_s + C[:, cols] @ c
            sc = F.score(rows, pred, feat.value)
            entry["other_engine"] = {"engine": other, "speedup_err_pct": sc.speedup_err, "mape_pct": sc.mape}
    return table, case


def to_markdown(table: list[dict[str, Any]], case: list[dict[str, Any]]) -> str:
    def pct(v: float) -> str:
        return "-" if not np.isfinite(v) else f"{v:.1f} %"

    fams = sorted({r["family"] for r in table if not r["family"].startswith("all")}) + ["all (held out)"]
    lines = ["Leave-one-family-out, per engine: median |TP speed-up error| / whole-request MAPE of the held-out family "
             "(terms chosen and fitted on the other families)", "",
             "| engine | structure | " + " | ".join(fams) + " |", "|---|---|" + "---:|" * len(fams)]
    for engine in [e for e in ENGINES if any(r["engine"] == e for r in table)]:
        for structure in STRUCTURES:
            cells = []
            for f in fams:
                r = next((x for x in table if x["engine"] == engine and x["structure"] == structure and x["family"] == f), None)
                cells.append("-" if r is None else f"{pct(r['speedup_err_pct'])} / {pct(r['mape_pct'])}")
            lines.append(f"| {engine} | {structure} | " + " | ".join(cells) + " |")
    model, gpu, batch, length, lo, hi, measured = ISSUE_CASE
    lines += ["", f"Not used to choose: {model} on {gpu}, batch {batch}, {length}/{length}, TP{lo} -> TP{hi} speed-up "
              f"(issue 17: measured {measured}x; the bench has TP 1-4), each structure fitted on all of its engine's rows:", "",
              "| engine | structure | predicted TP{lo}->TP{hi} | terms (us) | on the other engine's rows: speed-up / MAPE |"
              .format(lo=lo, hi=hi), "|---|---|---:|---|---:|"]
    for c in case:
        terms = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in c["terms"].items() if v > 0)
        o = c.get("other_engine")
        other = "-" if o is None else f"{pct(o['speedup_err_pct'])} / {pct(o['mape_pct'])}"
        lines.append(f"| {c['engine']} | {c['structure']} | {c['speedup']:.2f}x | {terms}; kernel_scale {c['kernel_scale']:.3f} "
                     f"| {other} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", help="measured-data root (default: the bundled copy, cost_models/data/measured)")
    ap.add_argument("--out", help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    text = to_markdown(*evaluate(args.data_root))
    print(text, end="")
    if args.out:
        Path(args.out).write_text("`python experiments/engine_tp_structure.py`\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
