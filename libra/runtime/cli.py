"""``libra-run``: run agentic GRPO on a Ray cluster under a Libra (or baseline) resource policy.

    libra-run --config run.yaml [--steps 3 --devices 4 --engine torch --policy libra --out DIR ...]

Every config key (docs/runtime.md) has a flag of the same name with dashes; flags override the
file. Bad input prints one line and exits 2; Ctrl-C stops cleanly and exits 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from libra.errors import UserError
from libra.runtime.config import KEYS, key_types


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="libra-run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML (.yaml/.yml) or TOML (.toml) file of run keys")
    p.add_argument("--json", default=None, metavar="FILE", help="write the run summary as JSON here")
    types = key_types()  # from RunConfig's annotations, so a key whose default is None parses too
    for key, (_default, help_) in KEYS.items():
        flag = "--" + key.replace("_", "-")
        help_ = help_.replace("%", "%%")  # argparse formats help with %: a literal % would print its internals
        kind = types[key]
        if kind is bool:
            p.add_argument(flag, dest=key, default=None, action=argparse.BooleanOptionalAction, help=help_)
        elif kind in (list, dict):
            p.add_argument(flag, dest=key, default=None, type=_json_arg, help=help_ + " (JSON)")
        elif kind in (int, float):
            p.add_argument(flag, dest=key, default=None, type=kind, help=help_)
        else:
            p.add_argument(flag, dest=key, default=None, help=help_)
    return p


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected JSON, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from libra.runtime.config import load_config

        from libra.paths import check_output_dir, check_output_file

        overrides = {k: getattr(args, k) for k in KEYS}
        cfg = load_config(args.config, overrides)
        # outputs first: a run must not end, minutes later, on a folder it cannot write
        cfg.out = check_output_dir(cfg.out, "--out" if args.out is not None else "out")
        if args.json:
            check_output_file(args.json, "--json")
        import importlib.util

        missing = [m for m in ("ray", "torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(f"libra-run needs the run extra ({', '.join(missing)} missing): pip install -e '.[run]'")
        from libra.runtime.loop import Runner
        summary = Runner(cfg).run()
    except UserError as exc:
        print(f"libra-run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("libra-run: interrupted", file=sys.stderr)
        return 130
    _print_summary(summary)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1, default=str)
    return 130 if summary.get("interrupted") else 0


def _print_summary(summary: dict[str, Any], max_rows: int = 12) -> None:
    """The end-of-run summary: the per-step table (first and last steps only on a long run: the
    whole table is steps.csv), one fidelity line (per step: fidelity.csv), the held-out result."""
    from libra.runtime.recording import fidelity_line

    rows = summary.get("rows") or []
    if rows:
        print(f"{'step':>4} {'reward':>7} {'rollout_s':>9} {'train_s':>8} {'sync_s':>7} {'step_s':>7} {'gen_tok/s':>9} {'migr':>5} {'split':>6}")
        shown = rows if len(rows) <= max_rows else [*rows[: max_rows // 2], None, *rows[-(max_rows // 2):]]
        for r in shown:
            if r is None:
                print(f"{'...':>4} ({len(rows) - 2 * (max_rows // 2)} more steps in steps.csv)")
                continue
            print(f"{int(r['step']):>4} {float(r['reward_mean']):>7.3f} {float(r['rollout_s']):>9.2f} {float(r['train_s']):>8.2f} "
                  f"{float(r['sync_s']):>7.2f} {float(r['step_s']):>7.2f} {float(r['gen_tok_s']):>9.0f} {int(float(r['migrations'])):>5} "
                  f"{int(float(r['n_rollout']))}:{int(float(r['n_train']))}")
    a = summary.get("async")
    if a:
        print(f"async loop: {a['rolled_out']} trajectories rolled out, {a['trained']} trained (each once), {a['untrained']} untrained; "
              f"largest staleness trained on {a['max_staleness_observed']} (max_staleness {a['max_staleness']})")
    fid = summary.get("fidelity") or []
    if fid:
        print(f"libra-sim replay of the run's trace, {fidelity_line(fid)} (per step: fidelity.csv, fidelity.png)")
    elif summary.get("fidelity_error"):
        print(f"libra-sim replay of the run's trace failed: {summary['fidelity_error']}")
    held = summary.get("heldout") or {}
    if held.get("before") and held.get("after"):
        b, a = held["before"], held["after"]
        print(f"held-out tasks ({int(b['n'])} episodes, seed {held['seed']}, temperature {held['temperature']:g}): "
              f"reward {b['reward']:.3f} -> {a['reward']:.3f}, tool use {b['used_tool']:.0%} -> {a['used_tool']:.0%}, "
              f"well-formed calls {b['well_formed_calls']:.0%} -> {a['well_formed_calls']:.0%}")
        kinds = sorted(k[len("reward_"):] for k in b if k.startswith("reward_") and k in a)
        if kinds:
            print("  by task kind: " + ", ".join(f"{k} {b['reward_' + k]:.3f} -> {a['reward_' + k]:.3f}" for k in kinds))
    if summary.get("out"):
        wall = f" ({summary['wall_s']:.0f} s)" if summary.get("wall_s") else ""
        print(f"outputs in {summary['out']}{wall}")


if __name__ == "__main__":
    sys.exit(main())
