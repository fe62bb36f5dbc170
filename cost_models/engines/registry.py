"""The bundled engine profiles, the default one, and resolving ``--engine NAME|FILE``.

Why a registry: a planner, a simulator replay and ``libra-calibrate predict`` must agree on what
"vllm-2024" means, and a user must get one well-defined profile when they name none. Bundled
profiles are JSON files in ``cost_models/data/engines/`` (``NAME.json``), each fitted by a recipe
in ``BUNDLED_RECIPES`` on the measured engine data the package ships, so
``libra-calibrate fit-engine --rebuild-bundled`` reproduces them (and a test checks it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cost_models.engines.profile import EngineProfile
from cost_models.errors import CostModelError

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "data" / "engines"
#: What ``CostEvaluator`` uses when no engine is named and the calibration has no engine entry.
#: Why vLLM 2024: RL post-training stacks (verl, OpenRLHF, AReaL) roll out with vLLM, and this is
#: the only vLLM whose TP scaling was measured end to end; see docs/cost-model.md.
DEFAULT_PROFILE = "vllm-2024"
#: Measured data (relative to the calibration root) -> bundled profile, and how it is fitted.
BENCH_CSV = "engine/llm_inference_bench.csv"
BUNDLED_RECIPES: dict[str, dict[str, Any]] = {
    "vllm-2024": {
        "csv": BENCH_CSV, "only_engine": "vLLM",
        "engine": "vLLM mid-2024 (V0 engine, benchmark_latency.py, fp16, CUDA graphs)",
        "description": "vLLM as measured by the Argonne LLM-Inference-Bench on A100 and H100 nodes (TP 1-4): "
                       "more per-step CPU and TP fan-out overhead than today's V1 engine",
    },
    "trtllm-2024": {
        "csv": BENCH_CSV, "only_engine": "TensorRT-LLM",
        "engine": "TensorRT-LLM mid-2024 (fp16, static batch)",
        "description": "TensorRT-LLM as measured by the Argonne LLM-Inference-Bench on A100 and H100 nodes (TP 1-4): "
                       "far less per-sequence and TP-collective cost than vLLM 2024, a larger fixed cost per step",
    },
}
#: Not fitted: the cost model's assumptions before profiles existed, kept for comparison.
CONSTANTS = "constants"

_CACHE: dict[tuple[str, int, int], EngineProfile] = {}


def bundled_names() -> list[str]:
    """Names ``--engine`` accepts besides a file: the bundled profiles and ``constants``."""
    return sorted([p.stem for p in BUNDLED_DIR.glob("*.json")] + [CONSTANTS])


def _load_cached(p: Path) -> EngineProfile:
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE[key] = EngineProfile.load(p)
    return _CACHE[key]


def constants_profile() -> EngineProfile:
    """The pre-profile constants (``ENGINE_STEP_S + ENGINE_PER_SEQ_S * B``, kernels as the tables)."""
    from cost_models.rollout import ENGINE_PER_SEQ_S, ENGINE_STEP_S

    return EngineProfile(name=CONSTANTS, step_s=ENGINE_STEP_S, per_seq_s=ENGINE_PER_SEQ_S,
                         engine="assumed (vLLM V1 published profiles)",
                         description="1 ms per iteration + 5 us per sequence at every TP; not fitted")


def get_profile(name_or_path: str | os.PathLike[str]) -> EngineProfile:
    """A bundled profile by name (case-insensitive), ``constants``, or a profile JSON file.
    Anything else is one line listing the valid names."""
    s = os.fspath(name_or_path).strip()
    key = s.lower()
    if key == CONSTANTS:
        return constants_profile()
    bundled = BUNDLED_DIR / f"{key}.json"
    if bundled.is_file() and os.sep not in s and not s.endswith(".json"):
        return _load_cached(bundled)
    p = Path(s)
    if p.is_file():
        return _load_cached(p)
    raise CostModelError(f"unknown engine profile {s!r}; valid: {', '.join(bundled_names())}, or a profile JSON file "
                         "(`libra-calibrate fit-engine`)")


def resolve_engine(engine: Any, calibration: str | os.PathLike[str] | None = None) -> EngineProfile:
    """The profile an evaluator uses: ``engine`` (a name, a file, an ``EngineProfile``, or an old
    ``EngineOverhead``) when given; else the calibration file's ``engine`` entry, as the
    two-term profile; else ``DEFAULT_PROFILE``."""
    from cost_models.calibration.store import EngineOverhead, load_engine_overhead

    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, EngineOverhead):
        return EngineProfile.from_overhead(engine.step_s, engine.per_seq_s, engine.source)
    if engine is not None:
        if not isinstance(engine, (str, os.PathLike)):
            raise CostModelError(f"engine must be a profile name, a profile file or an EngineProfile, got {type(engine).__name__}")
        return get_profile(engine)
    if calibration is not None:
        entry = load_engine_overhead(calibration)
        if entry is not None:
            return EngineProfile.from_overhead(entry.step_s, entry.per_seq_s, entry.source)
    return get_profile(DEFAULT_PROFILE)
