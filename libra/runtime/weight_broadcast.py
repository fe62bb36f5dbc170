"""Weight sync on GPUs: trainer rank 0 broadcasts the policy over NCCL, in packed buckets, into
every vLLM worker of every rollout instance (vLLM's weight-transfer API,
``vllm.distributed.weight_transfer``), instead of gathering a state dict to the driver and
writing a safetensors file per engine (the CPU path, ``VLLMEngine.load_state_dict``).

One process group per placement: the trainer's rank 0 is rank 0, instance ``i``'s TP workers
follow at ``offsets[i]`` (``group_layout``); the rendezvous is rank 0's node IP and a port free
there. Each sync, every engine posts ``update_weights`` with the tensors' names, dtypes and
shapes, and the trainer's ranks walk the parameters (under ZeRO-3 each one gathered for the
moment it is sent, a collective of the trainer's ranks) while rank 0 sends them in bf16 buckets.

GPU-only: ``nccl_sync_supported`` says whether the installed vLLM has the API; the test that
drives it is skipped without two CUDA devices (tests/runtime/test_gpu_cluster.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


def group_layout(tps: Sequence[int]) -> tuple[int, list[int]]:
    """``(world_size, rank_offsets)`` of the broadcast group: the trainer is rank 0, instance
    ``i``'s workers take ranks ``offsets[i] .. offsets[i] + tps[i] - 1``."""
    offsets, nxt = [], 1
    for tp in tps:
        if tp < 1:
            raise ValueError(f"an instance's TP must be >= 1, got {tp}")
        offsets.append(nxt)
        nxt += tp
    return nxt, offsets


def nccl_sync_supported() -> bool:
    """True when the installed vLLM ships the NCCL weight-transfer engine (and CUDA is present)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine  # noqa: F401
    except Exception:
        return False
    return True


def trainer_group(master: str, port: int, world: int) -> Any:
    """The trainer's end of the group (rank 0, on the current CUDA device)."""
    import torch
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine as E

    if hasattr(E, "trainer_init"):
        return E.trainer_init({"master_address": master, "master_port": port, "world_size": world})
    init = getattr(E, "stateless_init_process_group", None) or E._stateless_init_process_group
    return init(master, port, 0, world, torch.cuda.current_device())


def send(params: Iterator[tuple[str, Any]], group: Any) -> None:
    """Broadcast ``(name, tensor)`` pairs from rank 0 in packed buckets."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine as E

    fn = getattr(E, "trainer_send_weights", None) or E.trainer_broadcast_weights
    fn(iterator=params, group=group, packed=True)


def weight_meta(model: Any, dtype: Any) -> dict[str, list[Any]]:
    """Names, dtype names and shapes of what ``model_params`` will send (ZeRO-3: the full shapes)."""
    names, dtypes, shapes = [], [], []
    for name, p in model.named_parameters():
        names.append(name)
        dtypes.append(str(dtype).split(".")[-1])
        shapes.append(list(getattr(p, "ds_shape", p.shape)))
    return {"names": names, "dtype_names": dtypes, "shapes": shapes}


def model_params(model: Any, dtype: Any, rank: int, zero3: bool) -> Iterator[tuple[str, Any]]:
    """The model's parameters in ``dtype``, one at a time; under ZeRO-3 each is gathered on every
    rank for the moment it is sent (every rank must drain this iterator; only rank 0 yields)."""
    import contextlib

    for name, p in model.named_parameters():
        ctx: Any = contextlib.nullcontext()
        if zero3:
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters([p], modifier_rank=None)
        with ctx:
            if rank == 0:
                yield name, p.detach().to(dtype=dtype, copy=True)  # a copy: the gathered storage is freed on exit
