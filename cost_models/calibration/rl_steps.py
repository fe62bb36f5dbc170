"""Fit and check the RL step overhead constants (``cost_models.rl_overheads``) on the published
RL step breakdowns (``cost_models/data/measured/rl_steps/rl_step_breakdowns.csv``).

Why a script and not numbers typed into the module: every constant must be traceable to named
rows (source_id / stage / model / seconds), and a reader must be able to re-run the fit and see
the per-row residuals. ``python -m cost_models.calibration.rl_steps`` prints the fitted constants
next to the module's values, then one table per term with each row's role (``fit``: used by the
fit; ``check``: predicted with the fitted constants, never fitted on), predicted and published
seconds; then the published-step check (colocated steps: published rollout and training parts
plus the predicted overheads against the published step). ``tests/test_rl_overheads.py`` asserts
the fit reproduces the module's constants.

GPUs of the rows that the catalog does not hold are built here from datasheets (roofline
operators): H20 (Hopper, 96 GB HBM3 at 4.0 TB/s, 148 TFLOP/s dense bf16, NVLink 900 GB/s total,
PCIe Gen5, assumed one 400 Gb/s NIC per GPU as on HGX H100), L20 (Ada, 48 GB GDDR6 at 864 GB/s,
119.5 TFLOP/s, no NVLink; its pinned host copy is the 24 GiB/s vime measured on it) and RTX A6000
(Ampere, 48 GB at 768 GB/s, 154.8 TFLOP/s, PCIe Gen4). Models not in the catalog (Qwen2.5-7B,
Qwen3-0.6B, Qwen3-4B, Qwen3-235B-A22B) are built from their Hugging Face ``config.json`` values.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models import rl_overheads as ro
from cost_models import transfers as xfer
from cost_models.errors import CostModelError
from cost_models.hardware import GPUSpec, get_gpu
from cost_models.models import ModelSpec, get_model
from cost_models.operators import load_operators

DATA = Path(__file__).resolve().parents[1] / "data" / "measured" / "rl_steps"
CSV_PATH = DATA / "rl_step_breakdowns.csv"
SOURCES_PATH = DATA / "rl_step_breakdowns_SOURCES.md"
GiB = 2.0**30

# ---- hardware and models of the published rows ------------------------------------------------
H20 = GPUSpec("h20", int(96e9), 4.0e12, 148e12, 450e9, 50e9, 8, 50e9)
L20 = GPUSpec("l20", int(48e9), 864e9, 119.5e12, 25e9, 25e9, 8, 24 * GiB)
A6000 = GPUSpec("a6000", int(48e9), 768e9, 154.8e12, 25e9, 12.5e9, 8, 25e9)

QWEN25_7B = ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, attn_bias=True)
QWEN3_06B = ModelSpec("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, tie_embeddings=True, qk_norm=True)
QWEN3_4B = ModelSpec("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, tie_embeddings=True, qk_norm=True)
QWEN3_235B = ModelSpec(
    "qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936,
    n_experts=128, experts_per_token=8, moe_intermediate=1536, qk_norm=True,
)
QWEN3_30B = get_model("qwen3-30b-a3b")
PHI3_VISION_PARAMS = 4.15e9  # Phi-3-vision-128k-instruct's published size (language model + CLIP encoder)


@dataclass(frozen=True)
class RowRef:
    """One row of the CSV, named by what identifies it: source, stage, model and its value."""

    source_id: str
    stage: str
    model: str
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.source_id} / {self.stage} / {self.model} / {self.seconds:g} s"


def load_rows(path: Path = CSV_PATH) -> list[dict[str, str]]:
    """The CSV's rows as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pick(rows: Sequence[dict[str, str]], ref: RowRef) -> dict[str, str]:
    """The one row ``ref`` names (a missing or ambiguous reference is an error, so a changed
    CSV cannot silently change a fit)."""
    hits = [
        r for r in rows
        if r["source_id"] == ref.source_id and r["stage"] == ref.stage and r["model"] == ref.model
        and math.isclose(float(r["seconds"]), ref.seconds, rel_tol=0, abs_tol=1e-9)
    ]
    if len(hits) != 1:
        raise CostModelError(f"{CSV_PATH.name}: {len(hits)} rows match {ref.label} (expected 1)")
    return hits[0]


