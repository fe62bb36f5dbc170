"""C-MLFQ: a causal multi-level feedback queue over heterogeneous-TP buckets.

Buckets are the plan's instance groups, ordered by context range (and TP, non-decreasing).
Every trajectory starts in the shortest bucket whose range holds its prompt. At each tool return
it is routed by causal signals only (the tool's outcome, turns so far, context so far) and by
what past steps showed about remaining work from such a state (``RemainingWorkModel``):

1. **Floor**: the smallest bucket whose range still holds the current context (a trajectory that
   outgrew its bucket must leave it: that bucket's instances were sized for shorter contexts).
2. **Promotion**: from there, the first bucket ``b`` (never below the current one: no demotion,
   the KV is already where it is) with ``P(final >= max_context_b | state) <= threshold``, i.e.
   the first bucket the trajectory is unlikely to outgrow. The last bucket is unbounded. An error
   return whose history says "errors run long" is promoted early; an ``ok`` at the same context
   may stay.
3. **Migration timing**: a move decided at a call's start migrates the KV (``Route.migrate=True``)
   while the tool runs; the simulator asks again at the tool's return (outcome and output known,
   issue 22), where a move's migration is exposed in full.
   When the migration (``kv_migration_s`` of the current context, cross-node unless the plan has
   one node) would outlast the tool's expected latency (median of past steps) plus ``margin_s``,
   the move is skipped unless the expected gain is large: the remaining tokens (model's
   expectation) times the per-token decode time saved at batch 1 must exceed ``gain_factor``
   times the migration's exposed part. A floor move (outgrown bucket) is never skipped.

Parameters: ``threshold`` (0.5: promote once outgrowing is no longer the minority outcome),
``margin_s`` (0.5 s), ``gain_factor`` (2.0); learned: the per-state final-length distributions
and tool latencies, refitted on the recent completed steps before each step.

Instance choice is work-conserving (``libra.scheduling.base.place``/``steal``): the bucket
C-MLFQ routes to is the shortest a trajectory may run in; it runs on an instance of that bucket
or a longer one with room, and idle instances pull queued work. The bucket counts (``live``)
are per routing bucket, whichever instance runs the trajectory.
"""

from __future__ import annotations

from libra.planner.costs import CostModel, DecodeTable, nvlink_domain
from libra.planner.plan import Plan
from libra.scheduling.base import Route, TrajectoryObservation, WorkConserving
from libra.scheduling.history_model import RemainingWorkModel


def floor_bucket(plan: Plan, context: int) -> int:
    """The smallest bucket whose context range still holds ``context``."""
    for b in plan.buckets:
        if b.max_context is None or context < b.max_context:
            return b.index
    return plan.buckets[-1].index


