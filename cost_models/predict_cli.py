"""``libra-calibrate predict``: ask the cost evaluator one question from the command line.

Why: to check a prediction against a measurement (a vLLM benchmark, a training log) without
writing Python, and to see at once why a strategy does not fit. Sub-commands:

  decode  --gpu G --model M --tp T --batch B --context C    one decode iteration; C is the context
          [--ignore-memory]                                 of EACH sequence (total KV = B x C, which
                                                            must fit the KV cache)
  prefill --gpu G --model M --tp T --tokens N [--cached K] [--batch B]
  train   --gpu G --model M [--gpus N] --tp T --pp P [--dp D] [--ep E] --global-batch-tokens X
          --seq-len S [--zero Z] [--micro-batch U] [--recompute] [--forward-only] [--ignore-memory]
  memory  --gpu G --model M --tp T                          rollout instance: KV capacity

``--json`` prints one JSON object (``{"ms": ...}`` for decode/prefill, ``{"s": ...}`` for train),
otherwise one human line. ``--calibration FILE`` uses a file written by ``libra-calibrate fit``;
``--engine NAME|FILE`` the inference-engine profile (``cost_models.engines``).
Bad input raises ``CostModelError``; the ``libra-calibrate`` entry point prints it on one line
and exits 2 (``main`` below does the same when this module runs on its own).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

NAME = "predict"
HELP = "predict one decode/prefill iteration, a training step, or a rollout instance's memory"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True, help="catalog GPU: a100, a800, h100, h200, b200, gb200, cpu")
    p.add_argument("--model", required=True, help="catalog model (e.g. qwen3-14b) or a config.json path")
    p.add_argument("--calibration", default=None, help="operator calibration JSON (default: bundled for the GPU)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="override the GPU's node size")
    p.add_argument("--engine", default=None, metavar="NAME|FILE",
                   help="inference-engine profile (vllm-2024, trtllm-2024, constants, or a fit-engine file; default: the "
                        "calibration's engine entry, else vllm-2024)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the ``predict`` sub-commands on ``p`` (the ``libra-calibrate predict`` parser)."""
    sub = p.add_subparsers(dest="predict_what", metavar="WHAT")
    sub.required = True

    d = sub.add_parser("decode", help="one decode iteration (ms)")
    _common(d)
    d.add_argument("--tp", type=int, required=True)
    d.add_argument("--batch", type=int, required=True, help="running sequences")
    d.add_argument("--context", type=int, required=True, help="KV tokens of EACH sequence")
    d.add_argument("--ignore-memory", action="store_true", help="predict even if the KV cache does not fit")

    f = sub.add_parser("prefill", help="one prefill forward (ms)")
    _common(f)
    f.add_argument("--tp", type=int, required=True)
    f.add_argument("--tokens", type=int, required=True, help="new tokens per sequence")
    f.add_argument("--cached", type=int, default=0, help="tokens already in each sequence's KV cache")
    f.add_argument("--batch", type=int, default=1, help="sequences prefilled together")

    t = sub.add_parser("train", help="one optimizer step (s)")
    _common(t)
    t.add_argument("--gpus", type=int, default=None, help="training GPUs (= tp*pp*dp)")
    t.add_argument("--tp", type=int, default=1)
    t.add_argument("--pp", type=int, default=1)
    t.add_argument("--dp", type=int, default=None, help="default: gpus / (tp*pp)")
    t.add_argument("--ep", type=int, default=1)
    t.add_argument("--zero", type=int, default=1, help="ZeRO stage 0-3")
    t.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    t.add_argument("--recompute", action="store_true", help="full activation recomputation")
    t.add_argument("--global-batch-tokens", type=int, required=True, help="tokens per optimizer step")
    t.add_argument("--seq-len", type=int, required=True, help="tokens per packed sequence")
    t.add_argument("--forward-only", action="store_true", help="a log-prob forward pass instead of a step")
    t.add_argument("--ignore-memory", action="store_true", help="predict even if it does not fit in memory")

    m = sub.add_parser("memory", help="a rollout instance's memory and KV-cache capacity")
    _common(m)
    m.add_argument("--tp", type=int, required=True)
    m.add_argument("--gpu-mem-util", type=float, default=0.9)


def _positive(name: str, v: int, minimum: int = 1) -> None:
    from cost_models.errors import CostModelError

    if v < minimum:
        raise CostModelError(f"--{name} must be >= {minimum}, got {v}")


def _evaluator(args: argparse.Namespace, **kw: Any) -> Any:
    from cost_models.evaluator import CostEvaluator

    return CostEvaluator(args.gpu, args.model, args.calibration, args.gpus_per_node, engine=args.engine, **kw)


