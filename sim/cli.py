"""``libra-sim``: the command-line entry point.

Each subcommand is a module in ``sim.commands`` with ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``. Modules import their heavy dependencies inside ``run`` so that
``libra-sim --help`` stays fast. A user mistake (``UserError`` or a cost-model input error) is
printed on one line with no traceback and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from libra.errors import UserError

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "sim.commands.replay",
    "sim.commands.plan",
    "sim.commands.gen",
    "sim.commands.validate",
    "sim.commands.stats",
    "sim.commands.convert",
    "sim.commands.sweep",
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [UserError]
    try:
        from cost_models.errors import CostModelError

        types.append(CostModelError)
    except ImportError:  # cost_models not importable: only our own errors apply
        pass
    return tuple(types)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one subparser per available command module."""
    parser = argparse.ArgumentParser(prog="libra-sim", description="Libra trace tools and cluster simulator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command is not part of this build yet
                continue
            raise
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``libra-sim``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except _user_error_types() as exc:
        print(f"libra-sim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("libra-sim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
