"""``libra-sim gen``: write a synthetic agentic workload trace (swe, search or math).

The trace's header records the workload, the model hint, the generator version and every
parameter, so the file says how to make it again; the same arguments always write the same bytes.
"""

from __future__ import annotations

import argparse
import sys

NAME = "gen"
HELP = "generate a synthetic agentic RL trace (workloads: swe, search, math)"

#: Shortcut flags for the parameters one changes most (any other: --param NAME=VALUE).
_SHORTCUTS: tuple[tuple[str, str, type], ...] = (
    ("--max-context", "max_context", int),
    ("--max-turns", "max_turns", int),
    ("--drift", "drift", float),
    ("--error-effect", "error_effect", float),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim gen``."""
    parser.add_argument("--workload", required=True, choices=("swe", "search", "math"), help="workload model")
    parser.add_argument("--steps", type=int, default=20, help="RL steps to generate (default 20)")
    parser.add_argument("--batch", type=int, default=512, help="trajectories per step (default 512)")
    parser.add_argument("--group-size", type=int, default=8, help="GRPO samples per prompt (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--first-step", type=int, default=0, help="number of the first step (default 0)")
    parser.add_argument("-o", "--output", required=True, help="trace file to write (.jsonl or .jsonl.gz)")
    parser.add_argument("--force", action="store_true", help="replace the output file if it exists (default: refuse)")
    for flag, name, typ in _SHORTCUTS:
        parser.add_argument(flag, dest=name, type=typ, default=None,
                            help=f"override the workload's {name} (see --list-params)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override any workload parameter (repeatable; see --list-params)")
    parser.add_argument("--list-params", action="store_true",
                        help="print the workload's parameters, defaults and sources, and exit")


def _overrides(args: argparse.Namespace) -> dict[str, str | float | int]:
    from libra.errors import UserError

    out: dict[str, str | float | int] = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param {item!r}: expected NAME=VALUE, e.g. --param turns_median=20")
        out[name.strip().replace("-", "_")] = value.strip()
    for _flag, name, _typ in _SHORTCUTS:
        value = getattr(args, name)
        if value is not None:
            out[name] = value
    return out


def run(args: argparse.Namespace) -> int:
    """Generate the trace and print a one-line summary."""
    import dataclasses

    from libra.trace.workload import DOCS, GENERATOR_VERSION, generate_steps, make_params, trace_header
    from libra.trace.workload.engine import to_trajectories
    from libra.trace.writer import write_trace

    if args.list_params:
        params = make_params(args.workload)
        sources = params.sources()
        for f in dataclasses.fields(params):
            print(f"{f.name:24s} {getattr(params, f.name)!s:>12s}  {DOCS[f.name]}  [{sources[f.name]}]")
        return 0
    from libra.paths import check_new_output_file

    # before generating: a million trajectories must not end on a bad path, nor replace a trace unasked
    check_new_output_file(args.output, "-o", args.force)
    params = make_params(args.workload, **_overrides(args))
    header = trace_header(params, args.steps, args.batch, args.group_size, args.seed, args.first_step)
    n_turns = 0

    def rows():
        nonlocal n_turns
        for sa in generate_steps(params, args.steps, args.batch, args.group_size, args.seed, args.first_step):
            n_turns += len(sa.gen_tokens)
            yield from to_trajectories(sa)

    count = write_trace(args.output, rows(), header)
    print(f"wrote {count} trajectories ({n_turns} turns, {args.steps} steps, workload {params.workload}, "
          f"generator v{GENERATOR_VERSION}, seed {args.seed}) to {args.output}", file=sys.stderr)
    return 0
