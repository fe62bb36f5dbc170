"""End-to-end engine measurements: the CSV ``libra-calibrate fit-engine`` reads.

Why a checked reader: a profile is only as good as its rows, and a user's CSV is typed by hand or
converted from ``vllm bench latency`` JSON. Every bad cell is one line naming the file, the line,
the field and the rule, never a traceback.

Columns (header names, any order; extra columns are ignored):

- ``model``: a catalog name (``cost_models.models``), a ``config.json`` path (relative paths are
  resolved against the CSV's folder), or a Hugging Face name with a bundled config
  (``cost_models/data/engines/models``, e.g. ``meta-llama/Meta-Llama-3-8B``);
- ``gpu`` (optional; else ``--gpu``): a catalog GPU, or the Argonne bench's "Nvidia H100 GPU";
- ``tp``, ``batch``, ``input_len``, ``output_len``: positive integers;
- one of ``request_latency_s`` (a static batch: one prefill of ``batch x input_len`` tokens, then
  ``output_len - 1`` decode steps with growing context), ``tpot_ms`` (mean decode step, ms), or
  ``output_tok_s_total`` (``batch * output_len / request latency``, converted to a latency);
- ``engine`` (optional): the engine that was measured, for ``--only-engine``.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.models import MODELS, ModelSpec, get_model

#: Hugging Face configs bundled for the models of the measured engine data (real config.json
#: values, the keys the cost model reads), so the bench's names resolve without a download.
BUNDLED_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "engines" / "models"
#: The Argonne LLM-Inference-Bench names its GPUs in words.
GPU_ALIASES = {"nvidia a100 gpu": "a100", "nvidia h100 gpu": "h100"}
TARGETS = ("request_latency_s", "tpot_ms", "output_tok_s_total")
INT_FIELDS = ("tp", "batch", "input_len", "output_len")


@dataclass(frozen=True)
class Measurement:
    """One measured run. ``kind`` is what ``value`` measures: ``latency`` (seconds of the whole
    static batch) or ``tpot`` (seconds of the mean decode step)."""

    model: ModelSpec
    gpu: str
    tp: int
    batch: int
    input_len: int
    output_len: int
    kind: str
    value: float
    engine: str = ""
    line: int = 0

    @property
    def model_name(self) -> str:
        return self.model.name


def sha256(path: str | os.PathLike[str]) -> str:
    """Digest of a measurement file, for a profile's provenance."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bundled_config(name: str) -> Path | None:
    """The bundled config.json of a Hugging Face model name, if there is one."""
    p = BUNDLED_CONFIGS / (name.strip().replace("/", "--") + ".json")
    return p if p.is_file() else None


def resolve_model(text: str, folder: Path) -> ModelSpec:
    """A model cell as a ``ModelSpec`` (see the module docstring for the forms)."""
    s = text.strip()
    if not s:
        raise CostModelError("empty")
    if s.lower() in MODELS:
        return get_model(s)
    bundled = bundled_config(s)
    if bundled is not None:
        return get_model(bundled)
    p = Path(s) if Path(s).is_absolute() else folder / s
    if p.exists():
        return get_model(p)
    try:
        return get_model(s)
    except CostModelError:
        known = sorted(f.stem.replace("--", "/") for f in BUNDLED_CONFIGS.glob("*.json"))
        raise CostModelError(f"unknown model {s!r}: not a catalog name ({', '.join(sorted(MODELS))}), "
                             f"a config.json path, or a bundled Hugging Face config ({', '.join(known)})") from None


def resolve_gpu(text: str) -> GPUSpec:
    """A gpu cell as a catalog ``GPUSpec`` (bench aliases accepted)."""
    s = text.strip()
    return get_gpu(GPU_ALIASES.get(s.lower(), s))


