"""The GRPO learner: plain torch, or DeepSpeed ZeRO 1-3 across data-parallel workers.

One ``Learner`` runs in each training worker (a Ray actor, or a torchrun process). With
DeepSpeed, the workers form a process group (gloo on CPU, NCCL on GPUs) and DeepSpeed averages
gradients and shards optimizer state (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3). On
CPU we pass ``torch.optim.AdamW`` as the client optimizer so DeepSpeed does not JIT-build its
fused Adam.

A step: the old policy's log-probs are computed first (no grad, the weights that generated the
rollout), then ``mini_batches`` optimizer steps over this worker's shard, each with the clipped
GRPO loss (``grpo``), optionally with a KL penalty to the frozen initial model. Every forward
covers at most ``logprob_tokens`` tokens (``grpo.accumulate_grpo``: gradients accumulated over
micro-batches), so a batch's full-vocabulary logits never exist at once. On GPUs: bf16 compute
with fp32 master weights; ZeRO-3 builds the model partitioned (``load_zero3``).

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

from libra.runtime.grpo import LOGPROB_TOKENS, Sample, accumulate_grpo, collate, token_logprobs

BACKENDS: tuple[str, ...] = ("torch", "deepspeed")


def _ds_config(zero_stage: int, clip_norm: float, bf16: bool = False) -> dict[str, Any]:
    """DeepSpeed's config. ``bf16`` (GPUs): bf16 weights, activations and gradients with fp32
    master weights and Adam moments in the optimizer (DeepSpeed keeps the fp32 copy, sharded
    under ZeRO), the precision the cost model prices; CPU runs stay fp32."""
    return {
        "bf16": {"enabled": bool(bf16)},
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip_norm,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def load_zero3(model_dir: str, ds_cfg: dict[str, Any], dtype: Any, rank: int) -> Any:
    """The policy built under ``deepspeed.zero.Init`` (each rank allocates only its partition of
    every parameter) and filled from the folder's safetensors one parameter at a time: rank 0
    reads that tensor and scatters it (``GatheredParameters(modifier_rank=0)``), so no rank ever
    holds the whole model. (transformers' own ZeRO-3 path needs ``accelerate``; this needs only
    DeepSpeed and safetensors.) Raises when a parameter is missing from the files."""
    import deepspeed
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights  # type: ignore[no-redef]

    config = AutoConfig.from_pretrained(model_dir)
    # no random init: it would index empty partitions, and every value is loaded below anyway
    with deepspeed.zero.Init(config_dict_or_path=ds_cfg, dtype=dtype), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()  # init_weights (skipped) is what ties them
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights (ZeRO-3 loads safetensors only)")
    for path in files:
        with safe_open(path, framework="pt") as sf:
            for key in sf.keys():
                p = params.get(key)
                if p is None:
                    continue
                with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                    if rank == 0:
                        p.data.copy_(sf.get_tensor(key).to(p.dtype))
                loaded.add(key)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{model_dir}: the weights files lack {len(missing)} parameters, e.g. {missing[:3]}")
    return model


class Learner:
    """GRPO on one worker (see the module docstring). ``rank``/``world`` are the DP group."""

    def __init__(self, model_dir: str, backend: str = "torch", zero_stage: int = 2, lr: float = 1e-3, clip: float = 0.2,
                 kl_coef: float = 0.0, mini_batches: int = 2, seed: int = 0, rank: int = 0, world: int = 1,
                 device: str = "cpu", max_grad_norm: float = 1.0, threads: int | None = None, local_rank: int = 0,
                 logprob_tokens: int = LOGPROB_TOKENS, temperature: float = 1.0, behaviour_cap: float = 5.0) -> None:
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
        # off-policy samples (async loop): the engines' sampling temperature, so the proximal
        # policy's log-probs compare with the behaviour log-probs they returned, and the cap of
        # the behaviour importance weight (``grpo.behaviour_weights``)
        self.temperature, self.behaviour_cap = float(temperature), float(behaviour_cap)
        if device == "cuda":  # the GPU Ray showed this worker (rendezvous.local_rank; 0 with one GPU visible)
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device(device)
        self.model_dir = model_dir
        self.behaviour: Any = None  # frozen step-start policy for streamed mini-batches (begin_step)
        self.logprob_tokens = logprob_tokens
        # GPUs compute in bf16 with fp32 master weights: DeepSpeed's bf16 mode (bf16 module, fp32
        # optimizer copy), or for the torch trainer fp32 parameters under bf16 autocast
        self.bf16 = self.device.type == "cuda"
        ds_cfg = _ds_config(zero_stage, max_grad_norm, bf16=self.bf16)
        if backend == "deepspeed":
            import importlib

            import deepspeed

            ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
            # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce op at
            # init_distributed (30-45 s on an idle 2-core machine, minutes on a busy one). Only its
            # inference kernels use that op; ZeRO training goes through torch.distributed (gloo),
            # so we skip the build.
            ds_torch_comm.build_shm_op = lambda: None
            if not torch.distributed.is_initialized():
                deepspeed.init_distributed(dist_backend="gloo" if self.device.type == "cpu" else "nccl")
        load_dtype = torch.bfloat16 if (self.bf16 and backend == "deepspeed") else torch.float32
        self._ds_cfg, self._load_dtype = ds_cfg, load_dtype
        self._zero3 = backend == "deepspeed" and zero_stage == 3  # frozen copies are partitioned too
        if backend == "deepspeed" and zero_stage == 3:
            model = load_zero3(model_dir, ds_cfg, load_dtype, rank)  # each rank builds only its partition
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=load_dtype)
        self.built_partitioned = self.zero3_partitioned(model)  # ZeRO-3: no rank ever held the whole model
        if not self.built_partitioned:
            model = model.to(self.device)
        self.pad_id = int(model.config.pad_token_id or 0)
        self.ref = self._frozen() if kl_coef > 0 else None
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.step_done = 0
        self.optimizer_reset = False  # set when a checkpoint's optimizer state could not be loaded
        if backend == "deepspeed":
            import deepspeed

            self.engine, self.opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_cfg)
            self.model = self.engine.module
            self.zero_stage = zero_stage
        else:
            self.engine, self.opt, self.model, self.zero_stage = None, opt, model, 0

    @staticmethod
    def zero3_partitioned(model: Any) -> bool:
        """True when ``model`` was built partitioned by ZeRO-3 (its parameters carry ``ds_id``)."""
        return any(hasattr(p, "ds_id") for p in model.parameters())

    def _frozen(self) -> Any:
        """A frozen copy of the model folder's policy (reference or behaviour), in bf16 on GPUs.
        Under ZeRO-3 it is partitioned like the policy (built by ``load_zero3`` and wrapped by
        DeepSpeed without an optimizer, whose hooks gather each layer for its forward), so no
        rank holds a whole copy; otherwise a full copy on every rank."""
        torch = self.torch
        if self._zero3:
            import deepspeed

            cfg = {k: v for k, v in self._ds_cfg.items() if k not in ("gradient_clipping", "zero_allow_untested_optimizer")}
            m = load_zero3(self.model_dir, cfg, self._load_dtype, self.rank)
            for p in m.parameters():
                p.requires_grad_(False)
            eng, *_ = deepspeed.initialize(model=m, config=cfg)
            eng.eval()
            return eng
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.bfloat16 if self.bf16 else torch.float32)
        m = m.to(self.device).eval()
        for p in m.parameters():
            p.requires_grad_(False)
        return m

    def _autocast(self) -> Any:
        """bf16 autocast for the torch trainer on GPUs (fp32 master parameters); a no-op otherwise
        (DeepSpeed's bf16 module already computes in bf16)."""
        import contextlib

        if self.bf16 and self.engine is None:
            return self.torch.autocast("cuda", dtype=self.torch.bfloat16)
        return contextlib.nullcontext()

    def _micro_count(self, rows: int, width: int) -> int | None:
        """Micro-batches of one mini-batch: the token budget's, agreed on by every DeepSpeed rank
        (the maximum; ZeRO-3 gathers parameters in every forward, so ranks run the same number)."""
        from libra.runtime.grpo import micro_slices

        n = len(micro_slices(rows, width, self.logprob_tokens))
        if self.engine is None:
            return n
        t = self.torch.tensor([n], device=self.device if self.device.type == "cuda" else "cpu")
        self.torch.distributed.all_reduce(t, op=self.torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def _backward(self, loss: Any, last: bool) -> None:
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss)
        else:
            loss.backward()

    # ---- training ----------------------------------------------------------------------------
    def _forward_logp(self, ids: Any, attn: Any, temperature: float = 1.0) -> Any:
        net = self.engine if self.engine is not None else self.model
        with self._autocast():
            return token_logprobs(net, ids, attn, self.logprob_tokens, self._micro_count(ids.shape[0], ids.shape[1]), temperature)

    def _frozen_logp(self, model: Any, ids: Any, attn: Any) -> Any:
        """Log-probs under a frozen copy: rank-local micro-batches for a full copy, the ranks'
        agreed count for a ZeRO-3 partitioned one (its forwards gather parameters)."""
        count = self._micro_count(ids.shape[0], ids.shape[1]) if self._zero3 else None
        with self.torch.no_grad(), self._autocast():
            return token_logprobs(model, ids, attn, self.logprob_tokens, count)

    def _update(self, batch: tuple[Any, Any, Any, Any], old: Any, ref: Any, scale: float = 1.0, weight: Any = None) -> dict[str, float]:
        """One optimizer step on ``batch``: gradients accumulated over micro-batches of at most
        ``logprob_tokens`` tokens (``grpo.accumulate_grpo``), clipped, applied."""
        torch = self.torch
        net = self.engine if self.engine is not None else self.model
        ids = batch[0]
        if self.engine is None:
            self.opt.zero_grad(set_to_none=True)
        with self._autocast():
            st, _ = accumulate_grpo(net, batch, old, ref, self.clip, self.kl_coef, lambda loss, last: self._backward(loss * scale, last),
                                    self.logprob_tokens, self._micro_count(ids.shape[0], ids.shape[1]), weight)
        if self.engine is not None:
            self.engine.step()
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.opt.step()
        return st

    def train_step(self, samples: Sequence[Sample], die_after: int | None = None, max_staleness: int | None = None) -> dict[str, float]:
        """One RL step on this worker's shard (every worker of a DeepSpeed group must call it
        with the same number of mini-batches: the driver gives each at least ``mini_batches``).
        ``die_after``: fault injection, the process exits after that many optimizer steps.

        ``max_staleness`` K (the async loop): refuse (``staleness.StalenessError``) a sample whose
        version is older than this trainer's ``step_done - K``, before any optimizer step: the
        driver checks the same rule, and this is the trainer's own count of its updates. Samples
        with behaviour log-probs train with decoupled PPO (``grpo``): the old log-probs computed
        here, before the first optimizer step, are the proximal policy's."""
        from libra.runtime.grpo import behaviour_targets, behaviour_weights
        from libra.runtime.staleness import check_fresh

        torch = self.torch
        if max_staleness is not None:
            versions = {s.traj_id or str(i): s.version for i, s in enumerate(samples)}
            if self.engine is not None:  # DeepSpeed: every rank decides on the group's oldest sample (no rank left in a collective)
                t = torch.tensor([min(versions.values(), default=self.step_done)], device=self.device if self.device.type == "cuda" else "cpu")
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
                versions["(the oldest of the group's shards)"] = int(t.item())
            check_fresh(self.step_done, self.step_done, max_staleness, versions, allow_newer=True)
        t0 = time.perf_counter()
        m = max(1, min(self.mini_batches, len(samples)))
        chunks = [list(samples[i::m]) for i in range(m)]
        batches = [tuple(x.to(self.device) for x in collate(c, self.pad_id)) for c in chunks]
        with torch.no_grad():
            old = [self._forward_logp(ids, attn) for ids, attn, _, _ in batches]
            ref = [self._frozen_logp(self.ref, ids, attn) for ids, attn, _, _ in batches] if self.ref is not None else [None] * m
            weights: list[Any] = [None] * m
            wstats: list[tuple[dict[str, float], int]] = []
            for i, (c, batch) in enumerate(zip(chunks, batches)):
                behav = behaviour_targets(c, batch[0].shape[1])
                if behav is None:
                    continue
                ids, attn, mask = batch[0], batch[1], batch[2]
                prox = old[i] if self.temperature == 1.0 else self._forward_logp(ids, attn, self.temperature)
                weights[i], ws = behaviour_weights(prox, behav.to(self.device), mask, self.behaviour_cap)
                wstats.append((ws, int(mask.sum())))
        t_fwd = time.perf_counter() - t0
        stats: dict[str, float] = {}
        tokens = 0
        done_mb = 0
        for batch, o, r, w in zip(batches, old, ref, weights):
            st = self._update(batch, o, r, weight=w)  # type: ignore[arg-type]
            tokens += int(batch[1].sum())
            done_mb += 1
            if die_after is not None and done_mb >= die_after:
                os._exit(1)
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v / m
        self.step_done += 1
        if wstats:
            from libra.runtime.grpo import merge_stats

            stats.update(merge_stats(wstats))
        stats.update(train_s=time.perf_counter() - t0, logprob_s=t_fwd, tokens=float(tokens), samples=float(len(samples)), rank=float(self.rank),
                     version=float(self.step_done))
        return stats

    # ---- streaming: one mini-batch at a time -------------------------------------------------
    def begin_step(self) -> float:
        """Freeze the step-start weights as the behaviour policy for this step's old log-probs
        (a collective under ZeRO-3: every rank calls it). Returns seconds."""
        t0 = time.perf_counter()
        if self.behaviour is None:
            self.behaviour = self._frozen()
        if self._zero3:  # same partitioning on both: each rank copies its own shards, nothing is gathered
            with self.torch.no_grad():
                for b, p in zip(self.behaviour.module.parameters(), self.model.parameters()):
                    b.ds_tensor.data.copy_(p.ds_tensor.data)
        else:
            self.behaviour.load_state_dict(self.state_dict())
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
        if self.engine is not None or not helpers:  # train_step's arithmetic, old log-probs from the frozen step-start copy
            batch = tuple(x.to(self.device) for x in collate(list(samples), self.pad_id))
            ids, attn = batch[0], batch[1]
            old = self._frozen_logp(self.behaviour, ids, attn)
            ref = self._frozen_logp(self.ref, ids, attn) if self.ref is not None and self.kl_coef > 0 else None
            t_fwd = time.perf_counter() - t0
            st = self._update(batch, old, ref, scale if self.engine is not None else 1.0)  # type: ignore[arg-type]
            tokens = int(attn.sum()) if self.engine is not None else sum(len(s.ids) for s in samples)
        else:
            self.opt.zero_grad(set_to_none=True)
            params = list(self.model.parameters())
            # gradients of this worker's and the helpers' sub-shards, summed, then divided by their tokens
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

    def weight_meta(self) -> dict[str, list[Any]]:
        """What ``broadcast_weights`` sends: names, dtype names (bf16), full shapes."""
        from libra.runtime.weight_broadcast import weight_meta

        return weight_meta(self.model, self.torch.bfloat16)

    def broadcast_weights(self, master: str | None = None, port: int = 0, world: int = 0) -> float:
        """The GPU weight sync (``weight_broadcast``): rank 0 sends every parameter in bf16
        buckets over NCCL to the engines' workers; under ZeRO-3 every rank takes part in the
        per-parameter gathers. ``master``/``port``/``world``: (re)build the group first (rank 0).
        Returns seconds."""
        from libra.runtime import weight_broadcast as wb

        t0 = time.perf_counter()
        if master is not None and self.rank == 0:
            self._wgroup = wb.trainer_group(master, port, world)
        params = wb.model_params(self.model, self.torch.bfloat16, self.rank, self.zero_stage == 3)
        if self.rank == 0:
            wb.send(params, self._wgroup)
        else:
            for _ in params:  # the gathers are collectives: drain in step with rank 0
                pass
        self.torch.cuda.synchronize()
        return time.perf_counter() - t0

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
