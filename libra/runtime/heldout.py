"""Held-out evaluation of the policy before and after a ``libra-run``.

Why: a step's training reward is measured on that step's own prompts, a few dozen of them, and
is noisy (GRPO samples at temperature 1); whether RL improved the policy is better read on a
fixed set of tasks the run never trains on. ``libra-run`` evaluates the starting weights and the
final weights on the same held-out tasks (their own seed, drawn by the same ``TaskSet`` rules),
with the same episode rules (tools, budgets, answer checking) as the rollout, and prints both.

It runs in the driver process on the torch engine, outside Ray: the evaluation is a measurement
of the weights, not of the cluster, so it must not depend on the plan or on which engine
generated the run's rollouts. Episodes advance together: each round generates the next turn of
every unfinished episode (in engine batches), then runs their tool calls on a thread pool.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from libra.runtime.episode import Episode
from libra.runtime.protocol import prompt_text
from libra.runtime.tasks import TaskSet
from libra.runtime.tiny_model import encode
from libra.runtime.tools import ToolBox


def run_episodes(engine: Any, episodes: list[Episode], tools: ToolBox, batch: int = 16, tool_threads: int = 8) -> list[Episode]:
    """Drive ``episodes`` to their ends on ``engine``, generating up to ``batch`` turns per
    engine call and running up to ``tool_threads`` tool calls at once."""
    tok = engine.tokenizer

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    live = [e for e in episodes if not e.done]
    with ThreadPoolExecutor(max_workers=tool_threads) as pool:
        while live:
            calls = []
            for i in range(0, len(live), batch):
                chunk = live[i : i + batch]
                for ep, res in zip(chunk, engine.generate([e.request() for e in chunk])):
                    call = ep.on_generation(res, decode)
                    if call is not None:
                        calls.append((ep, pool.submit(tools.call, call.name, call.args)))
            for ep, fut in calls:
                tr = fut.result()
                text = Episode.response_text(tr)
                ep.on_tool_result(tr, encode(tok, text), text)
            live = [e for e in live if not e.done]
    return episodes


def summarize(episodes: list[Episode]) -> dict[str, float]:
    """Mean reward (overall and per task kind: ``reward_<kind>``), share of episodes calling a
    tool, share of calls naming a known tool, share of calls that ran ``ok``."""
    calls = [t for e in episodes for t in e.turns if t.tool is not None]
    n = max(len(episodes), 1)
    by_kind: dict[str, list[float]] = {}
    for e in episodes:
        by_kind.setdefault(e.task.kind, []).append(e.reward)
    return {
        **{f"reward_{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())},
        "reward": sum(e.reward for e in episodes) / n,
        "used_tool": sum(1 for e in episodes if any(t.tool for t in e.turns)) / n,
        "well_formed_calls": (sum(1 for t in calls if t.tool in ("python", "search")) / len(calls)) if calls else 0.0,
        "tool_ok": (sum(1 for t in calls if t.outcome == "ok") / len(calls)) if calls else 0.0,
        "n": float(len(episodes)),
    }


def heldout_eval(model_dir: str, state: dict[str, Any] | None, n: int, seed: int, kinds: dict[str, float], temperature: float,
                 max_new_tokens: int, max_tool_calls: int, max_context: int, tool_opts: dict[str, Any] | None = None,
                 samples: int = 1, threads: int = 1) -> dict[str, float]:
    """Evaluate ``state`` (policy weights; None: the checkpoint in ``model_dir``) on ``n``
    held-out tasks drawn with ``seed``, ``samples`` episodes per task. Seeds of the sampling
    depend only on the task and sample index, so before and after see the same draws of noise."""
    from libra.runtime.engines.torch_engine import TorchEngine

    t0 = time.perf_counter()
    engine = TorchEngine(model_dir, device="cpu", seed=seed, max_context=max_context, threads=threads)
    if state is not None:
        engine.load_state_dict(state)
    tasks = TaskSet(kinds, seed=seed).batch(0, n)
    eps = []
    for i, t in enumerate(tasks):
        ids = encode(engine.tokenizer, prompt_text(t.question))
        for k in range(samples):
            eps.append(Episode(f"heldout-{i}-{k}", 0, f"heldout-{i}", t, ids, max_tool_calls, max_new_tokens, max_context, temperature,
                               seed=seed * 1_000_003 + i * 101 + k))
    run_episodes(engine, eps, ToolBox(**(tool_opts or {})))
    out = summarize(eps)
    out["eval_s"] = time.perf_counter() - t0
    return out