@dataclass(frozen=True)
class Residual:
    """One row's prediction against its published value."""

    term: str
    row: str
    role: str  # "fit" | "check"
    setup: str
    predicted_s: float
    published_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.published_s - 1.0


# ---- (a) vLLM sleep-mode wake-up -----------------------------------------------------------------
WAKE_FIT = [
    (RowRef("vllm_sleep_blog", "offload_onload", "Qwen3-0.6B", 0.26), 2.0 * 0.596e9),
    (RowRef("vllm_sleep_blog", "offload_onload", "Phi-3-vision-128k-instruct (4.2B)", 0.82), 2.0 * PHI3_VISION_PARAMS),
    *((RowRef("vllm_sleep_blog", "offload_onload", "Qwen3-Coder-30B-A3B-Instruct", v), 2.0 * QWEN3_30B.params_total)
      for v in (2.89, 2.86, 2.85)),
]
#: FP8 weights (1 byte/param) on one A100, and the 235B FP8 model on 4 A100s (a quarter each)
WAKE_CHECK = [
    (RowRef("vllm_sleep_blog", "offload_onload", "Qwen3-0.6B", 0.18), 0.596e9, "fp8, 1 GPU"),
    (RowRef("vllm_sleep_blog", "offload_onload", "Phi-3-vision-128k-instruct (4.2B)", 0.78), PHI3_VISION_PARAMS, "fp8, 1 GPU"),
    *((RowRef("vllm_sleep_blog", "offload_onload", "Qwen3-235B-A22B-Instruct-2507-FP8", v), QWEN3_235B.params_total / 4,
       "fp8, TP4: 4 GPUs load at once") for v in (5.66, 5.29, 5.27)),
]


def fit_engine_wake(rows: Sequence[dict[str, str]]) -> tuple[float, float]:
    """(ENGINE_WAKE_FIXED_S, ENGINE_WAKE_EFF): ``t = fixed + bytes / (eff * pcie_bw(A100))`` by
    least squares in relative error over ``WAKE_FIT``."""
    pcie = get_gpu("a100").pcie_bw
    y = np.array([float(pick(rows, r)["seconds"]) for r, _ in WAKE_FIT])
    x = np.array([b for _, b in WAKE_FIT])
    a = np.stack([1.0 / y, x / y], axis=1)
    (fixed, per_byte), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    return float(fixed), float(1.0 / (per_byte * pcie))


def wake_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    a100 = get_gpu("a100")
    out = []
    for ref, nbytes in WAKE_FIT:
        pred = ro.ENGINE_WAKE_FIXED_S + nbytes / (ro.ENGINE_WAKE_EFF * a100.pcie_bw)
        out.append(Residual("engine wake", ref.label, "fit", f"{nbytes / 1e9:.1f} GB bf16, A100", pred, float(pick(rows, ref)["seconds"])))
    for ref, nbytes, setup in WAKE_CHECK:
        pred = ro.ENGINE_WAKE_FIXED_S + nbytes / (ro.ENGINE_WAKE_EFF * a100.pcie_bw)
        out.append(Residual("engine wake", ref.label, "check", f"{nbytes / 1e9:.1f} GB/GPU {setup}", pred, float(pick(rows, ref)["seconds"])))
    return out


# ---- (a) trainer offload / onload ------------------------------------------------------------------
OFFLOAD_ROW = RowRef("vime_442_443_445", "offload_onload", "Qwen3-0.6B", 11.228)
ONLOAD_ROW = RowRef("vime_442_443_445", "offload_onload", "Qwen3-0.6B", 3.773)


def _number(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text)
    if m is None:
        raise CostModelError(f"cannot read {what} (pattern {pattern!r}) from the published notes")
    return float(m.group(1))


