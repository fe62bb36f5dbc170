"""Diagnostic: Libra's ablations and baselines on a trace variant, async, steps after the first.

    .venv/bin/python experiments/variants.py TRACE GPUS MODE A:B POLICY[,POLICY...]

Variants used in the README: ``libra-sim gen --workload swe --batch 2048 --steps 4 --seed 1``
(work-bound at 48 GPUs), ``... --seed 2 --param turns_median=4`` (short contexts), and the
bundled trace at 16 GPUs. SIMULATED numbers.
"""
import sys, numpy as np
from libra.cluster import ClusterSpec
from sim.replay import load_steps, replay_policy
from sim.loop import SimConfig
trace, gpus, mode, rng = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
steps,_ = load_steps(trace, rng)
cl = ClusterSpec(gpus, "a800", "qwen3-14b")
for pol in sys.argv[5].split(","):
    r = replay_policy(steps, pol, cl, SimConfig(mode=mode))
    s1 = r.steps[1:]
    print(f"{trace} {gpus} {mode} {pol:22s} step {np.mean([s.step_s for s in s1]):.1f} rollout {np.mean([s.rollout_makespan_s for s in s1]):.1f} LB {np.mean([s.lower_bound_s for s in s1]):.1f} CP {np.mean([s.critical_path_s for s in s1]):.1f} work {np.mean([s.work_bound_s for s in s1]):.1f} train {np.mean([s.train_s for s in s1]):.1f} split {s1[-1].n_rollout_gpus}:{s1[-1].n_train_gpus} tps {s1[-1].rollout_tps} migr {sum(s.migrations for s in s1)} roles {sum(s.role_changes for s in s1)}", flush=True)
