"""A small rollout engine on torch + transformers, for CPU runs, tests and GPU checks.

It keeps each trajectory's KV cache (a transformers ``DynamicCache``) across its tool calls, like
vLLM's prefix cache does, so a trajectory that stays on its instance pays only for the tool's
return tokens, and one that moves recomputes its context on the destination.

The requests of one ``generate`` call are decoded together, as a batched engine would: their
new context suffixes are prefilled in one forward on their own (left-padded) caches, then the
caches are left-padded into one batch cache and a single forward per decode step advances every
still-running sequence (padding masked out, explicit per-sequence positions, each request
sampled with its own seeded generator). A sequence that finishes leaves the batch at once with
its exact cache (pads stripped), so the next turn's prefix reuse works as if it had been decoded
alone. No continuous batching across calls: a call's batch only shrinks (vLLM is
the engine that admits new sequences mid-flight).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from libra.runtime.engines.base import TurnRequest, TurnResult
from libra.runtime.chat_format import for_tokenizer


def _kv_layers(cache: Any) -> list[tuple[Any, Any]]:
    """Per-layer (keys, values) of a ``DynamicCache``, ``[batch, kv_heads, seq, head_dim]`` each.

    transformers >= 4.56 keeps them in ``cache.layers``; older releases in ``key_cache`` /
    ``value_cache`` lists. Reading both keeps the engine working across the versions the run
    extra allows."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _cache_from(kv: list[tuple[Any, Any]]) -> Any:
    """A fresh ``DynamicCache`` holding ``kv`` (through ``update``, the API every version has)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


@dataclass
class _Seq:
    """One request's decoding state inside a batch."""

    req: TurnRequest
    gen: Any  # the request's own torch.Generator: its samples do not depend on the batch
    past: Any  # its DynamicCache while outside the batch (before it joins, after it leaves)
    logits: Any  # logits after its last fed token
    budget: int
    computed: int
    cached: int
    prefill_s: float
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    finish: str = ""


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
        # a turn stops where the chat format says (the tiny policy: </tool_call> or <|im_end|>; a chat template: <|im_end|>)
        self.stop_ids = {self.tokenizer.convert_tokens_to_ids(s) for s in for_tokenizer(self.tokenizer).stop_strings}
        self.max_context = max_context
        self.max_cached_seqs = max_cached_seqs
        self.seed = seed
        # traj_id -> (tokens fed so far, DynamicCache, logits after the last fed token)
        self._cache: dict[str, tuple[list[int], Any, Any]] = {}

    # ---- KV bookkeeping ----------------------------------------------------------------------
    def cached_tokens(self) -> int:
        return sum(len(t) for t, _, _ in self._cache.values())

    def sleep(self) -> int:
        """Release device memory for a colocated trainer: drop every KV cache and, on a GPU, move
        the weights to host memory (``wake`` brings them back). Returns the KV tokens freed."""
        freed = self.drop(list(self._cache))
        if self.device.type == "cuda":
            self.model.to("cpu")
            self.torch.cuda.empty_cache()
        return freed

    def wake(self) -> None:
        """Back from ``sleep``: the weights on the device again (the next weight sync overwrites them)."""
        self.model.to(self.device)

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
        out = self.model(input_ids=x, **{self._cache_kw: past}, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float(), getattr(out, self._cache_kw)

    def _reusable(self, traj_id: str, context: list[int]) -> tuple[Any, Any, int]:
        """(cache, logits after it, tokens it holds) of the trajectory's kept KV when what it fed
        is a prefix of ``context`` (the exact check that makes reuse safe), else (None, None, 0).
        The entry is taken out of the store: the caller puts back what it computes."""
        hit = self._cache.pop(traj_id, None)
        if hit is not None:
            fed, past, logits = hit
            n = len(fed)
            if n <= len(context) and context[:n] == fed:
                return past, logits, n
        return None, None, 0

    def _context_state(self, traj_id: str, context: list[int]) -> tuple[Any, Any, int, int]:
        """(last logits, cache, tokens computed now, tokens reused) with ``context`` fed."""
        past, logits, n = self._reusable(traj_id, context)
        if n == len(context):
            return logits, past, 0, n
        logits, past = self._forward(context[n:], past)
        return logits, past, len(context) - n, n

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
        """One turn for every request, decoded as one batch.

        A trajectory has at most one turn in flight, so a call normally names each ``traj_id``
        once; should one repeat, the repeat goes into a later batch so that it sees the cache its
        earlier turn left (what one-at-a-time decoding did)."""
        results: list[TurnResult] = []
        batch: list[TurnRequest] = []
        for r in requests:
            if any(b.traj_id == r.traj_id for b in batch):
                results += self._generate_batch(batch)
                batch = []
            batch.append(r)
        if batch:
            results += self._generate_batch(batch)
        return results

    def _generate_batch(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Prefill the requests' new suffixes in one forward, then decode all together.
        ``prefill_s`` is the request's share of the prefill forward (by tokens computed) and
        ``decode_s`` the batched loop's wall time, the same for every request: what a batched
        engine experiences, so summing ``prefill_s`` (not ``decode_s``) over a batch is its time."""
        torch = self.torch
        seqs: list[_Seq] = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            todo: list[tuple[_Seq, list[int]]] = []
            for r in requests:
                ctx = list(r.context)
                past, logits, n = self._reusable(r.traj_id, ctx)
                gen = torch.Generator(device="cpu").manual_seed(int(r.seed) & 0x7FFFFFFFFFFFFFFF)
                budget = max(0, min(r.max_new_tokens, self.max_context - len(ctx)))
                s = _Seq(r, gen, past, logits, budget, len(ctx) - n, n, 0.0)
                seqs.append(s)
                if s.computed:
                    todo.append((s, ctx[n:]))
            if len(todo) == 1:
                s, suffix = todo[0]
                s.logits, s.past = self._forward(suffix, s.past)
            elif todo:
                done = self._prefill_batch([(s.past, suffix) for s, suffix in todo])
                for (s, _), (logits, past) in zip(todo, done):
                    s.logits, s.past = logits, past
            t1 = time.perf_counter()
            total = sum(s.computed for s in seqs)
            for s in seqs:
                s.prefill_s = (t1 - t0) * (s.computed / total if total else 1.0 / len(seqs))
            self._decode([s for s in seqs if s.budget > 0])
        for s in seqs:
            # the cache holds the KV of what was fed: the context and every generated token but
            # the last (which is fed at the trajectory's next turn), with the logits after it
            fed = list(s.req.context) + s.out[:-1]
            self._cache[s.req.traj_id] = (fed, s.past, s.logits)
        self._evict()
        decode_s = time.perf_counter() - t1
        return [TurnResult(s.req.traj_id, tuple(s.out), tuple(s.lps), s.finish or "length", s.computed, s.cached, s.prefill_s, decode_s)
                for s in seqs]

    def _prefill_batch(self, items: list[tuple[Any, list[int]]]) -> list[tuple[Any, Any]]:
        """Feed each ``(cache or None, suffix)`` its suffix in one forward; returns each one's
        (logits after its last token, its own cache).

        The caches are left-padded to a common width and the suffixes right-padded, so every
        sequence is contiguous and ends its real part in its own column; pads are masked out of
        the attention (and no query row is fully masked: a pad query sees its own real tokens,
        which keeps softmax finite). Each sequence's cache is then cut back out of the batch."""
        torch = self.torch
        from transformers import DynamicCache

        pasts = [_kv_layers(p) if p is not None else None for p, _ in items]
        lens = [kv[0][0].shape[-2] if kv else 0 for kv in pasts]
        width, q = max(lens), max(len(x) for _, x in items)
        pad = torch.nn.functional.pad
        if width:
            ref = next(kv for kv in pasts if kv)
            kv_batch = []
            for layer, (k0, v0) in enumerate(ref):
                ks, vs = [], []
                for kv, n in zip(pasts, lens):
                    k, v = kv[layer] if kv else (k0[:, :, :0], v0[:, :, :0])
                    ks.append(pad(k, (0, 0, width - n, 0)))
                    vs.append(pad(v, (0, 0, width - n, 0)))
                kv_batch.append((torch.cat(ks), torch.cat(vs)))
            cache = _cache_from(kv_batch)
        else:
            cache = DynamicCache()
        ids = [x + [0] * (q - len(x)) for _, x in items]
        mask = [[0] * (width - n) + [1] * (n + len(x)) + [0] * (q - len(x)) for n, (_, x) in zip(lens, items)]
        pos = [list(range(n, n + q)) for n in lens]
        dev = self.device
        # logits only at each row's last real position (a real model's vocabulary makes the
        # full [B, q, vocab] tensor gigabytes for long prompts)
        last = sorted({len(x) - 1 for _, x in items})
        col = {p: j for j, p in enumerate(last)}
        out = self.model(input_ids=torch.tensor(ids, dtype=torch.long, device=dev), attention_mask=torch.tensor(mask, dtype=torch.long, device=dev),
                         position_ids=torch.tensor(pos, dtype=torch.long, device=dev), **{self._cache_kw: cache}, use_cache=True,
                         logits_to_keep=torch.tensor(last, dtype=torch.long, device=dev))
        layers = _kv_layers(getattr(out, self._cache_kw))
        res = []
        for row, (n, (_, x)) in enumerate(zip(lens, items)):
            lo, hi = width - n, width + len(x)
            own = _cache_from([(k[row:row + 1, :, lo:hi].clone(), v[row:row + 1, :, lo:hi].clone()) for k, v in layers])
            res.append((out.logits[row, col[len(x) - 1]].float().clone(), own))
        return res

    def _decode(self, seqs: list[_Seq]) -> None:
        """The batched decode loop: sample every active sequence from its logits, let finished
        ones leave the batch (with their exact caches), feed the others' tokens in one forward."""
        if not seqs:
            return
        torch = self.torch
        active = list(seqs)
        logits = torch.stack([s.logits for s in active])  # [B, vocab]
        batch: _BatchCache | None = None  # built once the first tokens are sampled
        while active:
            temps = torch.tensor([max(s.req.temperature, 1e-5) for s in active], device=logits.device)
            logp = torch.log_softmax(logits / temps[:, None], dim=-1).cpu()
            keep: list[int] = []
            feed: list[int] = []
            for row, s in enumerate(active):
                lp = logp[row]
                if s.req.temperature <= 0:
                    tok = int(torch.argmax(lp))
                else:
                    tok = int(torch.multinomial(lp.exp(), 1, generator=s.gen))
                s.out.append(tok)
                s.lps.append(float(lp[tok]))
                if tok in self.stop_ids:
                    s.finish = "stop"
                elif len(s.out) >= s.budget:
                    s.finish = "length"
                else:
                    keep.append(row)
                    feed.append(tok)
                    continue
                s.logits = logits[row].clone()
                if batch is not None:
                    s.past = batch.take(row)
            if not keep:
                return
            if batch is None:
                batch = _BatchCache(torch, [active[i].past for i in keep], self.device)
                for i in keep:
                    active[i].past = None  # the batch holds it now
            elif len(keep) < len(active):
                batch.select(keep)
            active = [active[i] for i in keep]
            logits = batch.step(self.model, self._cache_kw, feed)


    def load_state_dict(self, state: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        sd = {k: (v if hasattr(v, "dtype") else self.torch.as_tensor(v)) for k, v in state.items()}
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        bad = [k for k in missing if "lm_head" not in k]
        if bad or unexpected:
            raise RuntimeError(f"weight sync: missing {bad[:3]}, unexpected {list(unexpected)[:3]}")
        self._cache.clear()  # KV computed by the old policy is stale
        return time.perf_counter() - t0


class _BatchCache:
    """Sequences' KV caches left-padded into one batch cache, with the attention mask (0 on pads)
    and each sequence's next position, so one forward advances them all as if each were alone."""

    def __init__(self, torch: Any, caches: list[Any], device: Any) -> None:
        self.torch = torch
        per_seq = [_kv_layers(c) for c in caches]
        lens = [kv[0][0].shape[-2] for kv in per_seq]
        width = max(lens)
        self.pad = [width - n for n in lens]
        pad = torch.nn.functional.pad
        kv = []
        for layer in range(len(per_seq[0])):
            ks = [pad(seq[layer][0], (0, 0, p, 0)) for seq, p in zip(per_seq, self.pad)]
            vs = [pad(seq[layer][1], (0, 0, p, 0)) for seq, p in zip(per_seq, self.pad)]
            kv.append((torch.cat(ks), torch.cat(vs)))
        self.cache = _cache_from(kv)
        self.mask = torch.tensor([[0] * p + [1] * n for p, n in zip(self.pad, lens)], dtype=torch.long, device=device)
        self.pos = torch.tensor(lens, dtype=torch.long, device=device)

    def step(self, model: Any, cache_kw: str, tokens: list[int]) -> Any:
        """Feed one token per sequence; returns the logits after it, ``[B, vocab]`` float."""
        torch = self.torch
        x = torch.tensor(tokens, dtype=torch.long, device=self.mask.device)[:, None]
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = model(input_ids=x, attention_mask=self.mask, position_ids=self.pos[:, None], **{cache_kw: self.cache}, use_cache=True)
        self.cache = getattr(out, cache_kw)
        self.pos = self.pos + 1
        return out.logits[:, -1].float()

    def take(self, row: int) -> Any:
        """Row ``row``'s own cache: its columns without the left pads, copied out of the batch."""
        p = self.pad[row]
        return _cache_from([(k[row:row + 1, :, p:].clone(), v[row:row + 1, :, p:].clone()) for k, v in _kv_layers(self.cache)])

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows``, and cut the leading columns that are now padding for all of them."""
        torch = self.torch
        cut = min(self.pad[r] for r in rows)
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.cache = _cache_from([(k[idx, :, cut:], v[idx, :, cut:]) for k, v in _kv_layers(self.cache)])
        self.mask = self.mask[idx, cut:]
        self.pos = self.pos[idx]
        self.pad = [self.pad[r] - cut for r in rows]
