"""The real executor behind ``libra-run``: Ray actors, rollout engines, trainer, real tools.

This package is the only part of ``libra`` that touches torch, ray, vllm or deepspeed, and it
imports them lazily inside the submodules that need them, so ``import libra.runtime`` (and the
pure submodules ``protocol``, ``tasks``, ``tools``, ``config``) stay light. Install the heavy
stack with ``pip install -e '.[run]'`` (see docs/runtime.md).
"""
