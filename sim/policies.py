"""Every policy ``libra-sim replay --policy`` knows: the simulator's baselines and the policy
core's (``libra.policies.POLICIES``: Libra and its ablations), by name.

Factories have one shape, ``(cluster: ClusterSpec, **opts) -> Policy``. ``resolve`` takes the
simulator's option names (``costs``, ``seed``, ``kl``, ``max_staleness`` (the staleness class K),
``staleness``, ``mode``, ``streaming``, ``mini_batches``, ``sim_config``, ``trace_steps`` and the
baseline pins) and hands each factory the ones it understands: the core policies get ``ev`` (the
shared evaluator), ``seed``, ``kl``, ``max_staleness`` (K), ``mode``, ``streaming`` and
``mini_batches``; the pins (``split``, ``rollout_tp``...) configure the baselines only.

Every policy runs within the staleness class K; ``min_staleness(name)`` is the smallest K a
policy runs in at all (``areal-static-optimal`` is asynchronous by design: 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policy import Policy
from sim.baselines import BASELINES

Factory = Callable[..., Policy]


#: Options only the baselines take (fixed-configuration pins).
PIN_OPTIONS = ("split", "rollout_tp", "train_tp", "train_pp", "train_ep", "micro_batch")


def _core() -> dict[str, Factory]:
    try:
        from libra.policies import POLICIES  # type: ignore[import-not-found]
    except ModuleNotFoundError as exc:
        if exc.name == "libra.policies":
            return {}
        raise
    return dict(POLICIES)


def factories() -> dict[str, Factory]:
    """Name -> factory, baselines first (a core policy of the same name would win: it is the
    reference implementation)."""
    out: dict[str, Factory] = dict(BASELINES)
    out.update(_core())
    return out


def policy_names() -> tuple[str, ...]:
    """Every known policy name, baselines first, in a stable order."""
    return tuple(factories())


POLICY_NAMES: tuple[str, ...] = policy_names()


def _accepted(fn: Factory, opts: dict[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return opts
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return opts
    return {k: v for k, v in opts.items() if k in params}


def _core_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """The simulator's options in the policy core's names (see the module docstring)."""
    out: dict[str, Any] = {}
    if opts.get("costs") is not None:
        out["ev"] = opts["costs"].ev
    for k in ("seed", "kl"):
        if opts.get(k) is not None:
            out[k] = opts[k]
    if opts.get("max_staleness") is not None:
        out["max_staleness"] = int(opts["max_staleness"])
    elif opts.get("staleness") is not None:  # callers written before the class existed
        out["max_staleness"] = opts["staleness"]
    for k in ("mode", "streaming", "mini_batches"):
        if opts.get(k) is not None:
            out[k] = opts[k]
    try:
        from libra.policies import OPTIONS  # type: ignore[import-not-found]

        out = {k: v for k, v in out.items() if k in OPTIONS}
    except ImportError:
        pass
    return out


def min_staleness(name: str) -> int:
    """The smallest staleness class K the policy ``name`` runs in (0 for every policy that can
    run on-policy; a baseline asynchronous by design says more)."""
    from sim.baselines import MIN_STALENESS

    return int(MIN_STALENESS.get(name, 0))


def resolve(name: str, cluster: ClusterSpec, **opts: Any) -> Policy:
    """The policy ``name`` built for ``cluster`` (``UserError`` listing the names if unknown)."""
    f = factories()
    if name not in f:
        raise UserError(f"unknown policy {name!r}; known: {', '.join(f)}")
    if name in BASELINES and f[name] is BASELINES[name]:
        return f[name](cluster, **_accepted(f[name], opts))
    return f[name](cluster, **_core_opts(opts))
