"""Ray for one ``libra-run``: started locally (one logical CPU per device worker, or the GPUs) or
joined at ``address``, quiet (no dashboard, no progress bars from every actor), with the one
threaded ``ToolActor`` every rollout's tool calls go to."""

from __future__ import annotations

import logging
import os
from typing import Any


def start_ray(cfg: Any) -> tuple[Any, str]:
    """Start or join Ray and the tool actor; returns (the ``ToolActor``, its sandbox's network
    isolation in words)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    env = {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": str(cfg.vllm_kv_gib), "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torch_extensions"))}}
    env["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # no weight-loading bar from every actor
    if cfg.address:
        ray.init(address=cfg.address, runtime_env=env, log_to_driver=True, logging_level=logging.WARNING)
    else:
        # logical CPUs: one per device worker (a colocated plan shares them at half each)
        res = {"num_cpus": cfg.devices} if cfg.device != "cuda" else {"num_gpus": cfg.devices, "num_cpus": max(os.cpu_count() or 1, 1)}
        ray.init(include_dashboard=False, runtime_env=env, log_to_driver=True, logging_level=logging.WARNING, **res)
    from libra.runtime.actors import ToolActor

    tools = ToolActor.remote({"timeout_s": cfg.tool_timeout_s, "memory_mb": cfg.tool_memory_mb, "max_output_bytes": cfg.tool_output_bytes})
    return tools, ray.get(tools.isolation.remote())


def describe_ray(cfg: Any, res: dict[str, float]) -> str:
    """Ray's resources in words (the raw dict also lists memory bytes and internal node keys)."""
    where = f"joined {cfg.address}" if cfg.address else "local"
    parts = [f"{int(res.get('CPU', 0))} CPU"] + ([f"{int(res['GPU'])} GPU"] if res.get("GPU") else [])
    return f"{where}, {' + '.join(parts)} slots for {cfg.devices} device workers"
