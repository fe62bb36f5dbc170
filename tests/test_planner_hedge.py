"""The first step of a workload of undeclared kind is planned as a hedge (issue 22, cause 1 of
held_out_3's losses).

Before: a converted agent log declares no kind (``workload: agent``) and no limits, so step 0
was planned from the SWE-like default prior alone. On a real ReAct log (FireAct HotpotQA, 16
A100, Qwen3-14B, K=1) that prior forecast 350 s of rollout for what ran 5.9 s, chose the
time-shared loop (two engine/trainer switches, 12.8 s a step), and the run then paid a move to
an async split: 0.53x of a fixed async split (SIMULATED). Now the loop class is the one of least
worst-case regret over the default prior and every known kind's prior.
"""

from __future__ import annotations

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import make_evaluator
from libra.planner.plan import same_layout
from libra.planner.search import Planner, SearchOptions, SearchResult, known_kind, loop_class, prices_by_train_gpus, prior_scenarios
from libra.planner.stats import PriorSpec

PROMPTS = np.full(128, 50, np.int64)  # short ReAct task statements, one run per prompt


def _planner(workload: str | None, hedge: bool, k: int = 1) -> Planner:
    cl = ClusterSpec(16, "a100", "qwen3-14b", workload=workload)
    return Planner(cl, make_evaluator(cl), SearchOptions(max_staleness=k, hedge_unknown_kind=hedge))


@pytest.fixture(scope="module")
def hedged_agent() -> tuple[Planner, SearchResult]:
    """The undeclared kind's hedged K=1 launch on 16 A100 / Qwen3-14B, searched once for the
    tests that read it (each search prices every class in every prior scenario)."""
    planner = _planner("agent", hedge=True)
    return planner, planner.search([], PROMPTS)


def test_an_undeclared_kind_is_hedged_over_every_known_kind() -> None:
    assert not known_kind(PriorSpec(workload="agent")) and not known_kind(PriorSpec())
    assert known_kind(PriorSpec(workload="search"))
    kinds = [s.workload for s in prior_scenarios(PriorSpec(workload="agent", max_context=8192))]
    assert kinds[0] == "agent" and {"swe", "search", "math"} <= set(kinds[1:])
    assert all(s.max_context == 8192 for s in prior_scenarios(PriorSpec(workload="agent", max_context=8192)))
    # each of them also wrong by the short side of PRIOR_STRETCH, the band the planner assumes of a prior
    from libra.planner.stats import PRIOR_STRETCH

    short = [f for f in PRIOR_STRETCH if f < 1.0]
    scenarios = prior_scenarios(PriorSpec(workload="agent"))
    assert short and len(scenarios) == 4 * (1 + len(short))
    assert {(s.workload, s.stretch) for s in scenarios} == {(k, f) for k in kinds[:4] for f in (1.0, *short)}


def test_the_first_step_of_a_react_log_is_not_planned_time_shared_from_the_swe_prior(hedged_agent: tuple[Planner, SearchResult]) -> None:
    """The SWE-like default alone planned this step time-shared (the held_out_3 loss). Since the
    prior resolves its tail quantiles (``PRIOR_POOL``) it no longer does on its own here; the
    hedge must still pick the async split, whose worst-case regret is below time-shared's."""
    after = hedged_agent[1]
    assert not after.best.colocated and after.best.mode == "async"
    assert after.hedge["async"] < after.hedge["time-shared"]


def test_the_hedged_class_has_the_least_worst_case_regret(hedged_agent: tuple[Planner, SearchResult]) -> None:
    res = hedged_agent[1]
    assert {"time-shared", "sync", "async"} <= set(res.hedge)  # every class priced in every scenario (no cut)
    assert res.hedge[loop_class(res.best)] == pytest.approx(min(res.hedge.values()))
    assert res.hedge[loop_class(res.best)] < res.hedge["time-shared"]
    assert min(res.hedge.values()) >= 1.0


