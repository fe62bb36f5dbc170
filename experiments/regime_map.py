"""The regime map: for which model, GPU, engine and workload each of Libra's mechanisms pays.

    .venv/bin/python experiments/regime_map.py [--size smoke|quick|full] [--out experiments/results]

Runs the grid ``experiments/grids/regime_map.yaml`` (``--size quick``: ``regime_map_quick.yaml``,
``smoke``: ``regime_map_smoke.yaml``) with ``libra-sim sweep`` (its cache under
``<out>/.cache/sweeps/<grid>/``: a rerun replays only what changed; the same grid runs on a Ray
cluster with ``libra-sim sweep GRID --out DIR --ray ADDRESS``), reads each configuration's axes
back from the grid (model, GPU, engine profile, workload kind, trajectories per GPU, median turn
length and context cap, tool latency, drift ("default": the workload kind's own), tool-error
effect, staleness class K) and computes
per cell:

* ``libra_vs_best``: Libra's throughput over the best baseline of its staleness class;
* ``planner``: ``libra-homogeneous`` (the planner alone) over that baseline;
* ``hetero``: ``libra-hetero`` / ``libra-homogeneous`` (+ heterogeneous TP);
* ``cmlfq``: ``libra-cmlfq`` / ``libra-hetero`` (+ C-MLFQ on top);
* ``pool``: ``libra-full`` / ``libra-cmlfq`` (+ the elastic pool on top);
* ``cmlfq_alone_off``: ``libra`` / ``reactive-mlfq`` (C-MLFQ against reactive routing with
  everything else on: its gain as the last mechanism left out).

The registry has no "C-MLFQ without heterogeneous TP" or "pool without C-MLFQ" policy, so a
mechanism's gain alone is measured for heterogeneous TP (over the planner) only; the others are
measured on top of the previous ones and, for C-MLFQ, also as the one left out. Heat maps per
block of the grid; the text names, from the CSV, the cells where each mechanism gains more than
3% (the sweep's tie band) and what those cells share. SIMULATED.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from exp_common import ROOT, Context, Figure, Section, finish_figure, fx, md_table, pick, pyplot, read_csv, script_main, \
    sha256_file, write_csv

NAME = "regime_map"
TITLE = "Regime map: where each of Libra's mechanisms pays"
GRIDS = ROOT / "experiments" / "grids"
TIE = 0.03
#: metric -> (numerator policy, denominator policy or "best" baseline of the class), label
METRICS: dict[str, tuple[str, str, str]] = {
    "libra_vs_best": ("libra", "best", "Libra vs best baseline"),
    "planner": ("libra-homogeneous", "best", "planner alone vs best baseline"),
    "hetero": ("libra-hetero", "libra-homogeneous", "+ heterogeneous TP"),
    "cmlfq": ("libra-cmlfq", "libra-hetero", "+ C-MLFQ"),
    "pool": ("libra-full", "libra-cmlfq", "+ elastic pool"),
    "cmlfq_alone_off": ("libra-full", "reactive-mlfq", "C-MLFQ vs reactive, rest on"),
}
MECHANISMS = ("planner", "hetero", "cmlfq", "pool", "cmlfq_alone_off")
#: The axes a configuration is described by, in display order.
AXES = ("kind", "model", "gpu", "engine", "traj_per_gpu", "gen_median_x", "max_context", "tool_latency_x", "drift", "error_effect", "K")
#: Pairs of axes drawn as heat maps (those the grid varies; a 1-D block is drawn against the kind).
PLANES: tuple[tuple[str, str], ...] = (
    ("model", "gpu"), ("kind", "traj_per_gpu"), ("gen_median_x", "max_context"), ("kind", "tool_latency_x"),
    ("kind", "drift"), ("kind", "error_effect"), ("model", "engine"), ("kind", "K"),
)


def grid_path(size: str) -> Path:
    return GRIDS / pick(size, "regime_map_smoke.yaml", "regime_map_quick.yaml", "regime_map.yaml")


def inputs(size: str) -> dict[str, Any]:
    return {"grid": sha256_file(grid_path(size))}


def axes_of(config: Any) -> dict[str, Any]:
    """A configuration's axis values, read from the grid (generator defaults resolved)."""
    from libra.trace.workload import make_params
    from sim.sweep.grid import GeneratedWorkload

    src = config.workload.source
    cl = config.cluster
    ax: dict[str, Any] = {"model": cl.model, "gpu": cl.gpu, "engine": cl.engine or "vllm-2024", "K": config.max_staleness}
    if isinstance(src, GeneratedWorkload):
        p = make_params(src.kind, **dict(src.params)).as_dict()
        d = make_params(src.kind).as_dict()
        ax.update(kind=src.kind, traj_per_gpu=round(src.batch / cl.gpus, 2), gen_median_x=round(p["gen_median"] / d["gen_median"], 3),
                  max_context=p["max_context"], tool_latency_x=round(p["lat_body_median_s"] / d["lat_body_median_s"], 3),
                  drift="default" if p["drift"] == d["drift"] else p["drift"], error_effect=p["error_effect"])
    else:
        ax.update(kind=Path(src.path).name.split("-")[0], traj_per_gpu=float("nan"), gen_median_x=1.0, max_context=0,
                  tool_latency_x=1.0, drift=float("nan"), error_effect=float("nan"))
    return ax


