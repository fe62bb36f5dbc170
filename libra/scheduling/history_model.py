"""What past steps say about a trajectory's remaining work, given only what is known now.

A routing decision happens at a tool call. The router knows the trajectory's context so far, its
turns so far, and, when the backend routes at the tool's *return*, that tool's outcome; it does
not know the future. ``RemainingWorkModel`` is fitted on COMPLETED steps, with two families of
*states*, each with a known *final* context length:

* return states ``(outcome, turns bin, context cell)``: every tool return after which the
  trajectory continues, context including the tool's output (used when an observation carries
  an outcome);
* call-start states ``(previous outcome, turns bin, context cell)``: the same calls at the
  moment they start, context before the tool's output, keyed by the outcome of the trajectory's
  PREVIOUS call ("none" before its first), plus every admission (turns 0, "none"). The simulator
  routes here (so the KV migration overlaps the tool): this call's outcome is not known yet, the
  previous one is. These are exactly the observations ``TrajectoryObservation(at_call_start=
  True)`` carries (sim/rollout.py), so the signal a router conditions on at routing time is the
  one the samples were keyed by. (An earlier version looked a call-start observation that had a
  previous outcome up in the RETURN states: the wrong outcome and a context shorter by the tool's
  output, biasing ``P(final >= bound)`` downwards.)

For a new state the model answers

* ``p_exceeds(state, bound)``: the empirical probability that the final context reaches
  ``bound`` (the chance the trajectory outgrows a bucket), and
* ``remaining(state)``: the empirical mean of ``final - context`` (tokens still to come),

from the samples with the same key, backing off to coarser keys (return states: without the turns
bin; call-start states: without the previous outcome, then without the turns bin), then to every
sample at least 0.9x as long as the current context, while fewer than ``min_samples`` support
the finer one; a finer key's few samples are then shrunk towards that estimate rather than
dropped (``prior_strength`` pseudo-samples; issue 22: a rare tail's error signal). Final lengths of samples from another context are rescaled by ``context /
sample context`` so a cell's spread does not bias the estimate.

It never takes the current step: its constructor takes completed steps only, and the routers
that use it are built before the step runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from libra.trace.columnar import StepArrays
from libra.trace.records import OUTCOMES

#: Upper edges of the turn bins (turns done): 0 (admission), 1, 2, 3-4, 5-8, 9-16, 17-32, 33+.
TURN_BIN_EDGES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)


def turn_bin(turns_done: int) -> int:
    """Log2 bin of the number of turns done."""
    return int(np.searchsorted(TURN_BIN_EDGES, turns_done, side="left"))


def context_cell(context: int) -> int:
    """Half-octave context cell (same granularity as the planner's grid)."""
    return int(np.floor(2 * np.log2(max(context, 256) / 256.0)))


def _cells(ctx: np.ndarray) -> np.ndarray:
    return np.floor(2 * np.log2(np.maximum(ctx, 256) / 256.0)).astype(np.int64)


def outcome_name(code: int) -> str:
    return OUTCOMES[code] if code >= 0 else "none"


@dataclass
class RemainingWorkModel:
    """Empirical remaining-work distributions per causal state (see the module docstring)."""

    min_samples: int = 16
    #: pseudo-samples the coarser estimate counts as when a sparse finer state is shrunk towards it
    prior_strength: float = 4.0
    _samples: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _all_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _all_final: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tool_latency_s: dict[str, float] = field(default_factory=dict)
    n_states: int = 0

    @classmethod
    def fit(cls, history: Sequence[StepArrays], window: int = 4, min_samples: int = 16) -> RemainingWorkModel:
        """Fit on the last ``window`` completed steps (oldest first in ``history``)."""
        m = cls(min_samples=min_samples)
        ret: list[list[np.ndarray]] = [[], [], [], []]  # ctx, final, outcome, turns at tool returns
        start: list[list[np.ndarray]] = [[], [], [], []]  # ctx, final, turns, previous outcome at call starts / admission
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
            final = s.total_tokens[traj]
            last = np.zeros(len(traj), bool)
            last[s.turn_offsets[1:] - 1] = True
            routed = (s.tool_code >= 0) & ~last  # calls after which the trajectory continues
            ret[0].append(ctx_after[routed])
            ret[1].append(final[routed])
            ret[2].append(s.outcome_code[routed])
            ret[3].append(turns_done[routed])
            # the previous call's outcome (-1 = none) of each turn's call, within its trajectory
            first = np.zeros(len(traj), bool)
            first[s.turn_offsets[:-1]] = True
            prev_out = np.where(first, -1, np.concatenate([[-1], s.outcome_code[:-1]]))
            start[0] += [(ctx_after - s.tool_tokens)[routed], s.prompt_tokens]
            start[1] += [final[routed], s.total_tokens]
            start[2] += [turns_done[routed], np.zeros(s.n, np.int64)]
            start[3] += [prev_out[routed], np.full(s.n, -1, np.int64)]
            for code, name in enumerate(s.tool_names):
                v = s.tool_latency_s[s.tool_code == code]
                lat.setdefault(name, []).append(v[~np.isnan(v)])
        if start[0]:
            onames = [outcome_name(int(x)) for x in range(-1, len(OUTCOMES))]
            r_ctx, r_fin = np.concatenate(ret[0]).astype(float), np.concatenate(ret[1]).astype(float)
            r_out, r_turns = np.concatenate(ret[2]).astype(np.int64) + 1, np.concatenate(ret[3])
            s_ctx, s_fin = np.concatenate(start[0]).astype(float), np.concatenate(start[1]).astype(float)
            s_turns = np.concatenate(start[2])
            s_prev = np.concatenate(start[3]).astype(np.int64) + 1
            m.n_states = len(r_ctx) + len(s_ctx)
            r_cell, s_cell = _cells(r_ctx), _cells(s_ctx)
            r_tb = np.searchsorted(np.asarray(TURN_BIN_EDGES), r_turns, side="left")
            s_tb = np.searchsorted(np.asarray(TURN_BIN_EDGES), s_turns, side="left")
            for code, ctx, fin, key_of in (
                ((r_out * 16 + r_tb) * 4096 + r_cell, r_ctx, r_fin, lambda u: ("r", onames[u // 65536], (u // 4096) % 16, u % 4096)),
                (r_out * 4096 + r_cell, r_ctx, r_fin, lambda u: ("r", onames[u // 4096], u % 4096)),
                ((s_prev * 16 + s_tb) * 4096 + s_cell, s_ctx, s_fin, lambda u: ("s", onames[u // 65536], (u // 4096) % 16, u % 4096)),
                (s_tb * 4096 + s_cell, s_ctx, s_fin, lambda u: ("s", u // 4096, u % 4096)),
                (s_cell, s_ctx, s_fin, lambda u: ("s", u)),
            ):
                uniq, inv = np.unique(code, return_inverse=True)
                order = np.argsort(inv, kind="stable")
                bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
                for j, u in enumerate(uniq):
                    ii = order[bounds[j] : bounds[j + 1]]
                    m._samples[key_of(int(u))] = (ctx[ii], fin[ii])
            ctx = np.concatenate([r_ctx, s_ctx])
            fin = np.concatenate([r_fin, s_fin])
            order = np.argsort(ctx)
            m._all_ctx, m._all_final = ctx[order], fin[order]
        for name, vs in lat.items():
            v = np.concatenate(vs)
            if len(v):
                m.tool_latency_s[name] = float(np.median(v))
        return m

    def _rescaled(self, got: tuple[np.ndarray, np.ndarray], context: int) -> np.ndarray:
        ctx, fin = got
        return np.maximum(fin * (context / np.maximum(ctx, 1.0)), context)

    def _finals(self, outcome: str | None, turns_done: int, context: int, call_start: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Predicted final lengths for a state, rescaled to ``context``, with their weights (sum 1).

        ``call_start``: the state is a call's start (``outcome`` is the previous call's, None
        before the first); otherwise a return (``outcome`` is the call's own) or, with ``outcome``
        None, an admission / a state without an outcome.

        The finest key with at least ``min_samples`` samples (else every sample whose context had
        reached 0.9x this one) is the base; each finer key that has FEWER samples is not thrown
        away but shrunk towards it, coarse to fine: its ``n`` samples count once each and the
        coarser estimate as ``prior_strength`` pseudo-samples (a Dirichlet-process posterior).
        Issue 22: dropping a rare state's samples below ``min_samples`` estimated P(outgrow |
        error) at 0.17 for a tail where every error outgrew (1.0), so C-MLFQ never promoted it;
        with 5 such samples the shrunk estimate is (5 + 4 x 0.17) / 9 = 0.63."""
        c = context_cell(context)
        tb = turn_bin(turns_done)
        if call_start:
            keys: tuple[tuple, ...] = (("s", outcome or "none", tb, c), ("s", tb, c), ("s", c))
        elif outcome is not None:
            keys = (("r", outcome, tb, c), ("r", outcome, c))
        else:
            keys = (("s", tb, c), ("s", c))
        levels = [self._samples.get(k) for k in keys]
        base = next((j for j, g in enumerate(levels) if g is not None and len(g[0]) >= self.min_samples), None)
        if base is not None:
            vals = self._rescaled(levels[base], context)  # type: ignore[arg-type]
        else:
            i = int(np.searchsorted(self._all_ctx, context * 0.9))
            vals = self._rescaled((self._all_ctx[i:], self._all_final[i:]), context) if len(self._all_ctx) - i >= 1 else np.zeros(0)
            base = len(levels)
        w = np.full(len(vals), 1.0 / len(vals)) if len(vals) else np.zeros(0)
        for g in reversed(levels[:base]):  # the sparse finer keys, coarse to fine
            if g is None or not len(g[0]):
                continue
            fine = self._rescaled(g, context)
            if not len(vals):
                vals, w = fine, np.full(len(fine), 1.0 / len(fine))
                continue
            k = self.prior_strength
            vals = np.concatenate([fine, vals])
            w = np.concatenate([np.ones(len(fine)), w * k]) / (len(fine) + k)
        if not len(vals):
            return np.asarray([float(context)]), np.asarray([1.0])
        return vals, w

    def p_exceeds(
        self, outcome: str | None, turns_done: int, context: int, bound: int | None, call_start: bool = False
    ) -> float:
        """P(final context >= ``bound``) given the state; 0 for an unbounded bucket."""
        if bound is None:
            return 0.0
        if context >= bound:
            return 1.0
        f, w = self._finals(outcome, turns_done, context, call_start)
        return float(np.sum(w * (f >= bound)))

    def remaining(self, outcome: str | None, turns_done: int, context: int, call_start: bool = False) -> float:
        """Expected tokens still to come (generation and tool returns) given the state."""
        f, w = self._finals(outcome, turns_done, context, call_start)
        return float(np.sum(w * f) - context)

    def remaining_quantile(
        self, outcome: str | None, turns_done: int, context: int, q: float, call_start: bool = False
    ) -> float:
        """A quantile of the remaining tokens given the state (of the weighted distribution)."""
        f, w = self._finals(outcome, turns_done, context, call_start)
        order = np.argsort(f, kind="stable")
        cw = np.cumsum(w[order])
        j = int(np.searchsorted(cw, q * cw[-1], side="left"))
        return float(f[order][min(j, len(f) - 1)] - context)

    def expected_tool_latency(self, tool: str | None, default: float = 1.0) -> float:
        """Median latency of ``tool`` in past steps (``default`` when never seen)."""
        if tool is None:
            return default
        return self.tool_latency_s.get(tool, default)
