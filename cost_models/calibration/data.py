"""Loading measured operator timings: aiconfigurator-style CSVs, Vidur network CSVs and
nccl-tests logs, validated row by row.

Why strict validation: a calibration silently fitted on a mistyped column (ms read as s, a
missing head count) poisons every plan made with it. Each problem raises ``CostModelError``
naming the file, the 1-based line and the column. Every loader returns latencies in SECONDS.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cost_models.errors import CostModelError

#: family -> (CSV file name, numeric columns the fit needs). ``latency`` is in milliseconds.
SCHEMAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm": ("gemm_perf.csv", ("m", "n", "k", "latency")),
    "attn_prefill": (
        "context_attention_perf.csv",
        ("batch_size", "isl", "num_heads", "num_key_value_heads", "latency"),
    ),
    "attn_decode": (
        "generation_attention_perf.csv",
        ("batch_size", "num_heads", "num_key_value_heads", "step", "latency"),
    ),
    "moe": (
        "moe_perf.csv",
        ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "latency"),
    ),
    "nccl": ("nccl_perf.csv", ("num_gpus", "message_size", "latency")),
    "custom_allreduce": ("custom_allreduce_perf.csv", ("num_gpus", "message_size", "latency")),
}

#: Extra non-numeric columns some files carry and the fit reads.
TEXT_COLUMNS: dict[str, tuple[str, ...]] = {"nccl": ("op_name",)}

#: MoE rows are taken with this routing distribution (present for every GPU in the data; a
#: mild power law is closer to real routing than perfectly balanced tokens).
MOE_DISTRIBUTION = "power_law_1.01"

#: Bytes per element of aiconfigurator's ``message_size`` (fp16/bf16 elements).
COMM_ELEMENT_BYTES = 2


@dataclass(frozen=True)
class Table:
    """One validated file: the rows as a DataFrame (latency converted to seconds in
    ``latency_s``) and the file's sha256 for provenance."""

    path: Path
    frame: pd.DataFrame
    sha256: str


