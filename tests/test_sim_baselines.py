"""The paper's baselines: honest choice, pins, colocated switching, hindsight labelling."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.trace.columnar import StepArrays
from sim.costs import load_costs
from sim.loop import SimConfig
from libra.policies import POLICY_NAMES, resolve
from sim.hindsight import SimReplayer
from sim.replay import replay_policy
from test_sim_support import make_step

CLUSTER = ClusterSpec(16, "a800", "qwen3-14b")


@pytest.fixture(scope="module")
def costs():  # type: ignore[no-untyped-def]
    return load_costs("a800", "qwen3-14b")


def _longer(step: StepArrays, k: int) -> StepArrays:
    """The same prompts, every generation ``k`` times longer (a different future)."""
    return replace(step, gen_tokens=step.gen_tokens * k)


def test_names_and_unknown_policy() -> None:
    for n in ("verl-colocated", "verl-static-uniform", "areal-static-optimal"):
        assert n in POLICY_NAMES
    with pytest.raises(UserError, match="unknown policy"):
        resolve("nope", CLUSTER)


def test_static_uniform_never_looks_at_the_future(costs) -> None:  # type: ignore[no-untyped-def]
    a = make_step(0, 32, seed=1)
    b = _longer(a, 8)
    pa = resolve("verl-static-uniform", CLUSTER, ev=costs.ev).plan(CLUSTER, (), a.prompt_tokens)
    pb = resolve("verl-static-uniform", CLUSTER, ev=costs.ev).plan(CLUSTER, (), b.prompt_tokens)
    assert pa == pb
    assert "prior" in str(pa.notes["chosen_by"])
    assert pa.mode == "sync" and not pa.colocated and len(pa.buckets) == 1
    assert len({i.tp for i in pa.instances}) == 1


def test_hindsight_baseline_says_so_and_uses_the_trace(costs) -> None:  # type: ignore[no-untyped-def]
    steps = [make_step(s, 32, seed=2) for s in range(2)]
    replayer = SimReplayer(steps, CLUSTER, costs)
    p = resolve("areal-static-optimal", CLUSTER, ev=costs.ev, hindsight=replayer).plan(CLUSTER, (), steps[0].prompt_tokens)
    assert "hindsight" in str(p.notes["chosen_by"]) and p.mode == "async" and p.max_staleness == 1
    with pytest.raises(UserError, match="needs hindsight replay: .*libra-sim"):  # no replayer: what libra-run has
        resolve("areal-static-optimal", CLUSTER, ev=costs.ev)


def test_pins_are_honoured(costs) -> None:  # type: ignore[no-untyped-def]
    s = make_step(0, 16, seed=3)
    p = resolve("verl-static-uniform", CLUSTER, ev=costs.ev, split=(8, 8), rollout_tp=2, train_tp=4, train_pp=1).plan(
        CLUSTER, (), s.prompt_tokens)
    assert (p.n_rollout_gpus, p.n_train_gpus) == (8, 8)
    assert {i.tp for i in p.instances} == {2} and len(p.instances) == 4
    assert (p.train.tp, p.train.pp, p.train.dp) == (4, 1, 2)
    with pytest.raises(UserError, match="sum"):
        resolve("verl-static-uniform", CLUSTER, ev=costs.ev, split=(8, 4)).plan(CLUSTER, (), s.prompt_tokens)
    with pytest.raises(UserError, match="rollout-tp"):
        resolve("verl-static-uniform", CLUSTER, ev=costs.ev, rollout_tp=3).plan(CLUSTER, (), s.prompt_tokens)


def test_colocated_time_shares_every_gpu_and_pays_the_switch(costs) -> None:  # type: ignore[no-untyped-def]
    steps = [make_step(s, 24, seed=4) for s in range(2)]
    res = replay_policy(steps, "verl-colocated", CLUSTER, SimConfig(), costs=costs)
    for m in res.steps:
        assert m.n_rollout_gpus == m.n_train_gpus == 16
        assert m.switch_s > 0 and m.sync_s > 0  # the stage switches, and the weights handed over by CUDA IPC
        assert m.completed == m.n_traj
    # the next rollout waits for the switch back: stages never overlap
    a, b = res.steps
    assert b.rollout_start_s >= a.step_end_s - 1e-9
    with pytest.raises(UserError, match="colocated"):
        replay_policy(steps, "verl-colocated", CLUSTER, SimConfig(mode="async"), costs=costs)


def test_makespan_is_never_below_the_critical_path(costs) -> None:  # type: ignore[no-untyped-def]
    steps = [make_step(s, 24, seed=5, turns=(2, 6)) for s in range(2)]
    res = replay_policy(steps, "verl-static-uniform", CLUSTER, SimConfig(noise_sigma=0.0), costs=costs)
    for m in res.steps:
        assert m.rollout_makespan_s >= m.critical_path_s * (1 - 1e-6)
        assert np.isfinite(m.makespan_over_bound) and m.makespan_over_bound >= 1 - 1e-6


def test_a_known_context_limit_reaches_the_baselines_prior(costs) -> None:  # type: ignore[no-untyped-def]
    """Libra's planner scales its first-step prior into ``ClusterSpec.max_context``; the baselines
    get the same knowledge (what their verl config would say), so the comparison stays fair."""
    a = make_step(0, 32, seed=1)
    capped = replace(CLUSTER, max_context=4096)
    p = resolve("verl-static-uniform", capped, ev=costs.ev).plan(capped, (), a.prompt_tokens)
    q = resolve("verl-static-uniform", CLUSTER, ev=costs.ev).plan(CLUSTER, (), a.prompt_tokens)
    assert "max context 4096" in str(p.notes["chosen_by"]) and "max context 32768" in str(q.notes["chosen_by"])
    assert p.predicted_rollout_s < q.predicted_rollout_s


def test_training_device_limit_binds_the_baselines_as_it_binds_libra(costs) -> None:  # type: ignore[no-untyped-def]
    """``ClusterSpec.max_train_gpus``: the static splits give training at most that many GPUs
    (the rest roll out), verl-colocated trains on that many, a pinned split above it is refused
    with the split that would work, and a limit no strategy fits names the count that would."""
    a = make_step(0, 32, seed=1)
    free = resolve("verl-static-uniform", CLUSTER, ev=costs.ev).plan(CLUSTER, (), a.prompt_tokens)
    assert free.n_train_gpus == 8  # whole-node splits on 2 nodes: 8:8
    capped = replace(CLUSTER, max_train_gpus=4)
    p = resolve("verl-static-uniform", capped, ev=costs.ev).plan(capped, (), a.prompt_tokens)
    assert (p.n_rollout_gpus, p.n_train_gpus) == (12, 4) and p.train.n_gpus == 4
    assert sum(i.tp for i in p.instances) <= 12
    c = resolve("verl-colocated", capped, ev=costs.ev).plan(capped, (), a.prompt_tokens)
    assert c.colocated and (c.n_rollout_gpus, c.n_train_gpus) == (16, 4) and c.train.n_gpus == 4
    res = replay_policy([a], "verl-colocated", capped, SimConfig(noise_sigma=0.0), costs=costs)
    assert res.steps[0].n_train_gpus == 4 and res.steps[0].completed == res.steps[0].n_traj
    with pytest.raises(UserError, match=r"--split 12:4"):
        resolve("verl-static-uniform", capped, ev=costs.ev, split=(8, 8)).plan(capped, (), a.prompt_tokens)
    one = replace(CLUSTER, max_train_gpus=1)  # 14B does not train on one A800
    with pytest.raises(UserError, match=r"training needs (\d+) .*try --max-train-gpus \1$"):
        resolve("verl-static-uniform", one, ev=costs.ev).plan(one, (), a.prompt_tokens)


@pytest.mark.parametrize("n_train, tp, pp, ep", [(16, 1, 2, 8), (32, 2, 1, 8)])
def test_pinned_megatron_moe_layouts_are_accepted(n_train: int, tp: int, pp: int, ep: int) -> None:
    """Layouts real MoE runs use (Megatron parallel folding: EP re-folds the TP x DP ranks) are
    priced, not refused: the branch and bound of the training tree used to cut every pinned leaf
    slower than the unpinned best, and the pin then found nothing ("no training strategy with
    tp=1, pp=2, ep=8 fits" while listing 1x2 as fitting)."""
    cluster = ClusterSpec(2 * n_train, "h100", "qwen3-30b-a3b")
    moe = load_costs("h100", "qwen3-30b-a3b")
    s = make_step(0, 64, seed=5)
    p = resolve("verl-static-uniform", cluster, ev=moe.ev, split=(n_train, n_train), rollout_tp=2,
                train_tp=tp, train_pp=pp, train_ep=ep).plan(cluster, (), s.prompt_tokens)
    assert (p.train.tp, p.train.pp, p.train.ep, p.train.dp) == (tp, pp, ep, n_train // (tp * pp))


def test_qwen3_235b_from_its_config_json_runs_tp4_pp8_ep16() -> None:
    """Qwen3-235B-A22B (94 layers, a Hugging Face config.json) on 128 training GPUs with the
    layout published runs use: TP 4, PP 8 (uneven stages: 94 is not a multiple of 8), EP 16."""
    from pathlib import Path

    cfg = str(Path(__file__).parents[1] / "experiments" / "data" / "published_runs" / "models" / "qwen3-235b-a22b" / "config.json")
    cluster = ClusterSpec(192, "h100", cfg)
    big = load_costs("h100", cfg)
    s = make_step(0, 64, seed=6)
    p = resolve("verl-static-uniform", cluster, ev=big.ev, split=(64, 128), rollout_tp=8,
                train_tp=4, train_pp=8, train_ep=16).plan(cluster, (), s.prompt_tokens)
    assert (p.train.tp, p.train.pp, p.train.ep, p.train.dp) == (4, 8, 16, 4)