def fit_trainer_copy(rows: Sequence[dict[str, str]], sources: str | None = None) -> tuple[float, float, float, float]:
    """(TRAINER_OFFLOAD_EFF, TRAINER_ONLOAD_EFF, TRAINER_OFFLOAD_FIXED_S, TRAINER_ONLOAD_FIXED_S)
    from vime's measured rates: the parked bytes and the pause/resume rates in the two rows'
    notes, the plain pinned-copy rate in the sources list (PR #444)."""
    text = sources if sources is not None else SOURCES_PATH.read_text()
    plain = _number(r"against (\d+(?:\.\d+)?) GiB/s for a plain pinned copy", text, "the plain pinned-copy rate")
    off_row, on_row = pick(rows, OFFLOAD_ROW), pick(rows, ONLOAD_ROW)
    parked = _number(r"~(\d+(?:\.\d+)?)\s*GiB at", off_row["notes"], "the parked bytes")
    off_rate = _number(r"GiB at (\d+(?:\.\d+)?) GiB/s", off_row["notes"], "the pause rate")
    on_rate = _number(r"resume (\d+(?:\.\d+)?) GiB/s", on_row["notes"], "the resume rate")
    off_fixed = float(off_row["seconds"]) - parked / off_rate
    on_fixed = float(on_row["seconds"]) - parked / on_rate
    return off_rate / plain, on_rate / plain, off_fixed, on_fixed


@dataclass(frozen=True)
class TrainerCase:
    ref: RowRef
    direction: str  # "offload" | "onload"
    gpu: GPUSpec
    model: ModelSpec
    tp: int
    dp: int
    zero: int
    role: str
    setup: str


TRAINER_CASES = [
    TrainerCase(OFFLOAD_ROW, "offload", L20, QWEN3_06B, 1, 1, 1, "fit", "1 L20, Megatron 1 GPU"),
    TrainerCase(ONLOAD_ROW, "onload", L20, QWEN3_06B, 1, 1, 1, "fit", "1 L20, Megatron 1 GPU"),
    *(TrainerCase(RowRef("relax_230", "offload_onload", "Qwen3-4B", v), "offload", A6000, QWEN3_4B, 1, 4, 1, "check",
                  "4 A6000, Megatron dp4 (assumed), baseline steady step") for v in (5.42, 5.11, 5.36, 5.47)),
    *(TrainerCase(RowRef("relax_230", "offload_onload", "Qwen3-4B", v), "onload", A6000, QWEN3_4B, 1, 4, 1, "check",
                  "4 A6000, Megatron dp4 (assumed), baseline steady step") for v in (2.28, 2.19, 2.17, 2.31)),
]


def trainer_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    out = []
    for c in TRAINER_CASES:
        fn = ro.trainer_offload_s if c.direction == "offload" else ro.trainer_onload_s
        pred = fn(c.gpu, c.model, c.tp, 1, c.dp, 1, c.zero)
        nbytes = ro.train_state_bytes_per_gpu(c.model, c.tp, 1, c.dp, 1, c.zero)
        out.append(Residual(f"trainer {c.direction}", c.ref.label, c.role, f"{c.setup}; {nbytes / 1e9:.1f} GB state/GPU", pred,
                            float(pick(rows, c.ref)["seconds"])))
    return out


# ---- (b) weight sync -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyncCase:
    ref: RowRef
    gpu: GPUSpec
    model: ModelSpec
    n_train: int
    rollout_tps: tuple[int, ...]
    same_node: bool
    role: str
    setup: str
    mode: xfer.SyncMode = "broadcast"
    bucket_bytes: float | None = None
    train_tp: int = 1


