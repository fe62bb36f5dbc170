"""Inference-engine profiles: what an engine (and its version) adds to each rollout iteration
beyond the kernels the operator tables time.

``profile`` (the ``EngineProfile`` model and its JSON format), ``registry`` (bundled profiles,
the default, resolving ``--engine NAME|FILE``), ``measurements`` (the end-to-end CSV
``libra-calibrate fit-engine`` reads), ``fit`` (non-negative least squares, terms chosen by
leave-one-model-out), ``report`` (TP speed-up and whole-request error tables). See
docs/cost-model.md, "Engine profiles".
"""

from __future__ import annotations

from cost_models.engines.profile import TERMS, EngineProfile
from cost_models.engines.registry import DEFAULT_PROFILE, bundled_names, get_profile, resolve_engine

__all__ = ["TERMS", "EngineProfile", "DEFAULT_PROFILE", "bundled_names", "get_profile", "resolve_engine"]