def _check_kv(ev: Any, tp: int, batch: int, context: int) -> None:
    """A decode whose KV cache (batch x context tokens) does not fit the instance's memory is an
    error naming what would fit, as ``predict train`` refuses a strategy that does not fit: a
    time for an impossible batch reads like a prediction (Qwen3-32B, TP 1, 256 x 32K on an H100)."""
    from cost_models.errors import CostModelError

    rep = ev.rollout_memory(tp)
    have = int(rep.extra["kv_tokens"]) if rep.fits else 0
    need = batch * context
    if need <= have:
        return
    kv: dict[int, int] = {tp: have}
    for t in (2, 4, 8):  # the rollout TPs the planner considers (ROLLOUT_MAX_TP = 8)
        if t > tp:
            try:
                r = ev.rollout_memory(t)
            except CostModelError:  # not a valid TP for this model or node
                continue
            kv[t] = int(r.extra["kv_tokens"]) if r.fits else 0
    bigger = [t for t in sorted(kv) if t > tp and kv[t] >= need]
    best = max(kv, key=lambda t: (kv[t] // max(context, 1), -t))
    if bigger:
        hint_s = f"TP {bigger[0]}" + (f", or batch <= {have // context:,} at TP {tp}" if have >= context else "")
    elif kv[best] >= context:
        hint_s = f"batch <= {kv[best] // context:,} at TP {best}"
    else:
        hint_s = "a shorter context or a GPU with more memory"
    where = f"the KV cache holds {have:,} tokens" if rep.fits else f"the weights alone do not fit ({rep.summary()})"
    raise CostModelError(f"decode {ev.model.name} on {ev.gpu.name} tp={tp}: batch {batch} x context {context:,} = "
                         f"{need:,} KV tokens does not fit: {where}; would fit: {hint_s} (--ignore-memory to predict anyway)")


def _emit(args: argparse.Namespace, obj: dict[str, Any], line: str) -> None:
    print(json.dumps(obj) if args.json else line)


def run(args: argparse.Namespace) -> int:
    """Answer the question in ``args``; returns 0. Bad input raises ``CostModelError``."""
    from cost_models.errors import CostModelError
    from cost_models.training import TrainStrategy

    what = args.predict_what
    if what == "decode":
        _positive("batch", args.batch)
        _positive("context", args.context, 0)
        ev = _evaluator(args)
        if not args.ignore_memory:
            _check_kv(ev, args.tp, args.batch, args.context)
        s = float(ev.decode_s(args.tp, args.batch, args.batch * args.context))
        _emit(
            args,
            {"ms": s * 1e3, "tokens_per_s": args.batch / s},
            f"decode {ev.model.name} on {ev.gpu.name} tp={args.tp} batch={args.batch} context={args.context}/seq: "
            f"{s * 1e3:.3f} ms/iteration ({args.batch / s:,.0f} tokens/s)",
        )
    elif what == "prefill":
        _positive("tokens", args.tokens)
        _positive("cached", args.cached, 0)
        _positive("batch", args.batch)
        ev = _evaluator(args)
        s = float(ev.prefill_s(args.tp, args.tokens, args.cached, args.batch))
        _emit(
            args,
            {"ms": s * 1e3, "tokens_per_s": args.batch * args.tokens / s},
            f"prefill {ev.model.name} on {ev.gpu.name} tp={args.tp} {args.batch} x {args.tokens} tokens "
            f"(+{args.cached} cached): {s * 1e3:.3f} ms ({args.batch * args.tokens / s:,.0f} tokens/s)",
        )
    elif what == "train":
        _positive("global-batch-tokens", args.global_batch_tokens)
        _positive("seq-len", args.seq_len)
        for name in ("tp", "pp", "ep", "micro_batch"):
            _positive(name.replace("_", "-"), getattr(args, name))
        ev = _evaluator(args)
        ev.validate(TrainStrategy(args.tp, args.pp, 1))  # name a bad tp/pp before any GPU-count arithmetic
        dp = args.dp
        if dp is None:
            if args.gpus is None:
                raise CostModelError("give --dp or --gpus (dp defaults to gpus / (tp*pp))")
            if args.gpus % (args.tp * args.pp):
                raise CostModelError(f"--gpus {args.gpus} is not a multiple of tp*pp = {args.tp * args.pp}")
            dp = args.gpus // (args.tp * args.pp)
        _positive("dp", dp)
        strat = TrainStrategy(args.tp, args.pp, dp, args.ep, args.zero, args.micro_batch, args.recompute)
        ev.validate(strat, args.gpus)
        mem = ev.train_memory(strat, args.seq_len, suggest=not args.ignore_memory)
        if not mem.fits and not args.ignore_memory:
            raise CostModelError(mem.summary())
        fn = ev.forward_s if args.forward_only else ev.train_iter_s
        s = float(fn(strat, args.global_batch_tokens, args.seq_len))
        kind = "forward pass" if args.forward_only else "train step"
        _emit(
            args,
            {
                "s": s,
                "tokens_per_s": args.global_batch_tokens / s,
                "memory_gb": mem.total_bytes / 1e9,
                "fits": mem.fits,
            },
            f"{kind} {ev.model.name} on {strat.n_gpus} x {ev.gpu.name} tp={strat.tp} pp={strat.pp} dp={strat.dp}"
            f"{f' ep={strat.ep}' if strat.ep > 1 else ''} zero={strat.zero_stage} mb={strat.micro_batch}"
            f"{' recompute' if strat.recompute else ''}: {s:.3f} s for {args.global_batch_tokens} tokens "
            f"({args.global_batch_tokens / s:,.0f} tokens/s), {mem.total_bytes / 1e9:.1f} GB per GPU"
            f"{'' if mem.fits else ' (DOES NOT FIT)'}",
        )
    elif what == "memory":
        ev = _evaluator(args, gpu_mem_util=args.gpu_mem_util)
        rep = ev.rollout_memory(args.tp)
        obj = {
            "fits": rep.fits,
            "kv_tokens": int(rep.extra["kv_tokens"]),
            "max_running_seqs": ev.max_running_seqs(args.tp) if rep.fits else 0,
            "breakdown_gb": {k: v / 1e9 for k, v in rep.breakdown.items()},
        }
        _emit(args, obj, f"{rep.summary()}; KV cache {obj['kv_tokens']:,} tokens")
    else:  # argparse restricts the choices; kept for direct callers
        raise CostModelError(f"unknown predict target {what!r}; valid: decode, prefill, train, memory")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``predict`` on its own (``python -m cost_models.predict_cli decode ...``)."""
    from cost_models.errors import CostModelError

    parser = argparse.ArgumentParser(prog="libra-calibrate predict", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CostModelError as e:
        print(f"libra-calibrate predict: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
