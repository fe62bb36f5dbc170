"""Lent rollout instances as gradient helpers (``libra.runtime.helper``): the update with
helpers is the update without them (token-weighted gradient combination, one optimizer step on
the trainer), a dead helper's sub-shard is recomputed, and streamed mini-batches use the
step-start behaviour policy for their old log-probs, in-process (no Ray)."""

from __future__ import annotations

import pytest

from runtime_markers import needs_torch

pytestmark = needs_torch


def _samples() -> list:
    from libra.runtime.grpo import Sample

    # different lengths (padding differs between shards) and generated-token counts
    out = []
    for i, (n, gen, adv) in enumerate([(18, 9, 1.0), (25, 16, -0.5), (12, 4, 0.7), (30, 21, -1.2), (16, 7, 0.3), (22, 12, -0.3)]):
        ids = tuple(20 + (i * 7 + k * 3) % 500 for k in range(n))
        out.append(Sample(ids, (0,) * (n - gen) + (1,) * gen, adv))
    return out


def _learner(**kw):
    from libra.runtime.tiny_model import DEFAULT_DIR
    from libra.runtime.trainer import Learner

    return Learner(DEFAULT_DIR, lr=2e-3, seed=0, **kw)


def _perturb(ln, seed: int = 1) -> None:
    """Move the trainer off the behaviour weights (as after an earlier mini-batch), so the
    ratio is not 1 and the clip matters."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ln.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def _sgd(ln) -> None:
    """Plain SGD (lr 1, no clipping) so the update IS the gradient: AdamW's first step is about
    lr * sign(g), which turns float-summation noise on near-zero entries into lr-sized
    differences and would hide what the test checks (the combined gradient)."""
    import torch

    ln.opt = torch.optim.SGD(ln.model.parameters(), lr=1.0)
    ln.max_grad_norm = float("inf")


def _params(ln) -> dict:
    return {k: v.detach().clone() for k, v in ln.model.named_parameters()}


def _assert_same_update(before: dict, pa: dict, pb: dict) -> None:
    """The two updates (= -gradients under ``_sgd``) agree to float32 summation noise: every
    entry within 1e-4 of the largest update entry (shards pad differently, so the BLAS sums
    differ in order), and the update is not trivially zero."""
    import torch

    scale = max(float((pa[k] - before[k]).abs().max()) for k in pa)
    assert scale > 1e-3, "the update did nothing"
    for k in pa:
        torch.testing.assert_close(pb[k] - before[k], pa[k] - before[k], rtol=1e-3, atol=1e-4 * scale)


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_update_with_helpers_equals_update_without(kl: float) -> None:
    import torch

    from libra.runtime.helper import GradHelper, HelperShard, split_for_helpers
    from libra.runtime.tiny_model import DEFAULT_DIR

    data = _samples()
    solo, team = _learner(kl_coef=kl), _learner(kl_coef=kl)
    for ln in (solo, team):
        ln.begin_step()
        _perturb(ln)
        _sgd(ln)
    before = _params(solo)
    a = solo.train_minibatch(data)
    behaviour = {k: v.clone() for k, v in solo.behaviour.state_dict().items()}
    parts = split_for_helpers(data, 2)
    helpers = []
    for part in parts[1:]:
        h = GradHelper(DEFAULT_DIR, clip=team.clip, kl_coef=kl)
        h.load(team.state_dict(), behaviour, version=1)
        helpers.append(HelperShard(part, h.grad(part)))
    b = team.train_minibatch(parts[0], helpers)
    assert b["helper_samples"] == len(parts[1]) + len(parts[2]) and b["recomputed"] == 0
    _assert_same_update(before, _params(solo), _params(team))
    for k in ("loss", "clip_frac", "ratio_mean", "kl"):
        assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert a["tokens"] == b["tokens"]


def test_dead_helper_is_recomputed_by_the_trainer() -> None:
    from libra.runtime.helper import HelperShard, split_for_helpers

    data = _samples()
    solo, team = _learner(), _learner()
    for ln in (solo, team):
        ln.begin_step()
        _perturb(ln)
        _sgd(ln)
    before = _params(solo)
    solo.train_minibatch(data)
    parts = split_for_helpers(data, 1)

    def dead():
        raise RuntimeError("the actor died")

    st = team.train_minibatch(parts[0], [HelperShard(parts[1], dead)])
    assert st["recomputed"] == len(parts[1]) and st["helper_samples"] == 0
    _assert_same_update(before, _params(solo), _params(team))


def test_streamed_minibatches_use_the_step_start_policy_like_train_step() -> None:
    """train_step computes all old log-probs before its first optimizer step; the streamed API
    must give the same update for the same mini-batches (the behaviour copy)."""
    data = _samples()
    batch_ln, stream_ln = _learner(mini_batches=2), _learner(mini_batches=2)
    batch_ln.train_step(data)
    stream_ln.begin_step()
    for k in range(2):
        stream_ln.train_minibatch(data[k::2])  # train_step's interleaved chunks
    assert stream_ln.end_step() == 1 == batch_ln.step_done
    pa, pb = _params(batch_ln), _params(stream_ln)
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < 1e-5
    # without the frozen copy (old log-probs from the current weights) the second mini-batch
    # would differ: the copy matters
    import torch

    assert not all(torch.equal(a, b) for a, b in zip(stream_ln.behaviour.parameters(), stream_ln.model.parameters()))


def test_helper_split_keeps_every_sample_once() -> None:
    from libra.runtime.helper import split_for_helpers

    data = _samples()
    for n in range(0, 8):
        parts = split_for_helpers(data, n)
        assert all(parts) and len(parts) == min(1 + n, len(data))
        assert sorted(s.ids for p in parts for s in p) == sorted(s.ids for s in data)
