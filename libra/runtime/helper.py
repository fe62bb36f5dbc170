"""Gradient helpers: a rollout instance lent to training computes gradients of sub-shards.

Why this shape: the elastic pool lends an idle rollout instance while a streamed update runs.
Rebuilding the trainer's data-parallel group (DeepSpeed/NCCL) for a worker that stays a few
seconds is the ~150 s synchronous re-shard the paper measured; instead the lent actor builds a
plain trainable copy of the policy in the background (non-blocking join) and, for every
mini-batch that starts after its join finished, computes the gradient of a sub-shard of that
mini-batch. The trainer adds the helpers' gradients to its own, weighted by generated-token
counts, before clipping and ONE optimizer step. Optimizer state never leaves the trainer, so
there is nothing to keep consistent; the combined gradient equals the single-worker gradient of
the mini-batch's GRPO token-mean loss (up to float summation order), because each shard returns
``d(sum over its generated tokens of the per-token loss)/dθ`` = tokens x the gradient of its
token-mean loss, and the trainer divides the sum by the mini-batch's generated tokens.

The helper's copy must hold the trainer's CURRENT weights (the ones the next optimizer step
updates) and the step-start BEHAVIOUR weights (old log-probs); the driver passes the current
weights whenever the trainer has stepped since the helper last loaded them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from libra.runtime.grpo import Sample, collate, minibatch_loss


@dataclass
class GradShard:
    """A helper's result for one sub-shard: ``grads[i]`` is the gradient of the SUM over the
    shard's generated tokens of the per-token loss w.r.t. parameter ``names[i]`` (None: the
    parameter got no gradient)."""

    names: tuple[str, ...]
    grads: list[Any]
    tokens: int
    samples: int
    stats: dict[str, float]
    compute_s: float
    logprob_s: float


@dataclass
class HelperShard:
    """One helper's part of a mini-batch as the trainer receives it: the samples (so the trainer
    can recompute them if the helper is gone) and the helper's result: a Ray ``ObjectRef`` of a
    ``GradShard``, a ``GradShard``, or a callable returning one (in-process use and tests)."""

    samples: list[Sample]
    result: Any
    helper: int = -1  # the lent instance's id, for the record
    meta: dict[str, Any] = field(default_factory=dict)

    def fetch(self) -> GradShard:
        """The helper's gradient; raises whatever the helper's failure raised."""
        if isinstance(self.result, GradShard):
            return self.result
        if callable(self.result):
            out = self.result()
            assert isinstance(out, GradShard)
            return out
        import ray

        return ray.get(self.result)


def accumulate_shard_grad(model: Any, behaviour: Any, ref: Any, samples: Sequence[Sample], pad_id: int, device: Any, clip: float,
                          kl_coef: float) -> tuple[dict[str, float], int, float]:
    """Backpropagate ``tokens x`` the token-mean GRPO loss of ``samples`` into ``model``'s
    ``.grad`` (accumulating: the caller zeroes). Returns ``(stats, tokens, logprob_s)``."""
    batch = tuple(x.to(device) for x in collate(list(samples), pad_id))
    loss, st, n, t_fwd = minibatch_loss(model, behaviour, ref, batch, clip, kl_coef)  # type: ignore[arg-type]
    (loss * n).backward()
    return st, n, t_fwd


class GradHelper:
    """The trainable copy a lent rollout instance builds (see the module docstring)."""

    def __init__(self, model_dir: str, device: str = "cpu", clip: float = 0.2, kl_coef: float = 0.0, pad_id: int | None = None,
                 threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = torch.device(device)
        self.clip, self.kl_coef = clip, kl_coef

        def load() -> Any:
            return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)

        self.model = load()
        self.behaviour = load().eval()
        for p in self.behaviour.parameters():
            p.requires_grad_(False)
        self.ref = None
        if kl_coef > 0:  # the KL reference is the initial model, as in the Learner
            self.ref = load().eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.pad_id = int(pad_id if pad_id is not None else (self.model.config.pad_token_id or 0))
        self.names = tuple(n for n, _ in self.model.named_parameters())
        self.version = -1

    def load(self, current: dict[str, Any] | None, behaviour: dict[str, Any] | None = None, version: int = 0) -> float:
        """Load the trainer's current weights (and, at the join, the step-start behaviour
        weights; None keeps what is there: the checkpoint's initial weights). Returns seconds."""
        t0 = time.perf_counter()
        if behaviour is not None:
            self.behaviour.load_state_dict(behaviour)
        if current is not None:
            self.model.load_state_dict(current)
            self.version = version
        return time.perf_counter() - t0

    def grad(self, samples: Sequence[Sample]) -> GradShard:
        """The gradient of ``samples``'s share of the loss (see ``GradShard``)."""
        t0 = time.perf_counter()
        for p in self.model.parameters():
            p.grad = None
        st, n, t_fwd = accumulate_shard_grad(self.model, self.behaviour, self.ref, samples, self.pad_id, self.device, self.clip, self.kl_coef)
        grads = [None if p.grad is None else p.grad.detach().to("cpu").clone() for p in self.model.parameters()]
        for p in self.model.parameters():
            p.grad = None
        return GradShard(self.names, grads, n, len(samples), st, time.perf_counter() - t0, t_fwd)


def split_for_helpers(samples: Sequence[Sample], n_helpers: int) -> list[list[Sample]]:
    """``samples`` split into ``1 + n_helpers`` interleaved parts (the trainer's first), each
    non-empty: at most ``len(samples) - 1`` helpers take part."""
    k = max(1, min(1 + n_helpers, len(samples)))
    return [list(samples[i::k]) for i in range(k)]

