"""R2E-Gym-like SWE agent with a shell tool (the Libra paper's main workload, Qwen3-14B).

An agent edits a repository through ``bash`` calls in a sandbox until it submits. Turns are
many (a median near 20 under a 50-step limit) and heavy-tailed; tool returns (file dumps, test
output) are large; commands take seconds with a heavy tail and occasional 60 s timeouts; hard
tasks hit the 32K context cap. Sources are lines of /work/shared/reference/workloads.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from libra.trace.workload.params import WorkloadParams, param


@dataclass(frozen=True)
class SweParams(WorkloadParams):
    """Defaults for the ``swe`` workload (see ``params.DOCS`` for each parameter's meaning)."""

    workload: ClassVar[str] = "swe"
    tool_name: ClassVar[str] = "bash"
    model_hint: ClassVar[str] = "Qwen3-14B"
    description: ClassVar[str] = "R2E-Gym-like SWE agent, shell tool in a sandbox"

    max_context: int = param(32768, "workloads.md:23 (max response 32768)")
    max_turns: int = param(50, "workloads.md:22 (max 50 agent steps)")
    drift: float = param(0.003, "workloads.md:44-46 (slower than math)")
    turn_drift_share: float = param(0.7, "workloads.md:11 (tool calls grow with length)")
    error_effect: float = param(1.0)
    error_gen_share: float = param(0.4)
    dataset_prompts: int = param(2048)
    prompt_median: float = param(1900.0, "workloads.md:23 (prompt cap 4096)")
    prompt_sigma: float = param(0.25)
    prompt_min: int = param(700)
    prompt_max: int = param(4096, "workloads.md:23 (prompt 4096)")
    prompt_difficulty_coef: float = param(0.1)
    group_corr: float = param(0.6)
    turns_median: float = param(15.0, "workloads.md:24 (median 29-78 with 250-step budgets; fewer under 50)")
    turns_sigma: float = param(0.65)
    first_hazard_mult: float = param(0.02)
    gen_median: float = param(170.0)
    gen_sigma_traj: float = param(0.35)
    gen_sigma_turn: float = param(0.75)
    gen_persistence_corr: float = param(0.5, "workloads.md:11")
    gen_first_mult: float = param(3.0)
    gen_tail_prob: float = param(0.02)
    gen_tail_alpha: float = param(1.5)
    gen_max_per_turn: int = param(8192)
    tool_tokens_median: float = param(240.0)
    tool_tokens_sigma: float = param(1.0)
    tool_tokens_max: int = param(6000)
    error_tokens_mult: float = param(1.6)
    timeout_tokens: int = param(30)
    error_logit: float = param(-1.1)
    error_difficulty_coef: float = param(0.5)
    error_streak: float = param(0.7)
    lat_body_median_s: float = param(0.8, "workloads.md:25-26 (seconds-scale sandbox commands)")
    lat_body_sigma: float = param(1.0)
    lat_tail_prob: float = param(0.05)
    lat_tail_median_s: float = param(12.0)
    lat_tail_sigma: float = param(0.7)
    lat_hang_prob: float = param(0.012)
    lat_timeout_s: float = param(60.0, "workloads.md:25 (60 s per command)")
    lat_floor_s: float = param(0.05)
    reward_base_logit: float = param(-0.9)
    reward_difficulty_coef: float = param(1.2)
    reward_turns_coef: float = param(0.9, "workloads.md:27-29 (failed trajectories are longer)")
    reward_error_coef: float = param(1.0)
    reward_learn_per_step: float = param(0.01)
