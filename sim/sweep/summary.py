"""The sweep's table and its verdict: the subject (Libra) against the best baseline of its class.

For each configuration the subject's throughput (generated tokens per simulated second over the
whole replay; every policy replays the same steps, so this is also the ratio of wall times) is
divided by the best baseline's *in the same staleness class*: a ratio above 1 + 3% is a win,
below 1 - 3% a loss, between them a tie (the noise of one seeded replay is a few percent). A
configuration where the subject failed is ``subject-failed``, one where every baseline failed
``no-baseline``: neither is hidden among the ties. Failed runs are listed with their errors.

Outputs: ``results.csv`` (one row per replay), ``results.json`` (configurations with their runs
and comparison, and the totals), ``summary.md`` (the same for people; every number SIMULATED).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.sweep.staleness import class_name

#: Relative throughput difference within which the subject and the best baseline tie.
TIE_TOLERANCE = 0.03
OUTCOMES: tuple[str, ...] = ("win", "tie", "loss", "subject-failed", "no-baseline")
#: results.csv columns, in order (a record's missing keys are blank).
CSV_COLUMNS: tuple[str, ...] = (
    "config", "workload", "workload_spec", "cluster", "gpus", "gpu", "model", "engine", "max_staleness", "class", "seed",
    "policy", "status", "mode", "staleness", "mean_step_s", "throughput_tok_s", "trained_tok_s", "wall_s", "mean_rollout_makespan_s",
    "mean_train_s", "completed", "expected", "all_completed", "split", "rollout_tps", "host_s", "cached", "hash", "error",
)


def classify(ratio: float, tolerance: float = TIE_TOLERANCE) -> str:
    """``win`` above 1 + tolerance, ``loss`` below 1 - tolerance, else ``tie``."""
    if ratio > 1 + tolerance:
        return "win"
    if ratio < 1 - tolerance:
        return "loss"
    return "tie"


@dataclass
class Comparison:
    """One configuration's verdict. ``ratio``: subject throughput / best baseline's (None when
    either side has no successful run)."""

    config: str
    max_staleness: int
    subject: str
    outcome: str
    ratio: float | None = None
    best_baseline: str | None = None
    subject_tok_s: float | None = None
    best_tok_s: float | None = None
    failed: list[str] = field(default_factory=list)  # policies of this configuration that failed


def _ok(rec: Mapping[str, Any] | None) -> bool:
    return rec is not None and rec.get("status") == "ok" and math.isfinite(float(rec.get("throughput_tok_s") or 0.0)) \
        and float(rec.get("throughput_tok_s") or 0.0) > 0


def compare(config: str, max_staleness: int, runs: Mapping[str, Mapping[str, Any]], subject: str,
            baselines: Sequence[str], tolerance: float = TIE_TOLERANCE) -> Comparison:
    """The verdict of one configuration from its runs (policy -> record; a policy absent from
    ``runs`` did not take part in the class)."""
    failed = [p for p, r in runs.items() if r.get("status") != "ok"]
    ok_base = [(float(runs[b]["throughput_tok_s"]), b) for b in baselines if b in runs and _ok(runs[b])]
    best_tok, best = max(ok_base) if ok_base else (None, None)
    sub = runs.get(subject)
    if not _ok(sub):
        return Comparison(config, max_staleness, subject, "subject-failed", None, best, None, best_tok, failed)
    s_tok = float(sub["throughput_tok_s"])  # type: ignore[index]
    if best_tok is None:
        return Comparison(config, max_staleness, subject, "no-baseline", None, None, s_tok, None, failed)
    ratio = s_tok / best_tok
    return Comparison(config, max_staleness, subject, classify(ratio, tolerance), ratio, best, s_tok, best_tok, failed)


@dataclass
class Totals:
    """Counts over every configuration, overall and per staleness class, and the worst ratio."""

    outcomes: dict[str, int]
    by_class: dict[str, dict[str, int]]
    worst_ratio: float | None
    worst_config: str | None
    geomean_ratio: float | None
    failed_runs: int
    runs: int


def totals(comparisons: Sequence[Comparison], records: Sequence[Mapping[str, Any]]) -> Totals:
    """Aggregate the verdicts (``records``: every run, for the failure count)."""
    outcomes = Counter(c.outcome for c in comparisons)
    by_class: dict[str, Counter[str]] = {}
    for c in comparisons:
        by_class.setdefault(class_name(c.max_staleness), Counter())[c.outcome] += 1
    rated = [c for c in comparisons if c.ratio is not None]
    worst = min(rated, key=lambda c: c.ratio) if rated else None  # type: ignore[arg-type, return-value]
    geo = math.exp(sum(math.log(c.ratio) for c in rated) / len(rated)) if rated else None  # type: ignore[arg-type]
    return Totals({o: outcomes.get(o, 0) for o in OUTCOMES}, {k: {o: v.get(o, 0) for o in OUTCOMES} for k, v in sorted(by_class.items())},
                  worst.ratio if worst else None, worst.config if worst else None, geo,
                  sum(r.get("status") != "ok" for r in records), len(records))


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """One row per replay, ``CSV_COLUMNS`` in order."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})