def run_sweep(ctx: Context, grid: Path) -> Path:
    """``libra-sim sweep GRID --out <cache>/sweeps/<grid>`` in this process (its cache makes a
    rerun compute only what changed); returns that folder. Failed runs are results (listed)."""
    from sim.commands import sweep as S

    out = ctx.cache / "sweeps" / grid.stem
    out.mkdir(parents=True, exist_ok=True)
    p = argparse.ArgumentParser()
    S.add_arguments(p)  # the command's own flags and defaults: the same run as typing it
    S.run(p.parse_args([str(grid), "--out", str(out), "--jobs", str(max(1, ctx.jobs)), "--quiet"]))
    return out


def cells(grid: Path, results_csv: Path) -> list[dict[str, Any]]:
    """One row per configuration: its axes, each policy's throughput, and the metrics."""
    from libra.policies import BASELINES
    from sim.sweep.grid import load_grid

    g = load_grid(str(grid))
    runs: dict[str, dict[str, dict[str, str]]] = {}
    for r in read_csv(results_csv):
        runs.setdefault(r["config"], {})[r["policy"]] = r
    out = []
    for c in g.configurations:
        rr = runs.get(c.id, {})
        tok = {p: float(r["throughput_tok_s"]) if r.get("status") == "ok" and r.get("throughput_tok_s") else float("nan")
               for p, r in rr.items()}
        base = [(v, p) for p, v in tok.items() if p in BASELINES and math.isfinite(v)]
        best_v, best_p = max(base) if base else (float("nan"), "none")
        row: dict[str, Any] = {"config": c.id, **axes_of(c), "best_baseline": best_p,
                               "failed": ";".join(f"{p}: {r.get('error')}" for p, r in rr.items() if r.get("status") != "ok")}
        for p, v in tok.items():
            row[f"tok_s:{p}"] = v
        for m, (num, den, _) in METRICS.items():
            d = best_v if den == "best" else tok.get(den, float("nan"))
            n = tok.get(num, float("nan"))
            row[m] = n / d if math.isfinite(n) and math.isfinite(d) and d > 0 else float("nan")
        row["libra_mode"] = rr.get("libra", {}).get("mode", "")
        row["libra_tps"] = rr.get("libra", {}).get("rollout_tps", "")
        out.append(row)
    return out


