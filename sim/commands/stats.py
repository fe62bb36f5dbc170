"""``libra-sim stats TRACE [--json] [--lenient]``: per-step statistics of a trace.

One table with a row per step (trajectories, turns, context length percentiles, generated tokens
per turn, tool mix, error/timeout rates, tool latency, rewards, drift in length vs the first and
the previous step), or with ``--json`` one JSON document a script can consume.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

NAME = "stats"
HELP = "per-step statistics of a trace (a table, or --json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim stats``."""
    parser.add_argument("trace", metavar="TRACE", help="trace file (.jsonl or .jsonl.gz)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    parser.add_argument("--lenient", action="store_true", help="skip invalid lines (counted in the output)")


def _fmt(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _table(rows: list[Any], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, show_lines=False, pad_edge=False)
    headers = ("step", "traj", "turns\nmean/p90/max", "gen/\nturn", "ctx\nmean", "ctx\np50", "ctx\np90", "ctx\np99",
               "ctx\nmax", "top tools", "err\n%", "tmo\n%", "tool lat s\np50/p99", "reward\nmean",
               "drift vs first\nmean/p90", "vs prev\nmean/p90")
    for col in headers:
        table.add_column(col, justify="left" if col == "top tools" else "right", no_wrap=True)
    for s in rows:
        tools = ", ".join(f"{k} {v:.0%}" for k, v in list(s.tool_mix.items())[:3]) or "-"
        c = s.context_tokens
        table.add_row(
            str(s.step),
            f"{s.n_trajectories:,}",
            f"{_fmt(s.turns.mean, 1)}/{_fmt(s.turns.p90)}/{_fmt(s.turns.max)}",
            _fmt(s.gen_tokens_per_turn.mean),
            _fmt(c.mean),
            _fmt(c.p50),
            _fmt(c.p90),
            _fmt(c.p99),
            _fmt(c.max),
            tools,
            _fmt(100 * s.outcome_rates.get("error", math.nan), 1),
            _fmt(100 * s.outcome_rates.get("timeout", math.nan), 1),
            f"{_fmt(s.tool_latency_p50_s, 2)}/{_fmt(s.tool_latency_p99_s, 2)}",
            _fmt(s.mean_reward, 3),
            f"{_fmt(s.drift_mean_vs_first, 2)}/{_fmt(s.drift_p90_vs_first, 2)}",
            f"{_fmt(s.drift_mean_vs_prev, 2)}/{_fmt(s.drift_p90_vs_prev, 2)}",
        )
    return table


def run(args: argparse.Namespace) -> int:
    """Read the trace step by step (one step in memory) and print its statistics."""
    from libra.trace.reader import open_trace
    from libra.trace.stats import iter_trace_stats
    from sim.commands._trace_progress import trace_progress

    with trace_progress("reading") as progress:
        reader = open_trace(args.trace, lenient=args.lenient, progress=progress)
        stats = list(iter_trace_stats(reader.steps()))
        summary = reader.validate()
    if args.json:
        hdr = reader.header
        doc = {
            "trace": summary.path,
            "header": None if hdr is None else {"workload": hdr.workload, "model": hdr.model, "source": hdr.source,
                                                 "version": hdr.version, "metadata": hdr.metadata},
            "n_trajectories": summary.n_trajectories,
            "n_turns": summary.n_turns,
            "n_steps": summary.n_steps,
            "skipped": summary.skipped_per_rule(),
            "steps": [s.to_dict() for s in stats],
        }
        print(json.dumps(doc, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=200)
    title = f"{summary.path}: {summary.n_trajectories:,} trajectories, {summary.n_steps} steps (context lengths in tokens)"
    console.print(_table(stats, title))
    if summary.skipped:
        console.print(f"skipped {len(summary.skipped)} invalid line(s):")
        for rule, count in summary.skipped_per_rule().items():
            console.print(f"  {count:>8}  {rule}", markup=False, highlight=False)
    return 0
