#!/usr/bin/env python
"""The one-GPU check: measured kernels, model iterations and copies next to the cost model's
prediction for the same shapes, on a machine with only PyTorch + transformers (no vLLM, Ray,
DeepSpeed, no network).

    python scripts/gpu_check.py                     # CUDA device 0, catalog h200, <= ~8 min
    python scripts/gpu_check.py --gpu h100 --budget-s 300
    python scripts/gpu_check.py --dry-run           # CPU, tiny shapes (CI): the same code paths

Models are Qwen3-shaped ``config.json`` files written to ``OUT/configs/`` (0.6B, 1.7B, 4B, 8B;
the published Qwen3 shapes) built with random bf16 weights: nothing is downloaded. Sections:

- ``gemm``: bf16 matmuls of each model's projections at 1..8192 tokens vs ``ops.gemm_s``;
- ``attn_prefill``: causal SDPA (flash) at 512/4K/16K tokens vs ``ops.attn_prefill_s``;
- ``attn_decode``: one-token SDPA over batch {1,8,32,128} x context {512,4K,16K} vs ``ops.attn_decode_s``;
- ``decode_iter``: one decode iteration of the whole model (HF eager, random KV cache) vs the
  evaluator's ``decode_s`` (its engine profile included: the gap is what an eager HF model lacks
  against the engine the profile describes);
- ``train_iter``: forward + backward + AdamW (fp32 master weights, bf16 autocast) of a batch vs
  ``train_iter_s``, and its MFU (``training.train_flops`` / time / the catalog's bf16 peak);
- ``copy``: device-to-device and pinned host-to-device copies vs ``memory_bound_s`` and the
  catalog's ``pcie_bw``;
- ``torch_engine``: libra-run's torch engine on the device (the bundled tiny policy, batched
  turns) vs ``prefill_s`` + ``decode_s`` for the same tokens.

Every row: section, case, measured seconds (median of repeats, CUDA events), predicted seconds,
measured / predicted, an extra figure (TFLOP/s, GB/s, MFU) and a note; a section that would run
past ``--budget-s`` or out of memory is recorded as skipped with the reason. Writes
``OUT/gpu_check.csv`` and ``OUT/gpu_check.md`` (default OUT: out/gpu_check).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

#: Published Qwen3 dense shapes (hidden, layers, heads, kv heads, intermediate, tied embeddings).
QWEN3 = {
    "qwen3-0.6b": (1024, 28, 16, 8, 3072, True),
    "qwen3-1.7b": (2048, 28, 16, 8, 6144, True),
    "qwen3-4b": (2560, 36, 32, 8, 9728, True),
    "qwen3-8b": (4096, 36, 32, 8, 12288, False),
}
#: The dry run's stand-ins (CPU, seconds in all).
TINY = {"tiny": (64, 2, 4, 2, 128, False)}

FIELDS = ("section", "model", "case", "measured_s", "predicted_s", "measured_over_predicted", "extra", "note")


def qwen3_config(hidden: int, layers: int, heads: int, kv: int, inter: int, tied: bool, vocab: int = 151936,
                 head_dim: int = 128) -> dict[str, Any]:
    """A Qwen3 ``config.json`` of these shapes (what transformers and the cost model both read)."""
    special = (151643, 151645) if vocab > 151645 else (vocab - 2, vocab - 1)
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": inter,
            "vocab_size": vocab, "tie_word_embeddings": tied, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
            "bos_token_id": special[0], "eos_token_id": special[1]}


class Check:
    """Runs the sections against a deadline and collects rows."""

    def __init__(self, device: str, gpu: str, out: str, budget_s: float, dry: bool) -> None:
        import torch

        self.torch, self.device, self.gpu, self.out, self.dry = torch, torch.device(device), gpu, out, dry
        self.t0, self.budget_s = time.perf_counter(), budget_s
        self.rows: list[dict[str, Any]] = []
        self.cfg_dir = os.path.join(out, "configs")
        os.makedirs(self.cfg_dir, exist_ok=True)
        shapes = TINY if dry else QWEN3
        vocab, hd = (512, 16) if dry else (151936, 128)
        self.models: dict[str, str] = {}
        for name, sh in shapes.items():
            path = os.path.join(self.cfg_dir, name)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(qwen3_config(*sh, vocab=vocab, head_dim=hd), f, indent=1)
            self.models[name] = path
        self.evs: dict[str, Any] = {}

    # ---- helpers ---------------------------------------------------------------------------------
    def ev(self, model: str) -> Any:
        from cost_models import CostEvaluator

        if model not in self.evs:
            self.evs[model] = CostEvaluator(self.gpu, os.path.join(self.models[model], "config.json"), gpus_per_node=1)
        return self.evs[model]

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def time_it(self, fn: Callable[[], Any], repeat: int = 5, warmup: int = 2) -> float:
        """Median seconds of ``fn`` (CUDA events on a GPU, wall clock on CPU; the dry run times
        each case once after one warm-up: it checks code paths, not speeds)."""
        torch = self.torch
        if self.dry:
            repeat, warmup = 1, 1
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat):
            if self.device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    def add(self, section: str, model: str, case: str, measured: float | None, predicted: float | None, extra: str = "",
            note: str = "") -> None:
        ratio = measured / predicted if measured and predicted else None
        self.rows.append({"section": section, "model": model, "case": case, "measured_s": measured, "predicted_s": predicted,
                          "measured_over_predicted": ratio, "extra": extra, "note": note})
        m = f"{measured * 1e3:10.3f} ms" if measured else "         -   "
        p = f"{predicted * 1e3:10.3f} ms" if predicted else "         -   "
        r = f"{ratio:6.2f}" if ratio else "     -"
        print(f"{section:13s} {model:11s} {case:34s} {m} {p} {r}  {extra} {note}", flush=True)

    def guarded(self, section: str, model: str, case: str, need_s: float, fn: Callable[[], None]) -> None:
        """Run one case unless the budget cannot hold ``need_s`` more; record OOM as a skip."""
        if self.left_s() < need_s:
            self.add(section, model, case, None, None, note=f"skipped: time budget ({self.budget_s:.0f} s) spent")
            return
        try:
            fn()
        except self.torch.OutOfMemoryError as exc:  # type: ignore[attr-defined]
            self.add(section, model, case, None, None, note=f"skipped: out of memory ({str(exc).splitlines()[0][:60]})")
        finally:
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()

    # ---- sections --------------------------------------------------------------------------------
    def gemm(self) -> None:
        torch = self.torch
        tokens = (1, 16) if self.dry else (1, 128, 2048, 8192)
        for name in self.models:
            spec = self.ev(name).model
            shapes = {"qkv": (spec.hidden, spec.q_dim + 2 * spec.kv_dim), "o": (spec.q_dim, spec.hidden),
                      "gate_up": (spec.hidden, 2 * spec.intermediate), "down": (spec.intermediate, spec.hidden)}
            for m in tokens:
                for op, (k, n) in shapes.items():
                    def one(m: int = m, k: int = k, n: int = n, op: str = op) -> None:
                        a = torch.randn(m, k, dtype=torch.bfloat16, device=self.device)
                        b = torch.randn(k, n, dtype=torch.bfloat16, device=self.device)
                        t = self.time_it(lambda: a @ b, repeat=10)
                        pred = float(self.ev(name).ops.gemm_s(m, n, k))
                        self.add("gemm", name, f"{op} m={m} n={n} k={k}", t, pred, f"{2 * m * n * k / t / 1e12:.1f} TFLOP/s")
                    self.guarded("gemm", name, f"{op} m={m}", 2.0, one)

    def _heads(self) -> list[tuple[str, int, int, int]]:
        seen, out = set(), []
        for name in self.models:
            s = self.ev(name).model
            key = (s.n_heads, s.n_kv_heads, s.head_dim)
            if key not in seen:
                seen.add(key)
                out.append((name, *key))
        return out

    def attention(self) -> None:
        torch = self.torch
        import torch.nn.functional as F

        lens = (16,) if self.dry else (512, 4096, 16384)
        batches = (1, 2) if self.dry else (1, 8, 32, 128)
        for name, nh, nkv, hd in self._heads():
            ops = self.ev(name).ops
            for n in lens:
                def pre(n: int = n) -> None:
                    q = torch.randn(1, nh, n, hd, dtype=torch.bfloat16, device=self.device)
                    k = torch.randn(1, nkv, n, hd, dtype=torch.bfloat16, device=self.device)
                    v = torch.randn_like(k)
                    t = self.time_it(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                    self.add("attn_prefill", name, f"heads {nh}/{nkv} tokens={n}", t, float(ops.attn_prefill_s(1, n, 0, nh, nkv)))
                self.guarded("attn_prefill", name, f"tokens={n}", 3.0, pre)
            for b in batches:
                for n in lens:
                    def dec(b: int = b, n: int = n) -> None:
                        q = torch.randn(b, nh, 1, hd, dtype=torch.bfloat16, device=self.device)
                        k = torch.randn(b, nkv, n, hd, dtype=torch.bfloat16, device=self.device)
                        v = torch.randn_like(k)
                        t = self.time_it(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                        kv_bytes = 2 * b * nkv * n * hd * 2
                        self.add("attn_decode", name, f"heads {nh}/{nkv} batch={b} ctx={n}", t, float(ops.attn_decode_s(b, b * n, nh, nkv)),
                                 f"{kv_bytes / t / 1e9:.0f} GB/s KV")
                    self.guarded("attn_decode", name, f"batch={b} ctx={n}", 3.0, dec)

    def _model(self, name: str, dtype: Any) -> Any:
        from transformers import AutoConfig, AutoModelForCausalLM

        torch = self.torch
        cfg = AutoConfig.from_pretrained(self.models[name])
        torch.manual_seed(0)
        with torch.device(self.device):
            return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")

    def decode_iter(self) -> None:
        torch = self.torch
        from transformers import DynamicCache

        names = list(self.models)[:: max(1, len(self.models) - 1)]  # the smallest and the largest
        batches = (1, 2) if self.dry else (1, 8, 32, 128)
        lens = (16,) if self.dry else (512, 4096, 16384)
        kv_budget = 2e6 if self.dry else 40e9
        for name in names:
            if self.left_s() < 30:
                self.add("decode_iter", name, "all", None, None, note="skipped: time budget spent")
                continue
            ev = self.ev(name)
            model = self._model(name, torch.bfloat16).eval()
            s = ev.model
            for b in batches:
                for n in lens:
                    kv = s.kv_bytes_per_token() * b * n
                    if kv > kv_budget:
                        self.add("decode_iter", name, f"batch={b} ctx={n}", None, float(ev.decode_s(1, b, b * n)),
                                 note=f"skipped: KV cache {kv / 1e9:.0f} GB > {kv_budget / 1e9:.0f} GB budget")
                        continue

                    def one(b: int = b, n: int = n) -> None:
                        cache = DynamicCache()
                        for layer in range(s.n_layers):
                            k = torch.randn(b, s.n_kv_heads, n, s.head_dim, dtype=torch.bfloat16, device=self.device)
                            cache.update(k, torch.randn_like(k), layer)
                        ids = torch.randint(0, s.vocab, (b, 1), device=self.device)
                        pos = torch.full((b, 1), n, device=self.device)
                        mask = torch.ones(b, n + 1, dtype=torch.long, device=self.device)

                        def step() -> None:
                            with torch.no_grad():
                                model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                                      logits_to_keep=1)
                            cache.crop(-1)  # drop the token the step appended: every repeat decodes at context n

                        t = self.time_it(step, repeat=3, warmup=1)
                        self.add("decode_iter", name, f"batch={b} ctx={n}", t, float(ev.decode_s(1, b, b * n)),
                                 f"{b / t:.0f} tok/s", f"HF eager vs engine profile {ev.engine.name}")
                    self.guarded("decode_iter", name, f"batch={b} ctx={n}", 10.0, one)
            del model

    def train_iter(self) -> None:
        torch = self.torch
        from cost_models.training import TrainStrategy, train_flops, train_iter_s

        names = list(self.models)[:-1] if not self.dry else list(self.models)  # the 8B's fp32 Adam state does not fit one GPU
        seq, seqs = (32, 2) if self.dry else (4096, 2)
        for name in names:
            ev = self.ev(name)

            def one(name: str = name, ev: Any = ev) -> None:
                model = self._model(name, torch.float32).train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=self.device.type == "cuda")
                ids = torch.randint(0, ev.model.vocab, (seqs, seq), device=self.device)

                def it() -> None:
                    opt.zero_grad(set_to_none=True)
                    for r in range(seqs):  # micro-batch 1: one sequence per forward/backward
                        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                            loss = model(input_ids=ids[r:r + 1], labels=ids[r:r + 1]).loss
                        loss.backward()
                    opt.step()

                t = self.time_it(it, repeat=2 if not self.dry else 1, warmup=1)
                tokens = seqs * seq
                # kernels only (factors 1): a bare torch iteration is not an RL framework's training
                # pass, which the evaluator's default FRAMEWORK_COMPUTE_FACTOR / TRAIN_ATTENTION_FACTOR price
                pred = float(train_iter_s(ev.ops, ev.gpu, ev.model, TrainStrategy(1, 1, 1, micro_batch=1), tokens, seq,
                                          compute_factor=1.0, attn_factor=1.0))
                mfu = train_flops(ev.model, tokens, seq) / t / ev.gpu.bf16_flops
                self.add("train_iter", name, f"{seqs}x{seq} tokens, fwd+bwd+AdamW", t, pred, f"MFU {mfu:.1%}",
                         "fp32 master, bf16 autocast" if self.device.type == "cuda" else "fp32 (CPU)")
                del model, opt
            self.guarded("train_iter", name, f"{seqs}x{seq}", 40.0 if not self.dry else 1.0, one)

    def copies(self) -> None:
        torch = self.torch
        ev = self.ev(next(iter(self.models)))
        nbytes = (1 << 20) if self.dry else (1 << 30)

        def d2d() -> None:
            a = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            b = torch.empty_like(a)
            t = self.time_it(lambda: b.copy_(a), repeat=10)
            self.add("copy", "-", f"device->device {nbytes >> 20} MiB", t, float(ev.ops.memory_bound_s(2 * nbytes)),
                     f"{nbytes / t / 1e9:.0f} GB/s")

        def h2d() -> None:
            pin = self.device.type == "cuda"
            h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            d = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            t = self.time_it(lambda: d.copy_(h, non_blocking=pin), repeat=10)
            self.add("copy", "-", f"host->device {nbytes >> 20} MiB" + (" pinned" if pin else ""), t, nbytes / ev.gpu.pcie_bw,
                     f"{nbytes / t / 1e9:.1f} GB/s", "pcie_bw of the catalog")

        self.guarded("copy", "-", "device->device", 2.0, d2d)
        self.guarded("copy", "-", "host->device", 2.0, h2d)

    def torch_engine(self) -> None:
        from cost_models import CostEvaluator
        from libra.runtime.engines.base import TurnRequest
        from libra.runtime.engines.torch_engine import TorchEngine
        from libra.runtime.chat_format import for_tokenizer
        from libra.runtime.tiny_model import DEFAULT_DIR

        def one() -> None:
            eng = TorchEngine(DEFAULT_DIR, device=self.device.type, seed=0)
            ev = CostEvaluator(self.gpu, os.path.join(DEFAULT_DIR, "config.json"), gpus_per_node=1)
            ctx = tuple(for_tokenizer(eng.tokenizer).prompt_ids("Compute 37*41+5."))
            batch, new = 8, 32
            reqs = [TurnRequest(f"t{i}", ctx, new, temperature=1.0, seed=i) for i in range(batch)]
            eng.generate(reqs)  # warm-up
            eng.drop([r.traj_id for r in reqs])
            if self.device.type == "cuda":
                self.torch.cuda.synchronize()
            t = time.perf_counter()
            outs = eng.generate(reqs)
            if self.device.type == "cuda":
                self.torch.cuda.synchronize()
            t = time.perf_counter() - t
            gen = [len(o.tokens) for o in outs]
            steps = max(gen)
            alive = [sum(1 for g in gen if g > s) for s in range(steps)]
            pred = float(ev.prefill_s(1, len(ctx), 0, batch)) + sum(
                float(ev.decode_s(1, a, a * (len(ctx) + s))) for s, a in enumerate(alive) if a)
            self.add("torch_engine", "tiny-policy", f"{batch} turns, prompt {len(ctx)}, {sum(gen)} tokens", t, pred,
                     f"{sum(gen) / t:.0f} tok/s", f"max_new {new}; engine profile {ev.engine.name}")

        self.guarded("torch_engine", "tiny-policy", "generate", 20.0 if not self.dry else 1.0, one)

    # ---- output ----------------------------------------------------------------------------------
    def write(self, header: dict[str, Any]) -> tuple[str, str]:
        csv_path = os.path.join(self.out, "gpu_check.csv")
        md_path = os.path.join(self.out, "gpu_check.md")
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(self.rows)

        def fmt(x: Any, ms: bool = True) -> str:
            if x is None or x == "":
                return "-"
            return f"{x * 1e3:.3f}" if ms else f"{x:.2f}"

        lines = [f"# GPU check ({header['device_name']}, cost-model catalog `{self.gpu}`)", "",
                 " ".join(f"{k}: {v};" for k, v in header.items()), "",
                 "| section | model | case | measured ms | predicted ms | measured / predicted | extra | note |",
                 "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
        for r in self.rows:
            lines.append(f"| {r['section']} | {r['model']} | {r['case']} | {fmt(r['measured_s'])} | {fmt(r['predicted_s'])} | "
                         f"{fmt(r['measured_over_predicted'], ms=False)} | {r['extra']} | {r['note']} |")
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return csv_path, md_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", default=None, help="cost-model catalog name of the device (default: h200; cpu with --dry-run)")
    p.add_argument("--out", default="out/gpu_check")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds (default 420)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: the code paths in seconds (CI)")
    p.add_argument("--sections", default="gemm,attention,decode_iter,train_iter,copies,torch_engine")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    if a.dry_run:
        device, gpu = "cpu", a.gpu or "cpu"
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
            return 2
        device, gpu = "cuda", a.gpu or "h200"
    import transformers

    chk = Check(device, gpu, a.out, a.budget_s, a.dry_run)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run, tiny shapes)"
    header = {"device_name": name, "torch": torch.__version__, "transformers": transformers.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": a.dry_run}
    print(" ".join(f"{k}={v}" for k, v in header.items()), flush=True)
    known = {"gemm": chk.gemm, "attention": chk.attention, "decode_iter": chk.decode_iter, "train_iter": chk.train_iter,
             "copies": chk.copies, "torch_engine": chk.torch_engine}
    for sec in a.sections.split(","):
        if sec not in known:
            print(f"gpu_check: unknown section {sec!r}; known: {', '.join(known)}", file=sys.stderr)
            return 2
        known[sec]()
    header["elapsed_s"] = round(time.perf_counter() - chk.t0, 1)
    csv_path, md_path = chk.write(header)
    print(f"gpu_check: {len(chk.rows)} rows in {header['elapsed_s']} s -> {csv_path}, {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
