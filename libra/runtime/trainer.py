"""The GRPO learner: plain torch, or DeepSpeed ZeRO 1-3 across data-parallel workers.

One ``Learner`` runs in each training worker (a Ray actor, or a torchrun process). With
DeepSpeed, the workers form a process group (gloo on CPU, NCCL on GPUs) and DeepSpeed averages
gradients and shards optimizer state (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3). On
CPU we pass ``torch.optim.AdamW`` as the client optimizer so DeepSpeed does not JIT-build its
fused Adam.

A step: the old policy's log-probs are computed first (no grad, the weights that generated the
rollout), then ``mini_batches`` optimizer steps over this worker's shard, each with the clipped
GRPO loss (``grpo``), optionally with a KL penalty to the frozen initial model.

Streaming (``begin_step``, ``train_minibatch`` per mini-batch as its GRPO groups complete,
``end_step``): the mini-batches arrive while the rollout still runs, after earlier optimizer
steps, so their old log-probs cannot be computed up front; ``begin_step`` freezes a copy of the
step-start weights (the behaviour policy, which generated the whole rollout) and every
mini-batch's old log-probs come from it: the same meaning as ``train_step``. A mini-batch may
carry ``HelperShard``s (``helper``): gradients of sub-shards computed by lent rollout instances,
added to the trainer's own weighted by generated tokens before clipping and the one optimizer
step (torch backend).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence
from typing import Any

from libra.runtime.grpo import Sample, collate, grpo_loss, minibatch_loss, token_logprobs

BACKENDS: tuple[str, ...] = ("torch", "deepspeed")


def _ds_config(zero_stage: int, clip_norm: float) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip_norm,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class Learner:
    """GRPO on one worker (see the module docstring). ``rank``/``world`` are the DP group."""

    def __init__(self, model_dir: str, backend: str = "torch", zero_stage: int = 2, lr: float = 1e-3, clip: float = 0.2,
                 kl_coef: float = 0.0, mini_batches: int = 2, seed: int = 0, rank: int = 0, world: int = 1,
                 device: str = "cpu", max_grad_norm: float = 1.0, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.torch = torch
        self.backend = backend
        self.rank, self.world = rank, world
        self.clip, self.kl_coef, self.mini_batches, self.max_grad_norm = clip, kl_coef, mini_batches, max_grad_norm
        self.device = torch.device(device)
        self.model_dir = model_dir
        self.behaviour: Any = None  # frozen step-start policy for streamed mini-batches (begin_step)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        self.pad_id = int(model.config.pad_token_id or 0)
        self.ref = None
        if kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.step_done = 0
        self.optimizer_reset = False  # set when a checkpoint's optimizer state could not be loaded
        if backend == "deepspeed":
            import deepspeed
            import importlib

            ds_torch_comm = importlib.import_module("deepspeed.comm.torch")

            # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce op at
            # init_distributed (30-45 s on an idle 2-core machine, minutes on a busy one). Only its
            # inference kernels use that op; ZeRO training goes through torch.distributed (gloo),
            # so we skip the build.
            ds_torch_comm.build_shm_op = lambda: None
            if not torch.distributed.is_initialized():
                deepspeed.init_distributed(dist_backend="gloo" if self.device.type == "cpu" else "nccl")
            self.engine, self.opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=_ds_config(zero_stage, max_grad_norm))
            self.model = self.engine.module
            self.zero_stage = zero_stage
        else:
            self.engine, self.opt, self.model, self.zero_stage = None, opt, model, 0

    # ---- training ----------------------------------------------------------------------------
    def _forward_logp(self, ids: Any, attn: Any) -> Any:
        net = self.engine if self.engine is not None else self.model
        return token_logprobs(net, ids, attn)

    def train_step(self, samples: Sequence[Sample], die_after: int | None = None) -> dict[str, float]:
        """One RL step on this worker's shard (every worker of a DeepSpeed group must call it
        with the same number of mini-batches: the driver gives each at least ``mini_batches``).
        ``die_after``: fault injection, the process exits after that many optimizer steps."""
        torch = self.torch
        t0 = time.perf_counter()
        m = max(1, min(self.mini_batches, len(samples)))
        chunks = [list(samples[i::m]) for i in range(m)]
        batches = [tuple(x.to(self.device) for x in collate(c, self.pad_id)) for c in chunks]
        with torch.no_grad():
            old = [self._forward_logp(ids, attn) for ids, attn, _, _ in batches]
            ref = [token_logprobs(self.ref, ids, attn) for ids, attn, _, _ in batches] if self.ref is not None else [None] * m
        t_fwd = time.perf_counter() - t0
        stats: dict[str, float] = {}
        tokens = 0
        done_mb = 0
        for (ids, attn, mask, adv), o, r in zip(batches, old, ref):
            logp = self._forward_logp(ids, attn)
            loss, st = grpo_loss(logp, o, mask, adv, self.clip, r, self.kl_coef)
            if self.engine is not None:
                self.engine.backward(loss)
                self.engine.step()
            else:
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.opt.step()
            tokens += int(attn.sum())
            done_mb += 1
            if die_after is not None and done_mb >= die_after:
                os._exit(1)
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v / m
        self.step_done += 1
        stats.update(train_s=time.perf_counter() - t0, logprob_s=t_fwd, tokens=float(tokens), samples=float(len(samples)), rank=float(self.rank))
        return stats

    # ---- streaming: one mini-batch at a time -------------------------------------------------
    def begin_step(self) -> float:
        """Freeze the step-start weights as the behaviour policy for this step's old log-probs
        (a collective under ZeRO-3: every rank calls it). Returns seconds."""
        torch = self.torch
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        state = self.state_dict()
        if self.behaviour is None:
            self.behaviour = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device).eval()
            for p in self.behaviour.parameters():
                p.requires_grad_(False)
        self.behaviour.load_state_dict(state)
        return time.perf_counter() - t0

    def train_minibatch(self, samples: Sequence[Sample], helpers: Sequence[Any] = (), scale: float = 1.0,
                        die: bool = False) -> dict[str, float]:
        """One optimizer step on a streamed mini-batch: this worker's ``samples`` plus, on the
        torch backend, the ``helpers``' sub-shards (``HelperShard``). The gradient is the GRPO
        token-mean loss's over all of them; a helper whose result cannot be fetched (it died) is
        recomputed here. ``scale`` multiplies the loss (DeepSpeed: ``world * tokens_rank /
        tokens_minibatch``, so DeepSpeed's rank average is the mini-batch's token mean).
        ``die``: fault injection, exit after the optimizer step."""
        from libra.runtime.grpo import merge_stats
        from libra.runtime.helper import accumulate_shard_grad

        torch = self.torch
        if self.behaviour is None:
            raise RuntimeError("train_minibatch before begin_step: no behaviour policy for the old log-probs")
        if helpers and self.engine is not None:
            raise ValueError("gradient helpers need the torch trainer backend")
        t0 = time.perf_counter()
        helper_samples = recomputed = 0
        if self.engine is not None:
            batch = tuple(x.to(self.device) for x in collate(list(samples), self.pad_id))
            loss, st, n, t_fwd = minibatch_loss(self.engine, self.behaviour, self.ref, batch, self.clip, self.kl_coef)  # type: ignore[arg-type]
            self.engine.backward(loss * scale)
            self.engine.step()
            tokens = int(batch[1].sum())
        else:
            self.opt.zero_grad(set_to_none=True)
            params = list(self.model.parameters())
            if not helpers:  # exactly train_step's arithmetic (no token re-weighting needed)
                batch = tuple(x.to(self.device) for x in collate(list(samples), self.pad_id))
                loss, st, n, t_fwd = minibatch_loss(self.model, self.behaviour, self.ref, batch, self.clip, self.kl_coef)  # type: ignore[arg-type]
                loss.backward()
                n = 1  # the gradient is already the token mean
            else:
                st, n, t_fwd = accumulate_shard_grad(self.model, self.behaviour, self.ref, samples, self.pad_id, self.device, self.clip,
                                                     self.kl_coef)
            parts = [(st, n)]
            tokens = sum(len(s.ids) for s in samples)
            for h in helpers:
                try:
                    g = h.fetch()
                    if len(g.grads) != len(params):
                        raise ValueError(f"helper sent {len(g.grads)} gradients for {len(params)} parameters")
                    for p, gr in zip(params, g.grads):
                        if gr is None:
                            continue
                        gr = gr.to(p.device)
                        p.grad = gr.clone() if p.grad is None else p.grad.add_(gr)
                    parts.append((g.stats, g.tokens))
                    helper_samples += len(h.samples)
                except Exception:  # the helper is gone (or sent garbage): this worker computes its share
                    hs, hn, hf = accumulate_shard_grad(self.model, self.behaviour, self.ref, h.samples, self.pad_id, self.device, self.clip,
                                                       self.kl_coef)
                    parts.append((hs, hn))
                    t_fwd += hf
                    recomputed += len(h.samples)
                tokens += sum(len(s.ids) for s in h.samples)
            total = max(1, sum(k for _, k in parts))
            for p in params:
                if p.grad is not None:
                    p.grad.div_(total)
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self.opt.step()
            st = merge_stats(parts)
        if die:
            os._exit(1)
        st = dict(st)
        st.update(train_s=time.perf_counter() - t0, logprob_s=t_fwd, tokens=float(tokens), samples=float(len(samples)),
                  helper_samples=float(helper_samples), recomputed=float(recomputed), rank=float(self.rank))
        return st

    def end_step(self) -> int:
        """The streamed step's last mini-batch is done: count the step (checkpoint names)."""
        self.step_done += 1
        return self.step_done

    # ---- weights and checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Full policy weights on CPU (gathered from all ranks under ZeRO-3; a collective there:
        every rank must call it)."""
        if self.engine is not None and self.zero_stage == 3:
            import deepspeed

            params = list(self.model.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def save_checkpoint(self, ckpt_dir: str) -> str:
        """Write step ``step_done``'s checkpoint (model, optimizer, step) and return its path.
        Written to a temporary name and renamed, so a kill mid-write leaves the previous one."""
        torch = self.torch
        tag = f"step{self.step_done:06d}"
        os.makedirs(ckpt_dir, exist_ok=True)
        if self.engine is not None:
            self.engine.save_checkpoint(ckpt_dir, tag=tag, client_state={"step_done": self.step_done}, save_latest=True)
            return os.path.join(ckpt_dir, tag)
        path = os.path.join(ckpt_dir, f"{tag}.pt")
        tmp = path + ".tmp"
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step_done": self.step_done}, tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, ckpt_dir: str) -> int:
        """Resume from the newest checkpoint in ``ckpt_dir``; returns the steps it had done (0: none)."""
        torch = self.torch
        if self.engine is not None:
            if not os.path.isfile(os.path.join(ckpt_dir, "latest")):
                return 0
            try:
                _, client = self.engine.load_checkpoint(ckpt_dir)
            except Exception as exc:  # ZeRO cannot re-partition optimizer state for a new DP size
                if "world size" not in str(exc):
                    raise
                # the plan changed the trainer's DP size: keep the weights, restart the moments
                _, client = self.engine.load_checkpoint(ckpt_dir, load_module_only=True, load_optimizer_states=False,
                                                        load_lr_scheduler_states=False)
                self.optimizer_reset = True
            self.step_done = int((client or {}).get("step_done", 0))
            return self.step_done
        found = sorted(glob.glob(os.path.join(ckpt_dir, "step*.pt")))
        if not found:
            return 0
        ck = torch.load(found[-1], map_location=self.device, weights_only=False)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.step_done = int(ck["step_done"])
        return self.step_done