def _modes(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload kind, each axis's most common value: the block's base point."""
    out: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        sel = [r for r in rows if r["kind"] == kind]
        out[kind] = {a: Counter(str(r[a]) for r in sel).most_common(1)[0][0] for a in AXES}
    out["*"] = {a: Counter(str(r[a]) for r in rows).most_common(1)[0][0] for a in AXES}
    return out


def plane(rows: list[dict[str, Any]], x: str, y: str) -> list[dict[str, Any]]:
    """The cells of the plane (x, y): every other axis at its base (per kind when kind is an axis)."""
    modes = _modes(rows)
    out = []
    for r in rows:
        base = modes[r["kind"]] if "kind" in (x, y) else modes["*"]
        if "kind" not in (x, y) and str(r["kind"]) != modes["*"]["kind"]:
            continue
        if all(str(r[a]) == base[a] for a in AXES if a not in (x, y)):
            out.append(r)
    return out


def _sortkey(v: Any) -> tuple[int, Any]:
    if v == "default":  # a workload's own default (drift differs by kind) sorts first
        return (-1, 0.0)
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def _heatmaps(ctx: Context, rows: list[dict[str, Any]], metric: str, fname: str, title: str) -> list[tuple[str, str, int]]:
    """Small multiples: one heat map of ``metric`` per plane the grid varies; returns the planes drawn."""
    plt = pyplot()
    drawn: list[tuple[str, str, int]] = []
    seen: list[set[str]] = []
    for x, y in PLANES:
        sel = plane(rows, x, y)
        ids = {r["config"] for r in sel}
        varied = len({str(r[x]) for r in sel}) > 1 or len({str(r[y]) for r in sel}) > 1
        if len(sel) >= 2 and varied and not any(ids <= s for s in seen):  # a plane inside one drawn already adds nothing
            drawn.append((x, y, len(sel)))
            seen.append(ids)
    if not drawn:
        return []
    n = len(drawn)
    cols = min(3, n)
    nr = math.ceil(n / cols)
    fig, axes = plt.subplots(nr, cols, figsize=(4.6 * cols, 3.4 * nr), squeeze=False)
    for i, (x, y, _) in enumerate(drawn):
        ax = axes[i // cols][i % cols]
        sel = plane(rows, x, y)
        xs = sorted({str(r[x]) for r in sel}, key=_sortkey)
        ys = sorted({str(r[y]) for r in sel}, key=_sortkey)
        m = np.full((len(xs), len(ys)), np.nan)
        for r in sel:
            m[xs.index(str(r[x])), ys.index(str(r[y]))] = r[metric]
        im = ax.imshow(m, cmap="RdBu", vmin=0.7, vmax=1.3, aspect="auto")
        for a in range(len(xs)):
            for b in range(len(ys)):
                if np.isfinite(m[a, b]):
                    ax.text(b, a, f"{m[a, b]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(xs)), xs, fontsize=7)
        ax.set_xticks(range(len(ys)), ys, fontsize=7, rotation=30)
        ax.set_ylabel(f"{x} (SIMULATED)")
        ax.set_xlabel(y)
        fig.colorbar(im, ax=ax, fraction=0.046)
    for j in range(n, nr * cols):
        axes[j // cols][j % cols].set_visible(False)
    finish_figure(fig, ctx.dir / fname, title)
    return drawn


def _mechanism_matrix(ctx: Context, rows: list[dict[str, Any]]) -> None:
    plt = pyplot()
    ms = ("libra_vs_best",) + MECHANISMS
    m = np.array([[r[k] for k in ms] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, max(3.0, 0.22 * len(rows) + 1.2)))
    im = ax.imshow(m, cmap="RdBu", vmin=0.8, vmax=1.2, aspect="auto")
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            if np.isfinite(m[i, j]):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=5)
    ax.set_xticks(range(len(ms)), [METRICS[k][2] for k in ms], rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), [r["config"].rsplit("/s", 1)[0] for r in rows], fontsize=5)
    ax.set_ylabel("configuration (SIMULATED)")
    fig.colorbar(im, ax=ax, fraction=0.03)
    finish_figure(fig, ctx.dir / "regime_mechanisms.png", "SIMULATED gain of each mechanism in every cell of the regime map")


def describe(rows: list[dict[str, Any]], metric: str, above: bool = True, tie: float = TIE) -> str:
    """"N of M cells, all of them with ..." for the cells where ``metric`` is above 1 + tie
    (``above``) or below 1 - tie, from the data: an axis value every such cell shares (and not
    every measured cell) is named; otherwise the most common values."""
    measured = [r for r in rows if math.isfinite(r[metric])]
    hit = [r for r in measured if (r[metric] > 1 + tie if above else r[metric] < 1 - tie)]
    head = f"{len(hit)} of {len(measured)} cells"
    if not hit:
        return head
    shared, common = [], []
    for a in AXES:  # name a value the hits share markedly more often than the measured cells do
        v, n = Counter(str(r[a]) for r in hit).most_common(1)[0]
        share_hit = n / len(hit)
        share_all = sum(str(r[a]) == v for r in measured) / len(measured)
        if share_hit >= 0.6 and share_hit - share_all >= 0.25:
            (shared if n == len(hit) else common).append(f"{a}={v}" if n == len(hit) else f"{a}={v} ({n})")
    best = max(hit, key=lambda r: r[metric]) if above else min(hit, key=lambda r: r[metric])
    out = head
    if shared:
        out += ", all of them with " + ", ".join(shared)
    if common:
        out += ("; " if shared else ", ") + "most with " + ", ".join(common)
    return out + f" ({'best' if above else 'worst'} {fx(best[metric])} at {best['config'].rsplit('/s', 1)[0]})"


def answer(rows: list[dict[str, Any]]) -> str:
    """The regime map's one-paragraph answer, from the cells."""
    parts = [f"Over {len(rows)} SIMULATED cells, Libra beat the best baseline of its staleness class by more than 3% in "
             f"{describe(rows, 'libra_vs_best')}, and lost by more than 3% in {describe(rows, 'libra_vs_best', above=False)}."]
    parts.append(f"The planner alone (homogeneous TP) gained in {describe(rows, 'planner')}.")
    for m, name in (("hetero", "Heterogeneous TP"), ("cmlfq", "C-MLFQ on top"), ("pool", "The elastic pool on top"),
                    ("cmlfq_alone_off", "C-MLFQ against reactive routing (everything else on)")):
        parts.append(f"{name} gained in {describe(rows, m)}; lost in {describe(rows, m, above=False)}.")
    none = [r for r in rows if all(not (r[m] > 1 + TIE) for m in MECHANISMS if math.isfinite(r[m]))]
    parts.append(f"No mechanism paid (> 3%) in {len(none)} of {len(rows)} cells.")
    k1 = [r for r in rows if str(r["K"]) == "1" and math.isfinite(r.get("tok_s:areal-static-optimal", float("nan")))]
    if k1:
        vs = [(r["tok_s:libra"] / r["tok_s:areal-static-optimal"], r["config"].rsplit("/s", 1)[0]) for r in k1
              if math.isfinite(r.get("tok_s:libra", float("nan")))]
        if vs:
            big = [c for v, c in vs if v >= 1.6]
            parts.append(f"Against AReaL-static-optimal (K=1 cells) Libra reached {fx(min(vs)[0])} to {fx(max(vs)[0])}; "
                         + (f"at least 1.6x in {', '.join(big)}." if big else "nowhere the paper's 1.6x."))
    return " ".join(parts)


def run(ctx: Context) -> Section:
    grid = grid_path(ctx.size)
    sweep_dir = run_sweep(ctx, grid)
    rows = cells(grid, sweep_dir / "results.csv")
    write_csv(ctx.dir / "regime_map.csv", rows)
    figs = []
    d1 = _heatmaps(ctx, rows, "libra_vs_best", "regime_libra.png", "SIMULATED regime map: Libra / best baseline of its class")
    if d1:
        figs.append(Figure("regime_libra.png", "SIMULATED regime map: Libra vs the best baseline",
                           "One heat map per block of the grid (two axes varied, every other at the block's base point); each "
                           "cell is Libra's throughput over the best baseline of its staleness class: blue above 1 (Libra "
                           "faster), red below."))
    d2 = _heatmaps(ctx, rows, "planner", "regime_planner.png", "SIMULATED regime map: planner alone / best baseline")
    if d2:
        figs.append(Figure("regime_planner.png", "SIMULATED regime map: the planner alone",
                           "The same planes for `libra-homogeneous` (the planner with one TP degree and least-loaded routing) "
                           "over the best baseline: how much of Libra's result is the planner's."))
    _mechanism_matrix(ctx, rows)
    figs.append(Figure("regime_mechanisms.png", "SIMULATED gain of each mechanism per cell",
                       "Every cell (rows) and each ratio (columns): Libra vs the best baseline, the planner alone vs it, then "
                       "each mechanism over the policy without it (heterogeneous TP, C-MLFQ, pool), and C-MLFQ against "
                       "reactive routing with everything else on. 1.00 (white) = no effect."))
    failed = [r for r in rows if r["failed"]]
    text = [answer(rows), "",
            f"Grid `{grid.relative_to(ROOT)}` ({len(rows)} configurations; run by `libra-sim sweep`, cached in "
            f"`{Path('.cache') / 'sweeps' / grid.stem}` under the results folder). Ratios of generated-token throughput; "
            "a ratio within 3% of 1 is a tie (one seeded replay's noise).", ""]
    if failed:
        text += [f"Failed runs in {len(failed)} cells: " + "; ".join(f"{r['config']}: {r['failed']}" for r in failed[:10]), ""]
    text.append(md_table(("cell", "libra loop", "libra TPs", "best baseline", *[METRICS[m][2] for m in ("libra_vs_best",) + MECHANISMS]),
                         [(r["config"].rsplit("/s", 1)[0], r["libra_mode"], r["libra_tps"], r["best_baseline"],
                           *[fx(r[m]) for m in ("libra_vs_best",) + MECHANISMS]) for r in rows]))
    return Section(NAME, TITLE, "For a model, GPU, engine and workload: does Libra beat the best baseline, and which mechanism "
                   "pays? One axis (or pair) of the grid varied at a time around a base point.", figs, "\n".join(text),
                   {"answer": answer(rows)}, ["regime_map.csv"])


if __name__ == "__main__":
    raise SystemExit(script_main(NAME, run, __doc__))
