"""``libra-calibrate profile``: measure this machine's operators with torch, in the calibration
CSV schema, so ``libra-calibrate fit`` turns them into a calibration for this device.

Why: the CPU engine, the tests and any GPU not in the bundled data need timings of their own;
writing the same files aiconfigurator does means one fitting path for all of them.

What is measured (latency in milliseconds after warm-up: the median of CUDA-event timings on a
GPU, the minimum of wall-clock repeats on a CPU, where other processes preempt threads):

- ``gemm_perf.csv``: ``torch.nn.functional.linear`` of an (m x k) input by an (n x k) weight;
- ``context_attention_perf.csv``: causal ``scaled_dot_product_attention`` over ``isl`` tokens;
- ``generation_attention_perf.csv``: one query token per sequence against ``step`` cached keys;
- ``nccl_perf.csv`` (cuda with 2+ GPUs only): ``all_reduce`` among 2..N GPUs, one process each.

With ``engine_model`` (``--engine-model DIR``) it then times that model's decode and prefill
iterations as the torch engine runs them and fits the engine's per-iteration overhead against
the operators just measured (``engine_profile``): ``engine.csv`` and an ``engine`` entry in
``profile_meta.json``, which ``fit`` copies into the calibration. ``engine_only`` skips the
operator sweep and reuses the CSVs already in the folder.

On CPU the default dtype is float32: bf16 matmul is emulated on most CPUs and an order of
magnitude slower than what the CPU engine actually runs; ``profile_meta.json`` records the dtype,
device, torch version and thread count, and ``fit`` copies it into the calibration's provenance.
Head size is 128 as in the bundled data.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cost_models.errors import CostModelError

HEAD_DIM = 128


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CostModelError(
            "profiling needs torch, which is not installed: pip install 'libra-rl[profile]'"
        ) from None
    return torch


class _Grid:
    """The shapes to sweep; ``quick`` keeps a test run to a few seconds on a laptop CPU."""

    def __init__(self, quick: bool, device: str) -> None:
        big = device == "cuda"
        if quick:
            self.gemm_m = [1, 8, 32, 128]
            self.gemm_nk = [64, 256, 512]
            self.prefill = [(b, s) for b in (1, 2) for s in (16, 64, 256)]
            self.decode = [(b, s) for b in (1, 4, 16) for s in (15, 127, 1023)]
            self.heads = [(4, 1), (8, 2)]
            self.repeats, self.warmup = 7, 2
        else:
            self.gemm_m = [1, 4, 16, 64, 128, 256, 512, 1024, 2048] + ([4096, 8192] if big else [])
            self.gemm_nk = [128, 256, 512, 1024, 2048, 4096] + ([8192, 16384] if big else [])
            lengths = [16, 64, 256, 1024, 2048] + ([4096, 8192] if big else [])
            self.prefill = [(b, s) for b in (1, 2, 4, 8) for s in lengths if b * s <= (65536 if big else 8192)]
            steps = [15, 127, 1023, 4095] + ([16383, 65535] if big else [])
            self.decode = [(b, s) for b in (1, 4, 16, 64, 256) for s in steps if b * s <= (4 << 20 if big else 1 << 18)]
            self.heads = [(4, 1), (8, 1), (8, 2), (16, 2), (32, 8)]
            self.repeats, self.warmup = (20, 5) if big else (7, 2)


def _timer(torch: Any, device: str) -> Callable[[Callable[[], Any], int, int], float]:
    """Median wall time (ms) of ``fn`` over ``repeats`` runs after ``warmup`` runs."""

    def run(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            return statistics.median(times)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        # On a CPU shared with other processes, a preempted OpenMP thread stalls the kernel's
        # barrier for a scheduler slice (milliseconds); the minimum is the undisturbed time.
        return min(times)

    return run


def _write(path: Path, header: list[str], rows: Iterable[list[Any]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow([f"{v:.5g}" if isinstance(v, float) else v for v in r])
    return path


def profile(
    device: str,
    out: Path,
    quick: bool = False,
    dtype: str = "auto",
    threads: int | None = None,
    engine_model: str | os.PathLike[str] | None = None,
    engine_only: bool = False,
    gpu: str | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """Measure and write the CSVs (plus ``profile_meta.json``) into ``out``; returns the paths.
    ``threads`` sets torch's intra-op threads (one thread gives stable timings on a CPU that
    other processes share: no OpenMP barrier waits on a preempted thread). ``engine_model``
    adds the engine-overhead measurement of that model folder (see module docstring); ``gpu``
    is the catalog name of the device (default ``cpu`` on a CPU; required on cuda with
    ``engine_model``, since the overhead is fitted against that device's operator model);
    ``log`` receives one line per engine point and the fit's summary."""
    if engine_only and engine_model is None:
        raise CostModelError("--engine-only needs --engine-model DIR")
    spec = None
    if engine_model is not None:
        from cost_models.hardware import get_gpu

        if gpu is None and device == "cuda":
            raise CostModelError("--engine-model on cuda needs --gpu NAME (a100, h100, h200, ...): "
                                 "the overhead is fitted against that GPU's operator model")
        spec = get_gpu(gpu or "cpu")
    torch = _import_torch()
    if threads is not None:
        if threads < 1:
            raise CostModelError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise CostModelError("--device cuda: torch sees no CUDA device (use --device cpu)")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "profile_meta.json"
    if engine_only:
        if not meta_path.is_file():
            raise CostModelError(f"--engine-only: {meta_path} not found (profile the operators into {out} first)")
        meta = json.loads(meta_path.read_text())
        written = _profile_engine(torch, Path(engine_model), device, out, spec, quick, meta, log)  # type: ignore[arg-type]
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        return written + [meta_path]
    written = _profile_operators(torch, device, out, quick, dtype)
    meta = {
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine(),
        "dtype": dtype,
        "dtype_note": "" if dtype == "bfloat16" else
        "float32: bf16 matmul is emulated on this CPU and far slower than what runs in practice",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": quick,
        "head_dim": HEAD_DIM,
        "latency_unit": "ms (" + ("median" if device == "cuda" else "minimum") + " of repeats)",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if engine_model is not None:
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")  # the operator fit reads the folder
        written += _profile_engine(torch, Path(engine_model), device, out, spec, quick, meta, log)  # type: ignore[arg-type]
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    written.append(meta_path)
    return written


def _profile_engine(torch: Any, model_dir: Path, device: str, out: Path, spec: Any, quick: bool,
                    meta: dict[str, Any], log: Callable[[str], None] | None) -> list[Path]:
    """Run the engine measurement and record its fit in ``meta["engine"]``."""
    from cost_models.calibration.engine_profile import profile_engine

    path, fit = profile_engine(torch, model_dir, device, out, spec, quick=quick, progress=log)
    meta["engine"] = {
        "step_s": fit.step_s,
        "per_seq_s": fit.per_seq_s,
        "source": {
            "model": str(model_dir),
            "device": device,
            "gpu": spec.name,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "quick": quick,
            "measured": "median of repeats; engine iterations of the batched torch engine, float32",
            **fit.to_source(),
        },
    }
    if log:
        ho = ", ".join(f"{k} {v:.1f}%" for k, v in fit.holdout_mape.items())
        ins = ", ".join(f"{k} {v:.1f}%" for k, v in fit.insample_mape.items())
        log(f"engine overhead: step {fit.step_s * 1e3:.3f} ms + {fit.per_seq_s * 1e6:.1f} us per sequence "
            f"({fit.rows} iterations; operators explain a median {fit.compute_share * 100:.0f}% of each)")
        log(f"MAPE of operators + overhead vs measured: held-out ({fit.holdout_rows} points) {ho}; in-sample {ins}")
    return [path]


def _profile_operators(torch: Any, device: str, out: Path, quick: bool, dtype: str) -> list[Path]:
    """The operator sweep: GEMM, attention (and all-reduce on 2+ GPUs) CSVs."""
    tdtype = getattr(torch, dtype)
    grid = _Grid(quick, device)
    timed = _timer(torch, device)
    dev = torch.device(device)
    written: list[Path] = []
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=dev, dtype=tdtype)

    with torch.inference_mode():
        rows = []
        for m in grid.gemm_m:
            for n in grid.gemm_nk:
                for k in grid.gemm_nk:
                    a, w = rand(m, k), rand(n, k)
                    rows.append([m, n, k, timed(lambda: torch.nn.functional.linear(a, w), grid.repeats, grid.warmup)])
        written.append(_write(out / "gemm_perf.csv", ["m", "n", "k", "latency"], rows))

        sdpa = torch.nn.functional.scaled_dot_product_attention
        rows = []
        for h, kv in grid.heads:
            for b, s in grid.prefill:
                q, k_, v = rand(b, h, s, HEAD_DIM), rand(b, kv, s, HEAD_DIM), rand(b, kv, s, HEAD_DIM)
                ms = timed(lambda: sdpa(q, k_, v, is_causal=True, enable_gqa=True), grid.repeats, grid.warmup)
                rows.append([b, s, h, kv, ms])
        written.append(_write(out / "context_attention_perf.csv",
                              ["batch_size", "isl", "num_heads", "num_key_value_heads", "latency"], rows))

        rows = []
        for h, kv in grid.heads:
            for b, s in grid.decode:
                q, k_, v = rand(b, h, 1, HEAD_DIM), rand(b, kv, s, HEAD_DIM), rand(b, kv, s, HEAD_DIM)
                ms = timed(lambda: sdpa(q, k_, v, enable_gqa=True), grid.repeats, grid.warmup)
                rows.append([b, h, kv, s, ms])
        written.append(_write(out / "generation_attention_perf.csv",
                              ["batch_size", "num_heads", "num_key_value_heads", "step", "latency"], rows))

    n_dev = torch.cuda.device_count() if device == "cuda" else 1
    if n_dev >= 2:
        written.append(_profile_allreduce(torch, out, n_dev, quick))
    return written


def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], repeats: int, result: Any) -> None:
    """One process per GPU: time NCCL all-reduce of each size (elements of 2 bytes)."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    for n in sizes:
        x = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        if rank == 0:
            result.put((world, n, (time.perf_counter() - t0) / repeats * 1e3))
    dist.destroy_process_group()


def _profile_allreduce(torch: Any, out: Path, n_dev: int, quick: bool) -> Path:
    import torch.multiprocessing as mp

    sizes = [1 << p for p in range(8, 25 if quick else 29, 2)]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    rows = []
    world = 2
    port = 29500 + os.getpid() % 1000
    while world <= n_dev:
        mp.start_processes(_allreduce_worker, args=(world, port + world, sizes, 5 if quick else 20, result),
                           nprocs=world, join=True, start_method="spawn")
        while not result.empty():
            w, n, ms = result.get()
            rows.append(["all_reduce", w, n, ms])
        world *= 2
    return _write(out / "nccl_perf.csv", ["op_name", "num_gpus", "message_size", "latency"], rows)
