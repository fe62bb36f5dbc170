"""Diagnostic: what the rollout lower bound's critical path is made of, per step (SIMULATED cost model).

    .venv/bin/python experiments/critical_path.py

Per step: the slowest trajectory run alone at TP8, batch 1 (decode + tool time), how many
trajectories come within 90/80/70% of it, how many reach the 32K cap, and the TP8 decode
iteration time by batch at a 25K context (what a tail trajectory pays when it shares a batch).
"""
import numpy as np
from libra.planner.bounds import _turn_geometry
from libra.trace.latencies import resolve_latencies
from sim.costs import load_costs
from sim.replay import load_steps
c = load_costs("a800","qwen3-14b")
steps,_ = load_steps("traces/swe-qwen3-14b.jsonl.gz","1:4")
for step in steps:
    lat = resolve_latencies(step, 0)
    owner, new, cached, ctx0 = _turn_geometry(step)
    g = step.gen_tokens.astype(float); ctx_sum = g*ctx0 + g*(g-1)/2
    tool = np.bincount(owner, weights=lat, minlength=step.n)
    b1,s1 = c.decode_coeffs(8,1)
    dec = np.bincount(owner, weights=g*b1+s1*ctx_sum, minlength=step.n)
    path = dec + tool
    mx = path.max()
    print(f"step {step.step}: CP max {mx:.0f} s (decode {dec[path.argmax()]:.0f}, tools {tool[path.argmax()]:.0f}); trajectories with CP >= 0.9 max: {(path>=0.9*mx).sum()}, >=0.8: {(path>=0.8*mx).sum()}, >= 0.7: {(path>=0.7*mx).sum()}; final==32768: {(step.total_tokens>=32768).sum()}, >=28K {(step.total_tokens>=28000).sum()}; tool share of CP median (top 20) {np.median((tool/path)[np.argsort(path)[-20:]]):.2f}")
    # per-token iteration time of TP8 at batch B, context 25K
    for B in (1,4,8,16,32,64):
        b,s = c.decode_coeffs(8,B); print(f"   TP8 B{B} iter@25K {1e3*(b+s*B*25000):.1f} ms", end="")
    print()
