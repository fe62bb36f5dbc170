"""What a worker joining (or leaving) a data-parallel training group must receive, and what it costs.

The protocol (docs/policy-core.md, "State consistency"), in short: optimizer state changes only at
optimizer steps, and is frozen during the gradient-accumulation (GA) micro-batches between them.
A joiner copies its shard of the state *as of the last optimizer step* while training continues,
then enters at a micro-batch boundary of the same mini-batch: the remaining micro-batches of that
mini-batch are spread over the new membership, gradients are averaged by the global sample count
(not the rank count), and the final reduction uses the new shard map. Every sample's gradient is
computed exactly once and the update is the same function of the same state and gradients, so the
trajectory of weights equals a fixed-membership run (up to floating-point summation order).

Bytes per parameter (mixed precision): bf16 weights 2, fp32 master weights 4, optimizer state
0 (SGD), 4 (SGD with momentum: velocity), 8 (Adam: m and v; plus the step count, a scalar).
ZeRO-0 replicates everything; ZeRO-1 shards master + optimizer state over the DP ranks; ZeRO-2
also gradients (zero at a step boundary; partially accumulated ones are handed over at the
switch); ZeRO-3 also the bf16 weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Optimizer = Literal["sgd", "momentum", "adam"]

WEIGHT_BYTES = 2
MASTER_BYTES = 4
GRAD_BYTES = 4
STATE_BYTES: dict[str, int] = {"sgd": 0, "momentum": 4, "adam": 8}


@dataclass(frozen=True)
class JoinTransfer:
    """Bytes a joiner receives when a DP group grows from ``dp_old`` to ``dp_new`` ranks."""

    weights: float  # bf16 weights (full replica, or its ZeRO-3 shard)
    master_and_state: float  # fp32 master weights + optimizer state (full or its shard)
    grad_handover: float  # accumulated gradient shard handed over mid-mini-batch (ZeRO-2/3)
    scalars: tuple[str, ...]  # small state that must match exactly

    @property
    def total(self) -> float:
        return self.weights + self.master_and_state + self.grad_handover


def join_transfer(optimizer: Optimizer, zero_stage: int, params: float, dp_old: int, dp_new: int, mid_minibatch: bool = True) -> JoinTransfer:
    """What one joiner receives (``params``: parameters of the model-parallel shard it joins).

    Under ZeRO >= 1 each old rank gives up the tail ``1/dp_old - 1/dp_new`` of its shard, so the
    joiner's shard (``1/dp_new`` of the state) arrives from all old ranks in parallel and no
    other data moves; the shard map (which flat ranges each rank owns) is rebuilt at the switch.
    """
    if optimizer not in STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(STATE_BYTES)}, got {optimizer!r}")
    if dp_new <= dp_old or dp_old < 1:
        raise ValueError(f"a join grows the group: dp_new ({dp_new}) must exceed dp_old ({dp_old}) >= 1")
    per_state = MASTER_BYTES + STATE_BYTES[optimizer]
    share = 1.0 / dp_new
    weights = params * WEIGHT_BYTES * (share if zero_stage >= 3 else 1.0)
    state = params * per_state * (share if zero_stage >= 1 else 1.0)
    grads = params * GRAD_BYTES * share if (zero_stage >= 2 and mid_minibatch) else 0.0
    scalars = ("lr schedule position", "loss scale")
    if optimizer == "adam":
        scalars = ("adam step count",) + scalars
    return JoinTransfer(weights, state, grads, scalars)


def leave_transfer(optimizer: Optimizer, zero_stage: int, params: float, dp_old: int, dp_new: int) -> float:
    """Bytes the leaver's shard sends back to the remaining ranks (ZeRO >= 1); 0 for ZeRO-0.

    A leaver returns its ``1/dp_old`` shard split over the ``dp_new`` survivors (at an optimizer
    step boundary, so no gradient is in flight)."""
    if dp_new >= dp_old or dp_new < 1:
        raise ValueError(f"a leave shrinks the group: dp_new ({dp_new}) must be below dp_old ({dp_old}) and >= 1")
    per = (MASTER_BYTES + STATE_BYTES[optimizer]) + (WEIGHT_BYTES if zero_stage >= 3 else 0)
    return params * per / dp_old if zero_stage >= 1 else 0.0


def sync_join_pause_s(transfer: JoinTransfer, link_bytes_per_s: float, regroup_s: float = 5.0) -> float:
    """Training stall of a SYNCHRONOUS join: every rank waits while the joiner receives its state
    and the communicator is rebuilt (``regroup_s``: NCCL group re-initialization)."""
    return transfer.total / link_bytes_per_s + regroup_s


def nonblocking_join_delay_s(transfer: JoinTransfer, link_bytes_per_s: float, microbatch_s: float, regroup_s: float = 5.0) -> tuple[float, float]:
    """``(stall, delay)`` of a NON-BLOCKING join: the copy and the new communicator are prepared in
    the background, so training stalls 0; the joiner starts at the first micro-batch boundary after
    both are ready (``delay`` from the decision)."""
    ready = max(transfer.total / link_bytes_per_s, regroup_s)
    boundaries = -(-ready // microbatch_s) if microbatch_s > 0 else 0
    return 0.0, boundaries * microbatch_s if microbatch_s > 0 else ready
