"""The simulator's ground-truth costs: the core's cached rollout prices, plus the loader.

``SimCosts`` is ``libra.planner.rollout_costs.RolloutCosts`` (decode coefficients, KV capacity,
running sequences and batched prefill, cached; ``memo``; ``step``, the ``StepCosts`` the
planner predicts with) under the name the simulator has always used, with the adapters its
training stage and elastic pool call. The cache lives in the core because the static baselines
(``libra.policies``) price their candidates with the same object; the simulator re-uses it
rather than keeping a copy. Noise is NOT applied here: callers multiply by ``sim.noise.Noise``
factors, so the planner (which predicts with the same evaluator) is never magically exact.

Everything that is not the rollout itself (the training stage, the per-sample bookkeeping, the
weight sync, the colocated stage switches, role changes, plan transitions, KV migration) is priced
by ``self.step``, a ``libra.planner.step_costs.StepCosts`` over the same evaluator: the object
the planner predicts with, so a replay with noise off charges exactly the planner's prices.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from libra.errors import UserError
from libra.planner.plan import RolloutInstance, TrainConfig
from libra.planner.rollout_costs import RolloutCosts


class SimCosts(RolloutCosts):
    """Cached ground-truth timings for one (GPU, model) pair (``RolloutCosts``), with the
    adapters the simulator's training stage, weight sync and pool call."""

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
