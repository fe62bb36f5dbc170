"""``PolicyOptions``: the one set of options every policy factory takes.

Why one type: the simulator and the runtime used to speak two vocabularies (``costs`` vs ``ev``,
``staleness`` vs ``max_staleness``) and a translation layer chose, per factory, which of its
options to pass on, so an option could be silently dropped or misspelt. Now every factory
(Libra, its ablations and every baseline) takes a ``PolicyOptions`` and each reads the fields
that concern it; a field that does not concern a policy is ignored by it, an unknown name is a
``UserError`` listing the known ones (``options_for``).

Fields (all optional):

* shared: ``ev`` (a cost evaluator to share, ``cost_models.CostEvaluator``; built from the
  cluster otherwise), ``seed``, ``kl`` (a reference-model forward: a KL term), ``max_staleness``
  (K, the staleness class the RL algorithm tolerates; every policy picks its loop within it),
  ``mode`` ("sync"/"async": pins the loop), ``staleness`` (the async bound to run with, at most
  K), ``streaming`` (pins streaming in sync mode), ``mini_batches`` (optimizer steps per RL
  step);
* Libra's planner and routers: ``replan`` ("every-step"/"drift"), ``drift_threshold``, ``join``
  ("nonblocking"/"sync"), ``lp_sigma`` (length-predictor noise), ``window`` (history steps the
  planner pools);
* the static baselines' pins (None: the baseline chooses): ``split`` (rollout, train GPUs),
  ``rollout_tp``, ``train_tp``, ``train_pp``, ``train_ep``, ``micro_batch``;
* a backend's what-if capability: ``hindsight``, a ``HindsightReplayer`` over the whole trace
  (only the simulator can offer one; ``areal-static-optimal`` needs it);
* a user's pin of every plan: ``pin``, a ``libra.policies.pinned.PlanPin`` (split and/or bucket
  bounds, ``libra-run --split/--bucket-bounds``), applied by the registry's ``resolve`` around
  any policy (``pinned``), so the plan the policy returns is the pinned one every backend runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from libra.errors import UserError

if TYPE_CHECKING:
    from libra.planner.costs import CostModel
    from libra.policies.hindsight import HindsightReplayer
    from libra.policies.pinned import PlanPin

#: The modes a loop may be pinned to.
MODES: tuple[str, ...] = ("sync", "async")


@dataclass(frozen=True)
class PolicyOptions:
    """Options of a policy (see the module docstring for each field)."""

    ev: CostModel | None = field(default=None, compare=False, repr=False)
    seed: int = 0
    kl: bool = False
    max_staleness: int | None = None
    mode: str | None = None
    staleness: int | None = None
    streaming: bool | None = None
    mini_batches: int = 4
    replan: str = "every-step"
    drift_threshold: float = 0.15
    join: str = "nonblocking"
    lp_sigma: float = 0.5
    window: int = 3
    run_steps: int | None = None  # the RL run's length in steps, when known (Libra amortizes the async pipeline's fill over it)
    continuous: bool = True  # async generates continuously across steps (the backend's loop: SimConfig.continuous); False in libra-run
    tool_kv: str = "keep"  # the engines keep a trajectory's KV during its tool calls (evictable) or release it (SimConfig.kv_mode)
    split: tuple[int, int] | None = None
    rollout_tp: int | None = None
    train_tp: int | None = None
    train_pp: int | None = None
    train_ep: int | None = None
    micro_batch: int | None = None
    hindsight: HindsightReplayer | None = field(default=None, compare=False, repr=False)
    pin: PlanPin | None = None

    @property
    def staleness_class(self) -> int:
        """K: ``max_staleness``; without it, with ``mode="async"``, ``staleness`` (default 1);
        else 0 (on-policy). The same rule as the simulator's ``SimConfig.staleness_class``."""
        if self.max_staleness is not None:
            return int(self.max_staleness)
        if self.mode == "async":
            return int(self.staleness) if self.staleness is not None else 1
        return 0

    @property
    def pinned_training(self) -> bool:
        """Whether any training-shape pin is set (the baselines then search every fitting leaf)."""
        return any(v is not None for v in (self.train_tp, self.train_pp, self.train_ep, self.micro_batch))


#: Every option name ``PolicyOptions`` knows, in declaration order.
OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PolicyOptions))

_INT = ("seed", "mini_batches", "window", "max_staleness", "staleness", "rollout_tp", "train_tp", "train_pp", "train_ep", "micro_batch")
_FLOAT = ("drift_threshold", "lp_sigma")


def options_for(name: str, options: PolicyOptions | None = None, **kwargs: Any) -> PolicyOptions:
    """``options`` (default: every default) with ``kwargs`` applied, checked, for the policy ``name``.

    A keyword whose value is None leaves the field as it is (callers pass "not set" as None).
    Unknown names and a mode other than sync/async are ``UserError``s naming the policy and the
    known names; numbers are coerced (``kl=0.5``, a KL coefficient, means a KL term)."""
    base = options if options is not None else PolicyOptions()
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        raise UserError(f"policy {name}: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    given: dict[str, Any] = {k: v for k, v in kwargs.items() if v is not None}
    out = dataclasses.replace(base, **given) if given else base
    if out.mode not in (None, *MODES):
        raise UserError(f"policy {name}: mode must be 'sync' or 'async', got {out.mode!r}")
    fixes: dict[str, Any] = {}
    for k in _INT:
        v = getattr(out, k)
        if v is not None and not isinstance(v, int):
            fixes[k] = int(v)
    for k in _FLOAT:
        v = getattr(out, k)
        if not isinstance(v, float):
            fixes[k] = float(v)
    if not isinstance(out.kl, bool):
        fixes["kl"] = bool(out.kl)
    if out.split is not None and not isinstance(out.split, tuple):
        fixes["split"] = tuple(out.split)
    return dataclasses.replace(out, **fixes) if fixes else out
