"""What a rollout engine is asked and what it answers: one generation turn of a trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """Generate the next turn of ``traj_id`` after ``context`` (all token ids so far).

    The whole context is sent every time: an engine that still holds the trajectory's KV for a
    prefix of it computes only the new suffix (the tool's return); one that does not (after a
    migration or a worker failure) recomputes the prefix. That is what makes a migration safe
    and lets its cost be measured.
    """

    traj_id: str
    context: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 1.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The generated tokens and how the turn ended: ``"stop"`` (a stop token: tool call or end of
    answer, the last token says which) or ``"length"`` (max_new_tokens reached)."""

    traj_id: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str
    prefill_tokens: int  # context tokens computed for this turn
    cached_tokens: int  # context tokens found in the engine's cache
    prefill_s: float
    decode_s: float
    instance: int = -1
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """The methods both engines implement (and the Ray actor forwards)."""

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Run one turn for each request (an engine may batch them)."""
        ...

    def prefill(self, traj_id: str, context: tuple[int, ...]) -> tuple[int, float]:
        """Compute and keep ``context``'s KV now (a migration's destination does this while the
        tool runs). Returns (tokens computed, seconds)."""
        ...

    def drop(self, traj_ids: list[str]) -> int:
        """Forget trajectories' KV; returns tokens freed."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> float:
        """Load new policy weights (weight sync); returns seconds taken."""
        ...

    def cached_tokens(self) -> int:
        """KV tokens held now."""
        ...
