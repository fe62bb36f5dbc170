"""The parameters every workload model shares, with their meaning and validation.

One generative model (``engine.py``) serves all workloads; a workload is a set of defaults for
these parameters (``swe.py``, ``search.py``, ``math_tool.py``), each default citing the line of
docs/reference/workloads.md it was calibrated to (``source`` metadata) or saying it was
chosen where the reference is silent. Field docs live in ``metadata["doc"]`` so the CLI help and
the README can print them without repeating them by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from libra.errors import UserError
from libra.trace.workload.distributions import LatencyModel


def param(default: Any, source: str = "chosen") -> Any:
    """A dataclass field whose default carries its calibration source (meaning: ``DOCS``)."""
    return field(default=default, metadata={"source": source})


#: Meaning of each parameter (workload modules repeat only defaults and sources).
DOCS: dict[str, str] = {
    "max_context": "context cap in tokens (prompt + generations + tool returns); reaching it ends the trajectory with finish 'length'",
    "max_turns": "step limit: a trajectory still calling a tool at this turn ends with finish 'tool_limit'",
    "drift": "per-step linear growth of generation lengths: step s scales them by max(0.1, 1 + drift*s); negative = shrinking",
    "turn_drift_share": "expected turns scale by the drift factor to this power (0: turns do not drift)",
    "error_effect": "causal strength of a failed tool call (error/timeout) on what follows: the stop hazard is multiplied by exp(-error_effect*m), m = the decaying failure memory, and the next generation by exp(error_gen_share*error_effect)",
    "error_memory": "decay per turn of the failure memory m (m <- error_memory*m + [call failed]): how long a failure keeps the agent going",
    "error_gen_share": "share of error_effect applied (in log space) to the next generation's length",
    "dataset_prompts": "prompts in the training set; each step samples batch/group_size of them, epoch by epoch",
    "prompt_median": "median prompt tokens",
    "prompt_sigma": "lognormal sigma of prompt tokens",
    "prompt_min": "smallest prompt",
    "prompt_max": "largest prompt (the recipe's prompt cap)",
    "prompt_difficulty_coef": "log prompt length grows by this per unit of latent difficulty",
    "group_corr": "correlation of a trajectory's persistence latent with its prompt's difficulty (GRPO samples of one prompt move together)",
    "turns_median": "median over trajectories of the turn-count scale (Weibull lambda; before the caps and error effects)",
    "turns_sigma": "lognormal sigma of a trajectory's turn-count scale (a lognormal mixture of Weibulls: the heavy tail)",
    "turns_shape": "Weibull shape of the turn count given its scale: 1 = constant stop hazard (geometric), > 1 = agents get likelier to stop as turns accumulate",
    "first_hazard_mult": "stop hazard at turn 0 relative to later turns (agents rarely answer without a tool call)",
    "gen_median": "median generated tokens per (non-first) turn",
    "gen_sigma_traj": "lognormal sigma of a trajectory's verbosity",
    "gen_sigma_turn": "lognormal sigma of generated tokens turn to turn",
    "gen_persistence_corr": "correlation of verbosity with persistence (the paper: tool-call count grows with sequence length)",
    "gen_first_mult": "the first turn (planning/reasoning) generates this many times more",
    "gen_tail_prob": "probability that a turn's generation is multiplied by a Pareto draw (runaway generations)",
    "gen_tail_alpha": "Pareto shape of that multiplier",
    "gen_max_per_turn": "per-turn generation cap (max new tokens per call)",
    "tool_tokens_median": "median tokens of a successful tool return",
    "tool_tokens_sigma": "lognormal sigma of tool return tokens",
    "tool_tokens_max": "tool returns are truncated to this many tokens",
    "error_tokens_mult": "an error return (traceback, stderr) is this many times longer",
    "timeout_tokens": "tokens of the message a timed-out call returns",
    "error_logit": "logit of a tool call failing (outcome 'error') for a prompt of average difficulty",
    "error_difficulty_coef": "error logit grows by this per unit of difficulty",
    "error_streak": "error logit grows by this right after an error (failed fixes cluster)",
    "lat_body_median_s": "median tool latency (seconds) of the body component",
    "lat_body_sigma": "lognormal sigma of the body component",
    "lat_tail_prob": "probability a call comes from the slow-tail component",
    "lat_tail_median_s": "median latency of the slow-tail component",
    "lat_tail_sigma": "lognormal sigma of the slow-tail component",
    "lat_hang_prob": "probability a call hangs until the timeout",
    "lat_timeout_s": "the tool's timeout; calls reaching it end with outcome 'timeout' at exactly this latency",
    "lat_floor_s": "fixed per-call overhead",
    "reward_base_logit": "success logit at step 0 for an average prompt and an average-length trajectory",
    "reward_difficulty_coef": "success logit falls by this per unit of difficulty",
    "reward_turns_coef": "success logit falls by this per e-fold of turns over the median (failed trajectories are longer)",
    "reward_error_coef": "success logit falls by this times the fraction of tool calls that failed",
    "reward_learn_per_step": "success logit rises by this per step (the policy learns)",
}


@dataclass(frozen=True)
class WorkloadParams:
    """Parameters of the shared generative model; subclasses set a workload's defaults."""

    workload: ClassVar[str] = ""
    tool_name: ClassVar[str] = ""
    model_hint: ClassVar[str] = ""
    description: ClassVar[str] = ""

    max_context: int
    max_turns: int
    drift: float
    turn_drift_share: float
    error_effect: float
    error_memory: float
    error_gen_share: float
    dataset_prompts: int
    prompt_median: float
    prompt_sigma: float
    prompt_min: int
    prompt_max: int
    prompt_difficulty_coef: float
    group_corr: float
    turns_median: float
    turns_sigma: float
    turns_shape: float
    first_hazard_mult: float
    gen_median: float
    gen_sigma_traj: float
    gen_sigma_turn: float
    gen_persistence_corr: float
    gen_first_mult: float
    gen_tail_prob: float
    gen_tail_alpha: float
    gen_max_per_turn: int
    tool_tokens_median: float
    tool_tokens_sigma: float
    tool_tokens_max: int
    error_tokens_mult: float
    timeout_tokens: int
    error_logit: float
    error_difficulty_coef: float
    error_streak: float
    lat_body_median_s: float
    lat_body_sigma: float
    lat_tail_prob: float
    lat_tail_median_s: float
    lat_tail_sigma: float
    lat_hang_prob: float
    lat_timeout_s: float
    lat_floor_s: float
    reward_base_logit: float
    reward_difficulty_coef: float
    reward_turns_coef: float
    reward_error_coef: float
    reward_learn_per_step: float

    def __post_init__(self) -> None:
        self.validate()

    @property
    def latency(self) -> LatencyModel:
        """The tool latency model these parameters describe."""
        return LatencyModel(
            body_median_s=self.lat_body_median_s,
            body_sigma=self.lat_body_sigma,
            tail_prob=self.lat_tail_prob,
            tail_median_s=self.lat_tail_median_s,
            tail_sigma=self.lat_tail_sigma,
            hang_prob=self.lat_hang_prob,
            timeout_s=self.lat_timeout_s,
            floor_s=self.lat_floor_s,
        )

    def validate(self) -> None:
        """Raise ``UserError`` naming the first parameter outside its valid range."""
        w = self.workload or type(self).__name__

        def bad(name: str, rule: str) -> UserError:
            return UserError(f"workload {w}: parameter {name}={getattr(self, name)!r}: {rule}")

        positive_ints = ("max_context", "max_turns", "dataset_prompts", "prompt_min", "prompt_max",
                         "gen_max_per_turn", "tool_tokens_max")
        for name in positive_ints:
            if int(getattr(self, name)) < 1:
                raise bad(name, "must be an integer >= 1")
        positive = ("prompt_median", "turns_median", "turns_shape", "gen_median", "tool_tokens_median", "gen_tail_alpha",
                    "lat_body_median_s", "lat_tail_median_s", "lat_timeout_s", "error_tokens_mult")
        for name in positive:
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        nonneg = ("prompt_sigma", "turns_sigma", "gen_sigma_traj", "gen_sigma_turn", "tool_tokens_sigma",
                  "lat_body_sigma", "lat_tail_sigma", "lat_floor_s", "first_hazard_mult", "gen_first_mult",
                  "timeout_tokens", "error_effect", "turn_drift_share")
        for name in nonneg:
            if not getattr(self, name) >= 0:
                raise bad(name, "must be >= 0")
        for name in ("gen_tail_prob", "lat_tail_prob", "lat_hang_prob", "error_gen_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be a probability in [0, 1]")
        if not 0.0 <= self.error_memory < 1.0:
            raise bad("error_memory", "must be in [0, 1)")
        for name in ("group_corr", "gen_persistence_corr"):
            if not -1.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be a correlation in [-1, 1]")
        if self.prompt_max < self.prompt_min:
            raise bad("prompt_max", f"must be >= prompt_min ({self.prompt_min})")
        if self.max_context <= self.prompt_max:
            raise bad("max_context", f"must exceed prompt_max ({self.prompt_max}) so every prompt fits")
        if self.lat_floor_s >= self.lat_timeout_s:
            raise bad("lat_floor_s", f"must be below lat_timeout_s ({self.lat_timeout_s})")

    def as_dict(self) -> dict[str, Any]:
        """Every parameter by name (what the trace header records)."""
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Parameter names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def sources(cls) -> dict[str, str]:
        """Where each default comes from (a workloads.md line, or 'chosen')."""
        return {f.name: f.metadata.get("source", "chosen") for f in dataclasses.fields(cls)}

    def replace(self, **changes: Any) -> WorkloadParams:
        """A copy with some parameters changed (validated); unknown names are a ``UserError``."""
        known = set(self.field_names())
        unknown = sorted(set(changes) - known)
        if unknown:
            raise UserError(f"workload {self.workload}: unknown parameter(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(known))}")
        types = {f.name: f.type for f in dataclasses.fields(self)}
        coerced: dict[str, Any] = {}
        for name, value in changes.items():
            try:
                coerced[name] = int(value) if types[name] in ("int", int) else float(value)
            except (TypeError, ValueError):
                raise UserError(f"workload {self.workload}: parameter {name}={value!r}: must be a number") from None
            if types[name] in ("int", int) and float(value) != coerced[name]:
                raise UserError(f"workload {self.workload}: parameter {name}={value!r}: must be an integer")
        return dataclasses.replace(self, **coerced)


@dataclass(frozen=True)
class Target:
    """A published figure a workload is calibrated to, and the band its generated value must hit.

    ``stat`` is a key of ``libra.trace.workload.report.trace_stats``; ``published`` is the figure
    as the reference states it; ``source`` the line of workloads.md (or "chosen" when the band
    encodes a modeling choice the reference does not pin down). ``low``/``high`` bound the value a
    generated trace of that workload (default parameters) must show; ``None`` = unbounded.
    """

    stat: str
    published: str
    source: str
    low: float | None = None
    high: float | None = None

    def holds(self, value: float) -> bool:
        """Whether ``value`` is inside the band."""
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    @property
    def band(self) -> str:
        """The band as text, e.g. ``[12, 30]`` or ``>= 0.8``."""
        if self.low is not None and self.high is not None:
            return f"[{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f">= {self.low:g}"
        if self.high is not None:
            return f"<= {self.high:g}"
        return "-"
