"""The torch engine decodes a call's requests as one batch: a request's output and the KV cache
it leaves must be what decoding it alone gives (greedy exactly; sampled with the same seed),
whatever else shares the batch, on the bundled tiny policy. The reference is a second engine fed
one request per call, and for greedy a cache-free oracle that recomputes the whole context at
every token."""

from __future__ import annotations

import pytest

from runtime_markers import needs_torch

pytestmark = needs_torch

QUESTIONS = [
    "Compute 12*34+5.",
    "What is the capital of Ostesfen?",
    "Compute 3*4+1 and 7*8+2.",
    "Compute 987*654+321.",
    "What is the capital of Varnholt?",
]


@pytest.fixture(scope="module")
def pair():
    """(batched engine, one-at-a-time engine), same weights."""
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.tiny_model import DEFAULT_DIR

    return TorchEngine(DEFAULT_DIR, seed=0, threads=1), TorchEngine(DEFAULT_DIR, seed=0, threads=1)


def _ctx(engine, question: str) -> tuple[int, ...]:
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tiny_model import encode

    return tuple(encode(engine.tokenizer, prompt_text(question)))


def _tool(engine, text: str) -> tuple[int, ...]:
    from libra.runtime.protocol import tool_response_text
    from libra.runtime.tiny_model import encode

    return tuple(encode(engine.tokenizer, tool_response_text(text)))


def _alone(engine, reqs):
    return [engine.generate([r])[0] for r in reqs]


def _same(batched, alone) -> None:
    for b, a in zip(batched, alone, strict=True):
        assert b.traj_id == a.traj_id
        assert b.tokens == a.tokens, b.traj_id
        assert b.finish == a.finish
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert (b.prefill_tokens, b.cached_tokens) == (a.prefill_tokens, a.cached_tokens)


def _same_cache(x, y, traj_id: str) -> None:
    from libra.runtime.engines.torch_engine import _kv_layers

    fx, cx, lx = x._cache[traj_id]
    fy, cy, ly = y._cache[traj_id]
    assert fx == fy
    for (kx, vx), (ky, vy) in zip(_kv_layers(cx), _kv_layers(cy), strict=True):
        assert kx.shape == ky.shape == (1, kx.shape[1], len(fx), kx.shape[3])
        assert x.torch.allclose(kx, ky, atol=1e-4) and x.torch.allclose(vx, vy, atol=1e-4)
    assert x.torch.allclose(lx, ly, atol=1e-4)


def _oracle_greedy(engine, context: tuple[int, ...], n: int) -> list[int]:
    """Greedy tokens by recomputing the whole sequence at every step (no cache, no batch)."""
    torch = engine.torch
    seq, out = list(context), []
    with torch.inference_mode():
        for _ in range(n):
            tok = int(torch.argmax(engine.model(input_ids=torch.tensor([seq])).logits[0, -1]))
            out.append(tok)
            if tok in engine.stop_ids:
                break
            seq.append(tok)
    return out


def test_greedy_multi_turn_batch_equals_one_at_a_time_and_leaves_the_same_caches(pair) -> None:
    from libra.runtime.engines.base import TurnRequest

    a, b = pair
    ctxs = [_ctx(a, q) for q in QUESTIONS]
    assert len({len(c) for c in ctxs}) > 2  # different context lengths: the batch is padded
    # different budgets too, so sequences leave the batch at different steps
    first = [TurnRequest(f"g{i}", c, 10 + 6 * i, temperature=0.0) for i, c in enumerate(ctxs)]
    r1a, r1b = a.generate(first), _alone(b, first)
    _same(r1a, r1b)
    for r, req in zip(r1a, first):
        assert r.tokens == tuple(_oracle_greedy(a, req.context, req.max_new_tokens))
        _same_cache(a, b, r.traj_id)
    # turn 2: each trajectory's tool return appended; its KV is reused in the batch
    second = [TurnRequest(r.traj_id, req.context + r.tokens + _tool(a, f"{40 + i}"), 24, temperature=0.0)
              for i, (r, req) in enumerate(zip(r1a, first))]
    # one context that does not extend what was fed (the cache is recomputed), one trajectory
    # that arrives by migration (prefilled on both engines first), one brand new
    second[1] = TurnRequest("g1", ctxs[3] + _tool(a, "x"), 24, temperature=0.0)
    moved = TurnRequest("m0", ctxs[0] + _tool(a, "7"), 20, temperature=0.0)
    assert a.prefill("m0", moved.context)[0] == b.prefill("m0", moved.context)[0] == len(moved.context)
    batch2 = second + [moved, TurnRequest("n0", _ctx(a, "Compute 5*6+7."), 20, temperature=0.0)]
    r2a, r2b = a.generate(batch2), _alone(b, batch2)
    _same(r2a, r2b)
    by_id = {r.traj_id: r for r in r2a}
    assert by_id["g0"].cached_tokens == len(first[0].context) + len(r1a[0].tokens) - 1
    assert by_id["g1"].cached_tokens == 0 and by_id["g1"].prefill_tokens == len(second[1].context)
    assert by_id["m0"].cached_tokens == len(moved.context) and by_id["m0"].prefill_tokens == 0
    for req in batch2:
        _same_cache(a, b, req.traj_id)
        assert by_id[req.traj_id].tokens == tuple(_oracle_greedy(a, req.context, req.max_new_tokens))


