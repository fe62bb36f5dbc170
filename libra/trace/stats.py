"""Per-step statistics of a trace: what each RL step's rollout looked like, and how it drifts.

Agentic RL workloads change as the policy learns (trajectories grow longer, tool mixes shift);
Libra replans when they do. These statistics are the human-readable view of that: the
``libra-sim stats`` table, the JSON it prints, and a pandas frame for notebooks. They are pure
functions of ``StepArrays`` (vectorized NumPy, no per-trajectory Python), so a step of a
million turns costs milliseconds.

Drift compares a step with the first step and with the previous step *of the trace*, as ratios of
mean and p90 final context length: ``> 1`` means trajectories got longer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import FINISHES, OUTCOMES

if TYPE_CHECKING:  # pandas is a dependency, but importing it costs ~0.3 s: only when asked
    import pandas as pd

#: The percentiles reported for every distribution.
PERCENTILES: tuple[int, ...] = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample; every field is NaN for an empty sample."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        """Mean, p50/p90/p99 (linear interpolation, NumPy's default) and max of ``values``."""
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        if not v.size:
            return cls(math.nan, math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(v, PERCENTILES)
        return cls(float(v.mean()), float(p50), float(p90), float(p99), float(v.max()))


@dataclass(frozen=True)
class StepStats:
    """Statistics of one RL step's trajectories (see the module docstring).

    Shares: ``tool_mix`` is each tool's share of the step's tool calls; ``outcome_rates`` is each
    outcome's share of tool calls, with ``"unknown"`` for calls whose outcome is null.
    ``tool_latency_p50_s``/``p99_s`` cover calls with a recorded latency (NaN when none).
    ``finish_counts`` counts every trajectory, with ``"null"`` for an unknown finish.
    Drift ratios are NaN for the first step (``vs_first``) and when a reference is zero.
    """

    step: int
    n_trajectories: int
    n_turns: int
    n_tool_calls: int
    turns: Distribution
    gen_tokens_per_turn: Distribution
    context_tokens: Distribution
    prompt_tokens: Distribution
    total_gen_tokens: int
    tool_mix: dict[str, float]
    outcome_rates: dict[str, float]
    tool_latency_p50_s: float
    tool_latency_p99_s: float
    n_latency_null: int
    finish_counts: dict[str, int]
    mean_reward: float
    n_reward_null: int
    drift_mean_vs_first: float = math.nan
    drift_p90_vs_first: float = math.nan
    drift_mean_vs_prev: float = math.nan
    drift_p90_vs_prev: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: NaN becomes None (JSON has no NaN)."""
        return _nan_to_none(asdict(self))

    def flat(self) -> dict[str, Any]:
        """One flat row (``context_tokens.p90`` -> ``context_p90``, tool shares as ``tool:NAME``)
        for tables and DataFrames."""
        row: dict[str, Any] = {
            "step": self.step,
            "trajectories": self.n_trajectories,
            "turns": self.n_turns,
            "tool_calls": self.n_tool_calls,
            "total_gen_tokens": self.total_gen_tokens,
            "mean_reward": self.mean_reward,
        }
        for name, dist in (
            ("turns", self.turns),
            ("gen_per_turn", self.gen_tokens_per_turn),
            ("context", self.context_tokens),
            ("prompt", self.prompt_tokens),
        ):
            for k, v in asdict(dist).items():
                row[f"{name}_{k}"] = v
        row["tool_latency_p50_s"] = self.tool_latency_p50_s
        row["tool_latency_p99_s"] = self.tool_latency_p99_s
        for tool, share in self.tool_mix.items():
            row[f"tool:{tool}"] = share
        for outcome, rate in self.outcome_rates.items():
            row[f"outcome:{outcome}"] = rate
        for finish, count in self.finish_counts.items():
            row[f"finish:{finish}"] = count
        row["drift_mean_vs_first"] = self.drift_mean_vs_first
        row["drift_p90_vs_first"] = self.drift_p90_vs_first
        row["drift_mean_vs_prev"] = self.drift_mean_vs_prev
        row["drift_p90_vs_prev"] = self.drift_p90_vs_prev
        return row


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def _ratio(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def step_stats(s: StepArrays) -> StepStats:
    """Statistics of one step, without drift (``trace_stats`` fills drift in)."""
    n_turns = s.n_turns
    has_tool = s.tool_code >= 0
    n_calls = int(has_tool.sum())
    tool_counts = np.bincount(s.tool_code[has_tool].astype(np.int64), minlength=len(s.tool_names))
    tool_mix = {name: float(c) / n_calls for name, c in zip(s.tool_names, tool_counts)} if n_calls else {}
    tool_mix = dict(sorted(tool_mix.items(), key=lambda kv: (-kv[1], kv[0])))
    outcomes = s.outcome_code[has_tool].astype(np.int64)
    outcome_rates: dict[str, float] = {}
    if n_calls:
        oc = np.bincount(outcomes + 1, minlength=len(OUTCOMES) + 1)
        outcome_rates = {name: float(oc[i + 1]) / n_calls for i, name in enumerate(OUTCOMES)}
        outcome_rates["unknown"] = float(oc[0]) / n_calls
    lat = s.tool_latency_s[has_tool]
    known_lat = lat[~np.isnan(lat)]
    if known_lat.size:
        lat50, lat99 = (float(x) for x in np.percentile(known_lat, (50, 99)))
    else:
        lat50 = lat99 = math.nan
    fc = np.bincount(s.finish_code.astype(np.int64) + 1, minlength=len(FINISHES) + 1)
    finish_counts = {name: int(fc[i + 1]) for i, name in enumerate(FINISHES)}
    finish_counts["null"] = int(fc[0])
    rewards = s.reward[~np.isnan(s.reward)]
    return StepStats(
        step=s.step,
        n_trajectories=s.n,
        n_turns=int(n_turns.sum()),
        n_tool_calls=n_calls,
        turns=Distribution.of(n_turns),
        gen_tokens_per_turn=Distribution.of(s.gen_tokens),
        context_tokens=Distribution.of(s.total_tokens),
        prompt_tokens=Distribution.of(s.prompt_tokens),
        total_gen_tokens=int(s.gen_tokens.sum()),
        tool_mix=tool_mix,
        outcome_rates=outcome_rates,
        tool_latency_p50_s=lat50,
        tool_latency_p99_s=lat99,
        n_latency_null=int(lat.size - known_lat.size),
        finish_counts=finish_counts,
        mean_reward=float(rewards.mean()) if rewards.size else math.nan,
        n_reward_null=int(s.n - rewards.size),
    )


def with_drift(stats: StepStats, first: StepStats | None, prev: StepStats | None) -> StepStats:
    """``stats`` with its drift ratios against the first and the previous step filled in."""
    from dataclasses import replace

    c = stats.context_tokens
    return replace(
        stats,
        drift_mean_vs_first=_ratio(c.mean, first.context_tokens.mean) if first else math.nan,
        drift_p90_vs_first=_ratio(c.p90, first.context_tokens.p90) if first else math.nan,
        drift_mean_vs_prev=_ratio(c.mean, prev.context_tokens.mean) if prev else math.nan,
        drift_p90_vs_prev=_ratio(c.p90, prev.context_tokens.p90) if prev else math.nan,
    )


def iter_trace_stats(steps: Iterable[StepArrays]) -> Iterator[StepStats]:
    """Stats of each step in the order given (ascending from ``TraceReader.steps()``), with
    drift; streams, so a trace of any size needs one step in memory."""
    first: StepStats | None = None
    prev: StepStats | None = None
    for s in steps:
        st = with_drift(step_stats(s), first, prev)
        if first is None:
            first = st
        prev = st
        yield st


def trace_stats(steps: Iterable[StepArrays]) -> list[StepStats]:
    """Stats of every step, with drift (see ``iter_trace_stats``)."""
    return list(iter_trace_stats(steps))


def stats_frame(stats: Iterable[StepStats]) -> pd.DataFrame:
    """One row per step (``StepStats.flat``), indexed by step; missing tools/outcomes are 0."""
    import pandas as pd

    rows = [s.flat() for s in stats]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    share_cols = [c for c in df.columns if c.startswith(("tool:", "outcome:", "finish:"))]
    df[share_cols] = df[share_cols].fillna(0)
    return df.set_index("step")
