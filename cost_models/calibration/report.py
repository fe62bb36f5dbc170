"""Fidelity of the fitted operator models on rows they were not fitted on.

Why held-out rows: interpolation reproduces its own data perfectly, so in-sample error says
nothing. Two splits, both seeded:

- ``random``: 20 % of the rows drawn at random are held out; the model is refitted on the other
  80 % and predicts them (how well the grid fills shapes between measurements);
- ``extrapolation``: the rows with the largest 20 % of work (FLOPs, KV bytes, message bytes) are
  held out and the model is fitted on the smaller ones (how well the roofline carries the fit
  beyond the measured range).

``in-sample`` (the fit on every row, i.e. the bundled calibration) is listed for reference.
Metrics: MAPE, the 90th percentile and the maximum of the absolute percentage error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cost_models.calibration import data as cdata
from cost_models.calibration.fit import FAMILY_FITS, fit_comm
from cost_models.calibration.sources import BUNDLE_SOURCES, NCCL_LOGS_GPU
from cost_models.calibration.store import Calibration
from cost_models.hardware import get_gpu
from cost_models.operators.fitted import FittedOperators
from cost_models.operators.roofline import RooflineOperators

FAMILIES = ("gemm", "attn_prefill", "attn_decode", "moe", "comm_intra", "p2p_intra", "comm_inter")
SPLITS = ("random", "extrapolation", "in-sample")
HOLDOUT = 0.2


@dataclass(frozen=True)
class Score:
    """Error of one family on one GPU under one split."""

    gpu: str
    family: str
    split: str
    n_train: int
    n_test: int
    mape: float
    p90: float
    max_ape: float
    roofline_mape: float


def family_rows(root: Path, gpu: str) -> dict[str, pd.DataFrame]:
    """Every measured row a GPU's calibration is fitted on, one frame per report family."""
    src = BUNDLE_SOURCES[gpu]
    tables = cdata.load_folder(root / src["data"])
    out = {fam: tables[fam].frame for fam in FAMILY_FITS if fam in tables}
    if "nccl" in tables:
        out["comm_intra"] = merged_collectives(tables["nccl"].frame,
                                               tables["custom_allreduce"].frame if "custom_allreduce" in tables else None)
    # network data are optional: a root without them reports the compute families only; a
    # profile borrowed from another NVLink generation (rescaled, ``network_gpu``) has no rows
    # measured on this GPU to score against
    if src.get("network") and (root / src["network"]).is_dir() and src.get("network_gpu", gpu) == gpu:
        p2p = cdata.load_vidur_p2p(root / src["network"]).frame
        out["p2p_intra"] = p2p[~p2p["inter_node"].astype(bool)].reset_index(drop=True)
    if src.get("nccl_logs") and (root / src["nccl_logs"]).is_dir() and gpu == NCCL_LOGS_GPU:
        # inter-node all-reduce was measured on this GPU's network only
        inter, _ = cdata.load_nccl_logs(root / src["nccl_logs"], get_gpu(gpu).gpus_per_node)
        out["comm_inter"] = inter
    return out


def merged_collectives(nccl: pd.DataFrame, custom: pd.DataFrame | None) -> pd.DataFrame:
    """Intra-node collective cells as the model represents them: NCCL per op, and for all-reduce
    the faster of NCCL and vLLM's custom all-reduce at each size."""
    parts = [nccl[["op_name", "num_gpus", "message_size", "latency_s"]]]
    if custom is not None:
        c = custom[["num_gpus", "message_size", "latency_s"]].copy()
        c.insert(0, "op_name", "all_reduce")
        parts.append(c)
    both = pd.concat(parts, ignore_index=True)
    both["op_name"] = both["op_name"].astype(str)
    return both.groupby(["op_name", "num_gpus", "message_size"], as_index=False)["latency_s"].min()


def work(family: str, f: pd.DataFrame) -> np.ndarray:
    """The size that orders rows for the extrapolation split."""
    if family == "gemm":
        return (2.0 * f["m"] * f["n"] * f["k"]).to_numpy(np.float64)
    if family == "attn_prefill":
        return (f["batch_size"] * f["isl"] ** 2 * f["num_heads"]).to_numpy(np.float64)
    if family == "attn_decode":
        return (f["batch_size"] * f["step"] * f["num_key_value_heads"]).to_numpy(np.float64)
    if family == "moe":
        return (f["num_tokens"] * f["topk"] * f["hidden_size"] * f["inter_size"] / f["moe_tp_size"]).to_numpy(np.float64)
    if family == "comm_intra":
        return f["message_size"].to_numpy(np.float64)
    return f["nbytes"].to_numpy(np.float64)


def fit_family(family: str, train: pd.DataFrame, gpu: str) -> FittedOperators:
    """Operators with only ``family`` fitted (on ``train``); the rest is roofline."""
    spec = get_gpu(gpu)
    roof = RooflineOperators(spec)
    if family in FAMILY_FITS:
        fams = {family: FAMILY_FITS[family](train, roof)}
    elif family == "comm_intra":
        fams = {"comm": fit_comm(train, None, roof)}
    elif family == "p2p_intra":
        fams = {"comm": fit_comm(None, None, roof, p2p=train)}
    elif family == "comm_inter":
        fams = {"comm": fit_comm(None, None, roof, inter=train)}
    else:
        raise ValueError(family)
    return FittedOperators(spec, Calibration(gpu=spec.name, families=fams))


