"""MoE decode at rollout batches: the cost model's decode iteration (PREDICTED) against public
measurements, and what the iteration is made of (issue 17, item 2).

    .venv/bin/python experiments/moe_decode.py [--out experiments/results/moe_decode]

Three tables, every predicted number from the cost model with the bundled calibration
(SIMULATED / PREDICTED, never measured here):

1. End-to-end decode steps: ``experiments/data/moe_decode/moe_decode_public.csv`` (public vLLM
   TPOT measurements of Qwen3-30B-A3B, and a dense control from the same source; URL, date and
   conditions on every row) and the in-repo Argonne LLM-Inference-Bench rows of Mixtral-8x7B
   (``cost_models/data/measured/engine``; in-sample for the ``vllm-2024`` profile). Predicted with
   the default engine profile (``vllm-2024``, fitted on 2024 vLLM V0 runs) and with ``constants``
   (1 ms + 5 us per sequence, tables' kernels: what a low-overhead engine would add).
2. The fused-MoE kernel term of one layer (Qwen3-30B-A3B shape, H100, TP 2) against
   aiconfigurator's measured vLLM fused-MoE rows (the table it is fitted on) and against the HBM
   floor of the expert weights a step must read (expected distinct experts under uniform routing).
3. The decode iteration at rollout batches, split into its terms.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.engines.fit import tpot_s  # noqa: E402
from cost_models.engines.measurements import read_measurements  # noqa: E402
from cost_models.evaluator import CostEvaluator  # noqa: E402
from cost_models.memory import DTYPE_BYTES, kv_heads_per_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = Path(__file__).resolve().parent / "data" / "moe_decode" / "moe_decode_public.csv"
BENCH = ROOT / "cost_models" / "data" / "measured" / "engine" / "llm_inference_bench.csv"
AIC_H100 = ROOT / "cost_models" / "data" / "measured" / "aiconfigurator" / "h100_sxm" / "moe_perf.csv"
QWEN3_MOE_SHAPE = (2048, 768, 8, 128)  # hidden, expert inter, top-k, experts




def public_rows(evs: dict[tuple[str, str, str], CostEvaluator] | None = None) -> list[dict[str, object]]:
    """Every row of the public CSV with its predicted TPOT under both engine profiles."""
    evs = {} if evs is None else evs
    rows, _ = read_measurements(PUBLIC)
    meta = list(csv.DictReader(open(PUBLIC, newline="")))
    out = []
    for r, m in zip(rows, meta):
        pred = {}
        for eng in ("vllm-2024", "constants"):
            key = (r.gpu, r.model_name, eng)
            if key not in evs:
                evs[key] = CostEvaluator(r.gpu, r.model, engine=eng)
            pred[eng] = tpot_s(evs[key], r.tp, r.batch, r.input_len, r.output_len)
        out.append({"model": r.model_name, "gpu": r.gpu, "tp": r.tp, "batch": r.batch, "in": r.input_len,
                    "out": r.output_len, "measured_ms": r.value * 1e3, "pred_ms": pred["vllm-2024"] * 1e3,
                    "ratio": pred["vllm-2024"] / r.value, "pred_constants_ms": pred["constants"] * 1e3,
                    "ratio_constants": pred["constants"] / r.value, "source": m["source"], "date": m["date"]})
    return out


def mixtral_rows() -> list[dict[str, object]]:
    """The Argonne bench's vLLM Mixtral-8x7B rows, median predicted / measured per (GPU, TP, batch)."""
    from cost_models.engines.fit import predict_row

    rows, _ = read_measurements(BENCH, only_engine="vLLM", skip_unknown=True)
    evs: dict[str, CostEvaluator] = {}
    agg: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for r in rows:
        if "ixtral" not in r.model_name:
            continue
        if r.gpu not in evs:
            evs[r.gpu] = CostEvaluator(r.gpu, r.model)
        agg[(r.gpu, r.tp, r.batch)].append(predict_row(evs[r.gpu], r) / r.value)
    return [{"gpu": g, "tp": t, "batch": b, "rows": len(v), "median_ratio": float(np.median(v))}
            for (g, t, b), v in sorted(agg.items())]


def aic_rows(tp: int = 2) -> dict[str, dict[int, float]]:
    """aiconfigurator's measured latency (s) of the Qwen3-30B-A3B fused-MoE layer on H100 at
    ``tp``, per routing distribution and token count."""
    h, inter, k, e = QWEN3_MOE_SHAPE
    out: dict[str, dict[int, float]] = defaultdict(dict)
    with open(AIC_H100, newline="") as f:
        for row in csv.DictReader(f):
            if (int(row["hidden_size"]), int(row["inter_size"]), int(row["topk"]), int(row["num_experts"]),
                    int(row["moe_tp_size"]), int(row["moe_ep_size"])) == (h, inter, k, e, tp, 1):
                out[row["distribution"]][int(row["num_tokens"])] = float(row["latency"]) * 1e-3
    return out


