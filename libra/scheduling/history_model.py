"""What past steps say about a trajectory's remaining work, given only what is known now.

A routing decision happens at a tool return. The router knows the trajectory's context so far,
its turns so far, and the tool's outcome; it does not know the future. ``RemainingWorkModel``
is fitted on COMPLETED steps: every tool return in them (and every admission, with no
outcome and 0 turns) is a *state* ``(outcome, turns bin, context cell)`` with a known *final*
context length. For a new state the model answers

* ``p_exceeds(state, bound)``: the empirical probability that the final context reaches
  ``bound`` (the chance the trajectory outgrows a bucket), and
* ``remaining(state)``: the empirical mean of ``final - context`` (tokens still to come),

from the samples with the same key, backing off to coarser keys (``(outcome, cell)``, then
``(cell,)``, then every sample at least as long as the current context) while fewer than
``min_samples`` support the finer one. Final lengths of samples from another context cell are
rescaled by ``context / sample context`` so a cell's spread does not bias the estimate.

It never takes the current step: its constructor takes completed steps only, and the routers
that use it are built before the step runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import OUTCOMES

#: Upper edges of the turn bins (turns done): 0-1, 2, 3-4, 5-8, 9-16, 17-32, 33+.
TURN_BIN_EDGES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def turn_bin(turns_done: int) -> int:
    """Log2 bin of the number of turns done."""
    return int(np.searchsorted(TURN_BIN_EDGES, turns_done, side="left"))


def context_cell(context: int) -> int:
    """Half-octave context cell (same granularity as the planner's grid)."""
    return int(np.floor(2 * np.log2(max(context, 256) / 256.0)))


def outcome_name(code: int) -> str:
    return OUTCOMES[code] if code >= 0 else "none"


@dataclass
class RemainingWorkModel:
    """Empirical remaining-work distributions per causal state (see the module docstring)."""

    min_samples: int = 16
    _samples: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _all_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _all_final: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tool_latency_s: dict[str, float] = field(default_factory=dict)
    n_states: int = 0

    @classmethod
    def fit(cls, history: Sequence[StepArrays], window: int = 4, min_samples: int = 16) -> RemainingWorkModel:
        """Fit on the last ``window`` completed steps (oldest first in ``history``)."""
        m = cls(min_samples=min_samples)
        ctx_l, fin_l, out_l, turn_l = [], [], [], []
        lat: dict[str, list[np.ndarray]] = {}
        for s in list(history)[-window:]:
            if not s.n or not len(s.gen_tokens):
                continue
            per_turn = s.gen_tokens + s.tool_tokens
            traj = np.repeat(np.arange(s.n), s.n_turns)
            csum = np.cumsum(per_turn)
            before = np.repeat(np.concatenate([[0], csum])[s.turn_offsets[:-1]], s.n_turns)
            ctx_after = s.prompt_tokens[traj] + csum - before  # context once this turn's tool returned
            turns_done = np.arange(len(traj)) - s.turn_offsets[traj] + 1
            is_ret = s.tool_code >= 0
            final = s.total_tokens[traj]
            # tool returns, plus the admission state of each trajectory (turns 0, no outcome)
            ctx_l += [ctx_after[is_ret], s.prompt_tokens]
            fin_l += [final[is_ret], s.total_tokens]
            out_l += [s.outcome_code[is_ret], np.full(s.n, -1, np.int8)]
            turn_l += [turns_done[is_ret], np.zeros(s.n, np.int64)]
            for code, name in enumerate(s.tool_names):
                v = s.tool_latency_s[s.tool_code == code]
                lat.setdefault(name, []).append(v[~np.isnan(v)])
        if ctx_l:
            ctx = np.concatenate(ctx_l).astype(np.float64)
            fin = np.concatenate(fin_l).astype(np.float64)
            out = np.concatenate(out_l)
            turns = np.concatenate(turn_l)
            m.n_states = len(ctx)
            cells = np.floor(2 * np.log2(np.maximum(ctx, 256) / 256.0)).astype(np.int64)
            tb = np.searchsorted(np.asarray(TURN_BIN_EDGES), turns, side="left")
            onames = [outcome_name(int(x)) for x in range(-1, len(OUTCOMES))]
            ocode = out.astype(np.int64) + 1
            for kind, code in (
                ("full", (ocode * 16 + tb) * 4096 + cells),
                ("outcome", ocode * 4096 + cells),
                ("cell", cells),
            ):
                uniq, inv = np.unique(code, return_inverse=True)
                order = np.argsort(inv, kind="stable")
                bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
                for j, u in enumerate(uniq):
                    ii = order[bounds[j] : bounds[j + 1]]
                    u = int(u)
                    if kind == "full":
                        key: tuple = (onames[u // (16 * 4096)], (u // 4096) % 16, u % 4096)
                    elif kind == "outcome":
                        key = (onames[u // 4096], u % 4096)
                    else:
                        key = (u,)
                    m._samples[key] = (ctx[ii], fin[ii])
            order = np.argsort(ctx)
            m._all_ctx, m._all_final = ctx[order], fin[order]
        for name, vs in lat.items():
            v = np.concatenate(vs)
            if len(v):
                m.tool_latency_s[name] = float(np.median(v))
        return m

    def _finals(self, outcome: str | None, turns_done: int, context: int) -> np.ndarray:
        """Predicted final lengths for a state: the backed-off sample set, rescaled to ``context``."""
        o = outcome or "none"
        c = context_cell(context)
        for key in ((o, turn_bin(turns_done), c), (o, c), (c,)):
            got = self._samples.get(key)
            if got is not None and len(got[0]) >= self.min_samples:
                ctx, fin = got
                return np.maximum(fin * (context / np.maximum(ctx, 1.0)), context)
        # coarsest: every sample whose context had reached at least this one
        i = int(np.searchsorted(self._all_ctx, context * 0.9))
        if len(self._all_ctx) - i >= 1:
            ctx, fin = self._all_ctx[i:], self._all_final[i:]
            return np.maximum(fin * (context / np.maximum(ctx, 1.0)), context)
        return np.asarray([float(context)])

    def p_exceeds(self, outcome: str | None, turns_done: int, context: int, bound: int | None) -> float:
        """P(final context >= ``bound``) given the state; 0 for an unbounded bucket."""
        if bound is None:
            return 0.0
        if context >= bound:
            return 1.0
        f = self._finals(outcome, turns_done, context)
        return float(np.mean(f >= bound))

    def remaining(self, outcome: str | None, turns_done: int, context: int) -> float:
        """Expected tokens still to come (generation and tool returns) given the state."""
        return float(np.mean(self._finals(outcome, turns_done, context)) - context)

    def remaining_quantile(self, outcome: str | None, turns_done: int, context: int, q: float) -> float:
        """A quantile of the remaining tokens given the state."""
        return float(np.quantile(self._finals(outcome, turns_done, context), q) - context)

    def expected_tool_latency(self, tool: str | None, default: float = 1.0) -> float:
        """Median latency of ``tool`` in past steps (``default`` when never seen)."""
        if tool is None:
            return default
        return self.tool_latency_s.get(tool, default)
