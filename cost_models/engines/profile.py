"""``EngineProfile``: what an inference engine adds to every iteration beyond its kernels, as a
named, versioned, fitted model, and its JSON file format.

Why a model of its own: the operator tables time kernels in isolation. A real engine adds, per
iteration, CPU work (scheduling, building the input tensors, sampling, output processing), the
fan-out of the step to each TP worker, a latency floor per all-reduce that isolated collective
benchmarks do not see, and launch gaps where the step runs outside CUDA graphs. Measured
end-to-end (``cost_models/data/measured/engine``), these make TP speed-ups far smaller than kernel
sums say at small batches. They belong to the engine and its version (a 2024 vLLM, today's V1,
TensorRT-LLM), not to the GPU, so they live in a profile the evaluator is given by name.

Per iteration of ``B`` sequences on a TP group of ``tp`` GPUs, for a model of ``L`` layers::

    overhead(tp, B) = step_s + per_seq_s * B + per_worker_s * (tp - 1)
                      + per_collective_s * n_allreduces(tp)           # 2 L when tp > 1, else 0
                      + per_layer_s * L                               # eager iterations only
    iteration       = kernel_scale * (sum of the operator times) + overhead(tp, B)

``per_layer_s`` (launch gaps) applies to iterations outside CUDA graphs: every prefill, and
decode steps of more than ``cuda_graph_max_batch`` sequences. ``kernel_scale`` is how the engine's
kernels compare with the operator tables (1 = the tables' kernels). Nothing here depends on the
KV context, so decode stays exactly ``base + slope * context`` (``cost_models.rollout``).

An old calibration file's ``engine`` entry (``EngineOverhead``: ``step_s + per_seq_s * B``,
measured by ``libra-calibrate profile --engine-model``) is the profile with only those two terms
(``from_overhead``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from cost_models.errors import CostModelError

FORMAT = "libra-engine-profile"
FORMAT_VERSION = 1
#: The additive per-iteration terms, in the order of the fit's design matrix.
TERMS = ("step_s", "per_seq_s", "per_worker_s", "per_collective_s", "per_layer_s")
#: vLLM captures decode CUDA graphs for batches up to 256 by default (and 2024 versions did too).
DEFAULT_CUDA_GRAPH_MAX_BATCH = 256
_MAX_TERM_S = 10.0


def n_allreduces(tp: Any, n_layers: int) -> Any:
    """TP all-reduces per forward: after attention and after the MLP of each layer, none at TP 1."""
    return np.where(np.asarray(tp) > 1, 2.0 * n_layers, 0.0)


@dataclass(frozen=True)
class EngineProfile:
    """One engine version's per-iteration overhead model (see the module docstring)."""

    name: str
    step_s: float = 0.0
    per_seq_s: float = 0.0
    per_worker_s: float = 0.0
    per_collective_s: float = 0.0
    per_layer_s: float = 0.0
    kernel_scale: float = 1.0
    cuda_graph_max_batch: int = DEFAULT_CUDA_GRAPH_MAX_BATCH
    engine: str = ""  # the engine and version in words, e.g. "vLLM 0.4-0.5 (V0), fp16"
    description: str = ""
    source: dict[str, Any] = field(default_factory=dict)  # provenance: data file digest, rows, residuals

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise CostModelError(f"engine profile name must be a non-empty string, got {self.name!r}")
        for term in TERMS:
            v = getattr(self, term)
            if not _is_number(v) or not (0.0 <= float(v) < _MAX_TERM_S):
                raise CostModelError(f"engine profile {self.name!r}: {term} must be a number of seconds in [0, 10), got {v!r}")
        if not _is_number(self.kernel_scale) or not (0.1 <= float(self.kernel_scale) <= 10.0):
            raise CostModelError(f"engine profile {self.name!r}: kernel_scale must be a number in [0.1, 10], got {self.kernel_scale!r}")
        if isinstance(self.cuda_graph_max_batch, bool) or not isinstance(self.cuda_graph_max_batch, int) or self.cuda_graph_max_batch < 0:
            raise CostModelError(f"engine profile {self.name!r}: cuda_graph_max_batch must be an integer >= 0, "
                                 f"got {self.cuda_graph_max_batch!r}")

    # ---- the model -------------------------------------------------------------------------
    def overhead_s(self, tp: Any, batch: Any, n_layers: int, prefill: bool) -> Any:
        """Seconds the engine adds to one iteration of ``batch`` sequences on ``tp`` GPUs
        (vectorized over ``tp`` and ``batch``). ``prefill``: the iteration runs eagerly."""
        if isinstance(tp, (int, float, np.integer, np.floating)) and isinstance(batch, (int, float, np.integer, np.floating)):
            s = (self.step_s + self.per_seq_s * float(batch) + self.per_worker_s * (float(tp) - 1.0)
                 + (self.per_collective_s * 2.0 * n_layers if tp > 1 else 0.0))
            if self.per_layer_s and (prefill or batch > self.cuda_graph_max_batch):
                s += self.per_layer_s * n_layers
            return s
        t = np.asarray(tp, dtype=np.float64)
        b = np.asarray(batch, dtype=np.float64)
        out = (self.step_s + self.per_seq_s * b + self.per_worker_s * (t - 1.0)
               + self.per_collective_s * n_allreduces(t, n_layers))
        if self.per_layer_s:
            eager = np.ones_like(b, dtype=bool) if prefill else b > self.cuda_graph_max_batch
            out = out + np.where(eager, self.per_layer_s * n_layers, 0.0)
        return out

    @property
    def terms(self) -> dict[str, float]:
        """The additive terms by name (seconds)."""
        return {t: float(getattr(self, t)) for t in TERMS}

    @property
    def fitted_terms(self) -> tuple[tuple[str, ...], bool]:
        """The term set the profile was fitted with and whether its kernel scale was fitted (from
        its provenance; else its non-zero terms and a scale other than 1)."""
        names = self.source.get("terms_fitted")
        if not names:
            names = [t for t in TERMS if getattr(self, t)] + (["kernel_scale"] if self.kernel_scale != 1.0 else [])
        return tuple(t for t in names if t in TERMS), "kernel_scale" in names

    @property
    def measured_tps(self) -> tuple[int, ...]:
        """TP degrees the profile was fitted on (``source.measured.tp``); empty when not recorded
        (a hand-written or pre-fit profile: nothing is known to be measured)."""
        tps = (self.source.get("measured") or {}).get("tp") or ()
        return tuple(sorted(int(t) for t in tps if _is_number(t)))

    @property
    def measured_batches(self) -> tuple[int, int] | None:
        """The smallest and largest batch the profile was fitted on, when recorded."""
        b = (self.source.get("measured") or {}).get("batch")
        if isinstance(b, (list, tuple)) and len(b) == 2 and all(_is_number(x) for x in b):
            return int(b[0]), int(b[1])
        return None

    def extrapolation(self, tps: Any = (), max_batch: int | None = None) -> list[str]:
        """In words, where a prediction at TP degrees ``tps`` and about ``max_batch`` sequences
        per iteration rests on this profile outside what it was fitted on: a TP degree outside
        the measured range (its TP speed-up is the model's, not a measurement) or a batch above
        the largest measured. Empty when inside, or when the profile records no range (then one
        line says so)."""
        measured = self.measured_tps
        if not measured:
            if "rows" in self.source:  # fitted before profiles recorded their range
                return [f"the engine profile {self.name} records no measured TP range (refit it with `libra-calibrate "
                        "fit-engine` to record one): its TP speed-ups may be extrapolated"]
            return [f"the engine profile {self.name} is not fitted on TP-scaling runs: its TP speed-ups are assumptions"]
        out = []
        lo, hi = measured[0], measured[-1]
        outside = sorted({int(t) for t in tps if int(t) < lo or int(t) > hi})
        rng = f"{lo}-{hi}" if lo != hi else f"{lo}"
        for t in outside:
            out.append(f"rollout TP {t} is outside the engine profile {self.name}'s measured TP {rng}: its TP speed-up "
                       "is extrapolated")
        b = self.measured_batches
        if b is not None and max_batch is not None and max_batch > b[1]:
            out.append(f"about {max_batch} running sequences per instance is above the engine profile {self.name}'s largest "
                       f"measured batch {b[1]}: its per-sequence cost is extrapolated")
        return out

    def with_terms(self, **values: Any) -> EngineProfile:
        """A copy with some terms (or ``kernel_scale``, ``name``, ``source``...) replaced."""
        return replace(self, **values)

    # ---- file format -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "name": self.name,
            "engine": self.engine,
            "description": self.description,
            "terms": self.terms,
            "kernel_scale": float(self.kernel_scale),
            "cuda_graph_max_batch": int(self.cuda_graph_max_batch),
            "source": self.source,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Indented JSON: profiles are small and people read their provenance."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> EngineProfile:
        """Parse a profile object; ``where`` names the file in the one-line error."""
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise CostModelError(f"{where}: not a {FORMAT} file (write one with `libra-calibrate fit-engine`)")
        if obj.get("version") != FORMAT_VERSION:
            raise CostModelError(f"{where}: engine profile format version {obj.get('version')!r}, this Libra reads {FORMAT_VERSION}")
        terms = obj.get("terms")
        if not isinstance(terms, dict):
            raise CostModelError(f"{where}: 'terms' must be an object of seconds ({', '.join(TERMS)})")
        unknown = sorted(set(terms) - set(TERMS))
        if unknown:
            raise CostModelError(f"{where}: unknown term {unknown[0]!r}; valid: {', '.join(TERMS)}")
        known = {f.name for f in fields(cls)}
        kw = {k: obj[k] for k in ("engine", "description", "kernel_scale", "cuda_graph_max_batch") if k in obj and k in known}
        try:
            return cls(name=obj.get("name") or Path(where).stem, source=dict(obj.get("source") or {}), **terms, **kw)
        except (CostModelError, TypeError) as exc:
            raise CostModelError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EngineProfile:
        """Read a file written by ``save``; anything else is a one-line ``CostModelError``."""
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"{p}: engine profile file not found")
        try:
            obj = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CostModelError(f"{p}: not a JSON engine profile ({exc})") from None
        return cls.from_json(obj, str(p))

    @classmethod
    def from_overhead(cls, step_s: float, per_seq_s: float, source: dict[str, Any] | None = None,
                      name: str = "calibration-engine-entry") -> EngineProfile:
        """A calibration file's ``engine`` entry (``step_s + per_seq_s * B``) as a profile with
        only those two terms: kernels as the tables, no TP-dependent terms."""
        return cls(name=name, step_s=step_s, per_seq_s=per_seq_s, source=dict(source or {}),
                   engine="measured by libra-calibrate profile --engine-model",
                   description="step_s + per_seq_s * B from a calibration file's engine entry")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and bool(np.isfinite(v))
