"""GRPO: group-normalized advantages and the clipped policy-gradient loss (torch).

Why these forms: GRPO (DeepSeekMath) drops the critic; each prompt's ``G`` samples are scored
against their own group's mean and spread. The loss is PPO's clipped surrogate per generated
token (tool returns and the prompt are masked out: the policy did not produce them), plus an
optional KL penalty to a frozen reference model with the unbiased ``k3`` estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def group_advantages(rewards: Sequence[float], groups: Sequence[str], eps: float = 1e-6, scale: bool = True) -> np.ndarray:
    """``(r - mean_g) / (std_g + eps)`` per group (``scale=False``: just ``r - mean_g``).
    A group whose rewards are all equal gets advantage 0: it carries no learning signal."""
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    keys: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        keys.setdefault(g, []).append(i)
    for idx in keys.values():
        v = r[idx]
        d = v - v.mean()
        out[idx] = d / (v.std() + eps) if scale else d
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """One trajectory as training data: all its tokens, which of them the policy generated, and
    its advantage."""

    ids: tuple[int, ...]
    gen_mask: tuple[int, ...]
    advantage: float


def collate(samples: Sequence[Sample], pad_id: int) -> tuple[Any, Any, Any, Any]:
    """Right-padded ``(input_ids, attention_mask, loss_mask, advantages)`` tensors. ``loss_mask``
    is aligned with the *targets* (position t holds token t+1's mask)."""
    import torch

    width = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for r, s in enumerate(samples):
        n = len(s.ids)
        ids[r, :n] = torch.tensor(s.ids)
        attn[r, :n] = 1
        mask[r, : n - 1] = torch.tensor(s.gen_mask[1:], dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return ids, attn, mask, adv


def token_logprobs(model: Any, ids: Any, attn: Any) -> Any:
    """log p(token t+1 | tokens <= t) for every position, shape [B, T-1]."""
    import torch

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.gather(torch.log_softmax(logits, dim=-1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def grpo_loss(logp: Any, old_logp: Any, mask: Any, adv: Any, clip: float = 0.2, ref_logp: Any = None, kl_coef: float = 0.0) -> tuple[Any, dict[str, float]]:
    """Clipped surrogate averaged over generated tokens (+ ``kl_coef`` * k3 KL to the reference)."""
    import torch

    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(1)
    surr = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a)
    per_tok = -surr
    kl = torch.zeros((), dtype=logp.dtype)
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp
        k3 = torch.exp(d) - d - 1
        per_tok = per_tok + kl_coef * k3
        kl = (k3 * mask).sum() / mask.sum().clamp_min(1)
    n = mask.sum().clamp_min(1)
    loss = (per_tok * mask).sum() / n
    with torch.no_grad():
        clipped = (((ratio - 1).abs() > clip).float() * mask).sum() / n
    return loss, {"loss": loss.item(), "clip_frac": clipped.item(), "kl": kl.item(), "ratio_mean": ((ratio * mask).sum() / n).item()}


def gen_tokens(sample: Sample) -> int:
    """Generated tokens of ``sample`` that the loss counts (``collate``'s loss mask: targets)."""
    return int(sum(sample.gen_mask[1:]))


def minibatch_loss(policy: Any, behaviour: Any, ref: Any, batch: tuple[Any, Any, Any, Any], clip: float,
                   kl_coef: float) -> tuple[Any, dict[str, float], int, float]:
    """The GRPO token-mean loss of one collated batch, with old log-probs from ``behaviour`` (the
    frozen step-start policy) and reference log-probs from ``ref`` (None: no KL term).

    Shared by the trainer and by lent helpers so both compute the same function of the same
    weights. Returns ``(loss, stats, generated_tokens, logprob_seconds)``."""
    import time

    import torch

    ids, attn, mask, adv = batch
    t0 = time.perf_counter()
    with torch.no_grad():
        old = token_logprobs(behaviour, ids, attn)
        r = token_logprobs(ref, ids, attn) if ref is not None and kl_coef > 0 else None
    t_fwd = time.perf_counter() - t0
    logp = token_logprobs(policy, ids, attn)
    loss, st = grpo_loss(logp, old, mask, adv, clip, r, kl_coef)
    return loss, st, int(mask.sum()), t_fwd


def merge_stats(parts: Sequence[tuple[dict[str, float], int]]) -> dict[str, float]:
    """Token-weighted mean of per-shard loss statistics: the statistics of the whole mini-batch's
    token-mean loss (each shard's are means over its own generated tokens)."""
    total = sum(n for _, n in parts)
    if not parts:
        return {}
    keys = parts[0][0].keys()
    if total <= 0:
        return {k: float(np.mean([s[k] for s, _ in parts])) for k in keys}
    return {k: float(sum(s[k] * n for s, n in parts) / total) for k in keys}
