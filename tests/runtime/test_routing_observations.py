"""The runtime's routing observations follow the simulator's semantics (pure: no Ray, no torch).

A router, C-MLFQ's history model in particular, is fitted on traces and exercised in
``libra-sim replay``; the real executor must hand it the same signal at the same moments. The
reference is ``sim/rollout.py``: at a tool call's START, ``at_call_start`` is set, ``turns_done``
counts the turn that ends with the call, ``last_tool`` is the tool being called, ``last_outcome``
the PREVIOUS call's outcome (None before the first) and ``context_tokens`` excludes the call's
output; a trailing (tool-limit) call is not routed. Here one scripted trajectory runs through
``Episode`` and, as a trace record, through the simulator; their observations must be equal.
"""

from __future__ import annotations

from typing import Any

from libra.cluster import ClusterSpec
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.runtime.engines.base import TurnResult
from libra.runtime.episode import Episode
from libra.runtime.tasks import TaskSet
from libra.runtime.tools.base import ToolResult
from libra.scheduling.base import InstanceLoad, Route, TrajectoryObservation
from libra.trace.columnar import StepArrays

#: one turn per row: (generated tokens, tool called or None, outcome, tool output tokens)
SCRIPT: list[tuple[int, str | None, str | None, int]] = [
    (5, "python", "error", 7),
    (4, "search", "ok", 3),
    (6, None, None, 0),
]
PROMPT = 11


def _fields(o: TrajectoryObservation) -> tuple[Any, ...]:
    return (o.at_call_start, o.turns_done, o.last_tool, o.last_outcome, o.context_tokens, o.prompt_tokens)


class _Spy:
    """A one-bucket router that records what it is asked (stays put on every call)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, TrajectoryObservation]] = []

    def admit(self, obs: TrajectoryObservation) -> int:
        self.seen.append(("admit", obs))
        return 0

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        self.seen.append(("route", obs))
        return Route(0, False)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        self.seen.append(("finish", obs))

    def choose_instance(self, bucket: int, loads: list[InstanceLoad], obs: TrajectoryObservation | None = None) -> int:
        return loads[0].instance


def _run_episode(script: list[tuple[int, str | None, str | None, int]], max_tool_calls: int) -> tuple[Episode, _Spy]:
    """Drive ``Episode`` through ``script`` the way ``libra.runtime.rollout.Rollout.run`` does:
    admission, each generation, routing at a call's start unless it ends the trajectory, the
    tool's return, finish."""
    task = TaskSet({"math": 1}, seed=0).batch(0, 1)[0]
    ep = Episode("t0", 0, "g0", task, list(range(1, PROMPT + 1)), max_tool_calls=max_tool_calls, max_new_tokens=64, max_context=4096)
    spy = _Spy()
    spy.admit(ep.observation(0, None, None, 0.0))
    texts: dict[tuple[int, ...], str] = {}
    for k, (gen, tool, outcome, out_tokens) in enumerate(script):
        toks = tuple(1000 + 100 * k + j for j in range(gen))
        texts[toks] = f"<tool_call>{tool}\nx</tool_call>" if tool else "<answer>1</answer>"
        call = ep.on_generation(TurnResult("t0", toks, (0.0,) * gen, "stop", 0, 0, 0.0, 0.0), lambda t: texts[tuple(t)])
        if call is None:
            break
        assert call.name == tool
        if not ep.call_ends_trajectory:
            spy.on_tool_return(ep.observation(0, 0, 0, 0.0))
        ep.on_tool_result(ToolResult("y", outcome or "ok", 0.1), [7] * out_tokens, "y")
        if ep.done:
            break
        spy.on_tool_return(ep.observation(0, 0, 0, 0.0))  # routed again at the return (issue 22)
    assert ep.done
    spy.on_finish(ep.observation(0, 0, 0, 0.0))
    return ep, spy


class _OnePolicy:
    name = "spy-test"
    sees_future = False

    def __init__(self, spy: _Spy) -> None:
        self.spy = spy

    def plan(self, cluster: Any, history: Any, prompt_tokens: Any) -> Plan:
        return Plan(2, 6, TrainConfig(1, 1, 6), (RolloutInstance(0, 2, 0, 0, 0),), (Bucket(0, 2, 0, None),))

    def scheduler(self, plan: Plan, future: Any = None) -> _Spy:
        return self.spy

    def pool(self, plan: Plan) -> None:
        return None


def _simulate(ep: Episode) -> _Spy:
    """The same trajectory (its trace record) replayed by the simulator, routed by a spy."""
    from sim.costs import load_costs
    from sim.loop import SimConfig, Simulator

    spy = _Spy()
    cluster = ClusterSpec(8, "a800", "qwen3-8b", 8)
    step = StepArrays.from_trajectories(0, [ep.to_trajectory()])
    Simulator([step], _OnePolicy(spy), cluster, load_costs("a800", "qwen3-8b"), SimConfig(noise_sigma=0.0, mode="sync")).run()
    return spy


def test_call_start_observations_follow_the_simulator_rules() -> None:
    ep, spy = _run_episode(SCRIPT, max_tool_calls=4)
    kinds = [k for k, _ in spy.seen]
    assert kinds == ["admit", "route", "route", "route", "route", "finish"]
    admit, first, first_ret, second, second_ret, fin = (o for _, o in spy.seen)
    # at a return: the call's own outcome and the context with its output
    assert _fields(first_ret) == (False, 1, "python", "error", PROMPT + 5 + 7, PROMPT)
    assert _fields(second_ret) == (False, 2, "search", "ok", PROMPT + 5 + 7 + 4 + 3, PROMPT)
    assert _fields(admit) == (False, 0, None, None, PROMPT, PROMPT)
    # first call: the turn ending with it is counted, no previous outcome, context before the output
    assert _fields(first) == (True, 1, "python", None, PROMPT + 5, PROMPT)
    # second call: the previous call's outcome ("error"), not this call's ("ok", still unknown)
    assert _fields(second) == (True, 2, "search", "error", PROMPT + 5 + 7 + 4, PROMPT)
    # finish after a turn without a tool: all turns, no tool, the whole context
    assert _fields(fin) == (False, 3, None, None, PROMPT + 5 + 7 + 4 + 3 + 6, PROMPT)


def test_the_tool_limit_call_is_not_routed_and_finish_carries_its_outcome() -> None:
    ep, spy = _run_episode(SCRIPT[:2], max_tool_calls=2)
    assert ep.finish == "tool_limit"
    # the first call: routed at its start and at its return; the budget's last call: not at all
    assert [k for k, _ in spy.seen] == ["admit", "route", "route", "finish"]
    fin = spy.seen[-1][1]
    assert _fields(fin) == (False, 2, "search", "ok", PROMPT + 5 + 7 + 4 + 3, PROMPT)


def test_runtime_and_simulator_observations_are_equal() -> None:
    """Admission, every routed call start and the finish: field for field the simulator's."""
    for script, limit in ((SCRIPT, 4), (SCRIPT[:2], 2)):
        ep, runtime = _run_episode(script, max_tool_calls=limit)
        sim = _simulate(ep)
        assert [(k, _fields(o)) for k, o in runtime.seen] == [(k, _fields(o)) for k, o in sim.seen]