SYNC_CASES = [
    SyncCase(RowRef("verl_fully_async", "weight_sync", "Qwen3-30B-A3B", 15.76), H20, QWEN3_30B, 16, (4,) * 4, False, "fit",
             "H20, 16 trainer -> 16 rollout ranks (4 nodes), NCCL, per tensor"),
    SyncCase(RowRef("verl_fully_async", "weight_sync", "Qwen3-235B-A22B", 58.57), H20, QWEN3_235B, 64, (8,) * 8, False, "fit",
             "H20, 64 -> 64 ranks (16 nodes), NCCL, per tensor"),
    SyncCase(RowRef("verl_fully_async", "weight_sync", "Qwen2.5-Math-7B", 0.12), H20, QWEN25_7B, 4, (4,), True, "check",
             "H20, 4 -> 4 ranks in one node, NCCL, per tensor (dense)"),
    SyncCase(RowRef("trl_5892", "weight_sync", "Qwen3-0.6B", 0.18), get_gpu("h100"), QWEN3_06B, 1, (1,), True, "check",
             "H100, 1 trainer + vLLM TP1, one node, per tensor"),
    SyncCase(RowRef("miles_p2p_doc", "weight_sync", "Qwen3-30B-A3B", 2.67), get_gpu("h100"), QWEN3_30B, 8, (8,), False, "check",
             "H100, train TP4 EP8 -> rollout TP8, 2 nodes, NCCL, 1 GB buckets", bucket_bytes=1e9, train_tp=4),
    SyncCase(RowRef("miles_p2p_doc", "weight_sync", "Qwen3-235B-A22B", 10.7536), get_gpu("h100"), QWEN3_235B, 32, (8,) * 4, False,
             "check", "H100, train TP4 PP4 -> rollout TP32 (as 4 x TP8), 8 nodes, NCCL, 1 GB buckets", bucket_bytes=1e9, train_tp=4),
    SyncCase(RowRef("trl_7131", "weight_sync", "Qwen3-32B", 2.3), get_gpu("h200"), get_model("qwen3-32b"), 16, (8,) * 2, False,
             "check", "H200, 16 FSDP2 trainer -> 16 sampler GPUs, NCCL packed (1 GB buckets assumed)", bucket_bytes=1e9),
    SyncCase(RowRef("vime_442_443_445", "weight_sync", "Qwen3-0.6B", 0.534), L20, QWEN3_06B, 1, (1,), True, "check",
             "1 L20 colocated, CUDA IPC, per tensor", mode="ipc"),
    *(SyncCase(RowRef("relax_230", "weight_sync", "Qwen3-4B", v), A6000, QWEN3_4B, 4, (1,) * 4, True, "check",
               "4 A6000 colocated, local IPC, per tensor, baseline steady step", mode="ipc") for v in (3.8, 4.1, 4.2, 3.85)),
]


def _sync_s(c: SyncCase, message_s: float) -> float:
    """The sync of case ``c`` with ``message_s`` per message (the formula is linear in it)."""
    ops = load_operators(c.gpu)
    base = xfer.weight_sync_s(ops, c.gpu, c.model, c.n_train, c.train_tp, 1, list(c.rollout_tps), c.same_node, c.mode, c.bucket_bytes)
    return base + (message_s - ro.SYNC_MESSAGE_S) * xfer.sync_messages(c.model, c.bucket_bytes)


def fit_sync_message(rows: Sequence[dict[str, str]]) -> float:
    """SYNC_MESSAGE_S: relative least squares through the origin over the ``fit`` cases,
    ``published - (bytes, link and load terms) = messages * c``."""
    num = den = 0.0
    for c in SYNC_CASES:
        if c.role != "fit":
            continue
        m = float(pick(rows, c.ref)["seconds"])
        b = _sync_s(c, 0.0)
        n = xfer.sync_messages(c.model, c.bucket_bytes)
        num += n * (m - b) / m**2
        den += n * n / m**2
    return num / den


def sync_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    out = []
    for c in SYNC_CASES:
        n = xfer.sync_messages(c.model, c.bucket_bytes)
        out.append(Residual("weight sync", c.ref.label, c.role, f"{c.setup}; {n} messages", _sync_s(c, ro.SYNC_MESSAGE_S),
                            float(pick(rows, c.ref)["seconds"])))
    return out


# ---- (a+b) whole colocated switches ----------------------------------------------------------------------
@dataclass(frozen=True)
class SwitchCase:
    """A published total of one colocated step's switches (both directions and the IPC sync)."""

    ref: RowRef
    gpu: GPUSpec
    model: ModelSpec
    n_gpus: int
    tp: int
    ep: int
    zero: int
    rollout_tp: int
    setup: str
    sync: bool = True


