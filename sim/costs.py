"""The simulator's ground-truth costs: the calibrated cost evaluator, cached and adapted.

Why a wrapper: the rollout hot path asks for decode coefficients at every interval and for a
prefill at most of them, tens of thousands of times per step; even the evaluator's scalar paths
cost tens of microseconds a call (argument checks, operator tables). Coefficients depend only on
(TP, batch), so they are cached; prefills are memoized on rounded arguments. Noise is NOT applied
here: callers multiply by ``sim.noise.Noise`` factors, so the planner (which predicts with the
same evaluator) is never magically exact.

Everything that is not the rollout itself (the training stage, the per-sample bookkeeping, the
weight sync, the colocated stage switches, role changes, plan transitions, KV migration) is priced
by ``self.step``, a ``libra.planner.step_costs.StepCosts`` over the same evaluator: the object
the planner predicts with, so a replay with noise off charges exactly the planner's prices.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from libra.errors import UserError
from libra.planner.costs import CostModel
from libra.planner.plan import RolloutInstance, TrainConfig
from libra.planner.step_costs import StepCosts


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
        #: the step's non-rollout prices, shared with the planner (see the module docstring)
        self.step = StepCosts(ev, gpus_per_node)

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
        return self.step.kv_migration_s(tokens, tp_src, tp_dst, same_node)

    # ------------------------------------------------------------------ training (StepCosts)
    def strategy(self, cfg: TrainConfig) -> Any:
        """``cfg`` as the evaluator's TrainStrategy."""
        return self.step.strategy(cfg)

    def train_stage_s(self, cfg: TrainConfig, tokens: int, seq_len: int, kl: bool) -> tuple[float, float]:
        """(forward passes, update) of one RL step's training (``StepCosts.train_stage_s``)."""
        return self.step.train_stage_s(cfg, tokens, seq_len, kl)

    def weight_sync_s(self, cfg: TrainConfig, instances: Sequence[RolloutInstance], train_gpus: Sequence[int]) -> float:
        """Pushing the new weights to every instance (``StepCosts.weight_sync_s``: NVLink when
        ``train_gpus`` and every instance share one NVLink domain)."""
        return self.step.weight_sync_s(cfg, instances, train_gpus)

    def to_train_s(self, rollout_tp: int, cfg: TrainConfig) -> float:
        """An elastic-pool GPU of a TP-``rollout_tp`` instance joining ``cfg``'s training."""
        return self.step.lend_s(cfg, rollout_tp)

    def to_rollout_s(self, rollout_tp: int, cfg: TrainConfig) -> float:
        """A lent GPU going back to rollout after ``cfg``'s training."""
        return self.step.return_s(cfg, rollout_tp)


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
