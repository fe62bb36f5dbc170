"""The honest baselines' length prior: what a verl user writes in a config before any rollout.

The static baselines (``verl-colocated``, ``verl-static-uniform``) choose their configuration
once, at their first plan, knowing the first step's prompt lengths and nothing else. For the
rest of each trajectory they assume ``PRIOR_GEN_TOKENS`` generated over ``PRIOR_TURNS`` turns,
``PRIOR_TOOL_TOKENS`` returned per tool call, ``PRIOR_TOOL_S`` per call, contexts up to
``PRIOR_MAX_CONTEXT``. (Libra's planner has its own, workload-aware prior:
``libra.planner.stats.prior_step``.)
"""

from __future__ import annotations

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn

PRIOR_GEN_TOKENS = 8192
PRIOR_TURNS = 8
PRIOR_TOOL_TOKENS = 512
PRIOR_TOOL_S = 2.0
#: The honest baselines' max context (verl's ``max_prompt_length + max_response_length`` of a
#: typical agentic config): like vLLM, which refuses a ``max_model_len`` above its KV capacity,
#: they only consider rollout TPs whose KV cache holds this much.
PRIOR_MAX_CONTEXT = 32768


def prior_step(prompt_tokens: np.ndarray, gen: int = PRIOR_GEN_TOKENS, turns: int = PRIOR_TURNS,
               tool_tokens: int = PRIOR_TOOL_TOKENS, tool_s: float = PRIOR_TOOL_S) -> StepArrays:
    """A stand-in step built from known prompts and the length prior (what an honest baseline
    can reason about before any rollout has run)."""
    per = max(1, gen // max(turns, 1))
    trajs = [
        Trajectory(
            id=f"prior-{i}", step=0, prompt_tokens=int(p),
            turns=tuple(Turn(per, "tool", tool_s, tool_tokens) for _ in range(turns - 1)) + (Turn(per, None),),
        )
        for i, p in enumerate(prompt_tokens)
    ]
    return StepArrays.from_trajectories(0, trajs)
