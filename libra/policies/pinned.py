"""A policy whose plans carry a user's pin of the device split and/or the bucket bounds.

Why a wrapper in the core: ``libra-run --split R:T --bucket-bounds [B]`` used to adjust each
plan after ``Policy.plan`` returned it, in the runtime. The plan a backend executed was then not
the plan the policy returned: the decision recorder (``libra.scheduling.recorder``) logged one
plan and the run executed another, and the fidelity replay (``libra-sim replay`` of the run's
trace) replayed the unpinned policy, so ``fidelity.csv`` compared two different plans. Now the
pin is part of the policy: ``pinned(policy, split, bounds, per_node).plan(...)`` returns the
pinned plan, which is the plan every backend records, routes with and executes. The registry
applies it from ``PolicyOptions.pin`` (``resolve``), so ``libra-run`` and ``libra-sim replay``
(``--plan-split``/``--bucket-bounds``) build the same pinned policy.

What a pin does (``pin_plan``): a split gives the rollout side ``R`` TP-1 instances (node
``i // per_node``) in one bucket and a DP-``T`` trainer (TP 1, PP 1) on the rest, not colocated;
bucket bounds cut the instances' context range at the given lengths, dealing the instances to
the buckets round-robin by (TP, id); a layout (``parse_layout``, ``--layout 8x1@2048,1x8``)
sets every bucket's instances, TP and bound (heterogeneous layouts too), on the split's rollout
devices or, for a time-shared plan, on all of them. The loop (``mode``, ``streaming``) stays the policy's. The
predictions stay those of the plan the policy chose (the pinned shape is not re-priced), and the
plan says so in ``notes["pinned"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.planner.plan import Bucket, Plan, RolloutInstance
from libra.policy_wrapper import PolicyWrapper
from libra.trace.columnar import StepArrays


@dataclass(frozen=True)
class PlanPin:
    """What a user pinned: ``split`` (rollout, train devices), ``bucket_bounds`` (increasing
    context lengths), ``per_node`` (devices per node, to place the split's instances)."""

    split: tuple[int, int] | None = None
    bucket_bounds: tuple[int, ...] | None = None
    per_node: int = 1
    #: forced rollout layout (``parse_layout``): per bucket, shortest first, (instances, TP, upper
    #: context bound; None for the last, unbounded one)
    layout: tuple[tuple[int, int, int | None], ...] | None = None

    def __post_init__(self) -> None:
        if self.split is not None:
            r, t = self.split
            if r < 1 or t < 1:
                raise UserError(f"pinned split {r}:{t}: both sides must be >= 1")
        if self.bucket_bounds is not None:
            b = list(self.bucket_bounds)
            if not all(isinstance(x, int) and x > 0 for x in b) or b != sorted(set(b)):
                raise UserError(f"pinned bucket bounds {b}: must be increasing positive context lengths")
        if self.per_node < 1:
            raise UserError(f"pinned plan: devices per node must be >= 1, got {self.per_node}")
        if self.layout is not None:
            if self.bucket_bounds:
                raise UserError("pinned plan: a layout carries its own bucket bounds; give --layout or --bucket-bounds, not both")
            if self.split is not None and self.split[0] != layout_gpus(self.layout):
                raise UserError(f"pinned layout {layout_text(self.layout)} uses {layout_gpus(self.layout)} rollout devices; "
                                f"the pinned split gives the rollout {self.split[0]}")
            for n, tp, _b in self.layout:
                if tp > self.per_node:
                    raise UserError(f"pinned layout {layout_text(self.layout)}: a TP-{tp} instance does not fit a node of {self.per_node} devices")

    @property
    def empty(self) -> bool:
        """Nothing pinned (the policy's plans stand as they are)."""
        return self.split is None and not self.bucket_bounds and not self.layout

    def text(self) -> str:
        """How the log and ``Plan.notes["pinned"]`` name the pin, e.g. ``split 2:1, bucket bounds [26]``."""
        parts = []
        if self.split is not None:
            parts.append(f"split {self.split[0]}:{self.split[1]}")
        if self.bucket_bounds:
            parts.append(f"bucket bounds {list(self.bucket_bounds)}")
        if self.layout:
            parts.append(f"layout {layout_text(self.layout)}")
        return ", ".join(parts)


def layout_gpus(layout: Sequence[tuple[int, int, int | None]]) -> int:
    """Devices a layout's instances use."""
    return sum(n * tp for n, tp, _b in layout)


def layout_text(layout: Sequence[tuple[int, int, int | None]]) -> str:
    """``((8, 1, 2048), (1, 8, None))`` -> ``8x1@2048,1x8``."""
    return ",".join(f"{n}x{tp}" + (f"@{b}" if b is not None else "") for n, tp, b in layout)


def parse_layout(text: str, flag: str = "--layout") -> tuple[tuple[int, int, int | None], ...]:
    """``NxTP[@BOUND],...`` -> per bucket (instances, TP, bound), shortest first. Each item is one
    bucket: N instances of TP ``TP`` serving contexts below ``BOUND``; exactly one item has no
    bound (the last, unbounded bucket). ``1x8,8x1@2048``: eight TP-1 instances for contexts
    below 2,048 tokens, one TP-8 instance for the rest. Order does not matter."""
    items: list[tuple[int, int, int | None]] = []
    for raw in str(text).split(","):
        part = raw.strip()
        if not part:
            continue
        head, _, bound = part.partition("@")
        n_s, x, tp_s = head.lower().partition("x")
        try:
            n, tp = int(n_s), int(tp_s)
            b = int(bound) if bound else None
        except ValueError:
            raise UserError(f"{flag} {text!r}: item {part!r} must be COUNTxTP or COUNTxTP@BOUND, e.g. 8x1@2048") from None
        if not x or n < 1 or tp < 1 or tp & (tp - 1) or (b is not None and b < 1):
            raise UserError(f"{flag} {text!r}: item {part!r} needs COUNT >= 1, TP a power of two, BOUND >= 1")
        items.append((n, tp, b))
    if not items:
        raise UserError(f"{flag} {text!r}: empty; expected e.g. 8x1@2048,1x8")
    unbounded = [it for it in items if it[2] is None]
    if len(unbounded) != 1:
        raise UserError(f"{flag} {text!r}: exactly one bucket must have no @BOUND (the longest), got {len(unbounded)}")
    bounded = sorted(it for it in items if it[2] is not None)
    bounds = [it[2] for it in bounded]
    if len(set(bounds)) != len(bounds):
        raise UserError(f"{flag} {text!r}: two buckets share a bound")
    return (*sorted(bounded, key=lambda it: it[2]), unbounded[0])  # type: ignore[arg-type, return-value]


def _layout_instances(layout: Sequence[tuple[int, int, int | None]], per_node: int) -> tuple[RolloutInstance, ...]:
    """The layout's instances, ids in bucket order, packed onto nodes largest TP first so that no
    instance straddles a node (TPs are powers of two no larger than a node)."""
    want = [(b, tp) for b, (n, tp, _bd) in enumerate(layout) for _ in range(n)]
    order = sorted(range(len(want)), key=lambda k: (-want[k][1], k))
    placed: dict[int, tuple[int, int]] = {}
    node, used = 0, 0
    for k in order:
        tp = want[k][1]
        if used + tp > per_node:
            node, used = node + 1, 0
        placed[k] = (node, used)
        used += tp
    return tuple(RolloutInstance(k, want[k][1], want[k][0], *placed[k]) for k in range(len(want)))


def pin_plan(plan: Plan, pin: PlanPin) -> Plan:
    """``plan`` with ``pin`` applied (see the module docstring); ``plan`` itself when nothing is pinned."""
    if pin.empty:
        return plan
    if pin.split is not None:
        r, t = pin.split
        per_node = pin.per_node
        insts = tuple(RolloutInstance(i, 1, 0, i // per_node, i % per_node) for i in range(r))
        plan = replace(plan, n_rollout_gpus=r, n_train_gpus=t, instances=insts, colocated=False,
                       buckets=(Bucket(0, 1, 0, None),), train=replace(plan.train, tp=1, pp=1, dp=t))
    if pin.layout:
        lay = pin.layout
        insts = _layout_instances(lay, pin.per_node)
        edges: list[int | None] = [0, *(b for _n, _tp, b in lay)]
        buckets = tuple(Bucket(k, tp, edges[k], edges[k + 1]) for k, (_n, tp, _b) in enumerate(lay))  # type: ignore[arg-type]
        r = layout_gpus(lay)
        if pin.split is not None or not plan.colocated:
            if not plan.colocated and pin.split is None and r != plan.n_rollout_gpus:
                raise UserError(f"pinned layout {layout_text(lay)} uses {r} rollout devices, the policy's plan has a separate "
                                f"trainer next to {plan.n_rollout_gpus}; add --plan-split {r}:T to pin the split too")
            plan = replace(plan, n_rollout_gpus=r, instances=insts, buckets=buckets)
        else:
            if r != plan.n_rollout_gpus:
                raise UserError(f"pinned layout {layout_text(lay)} uses {r} devices; the policy's time-shared plan runs its rollout "
                                f"on {plan.n_rollout_gpus} (use all of them, or add --plan-split {r}:T for a separate trainer)")
            plan = replace(plan, instances=insts, buckets=buckets)
    bounds = list(pin.bucket_bounds or ())
    if bounds:
        n_b = min(len(bounds) + 1, len(plan.instances))
        edges: list[int | None] = [0, *bounds[: n_b - 1], None]
        tps = sorted(i.tp for i in plan.instances)
        buckets = tuple(Bucket(b, tps[min(b, len(tps) - 1)], edges[b], edges[b + 1]) for b in range(n_b))  # type: ignore[arg-type]
        insts = tuple(replace(inst, bucket=k % n_b) for k, inst in enumerate(sorted(plan.instances, key=lambda i: (i.tp, i.id))))
        plan = replace(plan, buckets=buckets, instances=tuple(sorted(insts, key=lambda i: i.id)))
    return replace(plan, notes={**plan.notes, "pinned": pin.text()})


class PinnedPolicy(PolicyWrapper):
    """``inner`` with every plan pinned (``pin_plan``); the scheduler and the pool are the inner
    policy's, made for the pinned plan the backend hands back."""

    _own = ("inner", "pin")

    def __init__(self, inner: Any, pin: PlanPin) -> None:
        super().__init__(inner)
        self.pin = pin
        self._plan: Plan | None = None  # the last pinned plan (what ``libra.sim`` reads as the policy's plan notes)

    def plan(self, cluster: ClusterSpec, history: Sequence[StepArrays], prompt_tokens: np.ndarray) -> Plan:
        """The inner policy's plan with the pin applied; a split larger than the cluster is a ``UserError``."""
        if self.pin.split is not None and sum(self.pin.split) > cluster.n_gpus:
            raise UserError(f"pinned split {self.pin.split[0]}:{self.pin.split[1]} needs {sum(self.pin.split)} devices; "
                            f"the cluster has {cluster.n_gpus}")
        self._plan = pin_plan(self.inner.plan(cluster, history, prompt_tokens), self.pin)
        return self._plan


def pinned(policy: Any, split: tuple[int, int] | None, bounds: Sequence[int] | None, per_node: int,
           layout: Sequence[tuple[int, int, int | None]] | None = None) -> Any:
    """``policy`` whose ``plan()`` returns its plans pinned to ``split``, ``bounds`` and/or
    ``layout`` (``policy`` itself when all are None/empty): the one place a user's pin becomes
    part of the decision, for every backend."""
    pin = PlanPin(tuple(split) if split is not None else None, tuple(bounds) if bounds else None, per_node,  # type: ignore[arg-type]
                  tuple(layout) if layout else None)
    return pinned_by(policy, pin)


def pinned_by(policy: Any, pin: PlanPin | None) -> Any:
    """``policy`` wrapped with ``pin`` (``policy`` itself when ``pin`` is None or empty)."""
    if pin is None or pin.empty:
        return policy
    return PinnedPolicy(policy, pin)