class CMLFQScheduler(WorkConserving):
    """The C-MLFQ router for one step (see the module docstring).

    Built from the plan and a model fitted on completed steps; it has no access to the step it
    routes beyond the observations handed to it.
    """

    migrate_moves: bool = True

    def __init__(
        self,
        plan: Plan,
        model: RemainingWorkModel,
        ev: CostModel | None = None,
        table: DecodeTable | None = None,
        threshold: float = 0.5,
        margin_s: float = 0.5,
        gain_factor: float = 2.0,
    ) -> None:
        if not plan.buckets:
            raise ValueError("C-MLFQ needs a plan with at least one bucket")
        self.plan = plan
        self.model = model
        self.ev = ev
        self.table = table
        self.threshold = threshold
        self.margin_s = margin_s
        self.gain_factor = gain_factor
        # KV moves over NVLink when every instance shares one NVLink domain (a node, or a GB200
        # NVL72 rack whose 4-GPU trays the instances may sit on)
        gpu = getattr(ev, "gpu", None)
        gpn = getattr(gpu, "gpus_per_node", None)
        if isinstance(gpn, int) and gpn > 0:
            dom = nvlink_domain(gpu, gpn)
            self.single_node = len({(i.node * gpn + i.first_gpu) // dom for i in plan.instances}) <= 1
        else:
            self.single_node = len({i.node for i in plan.instances}) <= 1
        self.slots = {b.index: self._slots(b.index) for b in plan.buckets}
        self.live = {b.index: 0 for b in plan.buckets}
        self.moves = 0
        self.skipped = 0
        self.finished = 0

    def _slots(self, bucket: int) -> float:
        """Sequences a bucket runs at once: per instance ``min(max_running_seqs, KV capacity /
        a representative context of the bucket's range)``; GPUs as a proxy without a table."""
        insts = self.plan.instances_in(bucket)
        if self.table is None:
            return float(max(1, sum(i.tp for i in insts)))
        b = self.plan.buckets[bucket]
        rep = (b.min_context + b.max_context) / 2 if b.max_context is not None else max(1.5 * b.min_context, 4096.0)
        return float(max(1, sum(min(self.table.max_seqs.get(i.tp, 1), int(self.table.kv_capacity.get(i.tp, 0) // max(rep, 1.0))) for i in insts)))

    def _pressure(self, bucket: int, extra: int = 0) -> float:
        return (self.live[bucket] + extra) / self.slots[bucket]

    # ---- decisions -----------------------------------------------------------------------------
    def admit(self, obs: TrajectoryObservation) -> int:
        b = floor_bucket(self.plan, obs.context_tokens)
        self.live[b] += 1
        return b

    def target(self, obs: TrajectoryObservation) -> int:
        """Where the rule (floor, then promotion) sends a trajectory, ignoring migration cost."""
        cur = obs.bucket if obs.bucket is not None else 0
        b = max(floor_bucket(self.plan, obs.context_tokens), cur)
        last = self.plan.buckets[-1].index
        while b < last:
            p = self.model.p_exceeds(
                obs.last_outcome, obs.turns_done, obs.context_tokens, self.plan.buckets[b].max_context, obs.at_call_start
            )
            if p <= self.threshold:
                break
            b += 1
        return b

    def migration_s(self, obs: TrajectoryObservation, dst: int) -> float:
        """Predicted time to move the trajectory's KV to bucket ``dst``."""
        if self.ev is None:
            return 0.0
        src_tp = self.plan.buckets[obs.bucket].tp if obs.bucket is not None else self.plan.buckets[0].tp
        return float(self.ev.kv_migration_s(obs.context_tokens, src_tp, self.plan.buckets[dst].tp, self.single_node))

    def gain_s(self, obs: TrajectoryObservation, dst: int) -> float:
        """Expected decode time saved by finishing in ``dst`` instead of the current bucket."""
        if self.table is None or obs.bucket is None:
            return 0.0
        t_src, t_dst = self.plan.buckets[obs.bucket].tp, self.plan.buckets[dst].tp
        if t_src not in self.table.base or t_dst not in self.table.base:
            return 0.0
        c = obs.context_tokens

        def per_token(t: int) -> float:
            return float(self.table.base[t][0] + self.table.slope[t][0] * c)

        return self.model.remaining(obs.last_outcome, obs.turns_done, c, obs.at_call_start) * (per_token(t_src) - per_token(t_dst))

    def on_tool_return(self, obs: TrajectoryObservation) -> Route:
        cur = obs.bucket if obs.bucket is not None else 0
        dst = self.target(obs)
        if dst == cur:
            return Route(cur, False)
        outgrown = floor_bucket(self.plan, obs.context_tokens) > cur
        if not outgrown:
            # an early promotion must not overload its destination: it still has free slots
            # after the move, or it is less loaded than the bucket the trajectory leaves
            if self._pressure(dst, 1) > max(1.0, self._pressure(cur)):
                self.skipped += 1
                return Route(cur, False)
            # at a call's start the move overlaps the tool; at its return nothing hides it
            hidden = self.model.expected_tool_latency(obs.last_tool) + self.margin_s if obs.at_call_start else 0.0
            exposed = self.migration_s(obs, dst) - hidden
            if exposed > 0 and self.gain_s(obs, dst) < self.gain_factor * exposed:
                self.skipped += 1
                return Route(cur, False)
        self.moves += 1
        self.live[cur] = max(0, self.live[cur] - 1)
        self.live[dst] += 1
        return Route(dst, self.migrate_moves)

    def on_finish(self, obs: TrajectoryObservation) -> None:
        self.finished += 1
        if obs.bucket is not None and obs.bucket in self.live:
            self.live[obs.bucket] = max(0, self.live[obs.bucket] - 1)


class NoMigrationScheduler(CMLFQScheduler):
    """Ablation ``no-migration``: the same routing decisions, but a move does not carry the KV;
    the destination re-prefills the whole context (what systems without KV transfer do)."""

    migrate_moves = False
