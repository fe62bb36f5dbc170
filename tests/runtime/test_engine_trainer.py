"""The torch engine (KV reuse across turns, migration by prefix recomputation) and the GRPO
learner (an update moves probability toward rewarded samples; checkpoints round-trip), on the
bundled tiny policy, in-process."""

from __future__ import annotations

import pytest

from runtime_markers import needs_torch

pytestmark = needs_torch


@pytest.fixture(scope="module")
def engines():
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.tiny_model import DEFAULT_DIR

    return TorchEngine(DEFAULT_DIR, seed=0), TorchEngine(DEFAULT_DIR, seed=0)


def _ctx(engine, question: str = "Compute 12*34+5.") -> tuple[int, ...]:
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tiny_model import encode

    return tuple(encode(engine.tokenizer, prompt_text(question)))


def test_kv_is_reused_on_the_same_instance_and_recomputed_after_a_move(engines) -> None:
    from libra.runtime.engines.base import TurnRequest

    a, b = engines
    ctx = _ctx(a)
    r1 = a.generate([TurnRequest("t", ctx, 12, temperature=0.0)])[0]
    assert r1.cached_tokens == 0 and r1.prefill_tokens == len(ctx) and len(r1.tokens) >= 1
    nxt = ctx + r1.tokens + (5, 6, 7)  # a tool's return appended
    stay = a.generate([TurnRequest("t", nxt, 6, temperature=0.0)])[0]
    # only the last generated token (not yet fed) and the 3 new tokens are computed
    assert stay.cached_tokens == len(ctx) + len(r1.tokens) - 1
    assert stay.prefill_tokens == 4
    # the move: the destination recomputes the prefix, then continues exactly as if it had stayed
    computed, secs = b.prefill("t", nxt)
    assert computed == len(nxt) and secs > 0
    moved = b.generate([TurnRequest("t", nxt, 6, temperature=0.0)])[0]
    assert moved.cached_tokens == len(nxt) and moved.prefill_tokens == 0
    assert moved.tokens == stay.tokens
    assert a.drop(["t"]) > 0 and a.cached_tokens() == 0


def test_sampling_is_seeded(engines) -> None:
    from libra.runtime.engines.base import TurnRequest

    a, b = engines
    ctx = _ctx(a, "What is the capital of Ostesfen?")
    x = a.generate([TurnRequest("s1", ctx, 16, temperature=1.0, seed=7)])[0]
    y = b.generate([TurnRequest("s2", ctx, 16, temperature=1.0, seed=7)])[0]
    assert x.tokens == y.tokens and x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_grpo_update_raises_rewarded_sample_probability(tmp_path) -> None:
    import torch

    from libra.runtime.grpo import Sample, collate, token_logprobs
    from libra.runtime.tiny_model import DEFAULT_DIR
    from libra.runtime.trainer import Learner

    good = Sample(tuple(range(20, 40)), (0,) * 5 + (1,) * 15, 1.0)
    bad = Sample(tuple(range(60, 80)), (0,) * 5 + (1,) * 15, -1.0)
    ln = Learner(DEFAULT_DIR, lr=5e-3, mini_batches=1, seed=0)

    def lp(s: Sample) -> float:
        ids, attn, mask, _ = collate([s], ln.pad_id)
        with torch.no_grad():
            return float((token_logprobs(ln.model, ids, attn) * mask).sum())

    before = (lp(good), lp(bad))
    for _ in range(3):
        st = ln.train_step([good, bad])
    assert lp(good) > before[0] and lp(bad) < before[1]
    assert st["tokens"] == 40 and 0 <= st["clip_frac"] <= 1
    path = ln.save_checkpoint(str(tmp_path / "ck"))
    assert path.endswith("step000003.pt")
    fresh = Learner(DEFAULT_DIR, lr=5e-3, mini_batches=1, seed=0)
    assert fresh.load_checkpoint(str(tmp_path / "ck")) == 3
    sd_a, sd_b = ln.state_dict(), fresh.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_kl_penalty_is_zero_at_the_reference() -> None:
    from libra.runtime.grpo import Sample
    from libra.runtime.tiny_model import DEFAULT_DIR
    from libra.runtime.trainer import Learner

    ln = Learner(DEFAULT_DIR, lr=1e-3, mini_batches=1, kl_coef=0.1, seed=0)
    s = [Sample(tuple(range(20, 30)), (0,) * 3 + (1,) * 7, a) for a in (1.0, -1.0)]
    first = ln.train_step(s)
    assert abs(first["kl"]) < 1e-6  # the policy starts at the reference
    second = ln.train_step(s)
    assert second["kl"] > 1e-6  # one update away from it, the penalty is positive


def test_weight_sync_changes_engine_outputs(engines) -> None:
    import torch

    from libra.runtime.engines.base import TurnRequest

    a, _ = engines
    ctx = _ctx(a, "Compute 50*50+1.")
    before = a.generate([TurnRequest("w", ctx, 8, temperature=0.0)])[0]
    sd = {k: v.clone() for k, v in a.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for k in [k for k in sd if "mlp.down_proj" in k]:
        sd[k] = torch.randn(sd[k].shape, generator=g) * 3.0
    assert a.load_state_dict(sd) >= 0 and a.cached_tokens() == 0
    after = a.generate([TurnRequest("w", ctx, 8, temperature=0.0)])[0]
    assert after.tokens != before.tokens
