"""RemainingWorkModel is trained on the observation semantics the simulator routes with.

The simulator asks the router when a tool call STARTS: context before this call's output,
``turns_done`` counting the turn that ends with the call, ``last_outcome`` the PREVIOUS call's
outcome. The model's call-start states must be keyed the same way, or C-MLFQ conditions on a
signal it was never trained on.
"""

from __future__ import annotations

import numpy as np
from test_planner_workload import make_history, make_step
from test_sim_invariants import _run
from test_sim_support import FixedPolicy, OneBucketRouter, simple_plan

from libra.scheduling.history_model import RemainingWorkModel, context_cell, turn_bin


def _call_start_observations(step):  # type: ignore[no-untyped-def]
    seen = []

    class Spy(OneBucketRouter):
        def on_tool_return(self, obs):  # type: ignore[no-untyped-def]
            seen.append(obs)
            return super().on_tool_return(obs)

    pol = FixedPolicy(simple_plan())
    pol.scheduler = lambda plan, future=None: Spy()  # type: ignore[method-assign]
    _run([step], pol)
    return seen


def test_every_simulator_call_start_observation_is_a_training_state() -> None:
    """Each call-start observation the simulator hands a router is, key and context, one of the
    states the model was fitted on (same step): previous outcome, turns bin, context cell."""
    step = make_step(0, n=24, median=3000, sigma=0.4, error_long=True)
    m = RemainingWorkModel.fit([step], min_samples=1)
    seen = _call_start_observations(step)
    assert seen and all(o.at_call_start for o in seen)
    assert any(o.last_outcome == "error" for o in seen)  # second calls of error trajectories
    for o in seen:
        key = ("s", o.last_outcome or "none", turn_bin(o.turns_done), context_cell(o.context_tokens))
        ctx, fin = m._samples[key]
        final = step.total_tokens[o.index]
        assert np.any((ctx == o.context_tokens) & (fin == final)), (key, o.context_tokens, final)


def test_call_start_uses_the_previous_outcome_not_return_states() -> None:
    """After an ``error`` on the first call (history: such trajectories run 4x long), the second
    call's start is promoted; after an ``ok`` it is not. Read as a return state (the old lookup),
    the same observation would use the wrong outcome's samples at a context shifted by the tool's
    output."""
    m = RemainingWorkModel.fit(make_history(4, n=128, median=3000, sigma=0.3, error_long=True))
    p_err = m.p_exceeds("error", 2, 1800, 8000, call_start=True)
    p_ok = m.p_exceeds("ok", 2, 1800, 8000, call_start=True)
    assert p_err > 0.5 > p_ok
    # first call: no previous outcome; the call-start state mixes both populations
    p_first = m.p_exceeds(None, 1, 1000, 8000, call_start=True)
    assert p_ok < p_first < p_err
    assert m.remaining("error", 2, 1800, call_start=True) > m.remaining("ok", 2, 1800, call_start=True)
