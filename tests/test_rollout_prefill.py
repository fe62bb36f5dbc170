"""The rollout DP prices a step's prompts at the rate of the batch they are admitted in
(``RolloutDP.prefill_rates``, ``DecodeTable.prefill_rate``), as the simulator prefills them
(``RolloutCosts.prefill_batch_s``). Checked against the simulator on a converted public log whose
prompts are most of its prefill (MedAgentBench, 4K-token prompts)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from libra.cluster import ClusterSpec
from libra.planner.costs import DecodeTable, make_evaluator, prefill_key
from libra.planner.rollout_costs import RolloutCosts
from libra.planner.rollout_dp import plan_layout
from libra.planner.search import Planner
from libra.planner.stats import compute_stats
from libra.trace.latencies import resolve_latencies
from libra.trace.reader import TraceReader
from sim.costs import SimCosts
from sim.loop import SimConfig, Simulator, observed_step
from test_sim_support import FixedPolicy, one_bucket_plan

LOG = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "held_out_19", "medagentbench-jan17v1.jsonl.gz")


def test_the_prefill_rate_is_what_the_simulator_charges_a_batch() -> None:
    """The same rounded evaluator call as the simulator's batched prefill, over its tokens."""
    cluster = ClusterSpec(32, "b200", "llama-3.1-70b")
    ev = make_evaluator(cluster)
    table = DecodeTable(ev, (1, 8))
    costs = RolloutCosts(ev)
    for tp, new, cached, k in ((8, 3900.0, 0.0, 44), (1, 250.0, 4100.0, 1), (8, 123.0, 0.0, 17)):
        key = prefill_key(tp, new, cached, k)
        charged = costs.prefill_batch_s(tp, [(new, cached)] * k)
        assert table.prefill_rate(tp, new, cached, k) == pytest.approx(charged / (key[1] * key[3]), rel=1e-12)
    # prefill is far from linear in the batch at TP 8: the batch costs well under the lone chunk
    assert table.prefill_rate(8, 3900.0, 0.0, 44) < 0.7 * table.prefill_per_token[8]


def test_prompts_at_their_batch_rate_rank_the_tp_degrees_as_the_simulator_does() -> None:
    """MedAgentBench's first step (88 runs, 4K-token prompts) on 16 of 32 B200 with Llama-3.1-70B,
    one-bucket layouts of TP 1, 2, 4 and 8, the DP fed the step's own trajectories against the
    simulator running that layout alone (noise off). With every prefill at the lone 512-token
    chunk's rate the DP predicted 0.93x, 1.01x, 1.16x and 1.32x the simulator (TP 1..8), so it
    ranked TP 1-2 above the TP 4 and 8 the simulator runs fastest; with the prompts at their
    admission batch's rate 0.92x, 0.94x, 1.00x and 1.01x, and the same order as the simulator
    (SIMULATED; what is left at TP 1-2 is the queueing the model does not charge)."""
    step = next(iter(TraceReader(LOG).steps()))
    step = observed_step(step, resolve_latencies(step, 0))
    cluster = ClusterSpec(32, "b200", "llama-3.1-70b")
    ev = make_evaluator(cluster)
    planner = Planner(cluster, ev)
    stats = compute_stats([step], step.prompt_tokens, window=1)
    assert float(stats.prompt_prefill.sum()) == pytest.approx(float(step.prompt_tokens.sum()))
    assert float(stats.prompt_count.sum()) == step.n
    flat = dataclasses.replace(stats, prompt_prefill=np.zeros(0), prompt_count=np.zeros(0), digest=stats.digest + "-flat")
    simulated, now, before = {}, {}, {}
    for tp in (1, 2, 4, 8):
        plan = one_bucket_plan(16, tp, 32)
        res = Simulator([step], FixedPolicy(plan), cluster, SimCosts(ev), SimConfig(noise_sigma=0.0)).run()
        simulated[tp] = res.steps[0].rollout_makespan_s
        layout, counts = plan_layout(plan)
        now[tp] = planner._hindsight_dp(plan, stats, 1).evaluate(layout, counts)[0]
        before[tp] = planner._hindsight_dp(plan, flat, 1).evaluate(layout, counts)[0]
    assert before[8] / simulated[8] > 1.25  # the lone chunk's rate, as before
    assert all(abs(now[tp] / simulated[tp] - 1.0) < 0.10 for tp in (1, 2, 4, 8)), (now, simulated)
    assert all(abs(now[tp] / simulated[tp] - 1.0) < 0.03 for tp in (4, 8)), (now, simulated)
    assert sorted(now, key=now.get) == sorted(simulated, key=simulated.get), (now, simulated)
    assert sorted(before, key=before.get) != sorted(simulated, key=simulated.get)
