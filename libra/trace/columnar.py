"""Columnar (NumPy) form of one RL step's trajectories.

The simulator and the planner work on arrays, not on Python objects: one ``StepArrays`` holds a
step's trajectories with their turns flattened. Trajectory ``i`` owns the turn rows
``turn_offsets[i]:turn_offsets[i+1]``.

Codes: ``tool_code`` indexes ``tool_names`` (-1 = no tool); ``outcome_code`` indexes
``libra.trace.records.OUTCOMES`` (-1 = null); ``finish_code`` indexes ``FINISHES`` (-1 = null).
``tool_latency_s`` is NaN where the trace said null (the workload's latency model decides).
``reward`` is NaN where null.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from libra.trace.records import FINISHES, OUTCOMES, Trajectory


@dataclass(frozen=True)
class StepArrays:
    """One step's trajectories as flat arrays (see the module docstring for the layout)."""

    step: int
    ids: tuple[str, ...]
    groups: tuple[str | None, ...]
    prompt_tokens: np.ndarray  # int64 [n]
    turn_offsets: np.ndarray  # int64 [n+1]
    gen_tokens: np.ndarray  # int64 [n_turns]
    tool_tokens: np.ndarray  # int64 [n_turns]
    tool_latency_s: np.ndarray  # float64 [n_turns], NaN = null
    tool_code: np.ndarray  # int16 [n_turns], -1 = no tool
    outcome_code: np.ndarray  # int8 [n_turns], -1 = null
    reward: np.ndarray  # float64 [n], NaN = null
    finish_code: np.ndarray  # int8 [n], -1 = null
    tool_names: tuple[str, ...]

    @property
    def n(self) -> int:
        """Number of trajectories."""
        return len(self.ids)

    @property
    def n_turns(self) -> np.ndarray:
        """Turns per trajectory, int64 [n]."""
        return np.diff(self.turn_offsets)

    @property
    def total_tokens(self) -> np.ndarray:
        """Final context length per trajectory, int64 [n]."""
        per_turn = self.gen_tokens + self.tool_tokens
        sums = np.add.reduceat(per_turn, self.turn_offsets[:-1]) if len(per_turn) else np.zeros(0, np.int64)
        return self.prompt_tokens + sums

    @property
    def total_gen_tokens(self) -> np.ndarray:
        """Generated tokens per trajectory, int64 [n]."""
        if not len(self.gen_tokens):
            return np.zeros(self.n, np.int64)
        return np.add.reduceat(self.gen_tokens, self.turn_offsets[:-1])

    @classmethod
    def from_trajectories(cls, step: int, trajectories: Iterable[Trajectory]) -> StepArrays:
        """Build the columnar form from row records (all of the same ``step``)."""
        trajs = list(trajectories)
        tool_index: dict[str, int] = {}
        offsets = np.zeros(len(trajs) + 1, np.int64)
        gen: list[int] = []
        ttok: list[int] = []
        lat: list[float] = []
        tcode: list[int] = []
        ocode: list[int] = []
        for i, t in enumerate(trajs):
            if t.step != step:
                raise ValueError(f"trajectory {t.id!r} is in step {t.step}, not {step}")
            for turn in t.turns:
                gen.append(turn.gen_tokens)
                ttok.append(turn.tool_tokens)
                lat.append(np.nan if turn.tool_latency_s is None else float(turn.tool_latency_s))
                tcode.append(-1 if turn.tool is None else tool_index.setdefault(turn.tool, len(tool_index)))
                ocode.append(-1 if turn.outcome is None else OUTCOMES.index(turn.outcome))
            offsets[i + 1] = offsets[i] + len(t.turns)
        return cls(
            step=step,
            ids=tuple(t.id for t in trajs),
            groups=tuple(t.group for t in trajs),
            prompt_tokens=np.fromiter((t.prompt_tokens for t in trajs), np.int64, len(trajs)),
            turn_offsets=offsets,
            gen_tokens=np.asarray(gen, np.int64),
            tool_tokens=np.asarray(ttok, np.int64),
            tool_latency_s=np.asarray(lat, np.float64),
            tool_code=np.asarray(tcode, np.int16),
            outcome_code=np.asarray(ocode, np.int8),
            reward=np.fromiter((np.nan if t.reward is None else t.reward for t in trajs), np.float64, len(trajs)),
            finish_code=np.fromiter((-1 if t.finish is None else FINISHES.index(t.finish) for t in trajs), np.int8, len(trajs)),
            tool_names=tuple(tool_index),
        )