def hbm_floor_s(gpu_bw: float, tokens: int, tp: int) -> float:
    """Seconds to read the weights of the expected distinct experts ``tokens`` tokens hit (top-k
    of E, uniform routing) for one layer on one GPU of a TP group, at the datasheet bandwidth."""
    h, inter, k, e = QWEN3_MOE_SHAPE
    hit = e * (1.0 - (1.0 - k / e) ** tokens)
    return hit * 3 * h * (inter / tp) * DTYPE_BYTES / gpu_bw


def kernel_rows(tp: int = 2) -> list[dict[str, object]]:
    ev = CostEvaluator("h100", "qwen3-30b-a3b")
    h, inter, k, e = QWEN3_MOE_SHAPE
    meas = aic_rows(tp)
    out = []
    for x in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        model = float(ev.ops.moe_s(x, h, inter, k, e, tp, 1))
        out.append({"tokens": x, "model_us": model * 1e6, "power_law_1.01_us": meas["power_law_1.01"][x] * 1e6,
                    "balanced_us": meas["balanced"][x] * 1e6, "hbm_floor_us": hbm_floor_s(ev.gpu.hbm_bw, x, tp) * 1e6})
    return out


def breakdown(gpu: str = "h100", model: str = "qwen3-30b-a3b", tp: int = 2, ctx: int = 2000,
              batches: tuple[int, ...] = (1, 16, 64, 256)) -> list[dict[str, object]]:
    """The decode iteration (PREDICTED) split into MoE / MLP kernels, attention, the other kernels,
    the engine profile's kernel scale and its overhead (ms)."""
    ev = CostEvaluator(gpu, model)
    rt = ev._rollout
    md, ops = rt.model, rt.ops
    L, hd = md.n_layers, float(md.hidden)
    out = []
    for b in batches:
        m = float(b)
        if md.is_moe:
            mlp = float(ops.moe_s(m, hd, md.moe_intermediate, md.experts_per_token, md.n_experts, tp, 1))
        else:
            it = md.intermediate / tp
            mlp = float(ops.gemm_s(m, 2 * it, hd) + ops.gemm_s(m, hd, it))
        qh, kh = rt._heads(tp)
        a0, per = ops.decode_coefficients(m, qh, kh)
        attn = float(a0 + per * b * ctx)
        kernels = L * (float(rt._dense_part(tp, m)) + attn) + float(rt._ends(tp, m, m))
        ovh = float(rt._overhead(tp, m, False))
        total = float(ev.decode_s(tp, b, b * ctx))
        assert math.isclose(total, rt._scale * kernels + ovh, rel_tol=1e-9)
        out.append({"batch": b, "total_ms": total * 1e3, "moe_or_mlp_ms": L * mlp * 1e3, "attention_ms": L * attn * 1e3,
                    "other_kernels_ms": (kernels - L * (mlp + attn)) * 1e3,
                    "kernel_scale_ms": (rt._scale - 1.0) * kernels * 1e3, "engine_overhead_ms": ovh * 1e3,
                    "kv_heads_per_gpu": kv_heads_per_gpu(md, tp)})
    return out


def _table(rows: list[dict[str, object]], cols: list[str]) -> list[str]:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "moe_decode"))
    a = ap.parse_args(argv)
    lines = ["# MoE decode at rollout batches: predicted (SIMULATED) vs public measurements", "",
             "`python experiments/moe_decode.py`. Predicted = the cost model, bundled calibration; "
             "`vllm-2024` is the default engine profile, `constants` the low-overhead one.", "",
             "## 1. End-to-end decode steps (mean TPOT, ms)", ""]
    pub = public_rows()
    lines += _table(pub, ["model", "gpu", "tp", "batch", "in", "out", "measured_ms", "pred_ms", "ratio",
                          "pred_constants_ms", "ratio_constants", "date", "source"])
    lines += ["", "Argonne LLM-Inference-Bench, vLLM (2024, V0) Mixtral-8x7B, median predicted / measured request "
              "latency (in-sample: these rows are in the `vllm-2024` fit):", ""]
    lines += _table(mixtral_rows(), ["gpu", "tp", "batch", "rows", "median_ratio"])
    lines += ["", "## 2. Fused-MoE layer, Qwen3-30B-A3B shape, H100, TP 2 (us)", "",
              "model = the cost model's `moe_s`; power-law / balanced = aiconfigurator's measured vLLM fused-MoE "
              "rows; HBM floor = expected distinct experts (uniform top-8 of 128) x their weight bytes / 3.35 TB/s.", ""]
    lines += _table(kernel_rows(), ["tokens", "model_us", "power_law_1.01_us", "balanced_us", "hbm_floor_us"])
    lines += ["", "## 3. The decode iteration, split (H100, TP 2, 2,000 KV tokens per sequence, ms, PREDICTED)", ""]
    cols = ["batch", "total_ms", "moe_or_mlp_ms", "attention_ms", "other_kernels_ms", "kernel_scale_ms",
            "engine_overhead_ms"]
    lines += ["Qwen3-30B-A3B:", ""] + _table(breakdown(), cols)
    lines += ["", "Qwen3-32B at TP 4 (dense, same engine profile), for comparison:", ""]
    lines += _table(breakdown(model="qwen3-32b", tp=4), cols)
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
