"""A first step planned at an assumed context cap: the rule ``LibraPolicy`` launches a run with
and ``libra-sim plan`` prints, in one place so the two cannot drift apart.

When a workload declares no context limit, the first step is planned from a length prior whose
own cap (65,536 tokens) is a guess. Two cases re-plan it at a shorter assumed cap, longest first,
from ``ASSUMED_CAPS``:

- nothing fits the prior (no incumbent): the first cap that fits is taken. A wrong guess then
  costs a re-plan after the first step, not a refusal (Qwen3-32B on 16 A800s was refused at
  sequence 65,536 while verl-colocated, assuming 32,768, ran it);
- the prior fits only a launch whose worst-case regret over the prior scenarios exceeds
  ``HEDGE_REGRET_CAP`` (``SearchResult.launch_regret``, ``Plan.notes["hedge_regret"]``): the
  first cap whose launch is within it is taken, else the one of least regret, the incumbent
  included.

Why a shared function: until session 34 only the policy applied the regret rule, so on 30 A100
with Qwen3-32B ``libra-sim plan`` printed a 6:24 launch while a replay launched 8:22.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import TypeVar

from libra.errors import UserError

#: Context caps tried, longest first, for a first step whose length prior fits nothing, or fits
#: only a launch of high regret, and whose workload declares no limit.
ASSUMED_CAPS: tuple[int, ...] = (32768, 16384, 8192, 4096)
#: A first step of undeclared kind whose launched plan (its training GPU count and loop class)
#: costs some prior scenario more than this many times that scenario's best plan
#: (``Plan.notes["hedge_regret"]``, ``SearchResult.launch_regret``) is planned again at each of
#: ``ASSUMED_CAPS``. Why: the default prior reaches 65,536 tokens, and on 36 H100 with Qwen3-32B
#: only 32 training GPUs hold that, so every split the prior allowed gave rollout 4 GPUs, one TP-4
#: instance, which the short scenarios price at up to 11x their best (1,400 runs of 700-token
#: prompts at K=1; 1.43 at an assumed 32,768); InterCode SQL (a few thousand tokens a run) ran its
#: first two steps at K=1 on it, 0.435x of the time-shared baseline, which assumes 32,768
#: (held_out_35 intercode-sql/h100-36-32b/K1, SIMULATED). At 1.5 the fallback fired on no launch
#: of held_out_33 or held_out_34 (every Libra row unchanged) and on held_out_35 only on 36 H100.
#: 1.25 since session 34: on 30 A100 with Qwen3-32B short logs launched 6:24 at TP 4 x 1 (two
#: rollout GPUs idle) at a regret of 1.48 and ran 0.835x-0.875x of the best static split
#: (held_out_42); at an assumed 32,768 they launch 8:22 (seen: that cluster's K=1 log losses
#: 6 -> 5, worst 0.835 -> 0.864x). Over K=1 launches of FireAct's prompts on 33 clusters of
#: held_out_34-42 the uncapped regret is at most 1.146 elsewhere.
HEDGE_REGRET_CAP = 1.25

T = TypeVar("T")


def plan_at_assumed_caps(plan_at: Callable[[int], T], regret_of: Callable[[T], float],
                         incumbent: T | None = None) -> tuple[T, int | None]:
    """The launch and the cap it assumed (None: ``incumbent``, at the prior's own cap).

    ``plan_at(cap)`` plans the first step with ``cap`` as the declared context limit (raising
    ``UserError`` when nothing fits it); ``regret_of`` reads a launch's worst-case regret over the
    prior scenarios (NaN or absent: 1.0). ``incumbent`` None: nothing fit the prior, and the first
    cap that fits is taken; the last cap's error is raised when none does. Otherwise the first
    cap whose launch is within ``HEDGE_REGRET_CAP``, else the launch of least regret,
    ``incumbent`` included. The risk a shorter cap takes is the baselines' (verl-colocated assumes
    32,768): a first-step run longer than the cap that the launched training GPUs cannot hold."""
    best, best_cap = incumbent, None
    best_regret = _regret(regret_of, incumbent) if incumbent is not None else float("inf")
    err: UserError | None = None
    for cap in ASSUMED_CAPS:
        try:
            cand = plan_at(cap)
        except UserError as e:
            err = e
            continue
        if incumbent is None:
            return cand, cap
        regret = _regret(regret_of, cand)
        if regret < best_regret:
            best, best_cap, best_regret = cand, cap, regret
        if regret <= HEDGE_REGRET_CAP:
            break
    if best is None:
        assert err is not None
        raise err
    return best, best_cap


def may_assume_cap(history: Sized, max_context: int | None) -> bool:
    """Whether a plan may be made at an assumed cap at all: only a first step (no measured step)
    of a workload that declares no context limit. Otherwise a misfit is the user's error."""
    return not len(history) and max_context is None


def needs_assumed_cap(regret: float, history: Sized, max_context: int | None) -> bool:
    """Whether a plan made from the prior, at this worst-case regret over the prior scenarios,
    is planned again at the assumed caps."""
    return may_assume_cap(history, max_context) and regret == regret and regret > HEDGE_REGRET_CAP


def _regret(regret_of: Callable[[T], float], plan: T) -> float:
    got = float(regret_of(plan))
    return got if got == got else 1.0
