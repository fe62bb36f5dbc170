"""Every policy ``libra-sim replay --policy`` knows: the simulator's baselines and the policy
core's (``libra.policies.POLICIES``: Libra and its ablations), by name.

Factories have one shape, ``(cluster: ClusterSpec, **opts) -> Policy``. Options a factory does
not take are dropped for it (unless it accepts ``**opts``), so the CLI can pass one option set
to every policy in ``--compare``.
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


def resolve(name: str, cluster: ClusterSpec, **opts: Any) -> Policy:
    """The policy ``name`` built for ``cluster`` (``UserError`` listing the names if unknown)."""
    f = factories()
    if name not in f:
        raise UserError(f"unknown policy {name!r}; known: {', '.join(f)}")
    return f[name](cluster, **_accepted(f[name], opts))
