"""``libra-sim replay``: replay a trace on a simulated cluster under one policy or all of them."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from typing import Any

from libra.errors import UserError

from sim.commands.common import MAX_GPUS, node_size
from sim.commands.common import positive_int as _positive_int

NAME = "replay"
HELP = "replay a trace on a simulated GPU cluster under a resource policy (or --compare all)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help="trace file (.jsonl or .jsonl.gz, TRACE_FORMAT v1)")
    p.add_argument("--gpus", type=_positive_int, default=48, help="GPUs in the cluster (default 48)")
    p.add_argument("--gpus-per-node", type=_positive_int, default=None,
                   help="GPUs per node (default: the GPU's, 8; 4 per GB200 tray, whose NVLink domain is the 72-GPU rack)")
    p.add_argument("--gpu", default=None, help="GPU catalog name (default: the trace header's hint, else a800)")
    p.add_argument("--model", default=None, help="model catalog name or config.json (default: the trace header's hint)")
    p.add_argument("--max-context", type=_positive_int, default=None, metavar="TOKENS",
                   help="a hard context limit of the workload: the first step's length prior is scaled into it "
                        "(libra-run's fidelity replay passes its max_context)")
    p.add_argument("--max-train-gpus", type=_positive_int, default=None, metavar="N",
                   help="the most GPUs the training backend can use (e.g. 1 for a single-process trainer): no policy gives "
                        "training more, the rest roll out (libra-run's fidelity replay passes 1 for its torch trainer)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="operator calibration file (`libra-calibrate fit` output) for the cost evaluator, e.g. one profiled "
                        "on this CPU for --gpu cpu (default: the GPU's bundled calibration, else the roofline)")
    p.add_argument("--engine", default=None, metavar="NAME|FILE",
                   help="inference-engine profile the rollout is timed with (vllm-2024, trtllm-2024, constants, or a "
                        "`libra-calibrate fit-engine` file; default: the calibration's engine entry, else vllm-2024)")
    p.add_argument("--policy", default=None, help="policy name (default: libra if available, else verl-static-uniform)")
    p.add_argument("--compare", action="store_true",
                   help="replay every known policy on the same trace (a policy that cannot run is reported, the rest go on; exit 1)")
    p.add_argument("--policies", default=None, help="with --compare: a comma-separated subset")
    p.add_argument("--seed", type=int, default=0, help="seed of the ground-truth noise and tool-latency draws")
    p.add_argument("--noise", type=float, default=0.03, help="sigma of the lognormal ground-truth noise (default 0.03; 0 = none)")
    p.add_argument("--max-staleness", default="0", metavar="K[,K...]",
                   help="the staleness the RL algorithm tolerates, for every policy alike (default 0: on-policy; each "
                        "policy then runs its fastest loop within it: sync, sync + streaming, or async up to K); "
                        "several classes (e.g. 0,1) are replayed one after the other and reported side by side")
    p.add_argument("--mode", choices=("sync", "async"), default=None,
                   help="override the loop every policy plans for (default: each policy's choice; async needs --max-staleness >= 1)")
    p.add_argument("--staleness", type=int, default=None, help="async: run with this staleness bound (1..K; default the plan's, K)")
    p.add_argument("--kl", type=float, default=0.0, metavar="COEF", help="KL coefficient; > 0 adds the reference model's forward pass")
    p.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=None,
                   help="override: sync mode trains (or not, --no-streaming) on completed GRPO groups while the rollout tail runs "
                        "(default: each policy's choice)")
    p.add_argument("--async-generation", choices=("continuous", "per-step"), default="continuous",
                   help="async loop: continuous = consecutive steps share the engines, the next step's prompts start "
                        "while this step's tail decodes (AReaL, NeMo RL; default); per-step = each step's rollout is a "
                        "batch whose tail gates the next (libra-run's async loop; its fidelity replay uses it)")
    p.add_argument("--tool-kv", choices=("keep", "release"), default="keep", help="KV of a trajectory during a tool call (default keep)")
    p.add_argument("--mini-batches", type=_positive_int, default=4, help="optimizer steps per RL step (gradient-accumulation boundaries)")
    p.add_argument("--steps", default=None, metavar="A:B", help="replay trace steps A..B-1 only")
    p.add_argument("--lenient", action="store_true",
                   help="skip invalid trace lines instead of failing (each reported on stderr as FILE:LINE: field: rule)")
    p.add_argument("--fail-gpu", action="append", default=[], metavar="STEP:SECONDS:GPU", help="take GPU away SECONDS into STEP's rollout (repeatable)")
    p.add_argument("--split", default=None, metavar="ROLLOUT:TRAIN", help="pin the GPU split (baselines)")
    p.add_argument("--plan-split", default=None, metavar="ROLLOUT:TRAIN",
                   help="pin every plan the policy returns to ROLLOUT TP-1 instances and a DP trainer on TRAIN GPUs "
                        "(libra.policies.pinned, any policy; libra-run's split key, which its fidelity replay passes)")
    p.add_argument("--bucket-bounds", default=None, metavar="N[,N...]",
                   help="pin every plan's rollout buckets at these context lengths, instances dealt round-robin "
                        "(libra.policies.pinned; libra-run's bucket_bounds key)")
    p.add_argument("--layout", default=None, metavar="NxTP[@BOUND],...",
                   help="pin every plan's rollout layout: per bucket N instances of TP TP for contexts below BOUND (one bucket "
                        "without a bound: the longest), e.g. 8x1@2048,1x8; with --plan-split R:T on R devices, else on a "
                        "time-shared plan's devices (libra.policies.pinned)")
    p.add_argument("--rollout-tp", type=_positive_int, default=None, help="pin the rollout TP (baselines)")
    p.add_argument("--train-tp", type=_positive_int, default=None, help="pin the training TP")
    p.add_argument("--train-pp", type=_positive_int, default=None, help="pin the training PP")
    p.add_argument("--train-ep", type=_positive_int, default=None, help="pin the training EP (MoE)")
    p.add_argument("--micro-batch", type=_positive_int, default=None, help="pin the training micro-batch")
    p.add_argument("--gantt-step", type=int, default=None, help="trace step for the instance Gantt (default: the first replayed)")
    p.add_argument("--out", default=None, metavar="DIR", help="write steps.csv and PNG plots here")
    p.add_argument("--json", default=None, metavar="FILE", help="write the run summary as JSON")
    p.add_argument("--per-step", action="store_true", help="also print a per-step table for each policy")
    p.add_argument("--wide", action="store_true",
                   help="the comparison table with all 15 columns (~180 characters wide; default: the 8 that fit an "
                        "80-column terminal)")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="with --compare: policies replayed in parallel processes (default: CPU cores; 1 = in this process)")


def _parse_split(text: str | None, flag: str = "--split") -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        a, b = text.split(":")
        return int(a), int(b)
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected ROLLOUT:TRAIN GPU counts, e.g. 24:24") from None


def _parse_bounds(text: str | None) -> tuple[int, ...] | None:
    """``--bucket-bounds 26,96`` -> (26, 96)."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise UserError(f"--bucket-bounds {text!r}: expected increasing context lengths, e.g. 96 or 40,96") from None