@pytest.mark.parametrize("kind", ["search", "swe", "math"])
def test_a_declared_kind_is_planned_from_its_own_prior_alone(kind: str) -> None:
    hedged = _planner(kind, hedge=True, k=0).search([], PROMPTS)
    plain = _planner(kind, hedge=False, k=0).search([], PROMPTS)
    assert repr(hedged.best) == repr(plain.best) and not hedged.hedge  # (NaN fields: compared as text)


def test_an_async_launch_split_has_the_least_mean_log_regret_over_the_scenarios() -> None:
    """An undeclared kind's async launch takes, among every async split, the one of least mean
    log-regret over the prior scenarios, each scenario searched with the async loop pinned
    (``Planner._class_runs``: a search keeps each split's best loop only, so unpinned a short
    scenario priced no async candidate where its steps ran synchronously). On 28 H100 with
    Qwen3-14B at K=1 (short ReAct prompts, 4 steps) the default prior alone launches 16:12; the
    scenarios agree on 12:16, which the hindsight plan of held_out_37
    fireact-hotpotqa/h100-28-14b/K1 ran (0.880x -> 1.001x, SIMULATED)."""
    import math

    prompts = np.full(128, 28, np.int64)
    cl = ClusterSpec(28, "h100", "qwen3-14b", workload="agent")

    def planner(**kw: object) -> Planner:
        return Planner(cl, make_evaluator(cl), SearchOptions(max_staleness=1, mini_batches=4, run_steps=4, **kw))  # type: ignore[arg-type]

    default = planner(hedge_unknown_kind=False).search([], prompts).best
    hedged = planner().search([], prompts).best
    assert (default.rollout.n_gpus, default.n_train) == (16, 12)
    assert (hedged.rollout.n_gpus, hedged.n_train) == (12, 16) and hedged.mode == "async"
    pinned = planner(mode="async", colocated=False)
    tables = [prices_by_train_gpus(pinned._search((), prompts, None, s, bound=False).candidates, "async")
              for s in prior_scenarios(PriorSpec.of(cl))]
    common = set.intersection(*(set(t) for t in tables))

    def mean_log(n: int) -> float:
        return sum(math.log(t[n] / min(t.values())) for t in tables) / len(tables)

    assert hedged.n_train in common and default.n_train in common
    assert mean_log(hedged.n_train) == pytest.approx(min(mean_log(n) for n in common))
    assert mean_log(hedged.n_train) < mean_log(default.n_train)


def test_an_undeclared_kind_launches_a_layout_sized_for_the_short_scenarios() -> None:
    """The default prior reaches 64K tokens, so its launch layout held sequences no short log
    brings (ZeRO-3 on 13 B200 for Qwen3-8B). The first training may re-build the layout for the
    price of its weights (``first_layout``), so the launch layout is the one of least worst-case
    cost over the scenarios: one sized for the short scenarios, which costs a long one a single
    re-build. held_out_17 fireact-multi/b200-24-8b/K1 trained 0.80 s a step where this layout
    trains 0.38 s (0.94x -> 0.99x, SIMULATED)."""
    from libra.planner.decision_tree import memory_report

    prompts = np.full(128, 35, np.int64)
    cl = ClusterSpec(24, "b200", "qwen3-8b", workload="agent")

    planner = Planner(cl, make_evaluator(cl), SearchOptions(max_staleness=1, mini_batches=4, run_steps=4))
    res = planner.search([], prompts)
    launched = res.best
    # the same split as searched from the default prior, whose layout held its 64K tokens
    default = next(c for c in res.candidates if c.rollout is launched.rollout and c.loop == launched.loop and c is not launched)
    assert launched.n_train == default.n_train and launched.train != default.train
    tokens, seq, seq_max = planner.train_shape(res.stats)  # the default prior's longest sequence
    assert memory_report(planner.ev, default.train, seq_max).fits
    assert not memory_report(planner.ev, launched.train, seq_max).fits  # too small for the 64K prior ...
    assert memory_report(planner.ev, launched.train, 4096).fits  # ... sized for short sequences
    # the next step's plan, made at launch too (K=1), keeps the split and layout: nothing has
    # trained yet, so the prior's memory does not force a re-shard of a provisional layout; its
    # knobs are those a batch of the prior's sequences settles to (``settle.settled_knobs``:
    # the launch knobs cannot hold the prior's longest, and the simulator refuses that)
    first = planner.plan([], prompts)
    second = planner.plan([], prompts, current=first)
    assert (first.n_train_gpus, first.train) == (launched.n_train, launched.train)
    assert second.n_train_gpus == first.n_train_gpus and same_layout(second.train, first.train)