def test_sampled_tokens_do_not_depend_on_the_batch(pair) -> None:
    from libra.runtime.engines.base import TurnRequest

    a, b = pair
    reqs = [TurnRequest(f"s{i}", _ctx(a, q), 24, temperature=1.0, seed=100 + i) for i, q in enumerate(QUESTIONS)]
    first = a.generate(reqs)
    _same(first, _alone(b, reqs))
    # the same requests in another batch (other neighbours, other rows, other padding) sample the same
    again = a.generate([TurnRequest("s4x", reqs[4].context, 24, 1.0, 104), TurnRequest("n", _ctx(a, "Compute 1*2+3."), 5, 1.0, 7),
                        TurnRequest("s2x", reqs[2].context, 24, 1.0, 102)])
    assert again[0].tokens == first[4].tokens and again[2].tokens == first[2].tokens


def test_stop_and_length_finishes_and_context_budget() -> None:
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.tiny_model import DEFAULT_DIR

    eng = TorchEngine(DEFAULT_DIR, seed=0, max_context=30, threads=1)
    ctx = [_ctx(eng, q) for q in QUESTIONS[:4]]
    reqs = [TurnRequest("stop", ctx[1], 32, temperature=0.0),  # the search call ends well inside 32
            TurnRequest("len", ctx[0], 3, temperature=0.0),
            TurnRequest("ctx", ctx[3], 32, temperature=0.0),  # max_context 30 leaves 8 of its ~15 tokens
            TurnRequest("full", ctx[0] + (5,) * (30 - len(ctx[0])), 8, temperature=0.0)]
    stop, length, capped, full = eng.generate(reqs)
    assert stop.finish == "stop" and stop.tokens[-1] in eng.stop_ids and len(stop.tokens) < 32
    assert length.finish == "length" and len(length.tokens) == 3
    assert capped.finish == "length" and len(capped.tokens) == 30 - len(ctx[3]) > 0
    assert full.finish == "length" and full.tokens == () and full.prefill_tokens == 30
    # what each left cached: the context and every generated token but the last (not yet fed)
    for req, res in zip(reqs, (stop, length, capped, full)):
        fed, cache, _ = eng._cache[req.traj_id]
        assert fed == list(req.context) + list(res.tokens[:-1])
        assert cache.get_seq_length() == len(fed)
    # timing: each its own prefill, one shared decode loop
    assert len({r.decode_s for r in (stop, length, capped, full)}) == 1
    assert all(r.prefill_s > 0 for r in (stop, length, capped, full))


def test_cached_tokens_drop_and_eviction() -> None:
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.tiny_model import DEFAULT_DIR

    eng = TorchEngine(DEFAULT_DIR, seed=0, max_cached_seqs=2, threads=1)
    reqs = [TurnRequest(f"d{i}", _ctx(eng, q), 6, temperature=0.0) for i, q in enumerate(QUESTIONS[:3])]
    res = eng.generate(reqs)
    # three decoded together, the oldest evicted once all are stored: d1 and d2 remain
    assert list(eng._cache) == ["d1", "d2"]
    held = [len(r.context) + len(x.tokens) - 1 for r, x in zip(reqs[1:], res[1:])]
    assert eng.cached_tokens() == sum(held)
    assert eng.drop(["d1", "nope"]) == held[0] and eng.cached_tokens() == held[1]
    # a trajectory named twice in one call: the second turn sees the cache the first one left
    ctx = reqs[0].context
    eng.prefill("d0", ctx)
    o1 = eng.generate([TurnRequest("d0", ctx, 4, temperature=0.0)])[0].tokens
    eng.prefill("d0", ctx)
    twice = eng.generate([TurnRequest("d0", ctx, 4, temperature=0.0), TurnRequest("d0", ctx + o1 + (5,), 4, temperature=0.0)])
    assert twice[0].tokens == o1 and twice[0].cached_tokens == len(ctx)
    assert twice[1].cached_tokens == len(ctx) + len(o1) - 1 and twice[1].prefill_tokens == 2
