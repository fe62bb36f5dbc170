"""Print the memory and timing tables of docs/cost-model.md (markdown) from the cost evaluator,
so the documented numbers can be regenerated after any change to the model or calibration.

    .venv/bin/python benchmarks/cost_model_tables.py
"""

from __future__ import annotations

from cost_models import CostEvaluator
from cost_models.memory import rollout_memory, train_memory
from cost_models.training import TrainStrategy, train_flops

GB = 1e9


def rollout_table(model: str) -> None:
    print(f"\n#### Rollout instance per GPU, {model} (gpu_mem_util 0.9, 8192 batched tokens, 256 seqs)\n")
    print("| GPU | TP | weights GB | activation peak GB | reserve GB | KV cache GB | KV tokens | max running seqs |")
    print("|---|---|---|---|---|---|---|---|")
    for gpu in ("a100", "h100", "h200"):
        ev = CostEvaluator(gpu, model)
        for tp in (1, 2, 4, 8):
            r = rollout_memory(gpu, model, tp)
            b = r.breakdown
            print(
                f"| {gpu} | {tp} | {b['weights'] / GB:.2f} | {b['activation_peak'] / GB:.2f} | {b['reserve'] / GB:.2f} | "
                f"{b['kv_cache'] / GB:.2f} | {r.extra['kv_tokens']:,} | {ev.max_running_seqs(tp) if r.fits else 0} |"
            )


def train_table(model: str, gpu: str, seq: int, strategies: list[TrainStrategy]) -> None:
    print(f"\n#### Training per GPU, {model} on {gpu}, seq_len {seq}, micro-batch 1\n")
    print("| tp | pp | dp | ep | ZeRO | recompute | weights | grads | optimizer | activations | logits | reserve | total GB | fits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in strategies:
        r = train_memory(gpu, model, s, seq, suggest=False)
        b = r.breakdown
        extra = b.get("zero3_gather_buffers", 0.0)
        print(
            f"| {s.tp} | {s.pp} | {s.dp} | {s.ep} | {s.zero_stage} | {'yes' if s.recompute else 'no'} | "
            f"{b['weights'] / GB:.1f} | {b['gradients'] / GB:.1f} | {b['optimizer'] / GB:.1f} | "
            f"{(b['activations'] + extra) / GB:.1f} | {b['logits'] / GB:.1f} | {b['reserve'] / GB:.1f} | "
            f"{r.total_bytes / GB:.1f} | {'yes' if r.fits else 'no'} |"
        )


def timing_table() -> None:
    print("\n#### Predicted times (bundled calibration)\n")
    print("| GPU | model | decode TP1 B1 ms | decode TP1 B64 ctx4096 ms | decode TP4 B64 ctx4096 ms | prefill TP1 4096 ms | train 1M tok (strategy) s | MFU |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [
        ("a800", "qwen3-14b", TrainStrategy(4, 1, 4)),
        ("h100", "qwen3-14b", TrainStrategy(4, 1, 4)),
        ("a800", "qwen3-30b-a3b", TrainStrategy(1, 1, 16, ep=8)),
        ("h100", "qwen3-30b-a3b", TrainStrategy(1, 1, 16, ep=8)),
        ("a800", "qwen3-32b", TrainStrategy(4, 2, 2)),
        ("h100", "qwen3-32b", TrainStrategy(4, 2, 2)),
    ]
    for gpu, model, s in cases:
        ev = CostEvaluator(gpu, model)
        tok = 1 << 20
        t = ev.train_iter_s(s, tok, 4096)
        mfu = train_flops(ev.model, tok, 4096) / (t * s.n_gpus * ev.gpu.bf16_flops)
        dec = [ev.decode_s(1, 1, 1024), ev.decode_s(1, 64, 64 * 4096), ev.decode_s(4, 64, 64 * 4096)]
        print(
            f"| {gpu} | {model} | {dec[0] * 1e3:.2f} | {dec[1] * 1e3:.2f} | {dec[2] * 1e3:.2f} | "
            f"{ev.prefill_s(1, 4096) * 1e3:.1f} | {t:.1f} (tp{s.tp} pp{s.pp} dp{s.dp}{f' ep{s.ep}' if s.ep > 1 else ''}) | {mfu:.0%} |"
        )


def main() -> None:
    rollout_table("qwen3-14b")
    rollout_table("qwen3-30b-a3b")
    train_table("qwen3-14b", "a800", 8192, [
        TrainStrategy(1, 1, 8, zero_stage=1), TrainStrategy(2, 1, 4, zero_stage=1), TrainStrategy(4, 1, 2, zero_stage=1),
        TrainStrategy(2, 1, 4, zero_stage=3), TrainStrategy(8, 1, 1, zero_stage=1), TrainStrategy(2, 2, 2, zero_stage=1),
        TrainStrategy(2, 1, 4, zero_stage=1, recompute=True),
    ])
    train_table("qwen3-30b-a3b", "a800", 8192, [
        TrainStrategy(1, 1, 8, ep=1, zero_stage=1), TrainStrategy(1, 1, 8, ep=8, zero_stage=1),
        TrainStrategy(2, 1, 4, ep=4, zero_stage=1), TrainStrategy(1, 1, 8, ep=8, zero_stage=3),
        TrainStrategy(1, 1, 8, ep=8, zero_stage=1, recompute=True),
    ])
    timing_table()


if __name__ == "__main__":
    main()
