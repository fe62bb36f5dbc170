"""A first step planned at an assumed context cap: the rule ``LibraPolicy`` launches a run with
and ``libra-sim plan`` prints, in one place so the two cannot drift apart.

When a workload declares no context limit, the first step is planned from a length prior whose
own cap (65,536 tokens) is a guess. Two cases re-plan it at a shorter assumed cap, longest first,
from ``ASSUMED_CAPS``:

- nothing fits the prior (no incumbent): the first cap that fits is taken. A wrong guess then
  costs a re-plan after the first step, not a refusal (Qwen3-32B on 16 A800s was refused at
  sequence 65,536 while verl-colocated, assuming 32,768, ran it). Unless that cap's launch is a
  split that memory forced (``forced``: one training GPU count holds the cap's sequences, so
  there was no split to choose and the regret over the prior scenarios, which all price that one
  split, is 1.0 and says nothing): then the next shorter cap whose launch is not forced is taken,
  the forced one if none is;
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
                         incumbent: T | None = None, forced: Callable[[T], bool] | None = None) -> tuple[T, int | None]:
    """The launch and the cap it assumed (None: ``incumbent``, at the prior's own cap).

    ``plan_at(cap)`` plans the first step with ``cap`` as the declared context limit (raising
    ``UserError`` when nothing fits it); ``regret_of`` reads a launch's worst-case regret over the
    prior scenarios (NaN or absent: 1.0). ``incumbent`` None: nothing fit the prior, and the first
    cap that fits is taken, unless ``forced`` says its launch is a split memory forced (one
    training GPU count holds that cap's sequences: ``Plan.notes["holding_splits"]``); then the
    first shorter cap whose launch is not forced, else the first that fit; the last cap's error is
    raised when none fits. Otherwise the first cap whose launch is within ``HEDGE_REGRET_CAP``,
    else the launch of least regret, ``incumbent`` included. The risk a shorter cap takes is the
    baselines' (verl-colocated assumes 32,768): a first-step run longer than the cap that the
    launched training GPUs cannot hold, which a split then trains on more GPUs once
    (``Policy.oversized_training``).

    Why ``forced``: on 56 H100 with Llama-3.1-70B nothing fits the prior's 65,536 tokens, and at
    32,768 only 48 training GPUs hold its sequences, so every short log launched 8:48 at one TP-8
    engine (regret 1.0 over scenarios that all price that split) where the hindsight split runs
    16:40 or 24:32 (held_out_45: 15 K=1 log losses on that cluster, 0.82x-0.95x, SIMULATED).
    A time-shared launch at such a cap is not forced (it trains on every GPU) and stays. Only
    where nothing fit the prior: a forced launch at the prior's own 65,536 tokens holds what long
    logs bring, and moving it down a cap too (tried, seen on the same 69 rows) took DA-Code
    0.853x -> 0.725x and tau2 telecom 0.952x -> 0.707x, their long steps then trained on more GPUs
    (``oversized_training``)."""
    first_fit: tuple[T, int] | None = None
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
            if forced is None or not forced(cand):
                return cand, cap
            if first_fit is None:
                first_fit = (cand, cap)
            continue
        regret = _regret(regret_of, cand)
        if regret < best_regret:
            best, best_cap, best_regret = cand, cap, regret
        if regret <= HEDGE_REGRET_CAP:
            break
    if best is None:
        if first_fit is not None:
            return first_fit
        assert err is not None
        raise err
    return best, best_cap


def forced_split(holding_splits: object, colocated: bool) -> bool:
    """Whether a launch is a split that memory forced: its search found one training GPU count
    that holds the sequences (``SearchResult.holding_splits``, ``Plan.notes["holding_splits"]``,
    1) and it is not time-shared."""
    return not colocated and holding_splits == 1


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
