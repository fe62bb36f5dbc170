"""Tool-time rebalancing: a trajectory starting a tool call may continue on a faster instance of
its own bucket, its KV moving there while the tool runs.

A trajectory stays on the instance it was admitted to for its whole life unless that instance
is full (``libra.scheduling.base.place``). Which instance it lands on is decided at admission,
when nothing is known of its length, so an instance that happens to draw several long
trajectories keeps a large batch long after the others drained, and every sequence on it
decodes at that batch's iteration time. Where the iteration time grows with the batch and the
context in flight (MoE experts touched, attention over long contexts), the step's makespan is
that unlucky instance's: on a generated math step on 44 B200 (Qwen3-30B-A3B, K = 2, one TP-1
bucket, noise off), one instance held 6-8 sequences while most held 2-4, and the step's rollout
took 128 s where the same trajectories on 48 instances took 99 s (SIMULATED). The planner cannot
price that luck, so a split the planner ranked equal to another lost 8% to it.

The rule: at a tool call's start (``TrajectoryObservation.at_call_start``), the router compares
one decode iteration on the trajectory's instance with one on each other started instance of the
same bucket that has room for its context, that instance's batch and context in flight grown by
the trajectory (``DecodeTable``: ``base + slope * context``, the coefficients the simulator and
the planner use). It moves when the best is at least ``REBALANCE_GAIN`` faster. The move is a KV
migration that overlaps the tool call (the simulator charges ``kv_migration_s``; the runtime
recomputes the context on the destination while the tool runs). Where the iteration time is flat
in the batch (dense models at small batches), nothing moves: on a converted ReAct log (Reflexion
HotpotQA, 28 GB200, Qwen3-14B, 3 TP-4 instances) a rule on sequence counts alone moved 68-301
trajectories a step for no gain; this rule moved 0-133 and the run's time was unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from libra.planner.costs import DecodeTable
from libra.planner.plan import Plan
from libra.scheduling.base import InstanceLoad, TrajectoryObservation

#: How much faster a decode iteration on another instance of the trajectory's bucket must be,
#: with the trajectory added there, than on its own instance, for it to move at a tool call's
#: start. Below that, the move is churn: the forecast iteration times are the model's, the batch
#: changes before the tool returns, and each move costs a KV transfer.
REBALANCE_GAIN = 0.2


def iteration_s(table: DecodeTable, tp: int, load: InstanceLoad, extra_tokens: int = 0) -> float:
    """One decode iteration on an instance of TP ``tp`` with ``load``'s running and queued
    sequences plus one (the trajectory placed there) and their context (plus ``extra_tokens``:
    the trajectory's own, when it is not there yet). KV held for sequences in a tool call counts
    as context in flight: they come back within the trajectory's next turns."""
    base, slope = table.base[tp], table.slope[tp]
    batch = min(len(base), max(1, load.running + load.queued + 1))
    return float(base[batch - 1] + slope[batch - 1] * (load.kv_tokens_used + load.queued_tokens + extra_tokens))


def rebalance_target(plan: Plan, table: DecodeTable, loads: Sequence[InstanceLoad], obs: TrajectoryObservation) -> int | None:
    """The instance a trajectory starting a tool call continues on: another started instance of
    its bucket with room for its context whose decode iteration, with it added, is at least
    ``REBALANCE_GAIN`` faster than its own instance's (the fastest such); None: it stays.
    Only at a call's start (the move then overlaps the tool), only within the bucket of the
    instance holding its KV, and only where the table prices that bucket's TP."""
    if not obs.at_call_start or obs.instance is None:
        return None
    cur = next((load for load in loads if load.instance == obs.instance), None)
    if cur is None or not 0 <= cur.bucket < len(plan.buckets):
        return None
    tp = plan.buckets[cur.bucket].tp
    if tp not in table.base:
        return None
    ctx = obs.context_tokens
    here = iteration_s(table, tp, cur)
    others = [o for o in loads if o.bucket == cur.bucket and o.started and o.instance != cur.instance and o.room(ctx) > 0]
    if not others:
        return None
    there, best = min((iteration_s(table, tp, o, ctx), o.instance) for o in others)
    return best if there <= here * (1.0 - REBALANCE_GAIN) else None
