"""Which tool calls the simulator routes: the same ones ``libra-run`` routes.

A real executor routes every call as it starts except the one it knows is the last: the call
budget's (``max_tool_calls``; the trace's finish ``tool_limit``). A call whose output then pushes
the context past its limit (finish ``length``) is known to be the last only when it returns, so
``libra-run`` routes it (and carries a move out). The simulator used to skip routing every
trailing call, reading the trace's hindsight; the recorded ``libra-run`` step of
``tests/runtime/test_decisions_match.py`` showed 9 routing decisions against the replay's 4.
"""

from __future__ import annotations

from libra.cluster import ClusterSpec
from libra.scheduling.recorder import DecisionLog, recorded
from libra.trace.columnar import StepArrays
from libra.trace.records import Trajectory, Turn
from sim.loop import SimConfig, Simulator
from test_sim_support import FixedPolicy, fake_costs, simple_plan


def _step() -> StepArrays:
    trajs = [
        # ends by length as its second call returns: that call is routed (a move: turns_done 2 is
        # even, so OneBucketRouter(migrate_to=1) stays; the first call, turns_done 1, moves)
        Trajectory("len", 0, 100, (Turn(50, "bash", 0.5, 30, "ok"), Turn(40, "bash", 0.5, 900, "ok")), "g0", 0.0, "length"),
        # its first call's output passes the limit: the only call, routed (and moved to bucket 1)
        Trajectory("len1", 0, 100, (Turn(60, "bash", 0.5, 900, "error"),), "g0", 0.0, "length"),
        # the call budget's last call: not routed (it is known to be the last as it starts)
        Trajectory("lim", 0, 120, (Turn(30, "bash", 0.4, 20, "ok"), Turn(35, "bash", 0.4, 25, "ok")), "g1", 0.0, "tool_limit"),
        Trajectory("stop", 0, 90, (Turn(20, "bash", 0.3, 10, "ok"), Turn(15, None)), "g1", 1.0, "stop"),
    ]
    return StepArrays.from_trajectories(0, trajs)


def test_only_the_call_budgets_last_call_goes_unrouted() -> None:
    step = _step()
    log = DecisionLog()
    policy = recorded(FixedPolicy(simple_plan(2, 2, two_buckets=True), migrate_to=1), log)
    res = Simulator([step], policy, ClusterSpec(16, "fake", "fake"), fake_costs(), SimConfig(noise_sigma=0.0)).run()
    routed = sorted(log.routes())
    # (id, turns done, at the call's start): every routed call at its start, and again at its
    # return when the trajectory continues (issue 22: outcome and output known then)
    assert routed == [("len", 1, False), ("len", 1, True), ("len", 2, True), ("len1", 1, True), ("lim", 1, False),
                      ("lim", 1, True), ("stop", 1, False), ("stop", 1, True)]
    # the moves of calls after which the trajectory ended were carried out (KV migrated) and
    # every trajectory still finished once, with its whole context
    m = res.steps[0]
    assert m.completed == m.n_traj == 4 and m.migrations >= 2
    fin = {d.obs.traj_id: d.obs for d in log.of("on_finish")}
    assert sorted(fin) == ["len", "len1", "lim", "stop"]
    assert fin["len"].context_tokens == 100 + 50 + 30 + 40 + 900 and fin["len"].last_outcome == "ok"
    assert fin["len1"].context_tokens == 100 + 60 + 900 and fin["len1"].last_tool == "bash" and fin["len1"].last_outcome == "error"
    assert fin["lim"].context_tokens == 120 + 30 + 20 + 35 + 25
    assert m.gen_tokens == int(step.total_gen_tokens.sum())
