"""The calibration file: fitted operator tables as versioned JSON.

Why JSON with a format version: the files are bundled in the package and written by users'
``libra-calibrate fit`` runs; a reader must reject a file it does not understand instead of
mis-reading it, and a person must be able to see where the numbers came from (``source``:
folder, file digests, tool version, time) without git.

A file may also carry a ``stage_overheads`` entry (``cost_models.calibration.stages``): per-stage
corrections fitted on a run's own logs by ``libra-calibrate from-logs``; optional too.

A file may also carry an ``engine`` entry (``EngineOverhead``): the rollout engine's fixed
per-iteration cost measured on this device (``libra-calibrate profile --engine-model``). It is
optional, so version-1 files without it stay valid and mean "use the cost model's constants".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost_models.calibration.stages import StageOverheads
from cost_models.errors import CostModelError

FORMAT = "libra-operator-calibration"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class EngineOverhead:
    """Per-iteration engine time outside the model's operators: ``step_s + per_seq_s * B`` for
    an iteration (decode step or prefill forward) of ``B`` sequences.

    Why a calibration entry: for a small model the framework's per-forward work (Python module
    calls, dispatch, input tensors, sampling) is most of an iteration, and it depends on the
    engine and the machine, so the cost model's vLLM-derived constants cannot stand for it.
    ``source`` records how it was measured (model, grid, held-out error)."""

    step_s: float
    per_seq_s: float
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("step_s", "per_seq_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0.0 <= float(v) < 10.0):
                raise CostModelError(f"engine overhead {name} must be a number of seconds in [0, 10), got {v!r}")

    def to_json(self) -> dict[str, Any]:
        return {"step_s": float(self.step_s), "per_seq_s": float(self.per_seq_s), "source": self.source}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> EngineOverhead:
        """Parse an ``engine`` entry; ``where`` names the file for the one-line error."""
        if not isinstance(obj, dict):
            raise CostModelError(f"{where}: 'engine' must be an object with step_s and per_seq_s")
        for key in ("step_s", "per_seq_s"):
            if key not in obj:
                raise CostModelError(f"{where}: 'engine' lacks the {key!r} field")
        try:
            return cls(step_s=obj["step_s"], per_seq_s=obj["per_seq_s"], source=dict(obj.get("source") or {}))
        except CostModelError as exc:
            raise CostModelError(f"{where}: {exc}") from None


@dataclass
class Calibration:
    """Fitted operator models of one device.

    ``gpu`` is the catalog name of the device the data were measured on (a800 loads the a100
    file and rescales its links). ``families`` maps an operator family (gemm, attn_prefill,
    attn_decode, moe, comm) to its fitted tables, as written by ``cost_models.calibration.fit``.
    """

    gpu: str
    families: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    engine: EngineOverhead | None = None
    stage_overheads: StageOverheads | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "version": self.version,
            "gpu": self.gpu,
            "source": self.source,
            "families": self.families,
        }
        if self.engine is not None:
            out["engine"] = self.engine.to_json()
        if self.stage_overheads is not None:
            out["stage_overheads"] = self.stage_overheads.to_json()
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write compact JSON (bundled files must stay small)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Read a file written by ``save``; anything else is a one-line ``CostModelError``."""
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"{p}: calibration file not found")
        try:
            obj = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CostModelError(f"{p}: not a JSON calibration file ({exc})") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise CostModelError(f"{p}: not a {FORMAT} file (write one with `libra-calibrate fit`)")
        if obj.get("version") != FORMAT_VERSION:
            raise CostModelError(
                f"{p}: calibration format version {obj.get('version')!r}, this Libra reads {FORMAT_VERSION}"
            )
        for key in ("gpu", "families"):
            if key not in obj:
                raise CostModelError(f"{p}: calibration file lacks the {key!r} field")
        engine = EngineOverhead.from_json(obj["engine"], str(p)) if obj.get("engine") is not None else None
        stages = StageOverheads.from_json(obj["stage_overheads"], str(p)) if obj.get("stage_overheads") is not None else None
        return cls(gpu=str(obj["gpu"]), families=dict(obj["families"]), source=dict(obj.get("source", {})), engine=engine,
                   stage_overheads=stages)


_FILE_CACHE: dict[tuple[str, int, int], Calibration] = {}


def _load_cached(path: str | os.PathLike[str]) -> Calibration:
    """A calibration file, parsed once per file version (path, mtime, size): evaluators are built
    often and the file does not change."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise CostModelError(f"{p}: calibration file not found") from None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _FILE_CACHE:
        _FILE_CACHE[key] = Calibration.load(p)
    return _FILE_CACHE[key]


def load_engine_overhead(path: str | os.PathLike[str]) -> EngineOverhead | None:
    """The ``engine`` entry of a calibration file (None when it has none), cached per file version."""
    return _load_cached(path).engine


def load_stage_overheads(path: str | os.PathLike[str]) -> StageOverheads | None:
    """The ``stage_overheads`` entry of a calibration file (None when it has none), cached per file version."""
    return _load_cached(path).stage_overheads