def write_json(path: str, meta: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], comps: Sequence[Comparison],
               tot: Totals) -> None:
    """Everything: the run's metadata, per configuration its runs and verdict, the totals."""
    doc = {"simulated": True, **meta, "tie_tolerance": TIE_TOLERANCE,
           "configurations": [dict(c, comparison=asdict(k)) for c, k in zip(configs, comps)], "totals": asdict(tot)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)


def render_markdown(meta: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], comps: Sequence[Comparison], tot: Totals,
                    policies: Sequence[str]) -> str:
    """summary.md: the verdict first, then the per-configuration table, then the failures."""
    subject = meta["subject"]
    lines = [f"# Sweep `{meta['grid_name']}` — SIMULATED results", "",
             f"Every number below is SIMULATED (`libra-sim`, cost model + seeded noise), not measured. Grid "
             f"`{meta['grid']}`, code key `{meta['code_key']}`, commit `{meta.get('commit') or 'unknown (not a git checkout: ' + str(meta.get('code_root')) + ')'}`"
             f"{' (working tree had uncommitted changes)' if meta.get('dirty') else ''}.", "",
             *([f"**INCOMPLETE**: the sweep was interrupted; {meta['incomplete']}. Rerun the same command: the finished "
                "runs are cached.", ""] if meta.get("incomplete") else []),
             f"`{subject}` against the best baseline of the same staleness class ({', '.join(meta['baselines'])}), by "
             f"throughput (generated tokens per simulated second; same steps for every policy): win > +{TIE_TOLERANCE:.0%}, "
             f"loss < -{TIE_TOLERANCE:.0%}, else tie.", "",
             "| class | configurations | " + " | ".join(OUTCOMES) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in OUTCOMES) + " |"]
    for k, counts in list(tot.by_class.items()) + [("all", tot.outcomes)]:
        n = sum(counts.values())
        lines.append(f"| {k} | {n} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    worst = f"{tot.worst_ratio:.3f} (`{tot.worst_config}`)" if tot.worst_ratio is not None else "—"
    geo = f"{tot.geomean_ratio:.3f}" if tot.geomean_ratio is not None else "—"
    lines += ["", f"SIMULATED worst ratio {subject} / best baseline: {worst}; geometric mean {geo}. "
                  f"Failed runs: {tot.failed_runs} of {tot.runs}.", "",
              "## Per configuration (SIMULATED; mean step s / throughput tok/s)", "",
              "| configuration | workload | cluster | " + " | ".join(policies) + " | best baseline | ratio | outcome |",
              "| --- | --- | --- | " + " | ".join("---:" for _ in policies) + " | --- | ---: | --- |"]
    for c, k in zip(configs, comps):
        cells = []
        for p in policies:
            r = c["runs"].get(p)
            if r is None:
                cells.append("n/a")
            elif r.get("status") != "ok":
                cells.append("FAILED")
            else:
                cells.append(f"{_fmt(r.get('mean_step_s'))} / {_fmt(r.get('throughput_tok_s'), 0)}")
        ratio = f"{k.ratio:.3f}" if k.ratio is not None else "—"
        lines.append(f"| `{c['config']}` | {c['workload_spec']} | {c['cluster_spec']} | " + " | ".join(cells)
                     + f" | {k.best_baseline or '—'} | {ratio} | {k.outcome} |")
    fails = [(c["config"], p, r.get("error")) for c in configs for p, r in c["runs"].items() if r.get("status") != "ok"]
    lines += ["", "## Failed runs", ""]
    lines += [f"- `{cfg}` {p}: {err}" for cfg, p, err in fails] if fails else ["None: every run completed every trajectory once."]
    lines += ["", "`n/a`: the policy does not take part in that staleness class (`sim/sweep/staleness.py`, `runs_in_class`).", ""]
    return "\n".join(lines)


def write_outputs(out_dir: str, meta: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], policies: Sequence[str],
                  subject: str, baselines: Sequence[str]) -> tuple[list[Comparison], Totals]:
    """Compare every configuration (``configs``: dicts with ``config``, ``max_staleness`` and
    ``runs``: policy -> record) and write results.csv, results.json and summary.md."""
    comps = [compare(c["config"], c["max_staleness"], c["runs"], subject, baselines) for c in configs]
    rows = [dict(r, **{k: c.get(k) for k in ("config", "workload", "workload_spec", "cluster", "gpus", "gpu", "model", "engine",
                                             "max_staleness", "class", "seed")}, policy=p)
            for c in configs for p, r in c["runs"].items()]
    tot = totals(comps, rows)
    write_csv(os.path.join(out_dir, "results.csv"), rows)
    write_json(os.path.join(out_dir, "results.json"), meta, configs, comps, tot)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(meta, configs, comps, tot, policies))
    return comps, tot
