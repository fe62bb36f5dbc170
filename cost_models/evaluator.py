"""``CostEvaluator``: the one object the planner and the simulator ask "how long" and "does it
fit" for a (GPU, model) pair.

Why a facade: callers should not assemble catalogs, operator sets, memory and timing modules
themselves, and they must all agree on the same calibration. The evaluator binds them once and
caches what is expensive (the decode coefficient tables per TP degree).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from numpy.typing import ArrayLike

from cost_models import memory as _mem
from cost_models import rl_overheads as _rl
from cost_models import training as _train
from cost_models import transfers as _xfer
from cost_models.calibration.stages import StageFit, StageOverheads
from cost_models.calibration.store import EngineOverhead, load_stage_overheads
from cost_models.engines.profile import EngineProfile
from cost_models.engines.registry import resolve_engine
from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.memory import MemoryReport
from cost_models.models import ModelSpec, get_model
from cost_models.operators import load_operators
from cost_models.operators.base import OperatorSet
from cost_models.rollout import RolloutTimer
from cost_models.training import TrainStrategy


#: no correction (scale 1, no fixed seconds)
_IDENTITY = StageFit()


class CostEvaluator:
    """Timing and memory answers for one GPU kind and one model (see docs/cost-model.md)."""

    def __init__(
        self,
        gpu: str | GPUSpec,
        model: str | os.PathLike[str] | ModelSpec,
        calibration: str | os.PathLike[str] | None = None,
        gpus_per_node: int | None = None,
        ops: OperatorSet | None = None,
        gpu_mem_util: float = 0.9,
        max_num_seqs: int = _mem.DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = _mem.DEFAULT_MAX_BATCHED_TOKENS,
        engine: str | os.PathLike[str] | EngineProfile | EngineOverhead | None = None,
        stage_overheads: StageOverheads | None = None,
    ) -> None:
        """``calibration``: a ``libra-calibrate fit`` file; its operator tables time the
        kernels. ``engine``: the inference engine's per-iteration profile
        (``cost_models.engines``): a bundled name (``vllm-2024``, ``trtllm-2024``,
        ``constants``), a profile JSON file, an ``EngineProfile``, or an ``EngineOverhead``.
        Without it, the calibration file's ``engine`` entry (as a two-term profile) when it
        has one, else the default profile (``cost_models.engines.DEFAULT_PROFILE``).
        ``stage_overheads``: per-stage corrections fitted on a run's logs
        (``cost_models.calibration.stages``); without it, the calibration file's
        ``stage_overheads`` entry when it has one, else none."""
        spec = get_gpu(gpu)
        if gpus_per_node is not None:
            spec = spec.with_gpus_per_node(int(gpus_per_node))  # keeps a larger NVLink domain (NVL72)
        self.gpu: GPUSpec = spec
        self.model: ModelSpec = get_model(model)
        self.ops: OperatorSet = ops if ops is not None else load_operators(spec, calibration)
        self.gpu_mem_util = gpu_mem_util
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.engine: EngineProfile = resolve_engine(engine, calibration)
        self._rollout = RolloutTimer(self.ops, self.gpu, self.model, profile=self.engine)
        self._kv_cap: dict[int, int] = {}
        if stage_overheads is None and calibration is not None:
            stage_overheads = load_stage_overheads(calibration)
        self.stage_overheads: StageOverheads | None = stage_overheads
        st = stage_overheads.stages if stage_overheads is not None else {}
        self._st_rollout, self._st_logprob, self._st_update, self._st_sync, self._st_step = (
            st.get(k, _IDENTITY) for k in ("rollout", "log_prob", "update", "sync", "step"))

    def __repr__(self) -> str:
        return f"CostEvaluator(gpu={self.gpu.name!r}, model={self.model.name!r}, ops={self.ops!r}, engine={self.engine.name!r})"

    # ---- rollout ----------------------------------------------------------------------------
    def decode_s(self, tp: ArrayLike, batch: ArrayLike, total_context: ArrayLike) -> Any:
        """One decode iteration: ``batch`` sequences, ``total_context`` KV tokens summed over them."""
        return self._st_rollout.apply(self._rollout.decode_s(tp, batch, total_context))

    def decode_coeffs(self, tp: ArrayLike, batch: ArrayLike) -> tuple[Any, Any]:
        """``(base_s, per_kv_token_s)``: ``decode_s == base_s + per_kv_token_s * total_context``."""
        base, slope = self._rollout.decode_coeffs(tp, batch)
        k = self._st_rollout.scale
        return (base, slope) if k == 1.0 else (base * k, slope * k)

    def prefill_s(self, tp: ArrayLike, new_tokens: ArrayLike, cached_tokens: ArrayLike = 0, batch: ArrayLike = 1) -> Any:
        """One forward over ``batch`` sequences each adding ``new_tokens`` after ``cached_tokens``."""
        return self._st_rollout.apply(self._rollout.prefill_s(tp, new_tokens, cached_tokens, batch))

    def rollout_memory(self, tp: int) -> MemoryReport:
        """Per-GPU memory of a rollout instance (weights, activation peak, reserve, KV cache)."""
        return _mem.rollout_memory(
            self.gpu, self.model, tp, self.gpu_mem_util, self.max_num_batched_tokens, self.max_num_seqs
        )

    def kv_capacity_tokens(self, tp: int) -> int:
        """KV-cache tokens an instance of ``tp`` GPUs holds (0: the model does not fit)."""
        cap = self._kv_cap.get(tp)
        if cap is None:
            cap = _mem.kv_capacity_tokens(
                self.gpu, self.model, tp, self.gpu_mem_util, self.max_num_batched_tokens, self.max_num_seqs
            )
            self._kv_cap[tp] = cap
        return cap

    def max_running_seqs(self, tp: int) -> int:
        """Most sequences an instance runs at once: vLLM's ``max_num_seqs`` (256) unless the KV
        cache holds fewer blocks than that (every running sequence needs at least one block)."""
        return min(self.max_num_seqs, self.kv_capacity_tokens(tp) // _mem.KV_BLOCK_TOKENS)

    def engine_extrapolation(self, rollout_tps: Sequence[int], batch_per_instance: int | None = None) -> list[str]:
        """Where rollout times at these TP degrees with about ``batch_per_instance`` running
        sequences (capped at what an instance runs at once) rest on the engine profile outside
        what it was fitted on, in words; empty when inside. Why: a TP speed-up beyond the measured
        TP degrees is the profile's structure extrapolated, which can be far off (docs/cost-model.md,
        "Engine profiles"), and the planner's user should see which choices rest on it."""
        tps = sorted({int(t) for t in rollout_tps})
        b = batch_per_instance
        if b is not None and tps:
            b = min(int(b), max(self.max_running_seqs(t) for t in tps))
        return self.engine.extrapolation(tps, b)

    def valid_rollout_tps(self) -> list[int]:
        """TP degrees an engine runs (``memory.tp_rule``: inside one NVLink domain, at most
        ``ROLLOUT_MAX_TP``) that leave room for a KV cache."""
        return [t for t in _mem.tp_degrees(self.model, self.gpu.nvlink_domain, rollout=True) if self.kv_capacity_tokens(t) > 0]

    # ---- training ---------------------------------------------------------------------------
    def validate(self, strategy: TrainStrategy, n_gpus: int | None = None) -> None:
        """Raise ``CostModelError`` naming what would work if ``strategy`` cannot run."""
        _train.validate_strategy(strategy, self.model, self.gpu, n_gpus)

    def train_iter_s(self, strategy: TrainStrategy, tokens: int, seq_len: int) -> float:
        """One optimizer step over ``tokens`` tokens in sequences of ``seq_len``."""
        return self._st_update.apply(_train.train_iter_s(self.ops, self.gpu, self.model, strategy, tokens, seq_len))

    def forward_s(self, strategy: TrainStrategy, tokens: int, seq_len: int) -> float:
        """A forward-only log-prob pass (old policy / reference model) over ``tokens``."""
        return self._st_logprob.apply(_train.forward_s(self.ops, self.gpu, self.model, strategy, tokens, seq_len))

    def train_memory(self, strategy: TrainStrategy, seq_len: int, suggest: bool = True) -> MemoryReport:
        """Per-GPU training memory; when it does not fit and ``suggest``, nearby strategies that
        would (the search for them costs a few ms, so the planner's leaf checks switch it off)."""
        self.validate(strategy)
        return _mem.train_memory(self.gpu, self.model, strategy, seq_len, suggest=suggest)

    # ---- transfers --------------------------------------------------------------------------
    def weight_sync_s(
        self,
        n_train_gpus: int | None = None,
        train_tp: int | None = None,
        train_pp: int | None = None,
        rollout_tps: Sequence[int] = (),
        same_node: bool = False,
        mode: _xfer.SyncMode = "broadcast",
        strategy: TrainStrategy | None = None,
        bucket_bytes: float | None = None,
    ) -> float:
        """Push the trained weights into every rollout instance (``rollout_tps``: one TP degree
        per instance). The trainer is given either as ``n_train_gpus, train_tp, train_pp`` or as
        ``strategy``. See ``transfers.weight_sync_s`` for the broadcast, sharded and (colocated)
        ipc forms; ``bucket_bytes`` packs tensors into buckets (default: one message per tensor)."""
        if strategy is not None:
            n_train_gpus = strategy.n_gpus if n_train_gpus is None else n_train_gpus
            train_tp = strategy.tp if train_tp is None else train_tp
            train_pp = strategy.pp if train_pp is None else train_pp
        if n_train_gpus is None or train_tp is None or train_pp is None:
            raise CostModelError("weight_sync_s needs n_train_gpus, train_tp and train_pp, or strategy=")
        return self._st_sync.apply(_xfer.weight_sync_s(
            self.ops, self.gpu, self.model, n_train_gpus, train_tp, train_pp, rollout_tps, same_node, mode, bucket_bytes
        ))

    def kv_migration_s(self, tokens: float, tp_src: int, tp_dst: int, same_node: bool = True) -> float:
        """Move one sequence's ``tokens`` of KV cache between two instances."""
        return _xfer.kv_migration_s(self.ops, self.model, tokens, tp_src, tp_dst, same_node)

    def role_change_s(
        self,
        to: Literal["rollout", "train"],
        rollout_tp: int = 1,
        strategy: TrainStrategy | None = None,
        offload_previous: bool = True,
    ) -> float:
        """One GPU switching role through host memory (see ``transfers.role_change_s``)."""
        s = strategy or TrainStrategy(1, 1, 1)
        return _xfer.role_change_s(
            self.gpu, self.model, to, rollout_tp, s.tp, s.pp, s.dp, s.ep, s.zero_stage, offload_previous
        )

    def trainer_build_s(self, strategy: TrainStrategy | None = None) -> float:
        """One training GPU re-built in ``strategy``'s layout before any optimizer step (only its
        bf16 weight shard loads; see ``rl_overheads.trainer_build_s``)."""
        s = strategy or TrainStrategy(1, 1, 1)
        return _rl.trainer_build_s(self.gpu, self.model, s.tp, s.pp, s.dp, s.ep, s.zero_stage)

    # ---- RL step overheads (cost_models.rl_overheads) ----------------------------------------
    def stage_switch_s(
        self, to: Literal["rollout", "train"], rollout_tp: int = 1, strategy: TrainStrategy | None = None
    ) -> float:
        """One GPU of a colocated plan switching stage: to ``train`` the engine sleeps and the
        trainer onloads its state; to ``rollout`` the trainer offloads and the engine wakes (the
        new weights then come by ``weight_sync_s(mode="ipc")``). See ``rl_overheads``."""
        s = strategy or TrainStrategy(1, 1, 1)
        return self._st_sync.apply(_rl.stage_switch_s(self.gpu, self.model, to, rollout_tp, s.tp, s.pp, s.dp, s.ep, s.zero_stage))

    def step_fixed_s(self, n_samples: int) -> float:
        """Per-step bookkeeping between rollout and training (reward, advantage, data movement)
        for ``n_samples`` trajectories (``rl_overheads.step_fixed_s``)."""
        return self._st_step.apply(_rl.step_fixed_s(n_samples))

    def weight_tensors(self) -> int:
        """Tensors of the model's state dict: the messages of an unbucketed weight sync."""
        return _rl.weight_tensors(self.model)