def predict(ops: Any, family: str, f: pd.DataFrame) -> np.ndarray:
    """Model times (s) for the rows of ``f``."""
    col = lambda c: f[c].to_numpy(np.float64)  # noqa: E731
    if family == "gemm":
        return ops.gemm_s(col("m"), col("n"), col("k"))
    if family == "attn_prefill":
        return ops.attn_prefill_s(col("batch_size"), col("isl"), 0.0, col("num_heads"), col("num_key_value_heads"))
    if family == "attn_decode":
        b = col("batch_size")
        return ops.attn_decode_s(b, b * col("step"), col("num_heads"), col("num_key_value_heads"))
    if family == "moe":
        return ops.moe_s(col("num_tokens"), col("hidden_size"), col("inter_size"), col("topk"),
                         col("num_experts"), col("moe_tp_size"), col("moe_ep_size"))
    if family == "comm_intra":
        out = np.empty(len(f))
        ops_col = f["op_name"].astype(str).to_numpy()
        nbytes = col("message_size") * cdata.COMM_ELEMENT_BYTES
        for op in np.unique(ops_col):
            sel = ops_col == op
            out[sel] = ops.collective_s(op, nbytes[sel], col("num_gpus")[sel])
        return out
    if family == "p2p_intra":
        return ops.p2p_s(col("nbytes"))
    if family == "comm_inter":
        return ops.allreduce_s(col("nbytes"), col("n_gpus"), inter_node=True)
    raise ValueError(family)


def split(family: str, f: pd.DataFrame, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (train, test) masks."""
    n = len(f)
    if kind == "in-sample":
        every = np.ones(n, dtype=bool)
        return every, every
    if kind == "random":
        rng = np.random.default_rng(seed)
        test = np.zeros(n, dtype=bool)
        test[rng.choice(n, size=max(1, int(round(HOLDOUT * n))), replace=False)] = True
        return ~test, test
    w = work(family, f)
    test = w >= np.quantile(w, 1.0 - HOLDOUT)
    if test.all():  # degenerate (constant work): hold out nothing meaningful
        test = np.zeros(n, dtype=bool)
        test[np.argmax(w)] = True
    return ~test, test


def score(gpu: str, family: str, f: pd.DataFrame, kind: str, seed: int) -> Score:
    train, test = split(family, f, kind, seed)
    ops = fit_family(family, f[train].reset_index(drop=True), gpu)
    rows = f[test].reset_index(drop=True)
    truth = rows["latency_s"].to_numpy(np.float64)
    ape = np.abs(np.asarray(predict(ops, family, rows)) - truth) / truth * 100.0
    roof_ape = np.abs(np.asarray(predict(ops.roof, family, rows)) - truth) / truth * 100.0
    return Score(gpu, family, kind, int(train.sum()), int(test.sum()), float(ape.mean()),
                 float(np.percentile(ape, 90)), float(ape.max()), float(roof_ape.mean()))


def run_report(
    root: Path,
    gpus: list[str],
    seed: int = 0,
    max_rows: int | None = None,
    families: tuple[str, ...] = FAMILIES,
    progress: Any = None,
) -> list[Score]:
    """Scores for every (gpu, family, split). ``max_rows`` subsamples each family (seeded)
    first, for quick runs."""
    scores: list[Score] = []
    for gpu in gpus:
        rows = family_rows(root, gpu)
        for fam in families:
            if fam not in rows:
                continue
            f = rows[fam]
            if max_rows is not None and len(f) > max_rows:
                f = f.sample(n=max_rows, random_state=seed).reset_index(drop=True)
            for kind in SPLITS:
                if progress is not None:
                    progress(gpu, fam, kind)
                scores.append(score(gpu, fam, f, kind, seed))
    return scores


def to_frame(scores: list[Score]) -> pd.DataFrame:
    return pd.DataFrame([s.__dict__ for s in scores])


def to_markdown(scores: list[Score]) -> str:
    """One table: a row per (family, GPU), MAPE (P90) per split, plus the roofline's MAPE on the
    random split's held-out rows for comparison."""
    df = to_frame(scores)
    lines = [
        "| family | GPU | rows | random 80/20 MAPE (P90) | extrapolation MAPE (P90) | in-sample MAPE | roofline MAPE |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (fam, gpu), g in df.groupby(["family", "gpu"], sort=False):
        by = {r.split: r for r in g.itertuples()}
        cell = lambda k: f"{by[k].mape:.1f}% ({by[k].p90:.1f}%)" if k in by else "-"  # noqa: E731
        rows = by["in-sample"].n_test if "in-sample" in by else "-"
        ins = f"{by['in-sample'].mape:.1f}%" if "in-sample" in by else "-"
        roof = f"{by['random'].roofline_mape:.0f}%" if "random" in by else "-"
        lines.append(f"| {fam} | {gpu} | {rows} | {cell('random')} | {cell('extrapolation')} | {ins} | {roof} |")
    return "\n".join(lines) + "\n"
