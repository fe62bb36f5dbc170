"""Run the policy on fresh tasks in-process (no Ray): reward, tool use, well-formed calls.

Used by ``scripts/train_tiny_policy.py`` to check the warm-up, by ``heldout`` (``libra-run``'s
before/after evaluation) and by tests; the Ray rollout
(``rollout``) follows the same ``Episode`` rules with many instances and concurrent tools.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from libra.runtime.episode import Episode
from libra.runtime.chat_format import for_tokenizer
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
            text = ep.tool_text(tr)
            ep.on_tool_result(tr, encode(tok, text), text)
    return ep


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
                text = ep.tool_text(tr)
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


def evaluate_policy(engine: Any, n: int = 32, seed: int = 0, kinds: dict[str, float] | None = None, temperature: float = 1.0) -> dict[str, float]:
    """``summarize`` of ``n`` fresh tasks (seeded) run on ``engine``."""
    tasks = TaskSet(kinds or {"math": 1, "math2": 1, "search": 1}, seed=seed).batch(0, n)
    fmt = for_tokenizer(engine.tokenizer)
    eps = [Episode(f"eval-{i}", 0, f"p{i}", t, fmt.prompt_ids(t.question), temperature=temperature, seed=seed + i, fmt=fmt)
           for i, t in enumerate(tasks)]
    return summarize(run_episodes(engine, eps, ToolBox(timeout_s=5.0)))
