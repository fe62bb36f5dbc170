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
    seen = [o for o in _call_start_observations(step) if o.at_call_start]  # (also asked at returns)
    assert seen
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


def _rare_tail_history():  # type: ignore[no-untyped-def]
    """200 trajectories whose first call returns ``ok`` and that end near 2,000 tokens, and 5
    whose first call fails and that run to 20,000: a rare tail announced by the error."""
    from libra.trace.columnar import StepArrays
    from libra.trace.records import Trajectory, Turn

    rng = np.random.default_rng(0)
    trajs = []
    for i in range(205):
        err = i % 41 == 0
        first = Turn(int(rng.integers(300, 400)), "bash", 1.0, 100, "error" if err else "ok")
        rest = (Turn(9000, "bash", 1.0, 100, "error"), Turn(9500, None)) if err else (Turn(int(rng.integers(1000, 1400)), None),)
        trajs.append(Trajectory(f"t{i}", 0, 500, (first, *rest), f"g{i}", 0.0, "stop"))
    return [StepArrays.from_trajectories(0, trajs)]


def test_a_rare_states_signal_is_shrunk_not_discarded() -> None:
    """Issue 22 (b): 5 error returns (fewer than min_samples=16), every one of which outgrew 8,000
    tokens. The old back-off dropped them for the pooled samples and answered P(outgrow) ~ 0.02;
    shrunk towards the pooled estimate with 4 pseudo-samples it is (5 + 4 p) / 9 > 0.5, so C-MLFQ
    promotes the tail at the error's return, and an ``ok`` return stays below."""
    m = RemainingWorkModel.fit(_rare_tail_history())
    p_err = m.p_exceeds("error", 1, 960, 8000)
    p_ok = m.p_exceeds("ok", 1, 960, 8000)
    assert p_err > 0.5 > 0.1 > p_ok, (p_err, p_ok)
    assert m.remaining("error", 1, 960) > 5 * m.remaining("ok", 1, 960)
