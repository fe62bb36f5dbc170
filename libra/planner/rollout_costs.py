"""``RolloutCosts``: the rollout's prices for one (GPU, model), cached, over the core's evaluator.

Why it is in the policy core: the static baselines (``libra.policies``) rank candidate
configurations with the rollout makespan lower bound (``libra.planner.bounds``), and the
simulator's ground truth asks the same questions (decode coefficients, KV capacity, running
sequences, batched prefill) tens of thousands of times per step. One object answers both, so a
baseline's estimate and the replay that charges it read the same numbers, and the simulator
(``sim.costs.SimCosts``, a subclass) re-uses it rather than keeping a copy.

Why a cache: even the evaluator's scalar paths cost tens of microseconds a call (argument
checks, operator tables). Decode coefficients depend only on (TP, batch), so they are cached;
prefills are memoized on rounded arguments (``prefill_batch_s``). Noise is never applied here:
the simulator multiplies by its own seeded factors, so a prediction is never magically exact.

Everything in a step that is not the rollout is priced by ``self.step``, the
``libra.planner.step_costs.StepCosts`` over the same evaluator.
"""

from __future__ import annotations

from collections.abc import Sequence

from libra.planner.costs import CostModel, prefill_at, prefill_key
from libra.planner.step_costs import StepCosts


class RolloutCosts:
    """Cached rollout timings for one evaluator (one GPU kind and model), plus its ``StepCosts``."""

    def __init__(self, ev: CostModel, gpus_per_node: int = 8) -> None:
        self.ev = ev
        self.gpus_per_node = gpus_per_node
        self._decode: dict[tuple[int, int], tuple[float, float]] = {}
        self._kv: dict[int, int] = {}
        self._seqs: dict[int, int] = {}
        self._prefill: dict[tuple[int, int, int, int], float] = {}
        #: scratch memo for derived per-step quantities (``libra.planner.bounds`` critical paths,
        #: the simulator's hindsight replays); keys name what they cache, values live as long as
        #: this object
        self.memo: dict[tuple[object, ...], object] = {}
        #: the step's non-rollout prices (training, sync, switches, transitions, migration)
        self.step = StepCosts(ev, gpus_per_node)

    def decode_coeffs(self, tp: int, batch: int) -> tuple[float, float]:
        """(base_s, slope_s_per_kv_token) of one decode iteration, cached."""
        key = (tp, batch)
        c = self._decode.get(key)
        if c is None:
            base, slope = self.ev.decode_coeffs(tp, batch)
            c = (float(base), float(slope))
            self._decode[key] = c
        return c

    def kv_capacity(self, tp: int) -> int:
        """KV-cache tokens one TP-``tp`` instance holds (0: the weights do not fit)."""
        c = self._kv.get(tp)
        if c is None:
            c = self._kv[tp] = int(self.ev.kv_capacity_tokens(tp))
        return c

    def max_seqs(self, tp: int) -> int:
        """vLLM's max running sequences for a TP-``tp`` instance."""
        c = self._seqs.get(tp)
        if c is None:
            c = self._seqs[tp] = max(1, int(self.ev.max_running_seqs(tp)))
        return c

    def prefill_batch_s(self, tp: int, seqs: Sequence[tuple[int, int]]) -> float:
        """Prefill of sequences admitted together, each ``(new_tokens, cached_tokens)``.

        They are prefilled as one batch (chunked prefill packs them into the next iteration):
        ``prefill_s(tp, mean new, mean cached, batch=k)``. The mean under-counts attention of a
        very uneven batch slightly; the decode part of the same iteration is charged separately.
        Calls are memoized on the arguments rounded to 1/8 of an octave (at most 4.4% off one
        argument, under the 3% noise once averaged; replayed makespans moved by <0.3% against
        1/16 octave on the bundled trace) because an evaluator call costs ~80 us and a step asks
        thousands of times.
        """
        k = len(seqs)
        if k == 0:
            return 0.0
        if k == 1:
            new, cached = seqs[0]
        else:
            new = sum(s[0] for s in seqs) / k
            cached = sum(s[1] for s in seqs) / k
        key = prefill_key(tp, new, cached, k)
        v = self._prefill.get(key)
        if v is None:
            v = self._prefill[key] = prefill_at(self.ev, key)
        return v
