"""``TrainStrategy``: the shape of a training job (TP x PP x DP, EP, ZeRO stage, micro-batch,
recompute), as frozen data.

Why a module of its own: the memory model (what fits) and the training timer (how long) both
take a strategy, and the planner's ``TrainConfig`` is this same type. Kept here, with no other
import, neither of those modules has to import the other for it (they used to import each other).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrainStrategy:
    """A training strategy on ``tp * pp * dp`` GPUs (``libra.planner.plan.TrainConfig`` is this
    type: the planner's plans carry it as they hand it to the evaluator).
    EP follows Megatron's MoE parallel folding (ETP = 1, CP = 1): the MoE layers re-fold a
    stage's ``tp * dp`` ranks as EP x expert-DP, so ``ep`` divides ``tp * dp``."""

    tp: int
    pp: int
    dp: int
    ep: int = 1
    zero_stage: int = 1
    micro_batch: int = 1
    recompute: bool = False

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp * self.dp
