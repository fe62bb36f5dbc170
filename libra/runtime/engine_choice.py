"""Which rollout engine and engine profile a run uses, and how many devices its trainer takes:
decided from the configuration alone (and what is installed), before Ray starts, because the
planner's cluster (``ClusterSpec.engine``, ``max_train_gpus``) depends on them."""

from __future__ import annotations

from typing import Any


def engine_kind(cfg: Any) -> str:
    """The engine that runs: ``engine``, or for ``auto`` vLLM where it imports, else torch."""
    from libra.runtime.engines import vllm_available

    return cfg.engine if cfg.engine != "auto" else ("vllm" if vllm_available() else "torch")


def engine_profile(cfg: Any) -> str | None:
    """The engine profile the planner and the fidelity replay time rollouts with.

    ``engine_profile`` when given. Otherwise a calibration file's own engine entry (None: the
    evaluator reads it from the file); otherwise the profile of the engine that runs: the
    bundled vLLM profile for vLLM, and ``constants`` for the torch engine, because the vLLM
    profiles' fitted per-sequence and per-collective terms describe vLLM's scheduler, not this
    project's torch engine (whose overhead ``libra-calibrate profile --engine-model`` measures)."""
    if cfg.engine_profile:
        return cfg.engine_profile
    if cfg.calibration:
        from cost_models.calibration.store import load_engine_overhead

        try:
            if load_engine_overhead(cfg.calibration) is not None:
                return None
        except Exception:  # an unreadable file is reported where the evaluator is built
            return None
    return "vllm-2024" if engine_kind(cfg) == "vllm" else "constants"


def max_train_gpus(cfg: Any) -> int | None:
    """The most devices the training backend uses: the torch trainer is a single worker."""
    return 1 if cfg.trainer == "torch" else None
