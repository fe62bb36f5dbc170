"""Run the policy on fresh tasks in-process (no Ray): reward, tool use, well-formed calls.

Used by ``scripts/train_tiny_policy.py`` to check the warm-up and by tests; the Ray rollout
(``rollout``) follows the same ``Episode`` rules with many instances and concurrent tools.
"""

from __future__ import annotations

from typing import Any

from libra.runtime.episode import Episode
from libra.runtime.protocol import prompt_text
from libra.runtime.tasks import TaskSet
from libra.runtime.tiny_model import encode
from libra.runtime.tools import ToolBox


def run_episode(engine: Any, ep: Episode, tools: ToolBox) -> Episode:
    """Drive one episode to its end on ``engine``."""
    tok = engine.tokenizer
    while not ep.done:
        res = engine.generate([ep.request()])[0]
        call = ep.on_generation(res, lambda ids: tok.decode(ids, skip_special_tokens=False))
        if call is not None:
            tr = tools.call(call.name, call.args)
            text = Episode.response_text(tr)
            ep.on_tool_result(tr, encode(tok, text), text)
    return ep


def evaluate_policy(engine: Any, n: int = 32, seed: int = 0, kinds: dict[str, float] | None = None, temperature: float = 1.0) -> dict[str, float]:
    """Mean reward, share of trajectories calling a tool, share of calls well formed."""
    tools = ToolBox(timeout_s=5.0)
    tasks = TaskSet(kinds or {"math": 1, "math2": 1, "search": 1}, seed=seed).batch(0, n)
    eps = []
    for i, t in enumerate(tasks):
        ep = Episode(f"eval-{i}", 0, f"p{i}", t, encode(engine.tokenizer, prompt_text(t.question)), temperature=temperature, seed=seed + i)
        eps.append(run_episode(engine, ep, tools))
    calls = [turn for e in eps for turn in e.turns if turn.tool is not None]
    return {
        "reward": sum(e.reward for e in eps) / len(eps),
        "used_tool": sum(1 for e in eps if any(t.tool for t in e.turns)) / len(eps),
        "well_formed_calls": (sum(1 for t in calls if t.tool in ("python", "search")) / len(calls)) if calls else 0.0,
        "tool_ok": (sum(1 for t in calls if t.outcome == "ok") / len(calls)) if calls else 0.0,
        "n": float(len(eps)),
    }