def sha256_of(path: Path) -> str:
    """Hex digest of a file (provenance that does not depend on git)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_numeric(path: Path, frame: pd.DataFrame, columns: Sequence[str]) -> None:
    for col in columns:
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = values.isna() | ~np.isfinite(values) | (values <= 0)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raw = frame[col].iloc[row]
            raise CostModelError(
                f"{path}: line {row + 2}, column {col!r}: expected a positive number, got {raw!r}"
            )
        frame[col] = values.astype(np.float64)


def read_table(path: Path, columns: Sequence[str], text_columns: Sequence[str] = ()) -> Table:
    """Read and validate one CSV: the named columns must exist and hold positive numbers."""
    if not path.is_file():
        raise CostModelError(f"{path}: file not found")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CostModelError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in (*columns, *text_columns) if c not in frame.columns]
    if missing:
        raise CostModelError(
            f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}; "
            f"has {', '.join(map(str, frame.columns))}"
        )
    if frame.empty:
        raise CostModelError(f"{path}: no data rows")
    _check_numeric(path, frame, columns)
    frame = frame.copy()
    if "latency" in frame.columns:
        frame["latency_s"] = frame["latency"] * 1e-3
    return Table(path, frame, sha256_of(path))


def load_family(data_dir: Path, family: str) -> Table | None:
    """The validated table of one operator family, or None when the folder has no such file."""
    fname, cols = SCHEMAS[family]
    path = data_dir / fname
    if not path.exists():
        return None
    table = read_table(path, cols, TEXT_COLUMNS.get(family, ()))
    if family == "moe" and "distribution" in table.frame.columns:
        dist = table.frame["distribution"].astype(str)
        chosen = MOE_DISTRIBUTION if (dist == MOE_DISTRIBUTION).any() else dist.iloc[0]
        table = Table(table.path, table.frame[dist == chosen].reset_index(drop=True), table.sha256)
    if family == "custom_allreduce" and "backend" in table.frame.columns:
        # CUDA-graph replay is how vLLM runs decode; eager numbers include Python launch cost
        graph = table.frame["backend"].astype(str) == "vllm_graph"
        if graph.any():
            table = Table(table.path, table.frame[graph].reset_index(drop=True), table.sha256)
    return table


def load_folder(data_dir: Path) -> dict[str, Table]:
    """Every family present in an aiconfigurator-style folder (at least one must be)."""
    if not data_dir.is_dir():
        raise CostModelError(f"{data_dir}: calibration folder not found")
    tables = {fam: t for fam in SCHEMAS if (t := load_family(data_dir, fam)) is not None}
    if not tables:
        names = ", ".join(s[0] for s in SCHEMAS.values())
        raise CostModelError(f"{data_dir}: no calibration CSV found (expected one of {names})")
    return tables


# ---- network data --------------------------------------------------------------------------
def load_vidur_p2p(network_dir: Path) -> Table:
    """Vidur's 2-rank send/recv profile: rows with ``devices_per_node`` 2 are intra-node, 1 is
    inter-node. Times are milliseconds (median column used: robust to warm-up outliers)."""
    path = network_dir / "send_recv.csv"
    col = "time_stats.send_recv.median"
    table = read_table(path, (col, "size", "num_workers", "devices_per_node"))
    frame = table.frame
    frame["latency_s"] = frame[col] * 1e-3
    frame["nbytes"] = frame["size"]
    frame["inter_node"] = frame["devices_per_node"] < frame["num_workers"]
    return Table(path, frame, table.sha256)


_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^\d+(\.\d*)?$")
_NRANKS = re.compile(r"Rank\s+(\d+)\s+Pid")


def parse_nccl_tests_log(path: Path) -> pd.DataFrame:
    """One nccl-tests ``all_reduce_perf`` log -> rows (n_gpus, nbytes, latency_s), the smaller of
    the out-of-place and in-place times. The GPU count is the number of ``Rank N Pid`` lines."""
    text = path.read_text(errors="replace")
    ranks = {int(m.group(1)) for m in _NRANKS.finditer(text)}
    if not ranks:
        raise CostModelError(f"{path}: no 'Rank N Pid' lines: not an nccl-tests log")
    rows = []
    for line in text.splitlines():
        body = line.split(">:", 1)[-1] if ">:" in line else line
        if body.lstrip().startswith("#"):
            continue
        tok = body.split()
        # size count type redop [root] time algbw busbw ...; root is printed by newer versions
        if len(tok) < 7 or not (_INT.match(tok[0]) and _INT.match(tok[1])):
            continue
        i = 5 if len(tok) >= 13 else 4  # 13 columns when a root column is printed
        times = [float(t) for t in (tok[i], tok[i + 4] if len(tok) > i + 4 else "") if _FLOAT.match(t)]
        if not times:
            continue
        # out-of-place and in-place runs measure the same thing: the smaller drops a warm-up spike
        nbytes, t_us = float(tok[0]), min(times)
        if nbytes > 0 and t_us > 0 and math.isfinite(t_us):
            rows.append((len(ranks), nbytes, t_us * 1e-6))
    if not rows:
        raise CostModelError(f"{path}: no result rows (size count type redop root? time ...)")
    return pd.DataFrame(rows, columns=["n_gpus", "nbytes", "latency_s"])


def load_nccl_logs(log_dir: Path, gpus_per_node: int) -> tuple[pd.DataFrame, dict[str, str]]:
    """All ``*.log`` nccl-tests runs of a folder whose GPU count spans several nodes (more than
    ``gpus_per_node`` ranks): the inter-node all-reduce measurements."""
    if not log_dir.is_dir():
        raise CostModelError(f"{log_dir}: nccl-tests log folder not found")
    frames, shas = [], {}
    for path in sorted(log_dir.glob("*.log")):
        df = parse_nccl_tests_log(path)
        if int(df["n_gpus"].iloc[0]) > gpus_per_node:
            frames.append(df)
            shas[path.name] = sha256_of(path)
    if not frames:
        raise CostModelError(f"{log_dir}: no nccl-tests log with more than {gpus_per_node} GPUs")
    return pd.concat(frames, ignore_index=True), shas