def test_the_launch_layout_is_also_priced_on_steps_shorter_than_every_prior(hedged_agent: tuple[Planner, SearchResult]) -> None:
    """Converted agent logs generate less than the shortest kind's prior stretched to 1/3, so the
    launch layout is also priced on every unstretched scenario stretched to ``LAUNCH_STRETCH``
    (``Planner._launch_runs``); the loop class and the split are not (they moved AgentDojo's
    124K-token first step off time-sharing, 0.992 -> 0.942x, SIMULATED)."""
    from libra.planner.search import LAUNCH_STRETCH

    planner, res = hedged_agent
    spec = PriorSpec.of(planner.cluster)
    runs = [planner._search((), PROMPTS, None, s, bound=False) for s in prior_scenarios(spec)]
    best = res.best
    launch = planner._launch_runs(best, runs, PROMPTS, None)
    extra = launch[len(runs):]
    unstretched = [r for r in runs if r.stats_spec is not None and r.stats_spec.stretch == 1.0]
    assert len(unstretched) >= 2 and len(extra) == len(unstretched)
    assert all(r.stats_spec is not None and r.stats_spec.stretch == pytest.approx(LAUNCH_STRETCH) for r in extra)
    # shorter steps: each extra scenario trains fewer tokens than its unstretched one
    assert all(planner.train_shape(e.stats)[0] < planner.train_shape(u.stats)[0] for e, u in zip(extra, unstretched))
    # no launch (a plan in force): the scenarios as they are
    assert planner._launch_runs(best, runs, PROMPTS, planner.to_plan(res)) == runs


def test_a_short_log_s_first_step_is_not_streamed_in_the_long_prior_s_layout() -> None:
    """A streamed step trains before its batch is complete, in its plan's strategy (nothing
    settles a streamed job), so the first step of an undeclared kind would train the 64K
    default prior's layout unsettled. FireAct HotpotQA's ReAct trajectories average 184 tokens,
    shorter than every prior scenario, and on 48 H100s with Qwen3-32B at K=0 the hedge streamed
    that step: 16.5 s of training where a layout settled for the batch takes 1.3 s, 0.79x of
    verl-static-uniform (held_out_25, SIMULATED). The hedge now picks among the classes whose
    first training settles its layout (``UNSETTLED_FIRST_STEP``): here a sync split, whose
    worst case over the scenarios (each prior and each stretched by 1/3) is below time-shared's."""
    from libra.planner.search import UNSETTLED_FIRST_STEP

    cl = ClusterSpec(48, "h100", "qwen3-32b", workload="agent")
    res = Planner(cl, make_evaluator(cl), SearchOptions(max_staleness=0, mini_batches=4, run_steps=4)).search([], PROMPTS)
    assert UNSETTLED_FIRST_STEP == "sync+streaming" and UNSETTLED_FIRST_STEP not in res.hedge
    assert not res.best.streaming and not res.best.colocated and res.best.mode == "sync"
    assert res.hedge["sync"] < res.hedge["time-shared"]
    # a declared kind is planned from its own prior and may stream its first step
    declared = Planner(ClusterSpec(48, "h100", "qwen3-32b", workload="swe"), make_evaluator(cl),
                       SearchOptions(max_staleness=0, mini_batches=4, run_steps=4)).search([], PROMPTS)
    assert not declared.hedge


