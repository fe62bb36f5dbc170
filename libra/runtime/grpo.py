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


#: Tokens (rows x padded width) one forward may cover when log-probs are micro-batched: a
#: micro-batch's full-vocabulary logits are at most this many rows of the vocabulary (4 K tokens
#: x 152 K Qwen vocabulary x 4 bytes = 2.5 GB in fp32, instead of ~40 GB for a 16 x 4 K batch).
LOGPROB_TOKENS = 4096


def micro_slices(rows: int, width: int, token_budget: int | None, count: int | None = None) -> list[slice]:
    """Row slices of a ``rows`` x ``width`` batch, each at most ``token_budget`` tokens (one row at
    least); ``count`` forces that many slices (DeepSpeed ranks must run the same number of
    forwards under ZeRO-3), some possibly empty."""
    if count is None:
        per = rows if not token_budget else max(1, token_budget // max(1, width))
        count = max(1, -(-rows // per))
    bounds = [round(i * rows / count) for i in range(count + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(count)]


def token_logprobs(model: Any, ids: Any, attn: Any, token_budget: int | None = None, count: int | None = None) -> Any:
    """log p(token t+1 | tokens <= t) for every position, shape [B, T-1]. With ``token_budget``
    the rows go through the model in micro-batches of at most that many tokens and each one's
    full-vocabulary logits are dropped once its tokens' log-probs are gathered (use it without
    grad: with grad, autograd keeps every micro-batch's logits; see ``accumulate_grpo``)."""
    import torch

    if count is None and (token_budget is None or ids.shape[0] * ids.shape[1] <= token_budget):
        return _logp(model, ids, attn)
    parts = []
    for sl in micro_slices(ids.shape[0], ids.shape[1], token_budget, count):
        if sl.stop > sl.start:
            parts.append(_logp(model, ids[sl], attn[sl]))
        else:  # an empty slice of a forced count: the forward still runs (ZeRO-3 ranks stay in step)
            _logp(model, ids[:1], attn[:1])
    return torch.cat(parts, 0)


def _logp(model: Any, ids: Any, attn: Any) -> Any:
    import torch

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # fp32 softmax: bf16 would blur the ratios
    return torch.gather(torch.log_softmax(logits, dim=-1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def accumulate_grpo(policy: Any, batch: tuple[Any, Any, Any, Any], old: Any, ref: Any, clip: float, kl_coef: float,
                    backward: Any, token_budget: int | None = None, count: int | None = None) -> tuple[dict[str, float], int]:
    """The gradient of the GRPO token-mean loss of ``batch`` accumulated over row micro-batches of
    at most ``token_budget`` tokens (``count``: exactly that many): each micro-batch's loss is
    weighted by its share of the batch's generated tokens and handed to ``backward(loss, last)``,
    so only one micro-batch's logits live at a time and the summed gradient equals the whole
    batch's. ``old``/``ref``: the batch's old and reference log-probs, tensors or callables of a
    row slice. Returns the token-weighted stats and the batch's generated tokens."""
    import torch

    ids, attn, mask, adv = batch
    total = float(mask.sum().clamp_min(1))
    slices = micro_slices(ids.shape[0], ids.shape[1], token_budget, count)
    parts: list[tuple[dict[str, float], int]] = []
    for i, sl in enumerate(slices):
        weight = 1.0
        if sl.stop <= sl.start:  # an empty slice (forced count): a zero-weight forward keeps ranks in step
            sl, weight = slice(0, 1), 0.0
        o = old(sl) if callable(old) else old[sl]
        r = (ref(sl) if callable(ref) else ref[sl]) if ref is not None else None
        logp = token_logprobs(policy, ids[sl], attn[sl])
        loss, st = grpo_loss(logp, o, mask[sl], adv[sl], clip, r, kl_coef)
        n = float(mask[sl].sum())
        backward(loss * (weight * n / total), i == len(slices) - 1)
        if weight > 0:
            parts.append((st, int(n)))
    if not parts:
        return {}, 0
    with torch.no_grad():
        stats = merge_stats(parts)
    return stats, int(total)


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
