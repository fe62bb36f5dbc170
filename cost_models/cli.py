"""``libra-calibrate``: fit operator models on measured data, report their fidelity, and profile
this machine.

Subcommands: ``fit`` (CSV folder -> versioned calibration JSON), ``report`` (held-out MAPE per
operator family and GPU; ``--engine`` for an engine profile's TP speed-up error), ``fit-engine``
(end-to-end runs -> engine profile JSON, ``cost_models.engines``), ``profile`` (measure this machine with torch into the same CSV
schema), and ``predict`` when ``cost_models.predict_cli`` is present. Heavy imports (pandas,
torch, rich) happen inside the subcommand, so ``--help`` is fast. A user mistake
(``CostModelError``) prints ``libra-calibrate: error: ...`` on one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from cost_models.errors import CostModelError

PROG = "libra-calibrate"
DEFAULT_REPORT_GPUS = ("a100", "h100", "h200", "b200", "gb200")


# ---- fit -----------------------------------------------------------------------------------
def _add_fit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="folder of aiconfigurator-style CSVs (gemm_perf.csv, ...)")
    p.add_argument("--gpu", required=True, help="catalog name of the device measured (a100, h100, h200, b200, gb200, cpu, ...)")
    p.add_argument("-o", "--output", required=True, help="calibration JSON to write")
    p.add_argument("--network", help="optional Vidur network folder (send_recv.csv) for intra-node p2p")
    p.add_argument("--nccl-logs", help="optional folder of multi-node nccl-tests all_reduce logs")
    p.add_argument("--nccl-logs-gpu", default="a100",
                   help="GPU whose network the nccl-tests logs were measured on (default a100)")
    p.add_argument("--network-gpu", help="GPU the --network profile was measured on when it is not --gpu "
                   "(its send/recv bandwidth is rescaled to --gpu's NVLink; b200/gb200 use h100's)")
    p.add_argument("--comm-extend", metavar="DIR",
                   help="aiconfigurator folder of the same NVLink generation whose collective tables carry --data's "
                        "to GPU counts it did not measure (gb200: b200_sxm)")


def _run_fit(args: argparse.Namespace) -> int:
    from cost_models.calibration.fit import fit_folder

    calib = fit_folder(args.data, args.gpu, args.network, args.nccl_logs, args.nccl_logs_gpu, args.network_gpu,
                       args.comm_extend)
    out = calib.save(args.output)
    fams = ", ".join(sorted(calib.families))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {calib.gpu}, families {fams}")
    if calib.engine is not None:
        print(f"engine overhead: step {calib.engine.step_s * 1e3:.3f} ms + {calib.engine.per_seq_s * 1e6:.1f} us "
              "per sequence (from profile --engine-model)")
    return 0


# ---- report --------------------------------------------------------------------------------
def _add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", nargs="+", default=list(DEFAULT_REPORT_GPUS), help="GPUs to report (default: all bundled)")
    p.add_argument("--data-root", help="measured-data root holding aiconfigurator/, vidur/, echo/ "
                   "(default: $LIBRA_CALIBRATION_DATA or a shared/calibration folder nearby)")
    p.add_argument("--out", help="folder for operator_report.md and operator_report.csv")
    p.add_argument("--seed", type=int, default=0, help="seed of the random split (default 0)")
    p.add_argument("--quick", action="store_true", help="subsample each family to 1500 rows (seconds)")
    p.add_argument("--family", nargs="+", help="only these families")
    p.add_argument("--engine", nargs="?", const="", metavar="NAME",
                   help="report an engine profile instead (TP speed-up and whole-request error per GPU and TP, "
                        "leave-one-model-out); NAME is a bundled profile (default: the default profile)")


def _run_engine_report(args: argparse.Namespace) -> int:
    from cost_models.engines import report as erep
    from cost_models.engines.registry import BUNDLED_RECIPES, DEFAULT_PROFILE

    names = [args.engine or DEFAULT_PROFILE] if args.engine != "all" else sorted(BUNDLED_RECIPES)
    for n in names:
        if n.lower() not in BUNDLED_RECIPES:
            raise CostModelError(f"--engine {n!r}: no bundled measurements to report on; valid: "
                                 f"{', '.join(sorted(BUNDLED_RECIPES))}, all")
    texts = []
    for n in names:
        profile, cells, _ = erep.engine_report(n.lower(), args.data_root)
        texts.append(erep.to_markdown(profile.name, cells))
    text = "\n".join(texts)
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "libra-calibrate report --engine" + (f" {args.engine}" if args.engine else "")
        (out / "engine_report.md").write_text(f"`{cmd}`\n\n" + text)
        print(f"wrote {out / 'engine_report.md'}")
    return 0


# ---- fit-engine ------------------------------------------------------------------------------
def _add_fit_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("measurements", nargs="?", metavar="MEASUREMENTS.csv",
                   help="end-to-end runs: model, tp, batch, input_len, output_len, and request_latency_s, tpot_ms "
                        "or output_tok_s_total (optional gpu, engine columns); see docs/cost-model.md")
    p.add_argument("--gpu", help="catalog GPU of rows without a gpu column/cell")
    p.add_argument("-o", "--output", help="engine profile JSON to write")
    p.add_argument("--name", help="profile name (default: the output file's stem)")
    p.add_argument("--only-engine", metavar="ENGINE", help="use only rows whose engine column equals this (e.g. vLLM)")
    p.add_argument("--skip-unknown", action="store_true",
                   help="skip rows whose model or GPU the cost model does not know instead of failing")
    p.add_argument("--terms", help="comma-separated terms to fit instead of choosing them by leave-one-model-out "
                                   "(step_s, per_seq_s, per_worker_s, per_collective_s, per_layer_s)")
    p.add_argument("--kernel-scale", choices=("auto", "fit", "fixed"), default="auto",
                   help="fit a multiplicative kernel scale (fit), keep it 1 (fixed), or let cross-validation choose (auto)")
    p.add_argument("--base", metavar="NAME|FILE", default=None,
                   help="profile whose values the terms your rows cannot identify keep (default: the default profile, "
                        "vllm-2024); e.g. runs of one model at TP 1 and 2 cannot separate per-worker from per-all-reduce cost")
    p.add_argument("--rebuild-bundled", action="store_true",
                   help="refit every bundled profile (cost_models/data/engines) from the measured data it came from")
    p.add_argument("--data-root", help="with --rebuild-bundled: the measured-data root (default: the bundled copy)")


def _run_fit_engine(args: argparse.Namespace) -> int:
    from cost_models.engines import fit as efit
    from cost_models.engines.profile import TERMS
    from cost_models.engines.registry import BUNDLED_DIR, BUNDLED_RECIPES

    scale = {"auto": None, "fit": True, "fixed": False}[args.kernel_scale]
    terms = None
    if args.terms:
        terms = [t.strip() for t in args.terms.split(",") if t.strip()]
        bad = [t for t in terms if t not in TERMS]
        if bad:
            raise CostModelError(f"--terms: unknown term {bad[0]!r}; valid: {', '.join(TERMS)}")
        if scale is None:
            scale = False
    if args.rebuild_bundled:
        if args.measurements or args.output or args.base:
            raise CostModelError("--rebuild-bundled takes no MEASUREMENTS.csv, -o or --base (it rewrites cost_models/data/engines)")
        fits = [efit.fit_bundled(n, args.data_root) for n in sorted(BUNDLED_RECIPES)]
        for f in fits:
            _print_fit(f, f.profile.save(BUNDLED_DIR / f"{f.profile.name}.json"))
        return 0
    if not args.measurements or not args.output:
        raise CostModelError("fit-engine needs MEASUREMENTS.csv and -o PROFILE.json (or --rebuild-bundled)")
    from cost_models.engines.registry import get_profile

    name = args.name or Path(args.output).stem
    base = get_profile(args.base) if args.base else None
    cmd = " ".join(["libra-calibrate", "fit-engine", str(args.measurements)]
                   + [f"--{k.replace('_', '-')} {v}" for k, v in (("gpu", args.gpu), ("only_engine", args.only_engine),
                                                                  ("terms", args.terms), ("base", args.base)) if v]
                   + (["--skip-unknown"] if args.skip_unknown else []) + [f"--kernel-scale {args.kernel_scale}"])
    f = efit.fit_csv(args.measurements, name, gpu=args.gpu, only_engine=args.only_engine, skip_unknown=args.skip_unknown,
                     terms=terms, fit_scale=scale, command=cmd, base=base)
    _print_fit(f, f.profile.save(args.output))
    return 0


def _print_fit(f: object, out: Path) -> None:
    prof = f.profile  # type: ignore[attr-defined]
    src = prof.source
    terms = ", ".join(f"{t} {getattr(prof, t) * 1e6:.1f} us" for t in src["terms_fitted"] if t != "kernel_scale")
    print(f"wrote {out}: {prof.name} from {src['rows']} rows ({src['rows_skipped']} skipped, {len(src['rows_excluded'])} "
          f"below the physical floor): kernel_scale {prof.kernel_scale:.3f}, {terms}")
    by = src["cross_validation"]
    cv, ins = src[by.split(" ")[0].replace("-", "_")], src["insample"]
    pct = lambda v: "n/a" if v is None else f"{v:.1f}%"  # noqa: E731
    print(f"  held out ({by}): request MAPE {pct(cv['mape_pct'])}, median TP speed-up error "
          f"{pct(cv['speedup_err_median_pct'])} (in-sample {pct(ins['mape_pct'])}, {pct(ins['speedup_err_median_pct'])})")
    m = src["measured"]
    batch = f"{m['batch'][0]}" if m["batch"][0] == m["batch"][1] else f"{m['batch'][0]}-{m['batch'][1]}"
    print(f"  measured: TP {', '.join(map(str, m['tp']))}, batch {batch}, {', '.join(m['gpus'])} "
          "(predictions outside these are extrapolations; libra-sim plan says so)")
    for t, d in src["not_identifiable"].items():
        kept = f"{d['kept']:.3f}" if t == "kernel_scale" else f"{d['kept'] * 1e6:.1f} us"
        print(f"  not identifiable: {t}, kept at {d['from']}'s {kept}: {d['why']}")


def _output_dir(path: str | None) -> None:
    """``--out``, created and probed for writing before the report's fitting starts (a folder it
    cannot write, e.g. under /proc, was a FileNotFoundError after 12 s of work)."""
    if not path:
        return
    import tempfile

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".libra-probe-"):
            pass
    except OSError as exc:
        raise CostModelError(f"--out {path}: cannot write there ({exc.strerror or type(exc).__name__})") from None


def _run_report(args: argparse.Namespace) -> int:
    _output_dir(args.out)
    if args.engine is not None:
        return _run_engine_report(args)
    from rich.console import Console
    from rich.table import Table

    from cost_models.calibration import report as rep
    from cost_models.calibration.sources import BUNDLE_SOURCES, find_calibration_root

    unknown = [g for g in args.gpu if g not in BUNDLE_SOURCES]
    if unknown:
        raise CostModelError(f"no measured data for GPU {unknown[0]!r}; report covers: {', '.join(BUNDLE_SOURCES)}")
    fams = tuple(args.family) if args.family else rep.FAMILIES
    bad = [f for f in fams if f not in rep.FAMILIES]
    if bad:
        raise CostModelError(f"unknown family {bad[0]!r}; valid: {', '.join(rep.FAMILIES)}")
    root = find_calibration_root(args.data_root)
    console = Console(stderr=True)
    with console.status("fitting held-out splits") as status:
        scores = rep.run_report(root, list(args.gpu), seed=args.seed, max_rows=1500 if args.quick else None,
                                families=fams,
                                progress=lambda g, f, k: status.update(f"{g} {f} {k}"))
    table = Table(title="Operator models: absolute percentage error on held-out rows")
    for col in ("family", "GPU", "rows", "random MAPE (P90)", "extrap. MAPE (P90)", "in-sample", "roofline"):
        table.add_column(col, justify="left" if col in ("family", "GPU") else "right")
    df = rep.to_frame(scores)
    for (fam, gpu), g in df.groupby(["family", "gpu"], sort=False):
        by = {r.split: r for r in g.itertuples()}
        cell = lambda k: f"{by[k].mape:.1f}% ({by[k].p90:.1f}%)"  # noqa: E731
        table.add_row(fam, gpu, str(by["in-sample"].n_test), cell("random"), cell("extrapolation"),
                      f"{by['in-sample'].mape:.1f}%", f"{by['random'].roofline_mape:.0f}%")
    Console(width=max(Console().width, 132)).print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "operator_report.csv", index=False, float_format="%.4g")
        (out / "operator_report.md").write_text(
            f"Held-out fidelity of the fitted operator models (seed {args.seed}"
            f"{', quick subsample' if args.quick else ''}); `libra-calibrate report"
            f"{' --quick' if args.quick else ''} --gpu {' '.join(args.gpu)}`.\n\n" + rep.to_markdown(scores)
        )
        print(f"wrote {out / 'operator_report.md'} and {out / 'operator_report.csv'}")
    return 0


# ---- profile -------------------------------------------------------------------------------
def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device to measure (default cpu)")
    p.add_argument("--out", default="calibration-profile", help="folder for the CSVs (default ./calibration-profile)")
    p.add_argument("--quick", action="store_true", help="a small grid and few repeats (seconds, for tests)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto: bfloat16 on cuda, float32 on cpu (bf16 matmul is emulated and slow on most CPUs)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's; 1 is stable on a busy CPU)")
    p.add_argument("--engine-model", metavar="DIR",
                   help="also time this Hugging Face model's decode/prefill iterations as the torch engine runs "
                        "them and fit the engine's per-iteration overhead (engine.csv; fit carries it into the calibration)")
    p.add_argument("--engine-only", action="store_true",
                   help="with --engine-model: skip the operator sweep, reuse the CSVs already in --out")
    p.add_argument("--gpu", help="catalog name of the device for --engine-model (default cpu; required with --device cuda)")


def _run_profile(args: argparse.Namespace) -> int:
    from cost_models.calibration.profile import profile

    written = profile(args.device, Path(args.out), quick=args.quick, dtype=args.dtype, threads=args.threads,
                      engine_model=args.engine_model, engine_only=args.engine_only, gpu=args.gpu,
                      log=lambda line: print(line, flush=True))
    for path in written:
        print(f"wrote {path}")
    return 0


COMMANDS = {
    "fit": (_add_fit, _run_fit, "fit operator models on a folder of measured CSVs and write a calibration JSON"),
    "report": (_add_report, _run_report, "held-out MAPE of the fitted models per operator family and GPU"),
    "fit-engine": (_add_fit_engine, _run_fit_engine,
                   "fit an inference-engine profile (per-iteration overhead by TP and batch) on end-to-end runs"),
    "profile": (_add_profile, _run_profile,
                "measure this machine's GEMM/attention/all-reduce (and, with --engine-model, a model's engine "
                "overhead) into calibration CSVs"),
}


def build_parser() -> argparse.ArgumentParser:
    """The full parser; ``predict`` is added when its module is importable."""
    parser = argparse.ArgumentParser(prog=PROG, description="Fit, check and profile Libra's operator timing models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (add, run, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        p.set_defaults(_run=run)
    try:
        predict = importlib.import_module("cost_models.predict_cli")
    except ModuleNotFoundError as exc:
        if exc.name != "cost_models.predict_cli":
            raise
    else:
        help_ = getattr(predict, "HELP", "predict step times with the cost evaluator")
        p = sub.add_parser("predict", help=help_, description=help_)
        predict.add_arguments(p)
        p.set_defaults(_run=predict.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``libra-calibrate``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except CostModelError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
