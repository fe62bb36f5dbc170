"""The one registry of policies: every name ``libra-sim`` and ``libra-run`` accept, and what each
needs from the backend that runs it.

Why one: the baselines used to live in the simulator with their own registry, a second one
merged them with the core's, and the runtime reached into the simulator for a baseline name. Now
every policy (Libra, its ablations, every baseline) is an entry here, built by a factory of one
shape, ``(cluster, options: PolicyOptions | None = None, **kwargs) -> Policy``, and a backend
asks ``resolve`` for a name and ``check_backend`` whether it can run it at all.

Capabilities (``PolicyEntry.needs``): what a policy is handed beyond the observations every
backend reports. ``FUTURE``: the step's true future (``scheduler(plan, future=step)``, the
``hindsight-routing``'s placement, ``Policy.sees_future``); ``HINDSIGHT``: a
``HindsightReplayer`` over the whole trace (``PolicyOptions.hindsight``:
``areal-static-optimal``). The simulator offers both; ``libra-run`` offers neither, so it
refuses those policies when it reads its configuration, before Ray or any model starts.

Staleness (``PolicyEntry.min_staleness``): every policy runs within the class K the user
allows; this is the smallest K a policy runs in at all (``areal-static-optimal`` is asynchronous
by design: 1).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policies.areal import HINDSIGHT_NEEDED, MIN_STALENESS, NAME as AREAL, areal_static_optimal
from libra.policies.libra_policy import LIBRA_POLICIES
from libra.policies.options import PolicyOptions, options_for
from libra.policies.pinned import pinned_by
from libra.policies.verl import verl_colocated, verl_static_uniform
from libra.policy import Policy

Factory = Callable[..., Policy]

#: The policy handed the step's true future (hindsight routing on Libra's layout; formerly ``oracle``).
HINDSIGHT_ROUTING = "hindsight-routing"

#: The step's true future, handed to ``scheduler(plan, future=step)`` (``Policy.sees_future``).
FUTURE = "future"
#: A ``HindsightReplayer`` over the whole trace (``PolicyOptions.hindsight``).
HINDSIGHT = "hindsight"
#: Every capability a backend may offer.
CAPABILITIES: tuple[str, ...] = (FUTURE, HINDSIGHT)

_ORACLE_NEEDS = ("hindsight-routing needs the step's true future (it routes by the trajectories' final lengths: "
                 "hindsight placement, not a policy a real run can execute): only libra-sim replays a known trace; in libra-run use an honest "
                 "policy (libra, length-predictor for a learned length model)")


@dataclass(frozen=True)
class PolicyEntry:
    """One registered policy: its factory, family, smallest staleness class, what it needs from
    the backend and why (``refusal``: the one-line reason a backend without it gives)."""

    name: str
    factory: Factory
    family: str  # "baseline": what Libra is measured against; "libra": Libra and its ablations
    min_staleness: int = 0
    needs: frozenset[str] = frozenset()
    refusal: str = ""


def _entries() -> tuple[PolicyEntry, ...]:
    base = (
        PolicyEntry("verl-colocated", verl_colocated, "baseline"),
        PolicyEntry("verl-static-uniform", verl_static_uniform, "baseline"),
        PolicyEntry(AREAL, areal_static_optimal, "baseline", min_staleness=MIN_STALENESS, needs=frozenset({HINDSIGHT}),
                    refusal=HINDSIGHT_NEEDED),
    )
    core = tuple(
        PolicyEntry(name, make, "libra", needs=frozenset({FUTURE}) if name == HINDSIGHT_ROUTING else frozenset(),
                    refusal=_ORACLE_NEEDS if name == HINDSIGHT_ROUTING else "")
        for name, make in LIBRA_POLICIES.items()
    )
    return base + core


#: Every policy, baselines first (the order ``--compare`` lists them in).
REGISTRY: dict[str, PolicyEntry] = {e.name: e for e in _entries()}
#: name -> factory, for every policy.
POLICIES: dict[str, Factory] = {n: e.factory for n, e in REGISTRY.items()}
#: Every policy name, baselines first.
POLICY_NAMES: tuple[str, ...] = tuple(REGISTRY)
#: The baselines: what a Libra policy is measured against.
BASELINES: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.family == "baseline")


def policy_names() -> tuple[str, ...]:
    """Every known policy name, baselines first, in a stable order."""
    return POLICY_NAMES


def entry(name: str) -> PolicyEntry:
    """The registry entry of ``name`` (``UserError`` listing the names if unknown)."""
    got = REGISTRY.get(name)
    if got is None:
        raise UserError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return got


def min_staleness(name: str) -> int:
    """The smallest staleness class K the policy ``name`` runs in (0 for every policy that can
    run on-policy; a baseline asynchronous by design says more). Unknown names: 0 (the caller's
    name check reports them)."""
    got = REGISTRY.get(name)
    return got.min_staleness if got is not None else 0


def check_backend(name: str, offers: Collection[str], backend: str) -> None:
    """Refuse, with the policy's own reason, a policy that needs a capability ``backend`` does
    not offer (``offers``: a subset of ``CAPABILITIES``). Call it before any long work."""
    e = entry(name)
    missing = sorted(e.needs - set(offers))
    if missing:
        raise UserError(f"{backend} cannot run policy {name!r}: {e.refusal or 'it needs ' + ', '.join(missing)}")


def resolve(name: str, cluster: ClusterSpec, options: PolicyOptions | None = None, **kwargs: Any) -> Policy:
    """The policy ``name`` built for ``cluster`` from ``options`` (keywords applied on top; an
    unknown one is a ``UserError`` naming the known options, an unknown name one naming the
    policies). With ``pin`` set (``PolicyOptions.pin``) the policy's plans come pinned
    (``libra.policies.pinned``): every backend that builds it here executes the same pinned plan."""
    e = entry(name)
    o = options_for(name, options, **kwargs)
    return pinned_by(e.factory(cluster, o), o.pin)  # type: ignore[no-any-return]
