"""The configuration hash and the result store: one JSON per (configuration, policy) hash.

Why a hash over everything that changes a result: a sweep of an hour must rerun only what
changed. A run's key covers the workload (the generator's full resolved parameters and version,
or the trace file's sha256 and step range), the cluster (GPUs, GPU, model, node size, limits, the
engine profile: its name, or the file's sha256), the policy, the staleness class, the noise seed,
the replay options, and a code key. The code key hashes the bundled calibration and engine-profile
data and the sources of the packages a replay runs (``cost_models``, ``libra`` less its runtime,
``sim`` less the sweep and CLI modules): a routing change by anyone invalidates the cache, a new
summary format does not. Nothing else (file order, workload and cluster names) enters the key, so
renaming a cluster in the grid recomputes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.sweep.grid import ClusterEntry, Configuration, GeneratedWorkload, TraceWorkload

#: Bump when a cached record's meaning changes (new fields are fine: readers use .get).
SCHEMA_VERSION = 1
#: Packages whose code decides a replay's numbers.
CODE_TREES: tuple[str, ...] = ("cost_models", "libra", "sim")
#: Parts of them (package-relative paths) that cannot change a replay's numbers.
CODE_EXCLUDED: tuple[str, ...] = ("libra/runtime", "sim/sweep", "sim/commands", "sim/cli.py", "sim/report.py", "sim/processes.py")
#: Bundled data files that enter the code key (calibrations, engine profiles, measured tables).
DATA_SUFFIXES: tuple[str, ...] = (".json", ".csv", ".yaml")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (not memoized: see ``file_sha256``)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=None)
def file_sha256(path: str) -> str:
    """sha256 of a file's bytes (memoized per process: a grid names a trace many times)."""
    return sha256_file(path)


def _package_dirs() -> list[tuple[str, Path]]:
    """(name, folder) of each package in ``CODE_TREES`` as imported: the code that actually runs."""
    import importlib

    out = []
    for name in CODE_TREES:
        mod = importlib.import_module(name)
        if getattr(mod, "__file__", None):
            out.append((name, Path(mod.__file__).parent))  # type: ignore[arg-type]
    return out


@lru_cache(maxsize=8)
def code_key(root: str | None = None) -> str:
    """A short hash of the code and bundled cost-model data a replay's numbers depend on
    (computed once per process: a sweep's driver fixes it at its start). ``root``: a folder
    holding the ``CODE_TREES`` packages (default: the imported packages' folders)."""
    dirs = [(n, Path(root) / n) for n in CODE_TREES] if root is not None else _package_dirs()
    h = hashlib.sha256()
    files: list[tuple[str, Path]] = []
    for name, top in dirs:
        if not top.is_dir():
            continue
        for p in top.rglob("*"):
            rel = f"{name}/{p.relative_to(top).as_posix()}"
            if not p.is_file() or "__pycache__" in rel or any(rel == e or rel.startswith(e + "/") for e in CODE_EXCLUDED):
                continue
            if p.suffix == ".py" or (p.suffix in DATA_SUFFIXES and "/data/" in rel):
                files.append((rel, p))
    for rel, p in sorted(files):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(sha256_file(p).encode())
    return h.hexdigest()[:16]


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _digest(obj: Any) -> str:
    return hashlib.sha256(_canonical(obj).encode()).hexdigest()


def workload_identity(src: GeneratedWorkload | TraceWorkload) -> dict[str, Any]:
    """What defines a workload's steps: the generator's resolved parameters and version, or the
    trace's bytes and step range."""
    if isinstance(src, GeneratedWorkload):
        from libra.trace.workload import GENERATOR_VERSION, make_params

        params = make_params(src.kind, **dict(src.params)).as_dict()
        return {"generate": src.kind, "generator_version": GENERATOR_VERSION, "steps": src.steps, "batch": src.batch,
                "group_size": src.group_size, "seed": src.seed, "params": params}
    return {"trace_sha256": file_sha256(src.path), "steps": src.steps}


def workload_key(src: GeneratedWorkload | TraceWorkload) -> str:
    """The hash a generated trace is stored under in ``DIR/traces/``."""
    return _digest(workload_identity(src))[:20]


def cluster_identity(c: ClusterEntry) -> dict[str, Any]:
    """The cluster's fields (resolved node size; the engine as a name or a file's sha256)."""
    from sim.commands.common import node_size

    engine: Any = c.engine
    if engine is not None and os.path.isfile(engine):
        engine = {"file_sha256": file_sha256(os.path.abspath(engine))}
    return {"gpus": c.gpus, "gpu": c.gpu, "model": c.model, "gpus_per_node": c.gpus_per_node or node_size(c.gpu),
            "engine": engine, "max_train_gpus": c.max_train_gpus, "max_context": c.max_context}


def run_key(config: Configuration, policy: str, code: str) -> str:
    """The hash of one policy's replay of ``config``: its result file's name in ``DIR/cache/``."""
    from dataclasses import asdict

    ident = {
        "schema": SCHEMA_VERSION, "code": code, "workload": workload_identity(config.workload.source),
        "cluster": cluster_identity(config.cluster), "policy": policy, "max_staleness": config.max_staleness,
        "seed": config.seed, "replay": asdict(config.replay),
    }
    return _digest(ident)[:24]


class ResultCache:
    """``DIR/cache/<hash>.json``, one record per replay; written atomically, so an interrupted
    sweep leaves only whole records and a rerun picks up where it stopped."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(out_dir) / "cache"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored record, or None (missing or unreadable: then it is computed again)."""
        try:
            with open(self.path(key), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and rec.get("hash") == key else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Store ``record`` under ``key`` (its ``hash`` field is set to ``key``)."""
        rec = dict(record, hash=key)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(rec, f, indent=1, sort_keys=True, default=str)
            os.replace(tmp, self.path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
