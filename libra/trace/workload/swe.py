"""R2E-Gym-like SWE agent with a shell tool (the Libra paper's main workload, Qwen3-14B).

An agent edits a repository through ``bash`` calls in a sandbox until it submits. Turns are
many (a median near 20 under a 50-step limit) and heavy-tailed; tool returns (file dumps, test
output) are large; commands take seconds with a heavy tail and occasional 60 s timeouts; hard
tasks hit the 32K context cap. Sources are lines of docs/reference/workloads.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from libra.trace.workload.params import Target, WorkloadParams, param


@dataclass(frozen=True)
class SweParams(WorkloadParams):
    """Defaults for the ``swe`` workload (see ``params.DOCS`` for each parameter's meaning)."""

    workload: ClassVar[str] = "swe"
    tool_name: ClassVar[str] = "bash"
    model_hint: ClassVar[str] = "Qwen3-14B"
    description: ClassVar[str] = "R2E-Gym-like SWE agent, shell tool in a sandbox"

    max_context: int = param(32768, "workloads.md:23 (max response 32768)")
    max_turns: int = param(50, "workloads.md:22 (max 50 agent steps)")
    drift: float = param(0.005, "workloads.md:44-46 (slower than math)")
    turn_drift_share: float = param(0.7, "workloads.md:11 (tool calls grow with length)")
    error_effect: float = param(1.0)
    error_memory: float = param(0.7)
    error_gen_share: float = param(0.4)
    dataset_prompts: int = param(2048)
    prompt_median: float = param(1900.0, "workloads.md:23 (prompt cap 4096)")
    prompt_sigma: float = param(0.25)
    prompt_min: int = param(700)
    prompt_max: int = param(4096, "workloads.md:23 (prompt 4096)")
    prompt_difficulty_coef: float = param(0.1)
    group_corr: float = param(0.6)
    turns_median: float = param(14.0, "workloads.md:24 (median 29-78 with 250-step budgets; fewer under 50)")
    turns_sigma: float = param(0.5)
    turns_shape: float = param(1.6)
    first_hazard_mult: float = param(0.02)
    gen_median: float = param(150.0)
    gen_sigma_traj: float = param(0.35)
    gen_sigma_turn: float = param(0.75)
    gen_persistence_corr: float = param(0.5, "workloads.md:11")
    gen_first_mult: float = param(3.0)
    gen_tail_prob: float = param(0.02)
    gen_tail_alpha: float = param(1.5)
    gen_max_per_turn: int = param(8192)
    tool_tokens_median: float = param(170.0)
    tool_tokens_sigma: float = param(1.0)
    tool_tokens_max: int = param(6000)
    error_tokens_mult: float = param(1.6)
    timeout_tokens: int = param(30)
    error_logit: float = param(-1.8)
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
    reward_turns_coef: float = param(0.5, "workloads.md:27-29 (failed trajectories are longer)")
    reward_error_coef: float = param(1.0)
    reward_learn_per_step: float = param(0.02)


#: Published figures the defaults are calibrated to, and the bands a generated trace must hit.
TARGETS: tuple[Target, ...] = (
    Target("turns_p50", "median 29-78 steps with 250-step budgets; DeepSWE caps at 50", "workloads.md:22,24", 10, 30),
    Target("turns_p99", "max 50 agent steps", "workloads.md:22", 40, 50),
    Target("gen_per_turn_p99_over_p50", "p99 often ~10x the median", "workloads.md:46", 5, 15),
    Target("final_len_p99", "max response 32768 tokens", "workloads.md:23", 20000, 32768),
    Target("finish_length", "context cap 32768: a minority truncated", "workloads.md:23", 0.02, 0.15),
    Target("latency_p50_s", "sandbox commands, seconds-scale", "workloads.md:25-26", 0.3, 3.0),
    Target("latency_p99_s", "60 s per command", "workloads.md:25", 10.0, 60.0),
    Target("latency_max_s", "60 s per command (timeout)", "workloads.md:25", None, 60.0),
    Target("timeout_rate", "occasional 60 s timeouts", "workloads.md:25", 0.003, 0.03),
    Target("spearman_turns_len", "tool-call count grows with sequence length (strongly)", "workloads.md:11", 0.8, None),
    Target("final_len_failed_over_resolved", "67.5K / 35.8K = 1.89 (unresolved / resolved)", "workloads.md:27", 1.4, 2.5),
    Target("remaining_error_over_ok", "not published: errors lengthen what follows (C-MLFQ premise)", "chosen", 1.1, None),
    Target("stop_next_error_over_ok", "not published: an agent rarely stops right after an error", "chosen", None, 0.7),
    Target("drift_gen_slope", "length grows, slower than math", "workloads.md:44-46", 0.0, 0.02),
)
