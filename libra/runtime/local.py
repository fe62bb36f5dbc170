"""A single-process RL loop (no Ray): one torch engine and one plain-torch learner on one
device, sharing the Episode rules, tools, GRPO and recording of the Ray runtime.

Why: a one-GPU machine without Ray or vLLM (``scripts/gpu_check.sh``) can still measure real
rollout and training times on CUDA and compare them with the cost evaluator.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def run_local(model_dir: str, device: str = "cpu", steps: int = 3, prompts: int = 8, group: int = 4, seed: int = 0, lr: float = 2e-3,
              max_new_tokens: int = 48, tasks: dict[str, float] | None = None, log: Any = print) -> list[dict[str, float]]:
    """Run ``steps`` GRPO steps; returns one row per step (times in seconds, tokens, reward)."""
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.episode import Episode
    from libra.runtime.evaluate import run_episode
    from libra.runtime.grpo import Sample, group_advantages
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tasks import TaskSet
    from libra.runtime.tiny_model import encode
    from libra.runtime.tools import ToolBox
    from libra.runtime.trainer import Learner

    eng = TorchEngine(model_dir, device=device, seed=seed)
    learner = Learner(model_dir, backend="torch", lr=lr, seed=seed, device=device)
    tools = ToolBox()
    ts = TaskSet(tasks or {"math": 1, "math2": 1, "search": 1}, seed=seed)
    rows = []
    for step in range(steps):
        t0 = time.perf_counter()
        eps = []
        for p, t in enumerate(ts.batch(step, prompts)):
            ids = encode(eng.tokenizer, prompt_text(t.question))
            for g in range(group):
                eps.append(Episode(f"s{step}-p{p}-r{g}", step, f"p{p}", t, ids, max_new_tokens=max_new_tokens, seed=seed * 7 + step * 1009 + p * 31 + g))
        busy = 0.0
        for ep in eps:
            run_episode(eng, ep, tools)
        t_roll = time.perf_counter() - t0
        rewards = [e.reward for e in eps]
        adv = group_advantages(rewards, [e.group for e in eps])
        st = learner.train_step([Sample(tuple(e.context), tuple(e.gen_mask), float(a)) for e, a in zip(eps, adv)])
        t1 = time.perf_counter()
        eng.load_state_dict(learner.state_dict())
        t_sync = time.perf_counter() - t1
        gen = sum(t.gen_tokens for e in eps for t in e.turns)
        row = {"step": step, "reward": float(np.mean(rewards)), "rollout_s": t_roll, "train_s": st["train_s"], "sync_s": t_sync,
               "gen_tokens": float(gen), "trained_tokens": st["tokens"], "trajectories": float(len(eps)), "busy_s": busy,
               "max_context": float(max(len(e.context) for e in eps))}
        rows.append(row)
        log(f"local step {step}: reward {row['reward']:.3f}, rollout {t_roll:.2f} s ({gen} tokens), train {st['train_s']:.2f} s, sync {t_sync:.3f} s")
    return rows
