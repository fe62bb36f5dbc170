"""``libra-calibrate from-logs`` and the ``libra-calibrate`` entry point.

The entry point is ``cost_models.cli``'s parser plus this subcommand: ``cost_models`` imports
nothing of ours, and the replay needs the simulator, so the console script names this module
and the rest of ``libra-calibrate`` stays where it was (``python -m cost_models.cli`` runs
without ``from-logs``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from libra.errors import UserError

NAME = "from-logs"
HELP = ("replay a run from its step metrics (verl timing_s/*, NeMo RL timing/train/*, AReaL timeperf/*) and config, print "
        "predicted vs logged per stage, and fit stage overheads into a calibration file --calibration reads")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", help="step metrics: console lines (step:N - key:value - ...), JSONL (verl's file "
                                              "logger) or a W&B export CSV")
    p.add_argument("--config", required=True, metavar="FILE",
                   help="the run's config: verl's saved Hydra YAML or its key=value overrides, AReaL or NeMo RL YAML, "
                        "or slime's launch command (what `libra-sim plan --emit` prints)")
    p.add_argument("--gpu", required=True, help="GPU kind the run used (a100, a800, h100, h200, b200, gb200)")
    p.add_argument("--model", default=None, help="model catalog name or config.json (default: the config's model path's name)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the GPU's)")
    p.add_argument("--trajectories", type=int, default=None, metavar="N",
                   help="trajectories per step (default: the config's prompts per step x samples per prompt)")
    p.add_argument("--engine", default=None, metavar="NAME|FILE", help="inference-engine profile (default: vllm-2024)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="operator calibration to start from (default: the GPU's bundled one)")
    p.add_argument("-o", "--output", default=None, metavar="FILE.json",
                   help="write the fitted stage overheads into a copy of the operator calibration (for --calibration)")


def run(args: argparse.Namespace) -> int:
    from cost_models.calibration.stages import StageFit, StageOverheads
    from cost_models.calibration.store import Calibration
    from cost_models.operators.loader import bundled_calibration_path

    from libra.cluster import ClusterSpec
    from sim.calibrate.fit import TO_EVALUATOR, fit_stage
    from sim.calibrate.logs import STAGE_KEYS, read_log
    from sim.calibrate.replay import STAGES, logged_times, simulate, synth_step
    from sim.calibrate.run_config import run_shape
    from sim.commands.common import node_size
    from sim.costs import load_costs

    if args.trajectories is not None and args.trajectories < 1:
        raise UserError(f"--trajectories must be >= 1, got {args.trajectories}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if args.output:
        from libra.paths import check_output_file

        check_output_file(args.output, "-o")
    every = read_log(args.log)
    timed = {k for keys in STAGE_KEYS.values() for k in keys}
    logs = [lg for lg in every if timed & set(lg.values)]  # exports have rows of other metrics only
    if not logs:
        raise UserError(f"{args.log}: no step has a stage timing ({', '.join(k[0] for k in STAGE_KEYS.values())}, ...)")
    shape = run_shape(args.config, args.trajectories)
    if shape.trajectories is None:
        raise UserError(f"{args.config}: no batch size to take the trajectories per step from; pass --trajectories N")
    model = args.model or (shape.model_hint.lower() if shape.model_hint else None)
    if model is None:
        raise UserError(f"{args.config}: no model path; pass --model NAME")
    gpn = args.gpus_per_node or node_size(args.gpu)
    cluster = ClusterSpec(shape.n_gpus, args.gpu, model, gpus_per_node=gpn, engine=args.engine)
    base = args.calibration or (str(bundled_calibration_path(args.gpu)) if bundled_calibration_path(args.gpu) else None)
    costs = load_costs(args.gpu, model, gpn, base, engine=args.engine)
    steps = [synth_step(lg, shape.trajectories, shape.group_size) for lg in logs]
    pred = simulate(shape, steps, cluster, costs)
    logged = [logged_times(lg) for lg in logs]
    sync_loop = shape.mode == "sync" and not shape.streaming
    results = [r for r in (fit_stage(s, pred, logged, sync_loop) for s in STAGES) if r is not None]
    layout = "colocated" if shape.colocated else f"{shape.n_rollout_gpus} rollout + {shape.train.n_gpus} training GPUs"
    t = shape.train
    print(f"{shape.framework} run: {model} on {shape.n_gpus} x {args.gpu}, {layout}, rollout TP{shape.rollout_tp}, training "
          f"TP{t.tp} PP{t.pp} DP{t.dp} ZeRO-{t.zero_stage}, {shape.trajectories} trajectories/step, "
          f"{'async K=' + str(shape.max_staleness) if shape.mode == 'async' else ('sync+streaming' if shape.streaming else 'sync')}; "
          f"{len(logs)} logged steps" + (f" ({len(every) - len(logs)} without stage timings skipped)" if len(every) > len(logs) else ""))
    for note in shape.notes:
        print(f"note: {note}")
    print("stage      steps  logged_s  SIMULATED_s  error   fit: scale  fixed_s  error after")
    for r in results:
        print(f"{r.stage:<10} {r.n:>5}  {r.logged_s:>8.2f}  {r.predicted_s:>11.2f}  {r.mape_before:>5.1%}   "
              f"{r.scale:>10.3f}  {r.fixed_s:>7.2f}  {r.mape_after:>5.1%}")
    missing = [s for s in STAGES if s not in {r.stage for r in results}]
    if missing:
        print(f"not logged (or not comparable in this loop): {', '.join(missing)}")
    if args.output:
        if base is None:
            raise UserError(f"-o: no operator calibration for {args.gpu} to add the overheads to; pass --calibration FILE "
                            "(a `libra-calibrate fit` file)")
        cal = Calibration.load(base)
        old = cal.stage_overheads.stages if cal.stage_overheads is not None else {}
        stages: dict[str, StageFit] = dict(old)
        for r in results:
            name = TO_EVALUATOR[r.stage]
            prev = old.get(name, StageFit())  # the predictions already include it: compose
            stages[name] = StageFit(scale=min(99.0, prev.scale * r.scale),
                                    fixed_s=0.0 if name == "rollout" else prev.fixed_s * r.scale + r.fixed_s)
        cal.stage_overheads = StageOverheads(stages, {
            "log": os.path.abspath(args.log), "config": os.path.abspath(args.config), "framework": shape.framework,
            "base": base, "steps": len(logs),
            "fit": {r.stage: {"n": r.n, "mape_before": round(r.mape_before, 4), "mape_after": round(r.mape_after, 4)} for r in results}})
        out = cal.save(args.output)
        print(f"wrote {out}: stage overheads for {', '.join(sorted(stages))}; use it with --calibration {out} "
              "(libra-sim replay, libra-calibrate predict)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """``cost_models.cli``'s parser with ``from-logs`` added."""
    from cost_models.cli import build_parser as base

    parser = base()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser(NAME, help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``libra-calibrate`` (every subcommand); a user mistake is one line, exit 2."""
    from cost_models.cli import PROG
    from cost_models.errors import CostModelError

    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (CostModelError, UserError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