def _parse_classes(text: str) -> list[int]:
    """``--max-staleness K[,K...]`` -> the staleness classes, in the order given, without repeats."""
    out: list[int] = []
    for part in str(text).split(","):
        try:
            k = int(part.strip())
        except ValueError:
            raise UserError(f"--max-staleness {text!r}: expected integers >= 0, e.g. 0 or 0,1") from None
        if k < 0:
            raise UserError(f"--max-staleness must be >= 0, got {k}")
        if k not in out:
            out.append(k)
    return out


def _parse_faults(items: list[str]) -> tuple[Any, ...]:
    from sim.loop import Fault

    out = []
    for it in items:
        parts = it.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            out.append(Fault(int(parts[0]), float(parts[1]), int(parts[2])))
        except ValueError:
            raise UserError(f"--fail-gpu {it!r}: expected STEP:SECONDS:GPU, e.g. 3:120:5") from None
        if out[-1].at_s < 0:
            raise UserError(f"--fail-gpu {it!r}: SECONDS must be >= 0")
    return tuple(out)


def _model_name(arg: str | None, hint: str | None) -> str:
    from cost_models import MODELS, get_model
    from cost_models.errors import CostModelError

    name = arg or hint
    if not name:
        raise UserError(f"the trace header names no model; pass --model (known: {', '.join(sorted(MODELS))})")
    for cand in (name, name.lower()):
        try:
            get_model(cand)
            return cand
        except (CostModelError, OSError, ValueError):
            continue
    src = "--model" if arg else "the trace header's model hint"
    how = "" if arg else " (a libra-run trace names its model folder: pass --model FOLDER/config.json)"
    raise UserError(f"{src} {name!r} is not a catalog model or config.json{how}; known: {', '.join(sorted(MODELS))}")


#: Skipped lines listed one by one by --lenient (the rest are counted per rule).
SKIPPED_SHOWN = 10


def _report_skipped(path: str, skipped: list[Any]) -> None:
    """--lenient: say on stderr how many lines were dropped, where (FILE:LINE) and by which rule."""
    if not skipped:
        return
    print(f"libra-sim: --lenient skipped {len(skipped)} invalid line(s) of {path}; the replay runs without them:",
          file=sys.stderr)
    for s in skipped[:SKIPPED_SHOWN]:
        print(f"  {path}:{s.line}: field '{s.field}': {s.rule}" + (f" ({s.detail})" if s.detail else ""), file=sys.stderr)
    if len(skipped) > SKIPPED_SHOWN:
        per_rule: dict[str, int] = {}
        for s in skipped:
            per_rule[s.rule_key] = per_rule.get(s.rule_key, 0) + 1
        print(f"  ... and {len(skipped) - SKIPPED_SHOWN} more; per rule: "
              + "; ".join(f"{n} x {rule}" for rule, n in sorted(per_rule.items(), key=lambda kv: -kv[1])), file=sys.stderr)


class _Progress:
    """A rich progress bar on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)

    def __enter__(self) -> _Progress:
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.__exit__(*exc)  # type: ignore[arg-type]

    def task(self, name: str, total: int) -> Any:
        if not self.bar:
            return None
        tid = self.bar.add_task(name, total=total)
        return lambda done, tot: self.bar.update(tid, completed=done)  # type: ignore[union-attr]


#: Written into --out when an interrupt cut a --compare short (names what did not run).
INCOMPLETE_FILE = "INCOMPLETE.txt"

#: What a forked worker replays (set before the pool forks, so nothing large is pickled).
_JOB: dict[str, Any] = {}


def _replay_one(name: str) -> tuple[str, Any, str | None]:
    """Replay one policy in a worker; a user error comes back as text (the others go on)."""
    from cost_models.errors import CostModelError
    from sim.replay import replay_policy

    try:
        return name, replay_policy(_JOB["steps"], name, _JOB["cluster"], _JOB["config"], costs=_JOB["costs"], **_JOB["pins"]), None
    except (UserError, CostModelError) as exc:
        return name, None, str(exc)


def _replay_parallel(jobs: int, steps: Any, names: list[str], cluster: Any, config: Any, pins: dict[str, Any],
                     costs: Any, got: list[tuple[str, Any, str | None]]) -> None:
    """Replay ``names`` in ``jobs`` forked processes, appending each outcome to ``got`` as it
    finishes (so an interrupt keeps what finished). Each policy's run is seeded and independent
    of the others, so the results equal a sequential replay's; the caller puts them back in
    ``names`` order. The workers inherit ``costs`` (so a ``--calibration`` reaches them too). On
    Ctrl-C the workers are terminated at once (``sim.processes``) and ``KeyboardInterrupt``
    propagates."""
    from concurrent.futures import as_completed

    from sim.processes import InterruptiblePool

    _JOB.update(steps=steps, cluster=cluster, config=config, pins=pins, costs=costs)
    try:
        with _Progress() as prog, InterruptiblePool(jobs, multiprocessing.get_context("fork")) as pool:
            tick = prog.task("policies", len(names))
            futures = pool.submit_all(_replay_one, names)
            for i, f in enumerate(as_completed(futures)):
                got.append(f.result())
                _finished(got[-1], i + 1, len(names), tick)
    finally:
        _JOB.clear()


def _finished(outcome: tuple[str, Any, str | None], done: int, total: int, tick: Any) -> None:
    """Progress of a --compare: the bar on a terminal, else one line per finished policy on
    stderr (a log shows how far an interrupted replay got)."""
    if tick:
        tick(done, total)
    elif total > 1:
        name, _res, err = outcome
        print(f"[{done}/{total}] {name} {'failed' if err else 'done'}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from libra.cluster import ClusterSpec
    from libra.policies import min_staleness, policy_names
    from sim import report
    from sim.costs import load_costs
    from sim.loop import SimConfig
    from sim.replay import load_steps, replay_policy

    from libra.paths import check_output_dir, check_output_file
    from libra.trace.limits import cluster_limits

    # outputs first: a --compare takes minutes, and must not end on a folder it cannot write
    if args.out:
        check_output_dir(args.out, "--out")
    if args.json:
        check_output_file(args.json, "--json")
    classes = _parse_classes(args.max_staleness)
    if args.staleness is not None and args.staleness < 0:
        raise UserError("--staleness must be >= 0")
    import math

    if not (0 <= args.noise <= 1):
        raise UserError(f"--noise must be a number in [0, 1] (sigma of the lognormal ground-truth noise), got {args.noise}")
    if not (math.isfinite(args.kl) and args.kl >= 0):
        raise UserError(f"--kl must be a finite number >= 0, got {args.kl}")
    if args.seed < 0:
        raise UserError(f"--seed must be an integer >= 0, got {args.seed}")
    if args.gpus > MAX_GPUS:
        raise UserError(f"--gpus must be an integer in [1, {MAX_GPUS:,}] (the planner searches every split: 13 s at "
                        f"{MAX_GPUS:,} on one core, minutes beyond), got {args.gpus:,}")
    dropped: list[Any] = []
    steps, header = load_steps(args.trace, args.steps, args.lenient, skipped=dropped)
    _report_skipped(args.trace, dropped)
    meta = getattr(header, "metadata", {}) or {}
    gpu = args.gpu or meta.get("gpu") or "a800"
    model = _model_name(args.model, getattr(header, "model", None))
    limits, limits_text = cluster_limits(header, args.max_context, args.trace)  # the same reading as libra-sim plan's
    gpn = args.gpus_per_node or node_size(gpu)
    cluster = ClusterSpec(args.gpus, gpu, model, gpn, max_train_gpus=args.max_train_gpus, engine=args.engine, **limits)
    costs = load_costs(gpu, model, gpn, args.calibration, engine=args.engine)
    names = policy_names()
    if args.compare:
        chosen = [n.strip() for n in args.policies.split(",")] if args.policies else list(names)
        for n in chosen:
            if n not in names:
                raise UserError(f"--policies: unknown policy {n!r}; known: {', '.join(names)}")
    else:
        chosen = [args.policy or ("libra" if "libra" in names else "verl-static-uniform")]
        if chosen[0] not in names:
            raise UserError(f"--policy {chosen[0]!r} is unknown; known: {', '.join(names)}")
    # --compare: per class, the policies that run in it and those that do not (left out, not failed)
    in_class = {k: [n for n in chosen if not args.compare or min_staleness(n) <= k] for k in classes}
    outside = {k: [n for n in chosen if n not in in_class[k]] for k in classes}
    if not any(in_class.values()):
        raise UserError(f"no chosen policy runs with --max-staleness {args.max_staleness} "
                        f"({', '.join(f'{n} needs >= {min_staleness(n)}' for n in chosen)})")
    if args.gantt_step is not None and args.gantt_step not in {s.step for s in steps}:
        have = [s.step for s in steps]
        raise UserError(f"--gantt-step {args.gantt_step}: not a replayed step (steps {have[0]}..{have[-1]})")
    gantt = args.gantt_step if args.gantt_step is not None else (steps[0].step if args.out else None)
    base = SimConfig(
        mode=args.mode, staleness=args.staleness, kl=args.kl, kv_mode=args.tool_kv, seed=args.seed,
        noise_sigma=args.noise, mini_batches=args.mini_batches, faults=_parse_faults(args.fail_gpu), gantt_step=gantt,
        streaming=args.streaming, max_staleness=classes[0], continuous=args.async_generation == "continuous",
    )
    from dataclasses import replace as _with

    configs = {k: _with(base, max_staleness=k) for k in classes}
    for c in configs.values():
        c.check()  # --mode async with K = 0, --staleness above K: one line, before any replay
    pins = dict(split=_parse_split(args.split), rollout_tp=args.rollout_tp, train_tp=args.train_tp, train_pp=args.train_pp,
                train_ep=args.train_ep, micro_batch=args.micro_batch)
    pins = {k: v for k, v in pins.items() if v is not None}
    plan_split = _parse_split(args.plan_split, "--plan-split")
    bounds = _parse_bounds(args.bucket_bounds)
    if plan_split is not None or bounds or args.layout:
        from libra.policies.pinned import PlanPin, layout_gpus, parse_layout

        if plan_split is not None and sum(plan_split) > args.gpus:
            raise UserError(f"--plan-split {args.plan_split}: needs {sum(plan_split)} GPUs, --gpus is {args.gpus}")
        layout = parse_layout(args.layout) if args.layout else None
        if layout is not None and layout_gpus(layout) > args.gpus:
            raise UserError(f"--layout {args.layout}: needs {layout_gpus(layout)} GPUs, --gpus is {args.gpus}")
        pins["pin"] = PlanPin(plan_split, bounds or None, gpn, layout)
    from cost_models.errors import CostModelError

    results = []
    failed: list[str] = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    outcomes: list[tuple[str, Any, str | None]] = []
    planned = [(k, n) for k, ns in in_class.items() for n in ns]
    interrupted = False
    try:
        for k, config in configs.items():
            run_names = in_class[k]
            if not run_names:
                continue
            jobs = min(args.jobs or cores, len(run_names))
            got: list[tuple[str, Any, str | None]] = []
            try:
                if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
                    _replay_parallel(jobs, steps, run_names, cluster, config, pins, costs, got)
                else:
                    with _Progress() as prog:
                        for name in run_names:
                            cb = prog.task(name, len(steps))
                            try:
                                got.append((name, replay_policy(steps, name, cluster, config, costs=costs, progress=cb, **pins), None))
                            except (UserError, CostModelError) as exc:
                                if not args.compare:
                                    raise
                                got.append((name, None, str(exc)))
                            if cb is None:
                                _finished(got[-1], len(got), len(run_names), None)
            finally:  # an interrupt keeps what finished, in the order of the policy list
                got.sort(key=lambda o: run_names.index(o[0]))
                outcomes += [(f"{n} (K={k})" if len(classes) > 1 else n, r, e) for n, r, e in got]
    except KeyboardInterrupt:
        interrupted = True
    for name, res, err in outcomes:
        if err is not None:
            # one policy that cannot run this configuration must not hide the others
            print(f"libra-sim: policy {name}: {err}", file=sys.stderr)
            failed.append(name)
        else:
            results.append(res)
    missing: list[str] = []
    if interrupted:
        done_names = {o[0] for o in outcomes}
        missing = [m for m in (f"{n} (K={k})" if len(classes) > 1 else n for k, n in planned) if m not in done_names]
        if not results:
            print("libra-sim: interrupted before any policy finished; nothing written", file=sys.stderr)
            return 130
        print(f"libra-sim: interrupted: writing the {len(results)} {'policy' if len(results) == 1 else 'policies'} that finished, marked INCOMPLETE "
              f"(not run: {', '.join(missing)})", file=sys.stderr)
    if not results:
        raise UserError(f"no policy could replay this trace ({', '.join(failed)}); see the messages above")
    # a terminal: its width (the narrow table fits 80 columns); --wide or a pipe: room for every column
    console = Console() if sys.stdout.isatty() and not args.wide else Console(width=200)
    n_traj = sum(s.n for s in steps)
    title = f"{os.path.basename(args.trace)}: {len(steps)} steps, {n_traj} trajectories, {args.gpus} x {gpu}, {model}, seed {args.seed}"
    if args.calibration:
        title += f", calibration {os.path.basename(args.calibration)}"
    title += f", engine {costs.ev.engine.name}"
    title += f"; limits: {limits_text}"
    if interrupted:
        title = f"INCOMPLETE (interrupted; not run: {', '.join(missing)}): {title}"
    console.print(report.summary_table(results, title, args.gpus, wide=args.wide))
    if args.per_step or len(results) == 1:
        for r in results:
            console.print(report.steps_table(r))
    for k, names_out in outside.items():
        for n in names_out:
            console.print(f"[dim]{n}: not in staleness class K={k} (asynchronous by design: --max-staleness >= {min_staleness(n)})[/dim]")
    for r in results:
        if r.notes.get("chosen_by"):
            console.print(f"[dim]{r.policy}: split {r.notes.get('split')}, rollout TP {r.notes.get('rollout_tp')}, chosen by {r.notes['chosen_by']}[/dim]")
    if args.compare:
        for r in results:
            v = report.vs_best_baseline(r, results)
            if r.policy == "libra" and v == v:
                best = report.best_baseline(results, r.max_staleness)
                assert best is not None
                console.print(f"libra ({r.mode}) vs the best baseline of staleness class K={r.max_staleness}, "
                              f"{best.policy} ({best.mode}): {v:.2f}x ({r.mean_step_s:.1f} s against {best.mean_step_s:.1f} s per step)")
    if args.json:
        doc = report.json_summary(results, args.trace, args.gpus, gpu, model, by_class=len(classes) > 1)
        doc["complete"] = not interrupted
        if interrupted:
            doc["not_run"] = missing
        report.write_json(args.json, doc)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        report.write_csv(os.path.join(args.out, "steps.csv"), results)
        marker = os.path.join(args.out, INCOMPLETE_FILE)
        if interrupted:
            # the plots take seconds (matplotlib): an interrupted replay writes its numbers and goes
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"INCOMPLETE: libra-sim replay was interrupted. steps.csv holds the {len(results)} "
                        f"{'policy' if len(results) == 1 else 'policies'} that finished; not run: {', '.join(missing)}. No plots were drawn (any PNG here is from an earlier "
                        "run); rerun the command for the whole comparison.\n")
            console.print(f"wrote {os.path.join(args.out, 'steps.csv')} and {INCOMPLETE_FILE} (INCOMPLETE: interrupted; no plots)")
        else:
            if os.path.exists(marker):
                os.remove(marker)  # an earlier interrupted run's marker: this run is whole
            paths = report.write_plots(args.out, results)
            console.print(f"wrote {os.path.join(args.out, 'steps.csv')} and {', '.join(os.path.basename(p) for p in paths)}")
    if interrupted:
        return 130
    return 1 if failed else 0
