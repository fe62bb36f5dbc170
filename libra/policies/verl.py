"""verl's two configurations, as static baselines (``libra.policies.static.StaticPolicy``).

Each runs its best honest loop within the staleness class K the user allows
(``PolicyOptions.max_staleness``; ``--max-staleness``), like Libra:

* ``verl-colocated``: verl's hybrid engine. Every GPU runs rollout (uniform TP, least-loaded
  routing), then every GPU trains; it pays both stage switches (engine sleep/wake, trainer
  offload/onload at the measured host-copy rates) and the CUDA-IPC weight hand-over, priced by
  ``StepCosts`` like every other plan. Synchronous in every class (rollout and training share
  every GPU: nothing can overlap).
* ``verl-static-uniform``: a fixed split of the cluster between rollout (uniform TP instances,
  least-loaded routing) and training; synchronous with K = 0, and with K >= 1 also priced with
  verl's one-step-off asynchronous loop (staleness 1), the faster estimate winning.

Both choose once, from the first step's prompts and the length prior (``libra.policies.prior``),
unless pinned (``split``, ``rollout_tp``, ``train_*``, ``micro_batch``). Where the backend can
replay (``libra-sim``: ``PolicyOptions.hindsight``), ``verl-colocated`` takes its best rollout TP
instead: every valid TP replayed over the trace (``libra.policies.areal.HindsightStaticPolicy``),
so Libra is measured against verl tuned, not against a prior's guess (issue 22). ``libra-run``
has no replayer and keeps the prior's choice.
"""

from __future__ import annotations

from typing import Any

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policies.options import PolicyOptions, options_for
from libra.policies.static import StaticPolicy


def verl_colocated(cluster: ClusterSpec, options: PolicyOptions | None = None, **kwargs: Any) -> StaticPolicy:
    """verl hybrid engine: all GPUs roll out, then all train (offload/reload in between)."""
    o = options_for("verl-colocated", options, **kwargs)
    if o.split is not None:
        raise UserError("verl-colocated uses every GPU for both stages; --split does not apply")
    if o.hindsight is not None and o.rollout_tp is None:
        # its best honest configuration: the rollout TP a user would tune, found by replaying each
        # valid TP over the trace (issue 22: against the prior's TP, Libra's 1.16x on one trace
        # was 1.03x against verl at its best TP)
        from libra.policies.areal import HindsightStaticPolicy

        return HindsightStaticPolicy("verl-colocated", cluster, o, o.hindsight, modes=("sync",), staleness=0, colocated=True)
    return StaticPolicy("verl-colocated", cluster, o, colocated=True, modes=("sync",), staleness=0)


def verl_static_uniform(cluster: ClusterSpec, options: PolicyOptions | None = None, **kwargs: Any) -> StaticPolicy:
    """A fixed rollout/training split with uniform TP, least-loaded routing: synchronous, or with
    K >= 1 verl's one-step-off async (staleness 1) when its estimate is faster."""
    o = options_for("verl-static-uniform", options, **kwargs)
    k = max(0, o.staleness_class)
    modes = (o.mode,) if o.mode else (("sync", "async") if k >= 1 else ("sync",))
    return StaticPolicy("verl-static-uniform", cluster, o, colocated=False, modes=modes,
                        staleness=int(o.staleness or 1) if k >= 1 else 0)
