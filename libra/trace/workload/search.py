"""Search-R1-like agent with a retrieval tool.

Few, short turns: the model thinks, issues at most 3 searches (GRPO settles at 1-2), reads the
top passages (about 500 tokens per observation) and answers. Retrieval is tens of ms with a tail
to about a second, and rare exhaustive-index stalls cut by the 30 s tool timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from libra.trace.workload.params import Target, WorkloadParams, param


@dataclass(frozen=True)
class SearchParams(WorkloadParams):
    """Defaults for the ``search`` workload (see ``params.DOCS`` for each parameter's meaning)."""

    workload: ClassVar[str] = "search"
    tool_name: ClassVar[str] = "search"
    model_hint: ClassVar[str] = "Qwen3-8B"  # in the cost-model catalog; Search-R1 trained 3B-7B models
    description: ClassVar[str] = "Search-R1-like agent, retrieval tool"

    max_context: int = param(4096, "Search-R1 max_prompt_length (not in workloads.md)")
    max_turns: int = param(4, "workloads.md:34 (budget of 3 searches, then the answer)")
    drift: float = param(0.003, "workloads.md:44-46")
    turn_drift_share: float = param(1.0, "workloads.md:34 (searches grow during training)")
    error_effect: float = param(1.0)
    error_memory: float = param(0.6)
    error_gen_share: float = param(0.4)
    dataset_prompts: int = param(8192)
    prompt_median: float = param(230.0)
    prompt_sigma: float = param(0.2)
    prompt_min: int = param(90)
    prompt_max: int = param(1024)
    prompt_difficulty_coef: float = param(0.05)
    group_corr: float = param(0.6)
    turns_median: float = param(2.0, "workloads.md:34 (GRPO stays at 1-2 searches)")
    turns_sigma: float = param(0.5)
    turns_shape: float = param(2.5)
    first_hazard_mult: float = param(0.3)
    gen_median: float = param(95.0)
    gen_sigma_traj: float = param(0.3)
    gen_sigma_turn: float = param(0.55)
    gen_persistence_corr: float = param(0.3)
    gen_first_mult: float = param(1.4)
    gen_tail_prob: float = param(0.01)
    gen_tail_alpha: float = param(2.0)
    gen_max_per_turn: int = param(500, "workloads.md:32 (500 tokens per turn)")
    tool_tokens_median: float = param(480.0, "workloads.md:32 (500-token observations, top-3 passages)")
    tool_tokens_sigma: float = param(0.12)
    tool_tokens_max: int = param(500, "workloads.md:32")
    error_tokens_mult: float = param(0.1)
    timeout_tokens: int = param(20)
    error_logit: float = param(-3.5)
    error_difficulty_coef: float = param(0.3)
    error_streak: float = param(0.5)
    lat_body_median_s: float = param(0.045, "workloads.md:35 (~26 ms per query at batch 256)")
    lat_body_sigma: float = param(0.8)
    lat_tail_prob: float = param(0.01)
    lat_tail_median_s: float = param(0.8)
    lat_tail_sigma: float = param(0.8)
    lat_hang_prob: float = param(0.0005, "workloads.md:36 (flat index can exceed 20 s)")
    lat_timeout_s: float = param(30.0, "workloads.md:33 (tool timeout 30 s)")
    lat_floor_s: float = param(0.01)
    reward_base_logit: float = param(0.0)
    reward_difficulty_coef: float = param(1.0)
    reward_turns_coef: float = param(0.3)
    reward_error_coef: float = param(1.0)
    reward_learn_per_step: float = param(0.01)


#: Published figures the defaults are calibrated to, and the bands a generated trace must hit.
TARGETS: tuple[Target, ...] = (
    Target("tool_calls_mean", "GRPO stays at 1-2 searches (budget 3)", "workloads.md:34", 1.0, 2.0),
    Target("turns_p99", "budget of 3 searches, then the answer", "workloads.md:34", 2, 4),
    Target("gen_per_turn_p99", "500 tokens per turn", "workloads.md:32", None, 500),
    Target("tool_tokens_p99", "500-token observations", "workloads.md:32", None, 500),
    Target("latency_p50_s", "~26 ms per query at batch 256", "workloads.md:35", 0.02, 0.1),
    Target("latency_p99_s", "tens of ms; flat index can exceed 20 s (rare)", "workloads.md:35-36", 0.1, 2.0),
    Target("latency_max_s", "tool timeout 30 s", "workloads.md:33", None, 30.0),
    Target("final_len_p99", "context cap 4096 (Search-R1 max_prompt_length)", "chosen", None, 4096),
    Target("remaining_error_over_ok", "not published: errors lengthen what follows (C-MLFQ premise)", "chosen", 1.1, None),
    Target("stop_next_error_over_ok", "not published: an agent rarely stops right after an error", "chosen", None, 0.8),
)
