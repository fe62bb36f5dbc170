"""``libra-sim validate TRACE [--lenient]``: check a trace against every rule of TRACE_FORMAT.md.

Prints ``OK`` with counts, or the first broken rule (``FILE:LINE: field 'F': RULE``) and exits 2.
With ``--lenient`` invalid lines are skipped and counted per rule instead; the exit status is 0
when at least the rest of the file is readable, so scripts can salvage partial traces knowingly.
"""

from __future__ import annotations

import argparse

NAME = "validate"
HELP = "check a trace file against the trace format (exit 2 on the first invalid line)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim validate``."""
    parser.add_argument("trace", metavar="TRACE", help="trace file (.jsonl or .jsonl.gz)")
    parser.add_argument(
        "--lenient", action="store_true", help="skip invalid lines and report how many per rule instead of failing"
    )


def run(args: argparse.Namespace) -> int:
    """Validate the whole file (one pass) and print a one-line verdict plus skip counts."""
    from libra.trace.reader import open_trace
    from sim.commands._trace_progress import trace_progress

    with trace_progress("validating") as progress:
        reader = open_trace(args.trace, lenient=args.lenient, progress=progress)
        summary = reader.validate()
    hdr = reader.header
    hints = ""
    if hdr is not None:
        parts = [f"{k}={v}" for k, v in (("workload", hdr.workload), ("model", hdr.model)) if v]
        hints = f" [{', '.join(parts)}]" if parts else ""
    print(
        f"OK {summary.path}: {summary.n_trajectories} trajectories, {summary.n_turns} turns, "
        f"{summary.n_steps} steps{hints}; steps {'sorted' if summary.sorted else 'unsorted (read by seeking)'}"
    )
    if summary.skipped:
        print(f"skipped {len(summary.skipped)} invalid line(s):")
        for rule, count in summary.skipped_per_rule().items():
            print(f"  {count:>8}  {rule}")
        first = summary.skipped[0]
        print(f"  first at line {first.line}: field '{first.field}': {first.rule}" + (f" ({first.detail})" if first.detail else ""))
    return 0
