"""Every policy by name: Libra, its ablations and the paper's baselines, in one registry.

| name | family | file | what it is |
| --- | --- | --- | --- |
| ``verl-colocated`` | baseline | ``verl.py`` | every GPU rolls out, then every GPU trains (stage switches paid) |
| ``verl-static-uniform`` | baseline | ``verl.py`` | a fixed split, uniform-TP instances, least-loaded; sync (one-step-off async with K >= 1) |
| ``areal-static-optimal`` | baseline | ``areal.py`` | the best fixed (split, TP, loop) in hindsight, by replay; async, K >= 1; needs a ``HindsightReplayer`` |
| ``libra`` and its ablations | libra | ``libra_policy.py`` | planner + router + elastic pool (its table); ``hindsight-routing`` sees the future |

One concept per file: ``options.py`` (``PolicyOptions``, the one options type every factory
takes), ``registry.py`` (the names, what each needs from a backend, ``resolve``,
``check_backend``), ``libra_policy.py``, ``static.py`` (``StaticPolicy``, the shape of every
baseline), ``prior.py`` (the baselines' length prior), ``verl.py``, ``areal.py``,
``hindsight.py`` (the ``HindsightReplayer`` Protocol ``sim`` implements), ``pinned.py`` (a user's
pin of split/bucket bounds as a policy wrapper, ``PolicyOptions.pin``). Both backends build
policies here; neither builds its own.
"""

from libra.policies.hindsight import HindsightReplayer
from libra.planner.assumed_cap import ASSUMED_CAPS
from libra.policies.libra_policy import LIBRA_POLICIES, ROUTERS, LibraPolicy
from libra.policies.options import OPTIONS, PolicyOptions, options_for
from libra.policies.pinned import PinnedPolicy, PlanPin, pin_plan, pinned
from libra.policies.registry import (BASELINES, CAPABILITIES, FUTURE, HINDSIGHT, POLICIES, POLICY_NAMES, REGISTRY, PolicyEntry,
                                     check_backend, entry, min_staleness, policy_names, resolve)
from libra.policies.static import StaticPolicy

__all__ = [
    "ASSUMED_CAPS", "BASELINES", "CAPABILITIES", "FUTURE", "HINDSIGHT", "LIBRA_POLICIES", "OPTIONS", "POLICIES", "POLICY_NAMES",
    "REGISTRY", "ROUTERS", "HindsightReplayer", "LibraPolicy", "PinnedPolicy", "PlanPin", "PolicyEntry", "PolicyOptions", "StaticPolicy",
    "check_backend", "entry", "min_staleness", "options_for", "pin_plan", "pinned", "policy_names", "resolve",
]
