"""The simulator's ground-truth costs: the calibrated cost evaluator, cached and adapted.

Why a wrapper: the rollout hot path asks for decode coefficients at every interval and for a
prefill at most of them, tens of thousands of times per step; even the evaluator's scalar paths
cost tens of microseconds a call (argument checks, operator tables). Coefficients depend only on
(TP, batch), so they are cached; prefills are memoized on rounded arguments. Noise is NOT applied
here: callers multiply by ``sim.noise.Noise`` factors, so the planner (which predicts with the
same evaluator) is never magically exact.

Role changes and the colocated offload/reload go through the evaluator's ``role_change_s``
(PCIe to host memory, its documented bandwidth).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from libra.errors import UserError
from libra.planner.costs import CostModel
from libra.planner.plan import TrainConfig


def to_strategy(cfg: TrainConfig) -> Any:
    """A TrainConfig as the evaluator's TrainStrategy (import deferred: see the module doc)."""
    from libra.planner.costs import to_strategy as _to

    return _to(cfg)


def _q(x: float) -> int:
    """``x`` rounded to 1/8 of an octave (exact below 16): the memo key of a cost call."""
    if x < 16:
        return int(round(x))
    e = math.floor(math.log2(x))
    step = 2.0 ** (e - 3)
    return int(round(x / step) * step)


class SimCosts:
    """Cached ground-truth timings for one (GPU, model) pair."""

    def __init__(self, ev: CostModel, gpus_per_node: int = 8) -> None:
        self.ev = ev
        self.gpus_per_node = gpus_per_node
        self._decode: dict[tuple[int, int], tuple[float, float]] = {}
        self._kv: dict[int, int] = {}
        self._seqs: dict[int, int] = {}
        self._prefill: dict[tuple[int, int, int, int], float] = {}
        #: scratch memo for derived per-step quantities (e.g. ``sim.bounds`` critical paths);
        #: keys name what they cache, values live as long as this object
        self.memo: dict[tuple[object, ...], object] = {}
        self._strategy: dict[TrainConfig, Any] = {}

    # ------------------------------------------------------------------ rollout
    def decode_coeffs(self, tp: int, batch: int) -> tuple[float, float]:
        """(base_s, slope_s_per_kv_token) of one decode iteration, cached."""
        key = (tp, batch)
        c = self._decode.get(key)
        if c is None:
            base, slope = self.ev.decode_coeffs(tp, batch)
            c = (float(base), float(slope))
            self._decode[key] = c
        return c

    def kv_capacity(self, tp: int) -> int:
        """KV-cache tokens one TP-``tp`` instance holds (0: the weights do not fit)."""
        c = self._kv.get(tp)
        if c is None:
            c = self._kv[tp] = int(self.ev.kv_capacity_tokens(tp))
        return c

    def max_seqs(self, tp: int) -> int:
        """vLLM's max running sequences for a TP-``tp`` instance."""
        c = self._seqs.get(tp)
        if c is None:
            c = self._seqs[tp] = max(1, int(self.ev.max_running_seqs(tp)))
        return c

    def prefill_batch_s(self, tp: int, seqs: Sequence[tuple[int, int]]) -> float:
        """Prefill of sequences admitted together, each ``(new_tokens, cached_tokens)``.

        They are prefilled as one batch (chunked prefill packs them into the next iteration):
        ``prefill_s(tp, mean new, mean cached, batch=k)``. The mean under-counts attention of a
        very uneven batch slightly; the decode part of the same iteration is charged separately.
        Calls are memoized on the arguments rounded to 1/8 of an octave (at most 4.4% off one
        argument, under the 3% noise once averaged; replayed makespans moved by <0.3% against
        1/16 octave on the bundled trace) because an evaluator call costs ~80 us and a step asks
        thousands of times.
        """
        k = len(seqs)
        if k == 0:
            return 0.0
        if k == 1:
            new, cached = seqs[0]
        else:
            new = sum(s[0] for s in seqs) / k
            cached = sum(s[1] for s in seqs) / k
        key = (tp, _q(new), _q(cached), _q(k) if k > 16 else k)
        v = self._prefill.get(key)
        if v is None:
            v = self._prefill[key] = float(self.ev.prefill_s(tp, max(1, key[1]), key[2], key[3]))
        return v

    def kv_migration_s(self, tokens: int, tp_src: int, tp_dst: int, same_node: bool) -> float:
        """Moving a sequence's KV between instances over NVLink or the network."""
        return float(self.ev.kv_migration_s(tokens, tp_src, tp_dst, same_node))

    # ------------------------------------------------------------------ training
    def strategy(self, cfg: TrainConfig) -> Any:
        s = self._strategy.get(cfg)
        if s is None:
            s = self._strategy[cfg] = to_strategy(cfg)
        return s

    def train_stage_s(self, cfg: TrainConfig, tokens: int, seq_len: int, kl: bool) -> tuple[float, float]:
        """(forward passes, update) of one RL step's training: old-policy log-probs (and the
        reference model's when ``kl``), then the optimizer pass over the step's tokens."""
        if tokens <= 0:
            return 0.0, 0.0
        s = self.strategy(cfg)
        fwd = float(self.ev.forward_s(s, tokens, seq_len))
        if kl:
            fwd *= 2.0
        return fwd, float(self.ev.train_iter_s(s, tokens, seq_len))

    def weight_sync_s(self, cfg: TrainConfig, rollout_tps: Sequence[int], same_node: bool = False) -> float:
        """Pushing the new weights from the trainer to every rollout instance (broadcast)."""
        if not rollout_tps:
            return 0.0
        return float(self.ev.weight_sync_s(cfg.n_gpus, cfg.tp, cfg.pp, list(rollout_tps), same_node))

    def to_train_s(self, rollout_tp: int, cfg: TrainConfig) -> float:
        """One GPU leaving rollout for training: drop weights and KV, load the training state
        of ``cfg`` from host memory (PCIe)."""
        return float(self.ev.role_change_s("train", rollout_tp, self.strategy(cfg)))

    def to_rollout_s(self, rollout_tp: int, cfg: TrainConfig) -> float:
        """One GPU going back to rollout: offload its training state to host, load the rollout
        weight shard for a TP-``rollout_tp`` engine (PCIe)."""
        return float(self.ev.role_change_s("rollout", rollout_tp, self.strategy(cfg), True))