SWITCH_CASES = [
    SwitchCase(RowRef("relax_230", "other", "Qwen3-30B-A3B", 23.507), H20, QWEN3_30B, 8, 1, 8, 1, 8,
               "8 H20, Megatron ep8 (assumed), sleep + update_weights + wake_up, baseline"),
    SwitchCase(RowRef("relax_230", "other", "Qwen3-30B-A3B", 18.094), H20, QWEN3_30B, 8, 1, 8, 1, 8,
               "8 H20, same, optimized (PG reuse)"),
    SwitchCase(RowRef("relax_152", "other", "Qwen3-VL-4B", 11), get_gpu("h200"), QWEN3_4B, 8, 1, 1, 1, 1,
               "8 H200, Qwen3-4B shapes, sleep + wake_up + update_weights"),
    SwitchCase(RowRef("vime_442_443_445", "offload_onload", "Qwen3-0.6B", 11.27), L20, QWEN3_06B, 1, 1, 1, 1, 1,
               "1 L20, sleep + wake_up (issue #442, N=16)", sync=False),
]


def colocated_switch_s(gpu: GPUSpec, model: ModelSpec, n_gpus: int, tp: int, ep: int, zero: int, rollout_tp: int,
                       sync: bool = True) -> float:
    """Both stage switches of one colocated step plus (``sync``) the IPC weight sync."""
    dp = n_gpus // tp
    t = ro.stage_switch_s(gpu, model, "train", rollout_tp, tp, 1, dp, ep, zero)
    t += ro.stage_switch_s(gpu, model, "rollout", rollout_tp, tp, 1, dp, ep, zero)
    if sync:
        t += xfer.weight_sync_s(load_operators(gpu), gpu, model, n_gpus, tp, 1, [rollout_tp] * (n_gpus // rollout_tp), True, "ipc")
    return t


def switch_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    return [Residual("colocated switch", c.ref.label, "check", c.setup,
                     colocated_switch_s(c.gpu, c.model, c.n_gpus, c.tp, c.ep, c.zero, c.rollout_tp, c.sync),
                     float(pick(rows, c.ref)["seconds"])) for c in SWITCH_CASES]


# ---- (c) log-prob passes against the update ---------------------------------------------------------------
@dataclass(frozen=True)
class LogprobCase:
    """A published log-prob pass and the update of the same step: their ratio does not depend on
    the (unpublished) token count, so it checks ``forward_s`` against ``train_iter_s``."""

    name: str
    logprob: RowRef
    update: RowRef
    gpu: GPUSpec
    model: ModelSpec
    tp: int
    dp: int
    ep: int
    zero: int
    seq_len: int
    setup: str


def _lp(source: str, model: str, lp: float, upd: float, stage: str = "old_logprob") -> tuple[RowRef, RowRef]:
    return RowRef(source, stage, model, lp), RowRef(source, "actor_update", model, upd)


LOGPROB_CASES = [
    LogprobCase("verl 7B FSDP2 32 H20", *_lp("verl_fully_async", "Qwen2.5-Math-7B", 107.71, 269.8), H20, QWEN25_7B, 1, 32, 1, 3, 8192,
                "FSDP2 = ZeRO-3 dp32, 8K-token sequences assumed"),
    LogprobCase("verl 7B FSDP2 64 H20", *_lp("verl_fully_async", "Qwen2.5-Math-7B", 70.26, 133.41), H20, QWEN25_7B, 1, 64, 1, 3, 8192,
                "ZeRO-3 dp64"),
    LogprobCase("verl 7B FSDP2 128 H20", *_lp("verl_fully_async", "Qwen2.5-Math-7B", 53.92, 113.81), H20, QWEN25_7B, 1, 128, 1, 3, 8192,
                "ZeRO-3 dp128"),
    LogprobCase("verl one-step-off 7B FSDP2 16 H20", *_lp("verl_one_step_off", "Qwen2.5-Math-7B", 88, 286), H20, QWEN25_7B, 1, 16, 1, 3,
                8192, "ZeRO-3 dp16"),
    LogprobCase("verl one-step-off 7B Megatron 16 H20", *_lp("verl_one_step_off", "Qwen2.5-Math-7B", 119, 344), H20, QWEN25_7B, 2, 8, 1, 1,
                8192, "tp2 dp8 ZeRO-1 assumed"),
    LogprobCase("verl 30B-A3B Megatron 128 H20 (old policy)", *_lp("verl_fully_async", "Qwen3-30B-A3B-Base", 28.73, 86.27), H20, QWEN3_30B,
                1, 128, 8, 1, 8192, "ep8 dp128 ZeRO-1 assumed"),
    LogprobCase("verl 30B-A3B Megatron 128 H20 (reference)", *_lp("verl_fully_async", "Qwen3-30B-A3B-Base", 20.86, 86.27, "ref_logprob"),
                H20, QWEN3_30B, 1, 128, 8, 1, 8192, "same"),
    LogprobCase("verl PrefixGrouper 4B FSDP 4 H800 (4K)", *_lp("verl_prefix_grouper", "Qwen3-4B", 1.7, 6.07), get_gpu("h100"), QWEN3_4B, 1, 4,
                1, 3, 4096, "no PrefixGrouper, H800 as H100 (same compute), ZeRO-3 dp4"),
    LogprobCase("verl PrefixGrouper 4B FSDP 4 H800 (8K)", *_lp("verl_prefix_grouper", "Qwen3-4B", 2.63, 10.18), get_gpu("h100"), QWEN3_4B, 1,
                4, 1, 3, 8192, "same, 8K context"),
]


def logprob_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    """Predicted ``forward_s / train_iter_s`` against the published log-prob / update ratio."""
    from cost_models.training import TrainStrategy, forward_s, train_iter_s

    out = []
    for c in LOGPROB_CASES:
        ops = load_operators(c.gpu)
        s = TrainStrategy(c.tp, 1, c.dp, c.ep, c.zero)
        tokens = c.seq_len * c.dp * 8  # 8 sequences per rank: the ratio barely depends on it
        ratio = forward_s(ops, c.gpu, c.model, s, tokens, c.seq_len) / train_iter_s(ops, c.gpu, c.model, s, tokens, c.seq_len)
        pub = float(pick(rows, c.logprob)["seconds"]) / float(pick(rows, c.update)["seconds"])
        out.append(Residual("log-prob / update", f"{c.name}: {c.logprob.label} over {c.update.seconds:g} s", "check", c.setup, ratio, pub))
    return out


# ---- (d) per-sample bookkeeping ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepParts:
    """A published step and its itemized parts (seconds), for the per-sample residual."""

    name: str
    step: RowRef
    parts: tuple[RowRef, ...]
    n_samples: int | None
    role: str
    setup: str


def _parts(source: str, model: str, step: float, *parts: tuple[str, float]) -> tuple[RowRef, tuple[RowRef, ...]]:
    return RowRef(source, "step_total", model, step), tuple(RowRef(source, st, model, v) for st, v in parts)


SAMPLE_CASES = [
    StepParts("verl 7B colocate 32 H20", *_parts("verl_fully_async", "Qwen2.5-Math-7B", 790.1, ("generation", 357.41),
              ("old_logprob", 107.71), ("actor_update", 269.8)), 512 * 16, "fit", "512 prompts x 16"),
    StepParts("verl 7B colocate 64 H20", *_parts("verl_fully_async", "Qwen2.5-Math-7B", 365.28, ("generation", 150.72),
              ("old_logprob", 70.26), ("actor_update", 133.41)), 512 * 16, "fit", "512 prompts x 16"),
    StepParts("verl 7B colocate 128 H20", *_parts("verl_fully_async", "Qwen2.5-Math-7B", 356.3, ("generation", 177.85),
              ("old_logprob", 53.92), ("actor_update", 113.81)), 512 * 16, "fit", "512 prompts x 16"),
    StepParts("verl 30B-A3B colocate 128 H20", *_parts("verl_fully_async", "Qwen3-30B-A3B-Base", 497.89, ("generation", 348.05),
              ("old_logprob", 28.73), ("ref_logprob", 20.86), ("actor_update", 86.27)), 512 * 16, "fit", "512 prompts x 16"),
    StepParts("relax VL-4B colocate 8 H200", *_parts("relax_152", "Qwen3-VL-4B", 115.6, ("generation", 62), ("actor_update", 42)),
              64 * 8, "check", "64 prompts x 8; minus the published ~11 s mode switching (row 'other' 11)"),
]
RELAX_152_SWITCH = RowRef("relax_152", "other", "Qwen3-VL-4B", 11)


def _residual_s(rows: Sequence[dict[str, str]], c: StepParts) -> float:
    rest = float(pick(rows, c.step)["seconds"]) - sum(float(pick(rows, p)["seconds"]) for p in c.parts)
    if c.step.source_id == "relax_152":
        rest -= float(pick(rows, RELAX_152_SWITCH)["seconds"])
    return rest


def fit_per_sample(rows: Sequence[dict[str, str]]) -> float:
    """PER_SAMPLE_S: the median over the ``fit`` steps of (step - itemized parts) / samples."""
    return float(statistics.median(_residual_s(rows, c) / c.n_samples for c in SAMPLE_CASES if c.role == "fit" and c.n_samples))


def sample_residuals(rows: Sequence[dict[str, str]]) -> list[Residual]:
    out = []
    for c in SAMPLE_CASES:
        assert c.n_samples
        out.append(Residual("per-sample", f"{c.name}: {c.step.label}", c.role, c.setup, ro.step_fixed_s(c.n_samples), _residual_s(rows, c)))
    return out


# ---- published-step check ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepCase:
    """A published colocated step: its measured rollout and training parts are taken as given;
    the overheads this module models are predicted and added."""

    name: str
    step: RowRef
    given: tuple[RowRef, ...]  # published parts added as measured (rollout without switches, log-probs, update)
    gpu: GPUSpec
    model: ModelSpec
    n_gpus: int
    tp: int
    zero: int
    rollout_tp: int
    n_samples: int
    switches: bool  # whether the given parts exclude the stage switches (then they are predicted)
    note: str


STEP_CASES = [
    StepCase("verl one-step-off, 7B FSDP2, 16 H20", RowRef("verl_one_step_off", "step_total", "Qwen2.5-Math-7B", 749),
             (RowRef("verl_one_step_off", "other", "Qwen2.5-Math-7B", 247), RowRef("verl_one_step_off", "old_logprob", "Qwen2.5-Math-7B", 88),
              RowRef("verl_one_step_off", "actor_update", "Qwen2.5-Math-7B", 286)),
             H20, QWEN25_7B, 16, 1, 3, 2, 512 * 16, True, "generate_sequences (inner) + old_logprob + update given; 512 x 16 samples assumed"),
    StepCase("verl one-step-off, 7B Megatron, 16 H20", RowRef("verl_one_step_off", "step_total", "Qwen2.5-Math-7B", 699),
             (RowRef("verl_one_step_off", "other", "Qwen2.5-Math-7B", 162), RowRef("verl_one_step_off", "old_logprob", "Qwen2.5-Math-7B", 119),
              RowRef("verl_one_step_off", "actor_update", "Qwen2.5-Math-7B", 344)),
             H20, QWEN25_7B, 16, 2, 1, 2, 512 * 16, True, "generate_sequences (inner) + old_logprob + update given; tp2 dp8 and 512 x 16 assumed"),
    StepCase("relax, VL-4B Megatron, 8 H200", RowRef("relax_152", "step_total", "Qwen3-VL-4B", 115.6),
             (RowRef("relax_152", "generation", "Qwen3-VL-4B", 62), RowRef("relax_152", "actor_update", "Qwen3-VL-4B", 42)),
             get_gpu("h200"), QWEN3_4B, 8, 1, 1, 1, 64 * 8, True, "rollout + train given; Qwen3-4B shapes for the VL-4B text model"),
    StepCase("vime, 0.6B Megatron offload on, 1 L20", RowRef("vime_442_443_445", "step_total", "Qwen3-0.6B", 18.853),
             (RowRef("vime_11", "generation", "Qwen3-0.6B", 1.26285), RowRef("vime_442_443_445", "actor_update", "Qwen3-0.6B", 0.472),
              RowRef("vime_442_443_445", "ref_logprob", "Qwen3-0.6B", 0.126)),
             L20, QWEN3_06B, 1, 1, 1, 1, 16, True, "rollout_fn (vime_11, same setup) + actor train + ref given; sleep/wake rows are fit rows"),
]


def step_overheads_s(c: StepCase) -> dict[str, float]:
    """The modelled overheads of one colocated step of ``c`` (seconds, by term)."""
    ops = load_operators(c.gpu)
    dp = c.n_gpus // c.tp
    out = {"to_train": ro.stage_switch_s(c.gpu, c.model, "train", c.rollout_tp, c.tp, 1, dp, 1, c.zero),
           "to_rollout": ro.stage_switch_s(c.gpu, c.model, "rollout", c.rollout_tp, c.tp, 1, dp, 1, c.zero)}
    out["sync"] = xfer.weight_sync_s(ops, c.gpu, c.model, c.n_gpus, c.tp, 1, [c.rollout_tp] * (c.n_gpus // c.rollout_tp),
                                     True, "ipc")
    out["per_sample"] = ro.step_fixed_s(c.n_samples)
    return out


def step_check(rows: Sequence[dict[str, str]]) -> list[tuple[str, float, float, dict[str, float], str]]:
    """(name, given parts, published step, predicted overheads, note) per ``STEP_CASES``."""
    out = []
    for c in STEP_CASES:
        given = sum(float(pick(rows, r)["seconds"]) for r in c.given)
        out.append((c.name, given, float(pick(rows, c.step)["seconds"]), step_overheads_s(c), c.note))
    return out


# ---- report ---------------------------------------------------------------------------------------------------
def fitted_constants(rows: Sequence[dict[str, str]] | None = None) -> dict[str, float]:
    """Every constant of ``rl_overheads`` as this module fits it from the CSV."""
    rows = load_rows() if rows is None else rows
    fixed, eff = fit_engine_wake(rows)
    off_eff, on_eff, off_fixed, on_fixed = fit_trainer_copy(rows)
    return {
        "ENGINE_WAKE_FIXED_S": fixed, "ENGINE_WAKE_EFF": eff,
        "TRAINER_OFFLOAD_EFF": off_eff, "TRAINER_ONLOAD_EFF": on_eff,
        "TRAINER_OFFLOAD_FIXED_S": off_fixed, "TRAINER_ONLOAD_FIXED_S": on_fixed,
        "SYNC_MESSAGE_S": fit_sync_message(rows), "PER_SAMPLE_S": fit_per_sample(rows),
    }


def residuals(rows: Sequence[dict[str, str]] | None = None) -> list[Residual]:
    """Every term's per-row residuals with the module's constants."""
    rows = load_rows() if rows is None else rows
    return (wake_residuals(rows) + trainer_residuals(rows) + sync_residuals(rows) + switch_residuals(rows)
            + logprob_residuals(rows) + sample_residuals(rows))


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def report(rows: Sequence[dict[str, str]] | None = None) -> str:
    """The fit, the residual tables and the published-step check, as markdown."""
    rows = load_rows() if rows is None else rows
    fit = fitted_constants(rows)
    parts = ["## Fitted constants (cost_models.rl_overheads)", _table(
        ["constant", "fitted from the CSV", "in the module"],
        [[k, f"{v:.4g}", f"{getattr(ro, k):.4g}"] for k, v in fit.items()])]
    res = residuals(rows)
    parts.append("## Residuals (predicted vs published, per row; seconds, log-prob rows: ratio to the update)")
    parts.append(_table(["term", "row (source / stage / model / value)", "role", "setup", "predicted", "published", "error"],
                        [[r.term, r.row, r.role, r.setup, f"{r.predicted_s:.3g}", f"{r.published_s:.3g}", f"{r.error:+.0%}"] for r in res]))
    parts.append("## Published colocated steps: given parts + predicted overheads")
    body = []
    for name, given, pub, ov, note in step_check(rows):
        tot = sum(ov.values())
        terms = ", ".join(f"{k} {v:.1f}" for k, v in ov.items())
        body.append([name, f"{given:.1f}", f"{tot:.1f} ({terms})", f"{given + tot:.1f}", f"{pub:.1f}", f"{(given + tot) / pub - 1:+.0%}",
                     f"{given / pub - 1:+.0%}", note])
    parts.append(_table(["step", "given s", "predicted overheads s", "predicted step s", "published s", "error", "without overheads", "note"], body))
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cost_models.calibration.rl_steps [--csv FILE]``: print the report."""
    ap = argparse.ArgumentParser(prog="python -m cost_models.calibration.rl_steps", description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH, help="the RL step breakdowns CSV (default: the bundled copy)")
    args = ap.parse_args(argv)
    print(report(load_rows(args.csv)), end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
