"""Held-out evaluation of the policy before and after a ``libra-run``.

Why: a step's training reward is measured on that step's own prompts, a few dozen of them, and
is noisy (GRPO samples at temperature 1); whether RL improved the policy is better read on a
fixed set of tasks the run never trains on. ``libra-run`` evaluates the starting weights and the
final weights on the same held-out tasks (their own seed, drawn by the same ``TaskSet`` rules),
with the same episode rules (tools, budgets, answer checking) as the rollout, and prints both.

It runs in the driver process on the torch engine, outside Ray: the evaluation is a measurement
of the weights, not of the cluster, so it must not depend on the plan or on which engine
generated the run's rollouts. Episodes advance together (``evaluate.run_episodes``).
"""

from __future__ import annotations

import time
from typing import Any

from libra.runtime.episode import Episode
from libra.runtime.evaluate import run_episodes, summarize
from libra.runtime.chat_format import for_tokenizer
from libra.runtime.tasks import TaskSet
from libra.runtime.tools import ToolBox

__all__ = ["heldout_eval", "run_episodes", "summarize"]


def heldout_eval(model_dir: str, state: dict[str, Any] | None, n: int, seed: int, kinds: dict[str, float], temperature: float,
                 max_new_tokens: int, max_tool_calls: int, max_context: int, tool_opts: dict[str, Any] | None = None,
                 samples: int = 1, threads: int = 1) -> dict[str, float]:
    """Evaluate ``state`` (policy weights; None: the checkpoint in ``model_dir``) on ``n``
    held-out tasks drawn with ``seed``, ``samples`` episodes per task. Seeds of the sampling
    depend only on the task and sample index, so before and after see the same draws of noise."""
    from libra.runtime.engines.torch_engine import TorchEngine

    t0 = time.perf_counter()
    engine = TorchEngine(model_dir, device="cpu", seed=seed, max_context=max_context, threads=threads)
    if state is not None:
        engine.load_state_dict(state)
    tasks = TaskSet(kinds, seed=seed).batch(0, n)
    eps = []
    fmt = for_tokenizer(engine.tokenizer)
    for i, t in enumerate(tasks):
        ids = fmt.prompt_ids(t.question)
        for k in range(samples):
            eps.append(Episode(f"heldout-{i}-{k}", 0, f"heldout-{i}", t, ids, max_tool_calls, max_new_tokens, max_context, temperature,
                               seed=seed * 1_000_003 + i * 101 + k, fmt=fmt))
    run_episodes(engine, eps, ToolBox(**(tool_opts or {})))
    out = summarize(eps)
    out["eval_s"] = time.perf_counter() - t0
    return out
