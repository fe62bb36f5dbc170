"""Replay results out: the terminal table, CSV, the ``--json`` summary and the plots.

Plots use matplotlib's Agg backend, imported only when ``--out`` asks for them, so a plain
replay never pays for matplotlib.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from sim.metrics import RunResult


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:,.{digits}f}"


def baseline_names() -> frozenset[str]:
    """The baselines (what a Libra policy is measured against; ``libra.policies.BASELINES``)."""
    from libra.policies import BASELINES

    return frozenset(BASELINES)


def best_baseline(results: Sequence[RunResult], max_staleness: int) -> RunResult | None:
    """The baseline of staleness class ``max_staleness`` with the shortest mean step (None: none ran)."""
    base = [r for r in results if r.policy in baseline_names() and r.max_staleness == max_staleness and r.steps]
    return min(base, key=lambda r: r.mean_step_s, default=None)


def vs_best_baseline(result: RunResult, results: Sequence[RunResult]) -> float:
    """The best same-class baseline's mean step over ``result``'s (> 1: ``result`` is faster);
    NaN for a baseline itself or when no baseline of its class ran."""
    if result.policy in baseline_names() or not result.steps or result.mean_step_s <= 0:
        return float("nan")
    best = best_baseline(results, result.max_staleness)
    return best.mean_step_s / result.mean_step_s if best is not None else float("nan")


#: The columns of the default (narrow) comparison table: what a 80-column terminal can show
#: without cutting a cell; ``--wide`` shows ``WIDE_COLUMNS`` (steps.csv and --json have the rest).
NARROW_COLUMNS: tuple[str, ...] = ("policy", "K", "mode", "split R:T", "TP", "step s", "tok/s", "vs best")
WIDE_COLUMNS: tuple[str, ...] = ("policy", "K", "mode", "split R:T", "rollout TP", "step s", "rollout s", "makespan/LB",
                                 "train s", "gen tok/s", "trained tok/s", "preempt", "migr", "done", "vs best base")
_LEFT = ("policy", "mode", "rollout TP", "TP", "split R:T")


def _cells(r: RunResult, results: Sequence[RunResult], n_gpus: int | None, narrow: bool) -> dict[str, str]:
    """Every column's text for one policy's row (``narrow``: the short forms of the narrow table)."""
    s = r.steps
    n = max(len(s), 1)
    ratio = [x.makespan_over_bound for x in s if math.isfinite(x.makespan_over_bound)]
    split = f"{s[0].n_rollout_gpus}:{s[0].n_train_gpus}" if s else "-"
    if s and (r.notes.get("colocated") or (n_gpus is not None and s[0].n_rollout_gpus + s[0].n_train_gpus > n_gpus)):
        split = f"{s[0].n_rollout_gpus} coloc"
    mode = r.mode.replace("async", f"async K={r.staleness}") if r.staleness else r.mode
    if narrow:
        mode = mode.replace("sync+streaming", "sync+stream")
    vs = vs_best_baseline(r, results)
    tok = _fmt(r.throughput_tok_s, 0)
    return {
        "policy": r.policy, "K": str(r.max_staleness), "mode": mode, "split R:T": split,
        "rollout TP": s[0].rollout_tps if s else "-", "TP": s[0].rollout_tps if s else "-",
        "step s": _fmt(r.mean_step_s), "rollout s": _fmt(sum(x.rollout_makespan_s for x in s) / n),
        "makespan/LB": _fmt(sum(ratio) / len(ratio), 2) if ratio else "-", "train s": _fmt(sum(x.train_s for x in s) / n),
        "gen tok/s": tok, "tok/s": tok, "trained tok/s": _fmt(r.trained_tok_s, 0),
        "preempt": str(sum(x.preemptions for x in s)), "migr": str(sum(x.migrations for x in s)),
        "done": f"{r.completed}/{r.expected}", "vs best base": f"{vs:.2f}x" if math.isfinite(vs) else "-",
        "vs best": f"{vs:.2f}x" if math.isfinite(vs) else "-",
    }


def summary_table(results: Sequence[RunResult], title: str, n_gpus: int | None = None, wide: bool = False) -> Any:
    """A rich Table with one row per policy. A colocated plan (rollout and training on the same
    GPUs) shows as ``N coloc``: told by the policy's note, or, given ``n_gpus``, by a split that
    books more GPUs than the cluster has (Libra's colocated plans printed as 48:48 on 48 GPUs).
    ``K`` is the staleness class the policy ran in (``--max-staleness``), ``mode`` the loop that
    ran (``async K=k`` with the staleness it used), ``vs best base`` the best baseline of the same
    class's mean step over this policy's (> 1: faster than every baseline of its class).

    Why two widths: all 15 columns need ~180 terminal columns, and at 80 rich cut every cell to
    ``v…``. By default the table has the 8 columns of ``NARROW_COLUMNS`` (``tok/s``: generated
    tokens per second; ``TP``: the rollout instances' TPs) without outer borders, numbers never
    wrapped, the policy name folded if the terminal is narrower still; ``wide`` shows every column
    (``--wide``). A single staleness class drops the K column. No box: its rules take 3
    characters a column, the policy names need them."""
    from rich.table import Table

    cols = list(WIDE_COLUMNS if wide else NARROW_COLUMNS)
    if not wide and len({r.max_staleness for r in results}) <= 1:
        cols.remove("K")
    if wide:
        t = Table(title=title, title_justify="left")
    else:
        t = Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1),
                  caption="more columns: --wide (every step: --out DIR's steps.csv)", caption_justify="left")
    for col in cols:
        t.add_column(col, justify="left" if col in _LEFT else "right",
                     no_wrap=col not in ("policy", "rollout TP", "TP"), overflow="fold")
    for r in results:
        cells = _cells(r, results, n_gpus, narrow=not wide)
        t.add_row(*(cells[c] for c in cols))
    return t


def steps_table(result: RunResult) -> Any:
    """A rich Table with one row per step of one policy."""
    from rich.table import Table

    t = Table(title=f"{result.policy}: per step", title_justify="left")
    for col in ("step", "rollout s", "LB s", "ratio", "train s", "sync/switch s", "re-plan s", "step s", "gen tok/s",
                "idle GPU-s roll", "idle GPU-s train", "preempt", "migr", "lent", "fault req", "reward"):
        t.add_column(col, justify="right")
    for s in result.steps:
        t.add_row(
            str(s.step), _fmt(s.rollout_makespan_s), _fmt(s.lower_bound_s), _fmt(s.makespan_over_bound, 2), _fmt(s.train_s),
            _fmt(s.sync_s + s.switch_s), _fmt(s.transition_s), _fmt(s.step_s), _fmt(s.gen_tok_s, 0), _fmt(s.idle_gpu_s_rollout, 0),
            _fmt(s.idle_gpu_s_train, 0), str(s.preemptions), str(s.migrations), str(s.role_changes), str(s.fault_requeued),
            _fmt(s.mean_reward, 3),
        )
    return t


def json_summary(results: Sequence[RunResult], trace: str, gpus: int, gpu: str, model: str, by_class: bool = False) -> dict[str, Any]:
    """The ``--json`` document: ``{"trace", "gpus", "gpu", "model", "policies": {NAME: ...}}``;
    with ``by_class`` (several staleness classes replayed) NAME is ``"POLICY K=k"``."""
    def key(r: RunResult) -> str:
        return f"{r.policy} K={r.max_staleness}" if by_class else r.policy

    return {"trace": trace, "gpus": gpus, "gpu": gpu, "model": model, "policies": {key(r): r.summary() for r in results}}


def write_json(path: str, doc: dict[str, Any]) -> None:
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(clean(doc), f, indent=1)
        f.write("\n")


def write_csv(path: str, results: Sequence[RunResult]) -> None:
    """Every step of every policy, one row each."""
    rows = [{"policy": r.policy, "max_staleness": r.max_staleness, **s.row()} for r in results for s in r.steps]
    if not rows:
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _modes(results: Sequence[RunResult]) -> str:
    """The loop mode(s) that actually ran (a policy's default, or ``--mode``), for plot titles."""
    # a run that changed loop mid-way reports "async/sync": its parts, once each
    modes = sorted({m for r in results for m in str(r.mode).split("/") if m})
    return "/".join(modes) + " mode"


def _plot_labels(results: Sequence[RunResult]) -> tuple[list[str], bool]:
    """One label per result, ``policy (mode)``, with ``K=k`` when several staleness classes ran
    (the same policy then appears once per class and must not share a label: matplotlib merged
    equal category labels into one bar)."""
    several = len({r.max_staleness for r in results}) > 1
    return [f"{r.policy} ({r.mode})" + (f", K={r.max_staleness}" if several else "") for r in results], several


def _bar_figsize(n: int, width: float) -> tuple[float, float]:
    """A horizontal bar chart's size: a fixed width, a height that grows with the bars (so labels
    never overlap or leave the figure, whatever the number of policies)."""
    return width, max(3.0, 0.3 * n + 1.8)


def write_plots(out: str, results: Sequence[RunResult]) -> list[str]:
    """step_breakdown.png, throughput.png, reward_vs_time.png, gantt.png; returns the paths.

    Every title starts with SIMULATED and names the loop mode that ran, so a figure lifted out
    of its folder cannot be read as a measurement; time axes use s, min or h, whichever fits.
    Why horizontal bars and outside legends: with ``--max-staleness 0,1`` there are ~20 runs;
    vertical bars made a 4,000-pixel-wide figure with labels off the axes, and a 21-entry legend
    ran off the figure. The bars are labelled per staleness class (``K=k``) and coloured by it;
    the axis limits leave room for the longest bar and its value. The Gantt is Libra's when Libra
    ran (else the first policy's), and its title says whose."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from libra.plotting import time_unit

    paths: list[str] = []
    tag = f"SIMULATED ({_modes(results)})"
    labels, several = _plot_labels(results)
    n = len(results)
    y = list(range(n))
    classes = sorted({r.max_staleness for r in results})
    class_color = {k: c for k, c in zip(classes, ("tab:green", "tab:blue", "tab:purple", "tab:brown", "tab:olive"))}

    def bars_axes(fig: Any, ax: Any) -> None:
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(n - 0.5, -0.5)  # first policy on top, no clipped bar
        for i in range(1, n):  # a rule between staleness classes
            if results[i].max_staleness != results[i - 1].max_staleness:
                ax.axhline(i - 0.5, color="0.6", linewidth=0.8, linestyle="--")

    # step-time breakdown: mean per policy, stacked
    fig, ax = plt.subplots(figsize=_bar_figsize(n, 9.0), layout="constrained")
    parts = [
        ("rollout", lambda s: s.rollout_makespan_s),
        ("train", lambda s: s.train_s),
        ("sync / switch", lambda s: s.sync_s + s.switch_s),
        ("re-plan transition", lambda s: s.transition_s),
    ]
    means = {label: [sum(fn(s) for s in r.steps) / max(len(r.steps), 1) for r in results] for label, fn in parts}
    totals = [sum(v[i] for v in means.values()) for i in range(n)]
    div, unit = time_unit(totals + [r.mean_step_s for r in results])
    left = [0.0] * n
    for label, _fn in parts:
        vals = [v / div for v in means[label]]
        ax.barh(y, vals, left=left, height=0.7, label=label)
        left = [b + v for b, v in zip(left, vals)]
    ax.vlines([r.mean_step_s / div for r in results], [i - 0.42 for i in y], [i + 0.42 for i in y], colors="k",
              linewidth=2, label="step time (stages overlap in async/streaming)")
    peak = max([*left, *(r.mean_step_s / div for r in results)], default=0.0)
    ax.set_xlim(0, (peak or 1.0) * 1.05)
    bars_axes(fig, ax)
    ax.set_xlabel(f"{unit} per step (mean)")
    ax.set_title(f"{tag}: step-time breakdown", fontsize=10)
    fig.legend(loc="outside lower center", ncol=3, fontsize=8)
    p = os.path.join(out, "step_breakdown.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    # throughput bars, coloured by staleness class
    fig, ax = plt.subplots(figsize=_bar_figsize(n, 8.0), layout="constrained")
    tok = [r.throughput_tok_s if math.isfinite(r.throughput_tok_s) else 0.0 for r in results]
    ax.barh(y, tok, height=0.7, color=[class_color[r.max_staleness] for r in results])
    for i, v in enumerate(tok):
        ax.text(v, i, f" {v:,.0f}", ha="left", va="center", fontsize=8)
    ax.set_xlim(0, (max(tok, default=0.0) or 1.0) * 1.15)  # room for the longest bar's value
    bars_axes(fig, ax)
    ax.set_xlabel("generated tokens / s")
    ax.set_title(f"{tag}: generation throughput", fontsize=10)
    if several:
        fig.legend(handles=[Patch(color=class_color[k], label=f"staleness class K={k}") for k in classes],
                   loc="outside lower center", ncol=len(classes), fontsize=8)
    p = os.path.join(out, "throughput.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    # reward vs wall-clock: one colour per policy, one line style per class, the legend beside
    curves = [(r, lab, r.reward_curve()) for r, lab in zip(results, labels)]
    drawn = [c for c in curves if c[2]]
    fig, ax = plt.subplots(figsize=(7.0 + (2.6 if len(drawn) > 4 else 0.0), max(4.0, 0.19 * len(drawn) + 1.2)),
                           layout="constrained")
    div, unit = time_unit([c[0] for _r, _l, cv in curves for c in cv])
    names = list(dict.fromkeys(r.policy for r in results))
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    styles = ("-", "--", ":", "-.")
    for r, lab, curve in drawn:
        ax.plot([c[0] / div for c in curve], [c[1] for c in curve], marker=".", label=lab,
                color=cmap(names.index(r.policy) % cmap.N), linestyle=styles[classes.index(r.max_staleness) % len(styles)])
    ax.set_xlabel(f"simulated wall-clock ({unit})")
    ax.set_ylabel("mean reward of the step (from the trace)")
    ax.set_title(f"{tag}: reward vs wall-clock (trace rewards, replayed timing)", fontsize=10)
    if drawn:
        if len(drawn) > 4:
            fig.legend(loc="outside right upper", fontsize=7)
        else:
            ax.legend(fontsize=8)
    p = os.path.join(out, "reward_vs_time.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    # Gantt of one step: Libra's when it ran, else the first policy that recorded one
    with_gantt = [r for r in results if r.gantt]
    rec = next((r for r in with_gantt if r.policy == "libra"), with_gantt[0] if with_gantt else None)
    if rec is not None:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        ids = sorted({g[0] for g in rec.gantt})
        fig, ax = plt.subplots(figsize=(9.5, 0.35 * len(ids) + 1.8))
        row = {iid: k for k, iid in enumerate(ids)}
        peak_b = max(g[4] for g in rec.gantt) or 1
        cmap = plt.get_cmap("viridis")
        norm = Normalize(vmin=0, vmax=peak_b)
        div, unit = time_unit([g[3] for g in rec.gantt])
        for iid, _tp, a, b, batch in rec.gantt:
            ax.barh(row[iid], (b - a) / div, left=a / div, height=0.8, color=cmap(norm(batch)), linewidth=0)
        ax.set_yticks(range(len(ids)), [f"inst {i} (TP{next(g[1] for g in rec.gantt if g[0] == i)})" for i in ids], fontsize=7)
        ax.set_xlabel(f"{unit} into the step's rollout")
        cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01)
        cbar.set_label("running batch (sequences)", fontsize=8)
        whose = f"{rec.policy}" + (f" (K={rec.max_staleness})" if several else "")
        why = "" if rec.policy == "libra" or len(results) == 1 else " (libra did not run: the first policy's)"
        ax.set_title(f"SIMULATED ({rec.mode} mode): Gantt of {whose}{why}: rollout instances in step {rec.gantt_step} "
                     f"(another step: --gantt-step N)", fontsize=9)
        fig.tight_layout()
        p = os.path.join(out, "gantt.png")
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths
