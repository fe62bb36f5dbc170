"""``libra-sim plan``: what Libra's planner would run for one step, and what it predicts.

With ``--trace`` the planner plans step ``--step`` (default: the trace's last step) from the
steps before it (their statistics, never the planned step's own lengths) and that step's
prompts, knowing the run's length as a replay of the trace does (``--run-steps``). Without a trace it plans from the documented default length prior
(``libra.planner.stats.default_prior_step``) for ``--prompts`` trajectories; when that prior fits
nothing and no context limit is declared, for the longest of 32K/16K/8K/4K tokens that fits (as
Libra plans a replay's first step), and says so. It prints the GPU
split, the training strategy, the rollout instances (TP, node) and buckets (context bounds), and
the predicted rollout, training, sync and step times; ``--json`` prints the same as JSON;
``--emit FRAMEWORK`` prints it as verl's, AReaL's, slime's or NeMo RL's own configuration
(``libra.export``).
A model that cannot fit says what would (more GPUs, a bigger GPU).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

NAME = "plan"
HELP = "show the plan Libra's planner picks for a cluster (split, strategies, buckets, predicted times)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``libra-sim plan``."""
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    parser.add_argument("--gpu", default=None, help="GPU kind (a100, a800, h100, h200, b200, gb200); default: a800")
    parser.add_argument("--model", default=None, help="model name or config.json (default: the trace's hint, else qwen3-14b)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node (default: the GPU's, 8; 4 per GB200 tray, whose NVLink domain is the 72-GPU rack)")
    parser.add_argument("--trace", default=None, help="plan from this trace's steps (default: the length prior)")
    parser.add_argument("--step", type=int, default=None, help="step to plan (default: the trace's last); history = steps before it")
    parser.add_argument("--prompts", type=int, default=512, help="trajectories per step without a trace (default 512)")
    parser.add_argument("--max-staleness", type=int, default=0, metavar="K",
                        help="the staleness the RL algorithm tolerates (default 0: on-policy); the planner picks the fastest loop "
                             "it allows: sync, sync + streaming, async up to K")
    parser.add_argument("--mode", choices=("sync", "async"), default=None,
                        help="pin the loop instead (default: the planner's choice; async needs --max-staleness >= 1)")
    parser.add_argument("--run-steps", type=int, default=None, metavar="N",
                        help="the RL run's length in steps: an async pipeline not yet running is priced as the run it starts over "
                             "the steps left, fill and drain included (default: the trace's step count, as libra-sim replay tells "
                             "the planner; without a trace, the steady state)")
    parser.add_argument("--homogeneous", action="store_true", help="one TP degree, one bucket (the libra-homogeneous planner)")
    parser.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                        help="a hard context limit of the workload (default: the trace header's declared max_context, as "
                             "libra-sim replay reads it)")
    parser.add_argument("--engine", default=None, metavar="NAME|FILE",
                        help="inference-engine profile the rollout is timed with (vllm-2024, trtllm-2024, constants, or a "
                             "`libra-calibrate fit-engine` file; default: the cost model's default, vllm-2024)")
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="calibration file for the cost evaluator (`libra-calibrate fit`, or `from-logs` with your run's "
                             "stage overheads), as libra-sim replay takes it")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    from libra.export.registry import EMITTERS

    parser.add_argument("--emit", choices=tuple(EMITTERS), default=None, metavar="FRAMEWORK",
                        help="print the plan as that RL framework's own configuration instead (" + ", ".join(EMITTERS)
                             + "); what it cannot express, and the nearest plan it can with its predicted cost, go to stderr")


def _load(args: argparse.Namespace) -> tuple[list[Any], Any, str | None, Any, int | None]:
    """(history, prompt_tokens, model hint, trace header, the trace's step count: None without a
    trace) for the planned step."""
    import numpy as np

    from libra.errors import UserError

    if args.trace is None:
        if args.step is not None:
            raise UserError("--step needs --trace")
        if args.prompts < 1:
            raise UserError(f"--prompts must be >= 1, got {args.prompts}")
        from libra.planner.stats import PRIOR_PROMPT_TOKENS

        return [], np.full(args.prompts, PRIOR_PROMPT_TOKENS, np.int64), None, None, None
    from libra.trace.reader import open_trace

    reader = open_trace(args.trace)
    hint = reader.header.model if reader.header is not None else None
    steps = list(reader.steps())
    if not steps:
        raise UserError(f"{args.trace}: the trace has no trajectories to plan from")
    numbers = [s.step for s in steps]
    target = numbers[-1] if args.step is None else args.step
    if target not in numbers:
        raise UserError(f"--step {target}: not in {args.trace} (steps {numbers[0]}..{numbers[-1]})")
    k = numbers.index(target)
    return steps[:k], steps[k].prompt_tokens, hint, reader.header, len(steps)


def _model_name(hint: str | None) -> str:
    """The trace's model hint as a catalog name when it is one (e.g. 'Qwen3-14B' -> 'qwen3-14b')."""
    if not hint:
        return "qwen3-14b"
    return hint.lower()


def run(args: argparse.Namespace) -> int:
    """Plan and print."""
    from libra.cluster import ClusterSpec
    from libra.errors import UserError
    from libra.planner.search import SearchOptions

    from sim.commands.common import MAX_GPUS, node_size

    if not 2 <= args.gpus <= MAX_GPUS:
        raise UserError(f"--gpus must be an integer in [2, {MAX_GPUS:,}] (rollout and training each need a GPU; the search takes "
                        f"13 s at {MAX_GPUS:,}, minutes beyond), got {args.gpus:,}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be an integer >= 1, got {args.gpus_per_node}")
    from libra.trace.limits import cluster_limits

    if args.max_context is not None and args.max_context < 1:
        raise UserError(f"--max-context must be >= 1, got {args.max_context}")
    if args.run_steps is not None and args.run_steps < 1:
        raise UserError(f"--run-steps must be >= 1, got {args.run_steps}")
    history, prompts, hint, header, trace_steps = _load(args)
    run_steps = args.run_steps if args.run_steps is not None else trace_steps
    limits, limits_text = cluster_limits(header, args.max_context, args.trace or "trace")  # the same reading as libra-sim replay's
    cluster = ClusterSpec(args.gpus, args.gpu or "a800", args.model or _model_name(hint), gpus_per_node=args.gpus_per_node or node_size(args.gpu or "a800"),
                          engine=args.engine, **limits)
    if args.max_staleness < 0:
        raise UserError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.mode == "async" and args.max_staleness < 1:
        raise UserError("--mode async needs --max-staleness K >= 1 (the staleness the RL algorithm tolerates)")
    # the run's length, as libra-sim replay gives the policy (``PolicyOptions.run_steps``): a
    # plan shown for a trace's step is the one its replay's planner would price
    # Libra's routers serve the older steps first on shared engines (``LibraPolicy`` prices that)
    opts = SearchOptions(mode=args.mode, max_staleness=args.max_staleness, max_buckets=1 if args.homogeneous else 2, run_steps=run_steps,
                         step_priority=True)
    from libra.planner.assumed_cap import ASSUMED_CAPS

    ev = None
    if args.calibration is not None:  # the replay's evaluator, so plan and replay price alike
        from sim.costs import load_costs

        ev = load_costs(cluster.gpu, cluster.model, cluster.gpus_per_node, args.calibration, engine=args.engine).ev
    planner, res, assumed, why = _search(cluster, opts, history, prompts, ev)
    if args.emit:
        return _emit(args.emit, planner, res, history, prompts)
    plan = planner.to_plan(res)
    doc = _as_dict(cluster, plan, len(history), len(prompts))
    doc["limits"] = limits_text
    if assumed is not None:
        doc["assumed_max_context"] = assumed
        doc["limits"] = (f"none declared; {why}, so planned for {assumed:,}-token contexts (of "
                         f"{'/'.join(f'{c // 1024}K' for c in ASSUMED_CAPS)}, as libra plans its first step); "
                         "pass --max-context N for your workload's")
    doc["extrapolation"] = planner.ev.engine_extrapolation(sorted({i.tp for i in plan.instances}),  # type: ignore[attr-defined]
                                                           -(-len(prompts) // max(1, len(plan.instances))))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc)
    return 0


def _search(cluster: Any, opts: Any, history: list[Any], prompts: Any, ev: Any = None) -> tuple[Any, Any, int | None, str]:
    """(planner, its search result, assumed context cap or None, why that cap: the limits line's
    words, empty when none was assumed); ``ev``: the evaluator (None: the
    cluster's). Without measured steps or a declared context limit, a prior that fits nothing (its
    own 65,536-token cap is a guess), or fits only a launch whose regret over the prior scenarios
    exceeds ``HEDGE_REGRET_CAP``, is planned at the assumed caps by the rule ``LibraPolicy``
    launches a replay with (``libra.planner.assumed_cap``, docs/policy-core.md); a misfit that
    remains names ``--max-context``."""
    import dataclasses

    from libra.errors import UserError
    from libra.planner.assumed_cap import ASSUMED_CAPS, HEDGE_REGRET_CAP, forced_launch, may_assume_cap, needs_assumed_cap, plan_at_assumed_caps
    from libra.planner.search import Planner

    regrets: dict[int, float] = {}  # assumed cap -> its launch's worst-case regret over the prior scenarios

    def plan_at(cap: int) -> tuple[Any, Any]:
        planner = Planner(dataclasses.replace(cluster, max_context=cap), ev=ev, options=opts)
        res = planner.search(history, prompts)
        regrets[cap] = float(res.launch_regret)
        return planner, res

    def regret_of(searched: tuple[Any, Any]) -> float:
        return float(searched[1].launch_regret)

    incumbent: tuple[Any, Any] | None = None
    first: UserError | None = None
    try:
        planner = Planner(cluster, ev=ev, options=opts)
        incumbent = (planner, planner.search(history, prompts))
    except UserError as exc:
        if not may_assume_cap(history, cluster.max_context):
            hint = "" if history else "; a shorter --max-context TOKENS may fit"
            raise UserError(f"{exc}{hint}") from None
        first = exc
    else:
        if not needs_assumed_cap(regret_of(incumbent), history, cluster.max_context):
            return incumbent[0], incumbent[1], None, ""
    passed_over: list[tuple[int, int, bool]] = []  # (cap, training GPUs, time-shared) of launches memory forced

    def forced(searched: tuple[Any, Any]) -> bool:
        hit = forced_launch(searched[1].holding_splits, searched[1].best.colocated, opts.max_staleness >= 1)
        if hit:
            passed_over.append((int(searched[0].cluster.max_context), int(searched[1].best.n_train), bool(searched[1].best.colocated)))
        return hit

    def passed(skipped: list[tuple[int, int, bool]]) -> str:
        return ", and at " + ", ".join(f"{c:,} no split's training GPUs hold the sequences (time-shared forced, not chosen)" if shared
                                       else f"{c:,} only {n} training GPUs hold the sequences (a split memory forced, not chosen)"
                                       for c, n, shared in skipped)

    try:
        (planner, res), cap = plan_at_assumed_caps(plan_at, regret_of, incumbent, forced=forced)
    except UserError:
        raise UserError(f"{first}; with no context limit declared it was also planned for "
                        f"{'/'.join(f'{c:,}' for c in ASSUMED_CAPS)}-token contexts and nothing fits: pass --max-context TOKENS "
                        "(your workload's limit), more GPUs or a bigger GPU") from None
    if incumbent is None:
        why = "nothing fits the length prior's 65,536-token cap"
    else:
        why = (f"the length prior's 65,536-token cap fits only a launch that costs some prior scenario "
               f"{regret_of(incumbent):.2f}x its best (over {HEDGE_REGRET_CAP}x)")
    skipped = [(c, n, shared) for c, n, shared in passed_over if cap is not None and c > cap]  # the caps passed over
    if skipped:
        why += passed(skipped)
    forced_caps = {c for c, _, _ in passed_over}
    costly = [(c, r) for c, r in sorted(regrets.items(), reverse=True)
              if cap is not None and c > cap and c not in forced_caps and r == r and r > HEDGE_REGRET_CAP]
    if costly:  # caps that fit but whose launch the regret rule passed over
        why += ", and at " + ", ".join(f"{c:,} the launch costs some prior scenario {r:.2f}x its best" for c, r in costly)
    return planner, res, cap, why


def _emit(framework: str, planner: Any, res: Any, history: list[Any], prompts: Any) -> int:
    """``--emit``: the configuration on stdout, what changed and the predicted times on stderr."""
    import sys

    from libra.export.emit import emit_plan

    out, lines = emit_plan(framework, planner, res, history, prompts)
    for line in lines:
        print(f"libra-sim plan --emit {framework}: {line}", file=sys.stderr)
    sys.stdout.write(out.text)
    return 0


def _as_dict(cluster: Any, plan: Any, n_history: int, n_prompts: int) -> dict[str, Any]:
    t = plan.train
    return {
        "cluster": {"gpus": cluster.n_gpus, "gpu": cluster.gpu, "model": cluster.model, "gpus_per_node": cluster.gpus_per_node,
                    "engine": cluster.engine},
        "planned_from": "length prior" if plan.notes.get("from_prior") else f"{n_history} completed step(s)",
        "trajectories": n_prompts,
        "mode": plan.mode,
        "streaming": plan.streaming,
        "loop": plan.notes.get("loop", plan.mode),
        "max_staleness": plan.max_staleness,
        "stagger_fill": plan.stagger_fill,
        "staleness_class": plan.notes.get("staleness_class", plan.max_staleness),
        "loop_step_s": plan.notes.get("loop_step_s", {}),
        "split": {"rollout_gpus": plan.n_rollout_gpus, "train_gpus": plan.n_train_gpus, "colocated": plan.colocated},
        "train": {"tp": t.tp, "pp": t.pp, "dp": t.dp, "ep": t.ep, "zero_stage": t.zero_stage, "micro_batch": t.micro_batch, "recompute": t.recompute},
        "buckets": [
            {"index": b.index, "tp": b.tp, "min_context": b.min_context, "max_context": b.max_context,
             "instances": len(plan.instances_in(b.index)), "predicted_s": plan.notes["bucket_times_s"][b.index]}
            for b in plan.buckets
        ],
        "instances": [{"id": i.id, "tp": i.tp, "bucket": i.bucket, "node": i.node, "first_gpu": i.first_gpu} for i in plan.instances],
        "predicted": {
            "rollout_s": plan.predicted_rollout_s,
            "rollout_load_s": plan.notes["rollout_load_s"],
            "rollout_critical_path_s": plan.notes["rollout_critical_path_s"],
            "train_s": plan.predicted_train_s,
            "sync_s": plan.notes["sync_s"],
            "step_s": plan.predicted_step_s,
        },
        "candidates_searched": plan.notes["candidates"],
    }


def _print(d: dict[str, Any]) -> None:
    c, p, t = d["cluster"], d["predicted"], d["train"]
    print(f"{c['model']} on {c['gpus']} x {c['gpu']} ({c['gpus_per_node']}/node), {d['trajectories']} trajectories, "
          f"{d['loop']} loop (staleness class K={d['staleness_class']}"
          + (", async staleness " + str(d['max_staleness']) if d['mode'] == 'async' else "")
          + (", the first step rolls out alone" if d.get("stagger_fill") else "") + f"); planned from {d['planned_from']}; limits: {d.get('limits', 'none declared')}")
    if d["split"].get("colocated"):
        print(f"split: colocated: rollout and training time-share all {c['gpus']} GPUs")
    else:
        print(f"split: {d['split']['rollout_gpus']} rollout GPUs, {d['split']['train_gpus']} training GPUs")
    print(f"train: TP {t['tp']} x PP {t['pp']} x DP {t['dp']}" + (f", EP {t['ep']}" if t["ep"] > 1 else "")
          + f", ZeRO-{t['zero_stage']}, micro-batch {t['micro_batch']}" + (", recompute" if t["recompute"] else ""))
    print("buckets:")
    for b in d["buckets"]:
        hi = "inf" if b["max_context"] is None else f"{b['max_context']:,}"
        print(f"  {b['index']}: context [{b['min_context']:,}, {hi}) on {b['instances']} x TP{b['tp']} instance(s), predicted {b['predicted_s']:.1f} s")
    per_node: dict[int, Counter[int]] = {}
    for i in d["instances"]:
        per_node.setdefault(i["node"], Counter())[i["tp"]] += 1
    print("instances by node: " + "; ".join(
        f"node {n}: " + ", ".join(f"{k} x TP{tp}" for tp, k in sorted(cnt.items())) for n, cnt in sorted(per_node.items())))
    print(f"predicted: rollout {p['rollout_s']:.1f} s (load {p['rollout_load_s']:.1f}, tail critical path "
          f"{p['rollout_critical_path_s']:.1f}), train {p['train_s']:.1f} s, sync {p['sync_s']:.2f} s, step {p['step_s']:.1f} s")
    for line in d.get("extrapolation", []):
        print(f"extrapolation: {line}")
    if d.get("loop_step_s"):
        print("step by loop (this split): " + ", ".join(f"{k} {v:.1f} s" for k, v in d["loop_step_s"].items()))