def test_a_plan_asked_for_before_any_rollout_finished_keeps_the_launch_plan() -> None:
    """At K >= 1 step 1 is planned while step 0 rolls out: nothing is measured yet, and a second
    search of the same prior (with the launch plan in force, so without ``_launch_layout``) moved
    the training layout the launch plan chose for short steps back to the prior's, a re-shard for
    nothing (FireAct HotpotQA, 64 A800, Qwen3-30B-A3B, K=1: 0.933x, SIMULATED). The ``Replanner``
    now keeps the plan in force until a step has been measured."""
    from libra.planner.search import Replanner

    rp = Replanner(_planner("agent", hedge=True))  # the rule is the Replanner's, on any cluster
    first = rp.plan([], PROMPTS)
    second = rp.plan([], PROMPTS)
    assert first.notes["from_prior"] and first.notes["replanned"]
    assert (second.n_train_gpus, second.train, second.instances, second.mode) == (first.n_train_gpus, first.train, first.instances, first.mode)
    assert second.notes["replanned"] is False and rp.replans == 1
    # a step too small to feed the plan's data-parallel ranks is searched for again
    few = PROMPTS[: max(1, first.train.dp - 1)]
    third = rp.plan([], few)
    assert third.notes["replanned"] is True and rp.replans == 2 and third.train.dp <= len(few)


def test_a_launch_split_gives_training_a_gpu_count_that_holds_twice_the_prior() -> None:
    """An undeclared kind's prior stops at 64K tokens, real logs reach twice that (AgentDojo,
    123,547 tokens), and the first training runs on the launch split. On 28 B200 with Qwen3-14B
    no strategy on 17 training GPUs holds 128K tokens (on 16 and 18 one does), and a launch of
    11:17 stopped AgentDojo at step 0's training (held_out_34 replayed on session 24's code,
    SIMULATED). Offered a near tie that holds it, the launch takes the nearest one; with none
    within ``TIE_TOLERANCE`` it keeps its pick; a declared limit turns the rule off."""
    from dataclasses import replace

    from libra.planner.search import LAUNCH_MEMORY_HEADROOM, TIE_TOLERANCE

    cl = ClusterSpec(28, "b200", "qwen3-14b", workload="agent")
    planner = Planner(cl, make_evaluator(cl), SearchOptions(max_staleness=1, mini_batches=4, run_steps=5))
    res = planner.search([], np.full(256, 900, np.int64))
    tokens, seq, seq_max = planner.train_shape(res.stats)
    need = int(seq_max * LAUNCH_MEMORY_HEADROOM)
    assert planner.tree.best(17, tokens, seq, need).best is None
    assert planner.tree.best(16, tokens, seq, need).best is not None and planner.tree.best(18, tokens, seq, need).best is not None
    split = [c for c in res.candidates if not c.colocated and c.mode == "async"]
    odd = next(c for c in split if c.n_train == 17)
    # priced as a near tie of its even neighbours, the odd count gives way to the nearest of them
    tied = [replace(c, robust_s=odd.rank()[0] * (1.0 + TIE_TOLERANCE / 2)) if c.n_train in (16, 18) else c for c in split]
    picked = planner._holding_launch(odd, tied, res.stats, None)
    assert picked.n_train in (16, 18)
    # no near tie: the pick stands (the rule costs at most the tie band)
    far = [replace(c, robust_s=odd.rank()[0] * (1.0 + 3 * TIE_TOLERANCE)) if c is not odd else c for c in split]
    assert planner._holding_launch(odd, far, res.stats, None) is odd
    # a declared limit: every strategy the search prices holds it, the rule is off
    declared = Planner(replace(cl, max_context=32768), make_evaluator(cl), SearchOptions(max_staleness=1))
    assert declared._holding_launch(odd, tied, res.stats, None) is odd
