"""libra-run times rollouts with the profile of the engine it runs, unless told otherwise: the
vLLM fits (per-sequence scheduler and per-collective terms) do not describe the torch engine."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from libra.runtime.loop import Runner  # noqa: E402


def _profile(**cfg: object) -> str | None:
    base = {"engine_profile": None, "calibration": None, "engine": "torch"}
    base.update(cfg)
    return Runner._engine_profile(SimpleNamespace(cfg=SimpleNamespace(**base)))  # type: ignore[arg-type]


def test_torch_engine_gets_the_constants_not_a_vllm_fit() -> None:
    assert _profile(engine="torch") == "constants"


def test_vllm_engine_gets_the_bundled_vllm_profile() -> None:
    assert _profile(engine="vllm") == "vllm-2024"


def test_an_explicit_profile_wins() -> None:
    assert _profile(engine="torch", engine_profile="trtllm-2024") == "trtllm-2024"


def test_a_calibration_with_an_engine_entry_is_left_to_the_evaluator(tmp_path: Path) -> None:
    from cost_models.calibration.store import Calibration, EngineOverhead

    path = tmp_path / "calib.json"
    Calibration(gpu="cpu", families={}, engine=EngineOverhead(7e-4, 6e-5)).save(path)
    assert json.loads(path.read_text())["engine"]["step_s"] == 7e-4
    assert _profile(engine="torch", calibration=str(path)) is None