def read_measurements(
    path: str | os.PathLike[str],
    gpu: str | None = None,
    only_engine: str | None = None,
    skip_unknown: bool = False,
) -> tuple[list[Measurement], list[str]]:
    """Rows of a measurement CSV and the reasons rows were skipped.

    ``gpu`` is the GPU of rows without a ``gpu`` cell. ``only_engine`` keeps rows whose ``engine``
    cell equals it (case-insensitive). ``skip_unknown`` skips rows whose model or GPU is not known
    to the cost model (the bench's GH200 and non-Llama-family models) instead of failing; every
    other bad cell fails with ``FILE: line N: field F: rule``."""
    p = Path(path)
    if not p.is_file():
        raise CostModelError(f"{p}: measurement file not found")
    gpu_default = get_gpu(gpu).name if gpu is not None else None
    rows: list[Measurement] = []
    skipped: list[str] = []
    with open(p, newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        missing = [c for c in ("model", *INT_FIELDS) if c not in header]
        if missing:
            raise CostModelError(f"{p}: line 1: missing column {missing[0]!r} "
                                 f"(need model, {', '.join(INT_FIELDS)} and one of {', '.join(TARGETS)})")
        targets = [t for t in TARGETS if t in header]
        if not targets:
            raise CostModelError(f"{p}: line 1: no measurement column; need one of {', '.join(TARGETS)}")
        if "gpu" not in header and gpu_default is None:
            raise CostModelError(f"{p}: line 1: no 'gpu' column; pass --gpu (the catalog GPU the rows were measured on)")
        models: dict[str, ModelSpec] = {}
        for line, rec in enumerate(reader, start=2):
            def bad(field: str, rule: str) -> CostModelError:
                return CostModelError(f"{p}: line {line}: field {field!r}: {rule}")

            engine = (rec.get("engine") or "").strip()
            if only_engine is not None and engine.lower() != only_engine.lower():
                continue
            ints: dict[str, int] = {}
            for name in INT_FIELDS:
                cell = (rec.get(name) or "").strip()
                try:
                    v = int(cell)
                except ValueError:
                    raise bad(name, f"must be a positive integer, got {cell!r}") from None
                if v < 1:
                    raise bad(name, f"must be a positive integer, got {v}")
                ints[name] = v
            given = [(t, (rec.get(t) or "").strip()) for t in targets if (rec.get(t) or "").strip()]
            if not given:
                raise bad(targets[0], f"empty; one of {', '.join(targets)} must hold a measurement")
            target, cell = given[0]
            try:
                value = float(cell)
            except ValueError:
                raise bad(target, f"must be a positive number, got {cell!r}") from None
            if not (value > 0 and value < float("inf")):
                raise bad(target, f"must be a positive number, got {cell!r}")
            if target == "tpot_ms" and ints["output_len"] < 2:
                raise bad("output_len", "tpot_ms needs output_len >= 2 (at least one decode step)")
            gcell = (rec.get("gpu") or "").strip() if "gpu" in header else ""
            try:
                g = resolve_gpu(gcell).name if gcell else gpu_default
            except CostModelError as exc:
                if skip_unknown:
                    skipped.append(f"line {line}: gpu {gcell!r} not in the catalog")
                    continue
                raise bad("gpu", str(exc)) from None
            if g is None:
                raise bad("gpu", "empty; fill it or pass --gpu")
            mcell = rec.get("model") or ""
            try:
                if mcell not in models:
                    models[mcell] = resolve_model(mcell, p.parent)
                spec = models[mcell]
            except CostModelError as exc:
                if skip_unknown:
                    skipped.append(f"line {line}: model {mcell.strip()!r} has no config")
                    continue
                raise bad("model", str(exc)) from None
            if target == "request_latency_s":
                kind, val = "latency", value
            elif target == "tpot_ms":
                kind, val = "tpot", value / 1e3
            else:
                kind, val = "latency", ints["batch"] * ints["output_len"] / value
            rows.append(Measurement(spec, g, ints["tp"], ints["batch"], ints["input_len"], ints["output_len"],
                                    kind, val, engine, line))
    if not rows:
        what = f" with engine {only_engine!r}" if only_engine else ""
        raise CostModelError(f"{p}: no usable measurement rows{what}" + (f" ({len(skipped)} skipped)" if skipped else ""))
    return rows, skipped
