"""A small rollout engine on torch + transformers, for CPU runs, tests and GPU checks.

It keeps each trajectory's KV cache (a transformers ``DynamicCache``) across its tool calls, like
vLLM's prefix cache does, so a trajectory that stays on its instance pays only for the tool's
return tokens, and one that moves recomputes its context on the destination. Sequences are
decoded one at a time (no continuous batching): that is what keeps this engine small; vLLM is
the batched engine.
"""

from __future__ import annotations

import time
from typing import Any

from libra.runtime.engines.base import TurnRequest, TurnResult
from libra.runtime.protocol import STOP_STRINGS


class TorchEngine:
    """One model replica on ``device`` (``"cpu"`` or ``"cuda"``)."""

    def __init__(self, model_dir: str, device: str = "cpu", seed: int = 0, max_context: int = 1024,
                 max_cached_seqs: int = 256, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device).eval()
        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns)
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stop_ids = {self.tokenizer.convert_tokens_to_ids(s) for s in STOP_STRINGS}
        self.max_context = max_context
        self.max_cached_seqs = max_cached_seqs
        self.seed = seed
        # traj_id -> (tokens fed so far, DynamicCache, logits after the last fed token)
        self._cache: dict[str, tuple[list[int], Any, Any]] = {}

    # ---- KV bookkeeping ----------------------------------------------------------------------
    def cached_tokens(self) -> int:
        return sum(len(t) for t, _, _ in self._cache.values())

    def drop(self, traj_ids: list[str]) -> int:
        freed = 0
        for t in traj_ids:
            got = self._cache.pop(t, None)
            if got is not None:
                freed += len(got[0])
        return freed

    def _evict(self) -> None:
        while len(self._cache) > self.max_cached_seqs:  # oldest first (dicts keep insertion order)
            self._cache.pop(next(iter(self._cache)))

    def _forward(self, ids: list[int], past: Any) -> tuple[Any, Any]:
        torch = self.torch
        from transformers import DynamicCache

        if past is None:
            past = DynamicCache()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, **{self._cache_kw: past}, use_cache=True)
        return out.logits[0, -1].float(), getattr(out, self._cache_kw)

    def _context_state(self, traj_id: str, context: list[int]) -> tuple[Any, Any, int, int]:
        """(last logits, cache, tokens computed now, tokens reused) with ``context`` fed."""
        hit = self._cache.pop(traj_id, None)
        if hit is not None:
            fed, past, logits = hit
            n = len(fed)
            if n <= len(context) and context[:n] == fed:
                if n == len(context):
                    return logits, past, 0, n
                logits, past = self._forward(context[n:], past)
                return logits, past, len(context) - n, n
        logits, past = self._forward(context, None)
        return logits, past, len(context), 0

    # ---- engine API --------------------------------------------------------------------------
    def prefill(self, traj_id: str, context: tuple[int, ...]) -> tuple[int, float]:
        t0 = time.perf_counter()
        ctx = list(context)
        with self.torch.inference_mode():
            logits, past, computed, _ = self._context_state(traj_id, ctx)
        self._cache[traj_id] = (ctx, past, logits)
        self._evict()
        return computed, time.perf_counter() - t0

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return [self._one(r) for r in requests]

    def _one(self, r: TurnRequest) -> TurnResult:
        torch = self.torch
        t0 = time.perf_counter()
        ctx = list(r.context)
        gen = torch.Generator(device="cpu").manual_seed(int(r.seed) & 0x7FFFFFFFFFFFFFFF)
        out: list[int] = []
        lps: list[float] = []
        finish = "length"
        with torch.inference_mode():
            logits, past, computed, cached = self._context_state(r.traj_id, ctx)
            t1 = time.perf_counter()
            fed = list(ctx)
            budget = min(r.max_new_tokens, self.max_context - len(ctx))
            for i in range(max(budget, 0)):
                logp = torch.log_softmax(logits / max(r.temperature, 1e-5), dim=-1).cpu()
                if r.temperature <= 0:
                    tok = int(torch.argmax(logp))
                else:
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                out.append(tok)
                lps.append(float(logp[tok]))
                if tok in self.stop_ids:
                    finish = "stop"
                    break
                if i + 1 < budget:
                    logits, past = self._forward([tok], past)
                    fed.append(tok)
        # the cache holds the KV of what was fed: the context and every generated token but the
        # last (which is fed at the trajectory's next turn), with the logits after it
        self._cache[r.traj_id] = (fed, past, logits)
        self._evict()
        t2 = time.perf_counter()
        return TurnResult(r.traj_id, tuple(out), tuple(lps), finish, computed, cached, t1 - t0, t2 - t1)

    def load_state_dict(self, state: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        sd = {k: (v if hasattr(v, "dtype") else self.torch.as_tensor(v)) for k, v in state.items()}
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        bad = [k for k in missing if "lm_head" not in k]
        if bad or unexpected:
            raise RuntimeError(f"weight sync: missing {bad[:3]}, unexpected {list(unexpected)[:3]}")
        self._cache.clear()  # KV computed by the old policy is stale
        return time.perf_counter() - t0