def load_costs(gpu: str, model: str, gpus_per_node: int = 8, calibration: str | os.PathLike[str] | None = None,
               engine: str | os.PathLike[str] | None = None) -> SimCosts:
    """The real evaluator for ``gpu``/``model`` wrapped for the simulator.

    ``calibration`` is an operator calibration file written by ``libra-calibrate fit``; without
    it the evaluator uses the bundled calibration of ``gpu`` (or the roofline). Passing one is
    how a replay on ``--gpu cpu`` uses the timings profiled on that CPU: the CPU has no bundled
    calibration, and its roofline is only a rough datasheet guess. A missing, unreadable or
    mismatched file is a one-line ``UserError``.

    ``engine`` is the inference-engine profile (``cost_models.engines``: a bundled name such as
    ``vllm-2024``, or a ``libra-calibrate fit-engine`` file); None: the calibration's engine
    entry if it has one, else the default profile. An unknown one is a one-line ``UserError``
    listing the valid names.
    """
    try:
        from cost_models import CostEvaluator  # type: ignore[attr-defined]
        from cost_models.errors import CostModelError
    except ImportError as exc:
        raise UserError(f"the cost evaluator (cost_models.CostEvaluator) is not available: {exc}") from exc
    if engine is not None:  # resolved first, so a bad name is named as --engine, not as --calibration
        from cost_models.engines import get_profile

        try:
            engine = get_profile(engine)  # type: ignore[assignment]
        except CostModelError as exc:
            raise UserError(f"--engine: {exc}") from None
    if calibration is not None:
        path = os.fspath(calibration)
        if os.path.isdir(path):
            raise UserError(f"--calibration {path}: is a folder of measurements; fit it into a file first "
                            f"(`libra-calibrate fit --data {path} --gpu {gpu} -o FILE.json`)")
        if not os.path.isfile(path):
            raise UserError(f"--calibration {path}: file not found (write one with `libra-calibrate fit`)")
        try:
            ev = CostEvaluator(gpu=gpu, model=model, gpus_per_node=gpus_per_node, calibration=path, engine=engine)
        except CostModelError as exc:
            raise UserError(f"--calibration: {exc}") from None
        return SimCosts(ev, gpus_per_node=gpus_per_node)
    ev = CostEvaluator(gpu=gpu, model=model, gpus_per_node=gpus_per_node, engine=engine)
    return SimCosts(ev, gpus_per_node=gpus_per_node)
