"""Reshape a tau2-bench telecom results file (dual control) into `--from openai-chat` JSONL.

Usage: python reshape_tau2_telecom.py <results.json> <llm_agent.py> <out.jsonl>

Adapted from the inline script of ``experiments/data/held_out_9/README.md`` (tau2 retail,
GPT-4.1); nothing is imported from outside this folder. The input is tau2's results JSON
``{timestamp, info, tasks, simulations}``; ``llm_agent.py`` is ``src/tau2/agent/llm_agent.py``
at the run's tau2 commit (``info.git_commit``), read (not imported) for the agent's system-prompt
template. One OpenAI-format chat line is written per simulation (rules in this folder's README,
"Conversion"). What differs from the retail script is the telecom domain's **dual control**: the
simulated user also calls tools, on its own (simulated) phone. tau2's orchestrator sends a user
message with tool calls to the environment and the results back to the *user*; only the user's
text messages reach the agent. So the user's tool calls and their results are left out of the
agent's conversation, and the time they took (the user's extra LLM calls and the device tools)
is part of the latency of the agent's ``respond`` turn, which is read as the user's text reply
timestamp minus the agent's message timestamp.

Only the structure and the texts needed for token counting go into the intermediate file; the
converter keeps counts, not text. The task ids (descriptive strings holding the task's issue and
persona) are replaced by a hash.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import statistics
import sys
from datetime import datetime

GREETING = "Hi! How can I help you today?"  # tau2's fixed first agent message (not generated)
#: tau2 termination reason -> trace ``finish``. ``user_stop`` stays null, as in held_out_9 (the
#: user's ###STOP### / ###TRANSFER### answers the agent's last text; the converter drops that
#: last ``respond``). ``max_steps`` (200 orchestrator steps) and ``too_many_errors`` (10 tool
#: errors) end the run right after an agent tool call whose result was logged: the call is kept.
FINISH = {"user_stop": None, "max_steps": "tool_limit", "too_many_errors": "abort"}


def strip_literal(path: str, name: str) -> str:
    """``name = \"\"\"...\"\"\".strip()`` (or a plain string) at module level in ``path``, read with ast."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            v = node.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "strip" and not v.args:
                return ast.literal_eval(v.func.value).strip()
            return ast.literal_eval(v)
    raise KeyError(name)


def ts(m: dict) -> datetime:
    return datetime.fromisoformat(m["timestamp"])


def main() -> None:
    src, agent_py, out_path = sys.argv[1:4]
    d = json.load(open(src, encoding="utf-8"))
    info = d["info"]
    assert info["environment_info"]["domain_name"] == "telecom", info["environment_info"]["domain_name"]
    assert info["agent_info"]["implementation"] == "llm_agent" and info["user_info"]["implementation"] == "user_simulator"
    model = info["agent_info"]["llm"]
    instruction = strip_literal(agent_py, "AGENT_INSTRUCTION")
    template = strip_literal(agent_py, "SYSTEM_PROMPT")
    policy = info["environment_info"]["policy"]
    system = template.format(domain_policy=policy, agent_instruction=instruction)
    # the layout held_out_9 wrote out by hand
    assert system == f"<instructions>\n{instruction}\n</instructions>\n<policy>\n{policy}\n</policy>"
    stats: collections.Counter = collections.Counter()
    device_calls: list[int] = []  # per respond turn: the user's tool calls on its device
    user_gens: list[int] = []  # per respond turn: the simulated user's LLM calls
    respond_lat: dict[bool, list[float]] = {True: [], False: []}  # by "the user used its device"
    rows = []
    for s in d["simulations"]:
        first, *rest = s["messages"]
        assert first["role"] == "assistant" and first["content"] == GREETING and not first.get("tool_calls") and first.get("usage") is None
        assert rest and rest[0]["role"] == "user" and not rest[0].get("tool_calls"), s["task_id"]
        assert all(ts(a) <= ts(b) for a, b in zip(s["messages"], s["messages"][1:])), s["task_id"]
        msgs: list[dict] = [{"role": "system", "content": system}, {"role": "system", "content": GREETING}]
        prev = None  # the last message the agent's conversation holds
        pending_user: set[str] = set()  # the user's tool calls awaiting their results
        pending_agent: set[str] = set()
        n_dev = n_gen = 0
        for m in rest:
            role = m["role"]
            if role == "assistant":
                assert not pending_agent and not pending_user, s["task_id"]
                calls = m.get("tool_calls") or []
                assert not (calls and m.get("content")), s["task_id"]  # tau2 rejects text with calls
                if m.get("errors"):
                    stats["assistant messages after a format retry (hidden extra call)"] += 1
                out = {"role": "assistant", "content": m["content"] or ""}
                if calls:
                    assert all(c.get("requestor", "assistant") == "assistant" for c in calls)
                    out["tool_calls"] = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in calls]
                    pending_agent = {c["id"] for c in calls}
                    stats["agent tool calls"] += len(calls)
                    if len(calls) > 1:
                        stats["agent messages with several calls"] += 1
                msgs.append(out)
                prev = m
                n_dev = n_gen = 0
            elif role == "tool" and m["requestor"] == "assistant":
                assert m["id"] in pending_agent, s["task_id"]
                pending_agent.discard(m["id"])
                msgs.append({"role": "tool", "tool_call_id": m["id"], "content": m["content"] or "", "error": m["error"],
                             "latency_s": max(0.0, (ts(m) - ts(prev)).total_seconds())})
                stats["agent tool results, error" if m["error"] else "agent tool results, ok"] += 1
                prev = m
            elif role == "user" and m.get("tool_calls"):
                # the user acting on its phone: goes to the environment, never to the agent
                assert not m.get("content") and not pending_user, s["task_id"]
                assert all(c.get("requestor") == "user" for c in m["tool_calls"])
                pending_user = {c["id"] for c in m["tool_calls"]}
                n_dev += len(m["tool_calls"])
                n_gen += 1
                stats["left out: user (device) tool calls"] += len(m["tool_calls"])
                stats["left out: user messages with tool calls"] += 1
            elif role == "tool" and m["requestor"] == "user":
                assert m["id"] in pending_user, s["task_id"]
                pending_user.discard(m["id"])
                stats["left out: user (device) tool results"] += 1
                if m["error"]:
                    stats["left out: user (device) tool results, error"] += 1
            elif role == "user":
                assert not pending_user, s["task_id"]
                out = {"role": "user", "content": m["content"] or ""}
                if prev is not None:  # the agent's text reply: its answer, after any device actions
                    lat = max(0.0, (ts(m) - ts(prev)).total_seconds())
                    out["latency_s"] = lat
                    assert prev["role"] == "assistant" and not prev.get("tool_calls"), s["task_id"]
                    device_calls.append(n_dev)
                    user_gens.append(n_gen + 1)
                    respond_lat[n_dev > 0].append(lat)
                msgs.append(out)
                prev = m
                n_dev = n_gen = 0
            else:
                raise ValueError(f"{s['task_id']}: unexpected message {role} {m.get('requestor')}")
        reason = s["termination_reason"]
        finish = FINISH[reason]
        last = s["messages"][-1]
        if finish is None:
            assert last["role"] == "user" and not last.get("tool_calls") and ("###STOP###" in last["content"] or "###TRANSFER###" in last["content"]), s["task_id"]
            stats["ends with ###TRANSFER###" if "###TRANSFER###" in last["content"] else "ends with ###STOP###"] += 1
        else:
            assert last["role"] == "tool" and last["requestor"] == "assistant" and not pending_agent, (s["task_id"], reason)
        stats[f"termination {reason}"] += 1
        group = "telecom-t" + hashlib.sha1(s["task_id"].encode("utf-8")).hexdigest()[:10]
        rows.append((group, int(s["trial"]), {
            "id": f"{group}-trial{s['trial']}", "group": group, "reward": float(s["reward_info"]["reward"]),
            "finish": finish, "model": model, "messages": msgs}))
    assert len({(g, t) for g, t, _ in rows}) == len(rows)
    rows.sort(key=lambda x: (x[0], x[1]))  # hashed task id order (the raw ids sort by issue type)
    with open(out_path, "w", encoding="utf-8") as f:
        for *_k, rec in rows:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    q = lambda xs: f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"  # noqa: E731
    print(len(rows), "runs;", len({g for g, _t, _r in rows}), "tasks; model", model, "; reward 1:", sum(r["reward"] == 1 for *_k, r in rows))
    print(dict(sorted(stats.items())))
    print("respond turns answered:", len(device_calls), "; with device actions:", sum(x > 0 for x in device_calls),
          "; device calls per respond min/median/max", min(device_calls), statistics.median(device_calls), max(device_calls),
          "; user LLM calls per respond", min(user_gens), statistics.median(user_gens), max(user_gens))
    print("respond latency s, user used its device:", q(respond_lat[True]), "; text only:", q(respond_lat[False]))
    print("sha256", hashlib.sha256(open(out_path, "rb").read()).hexdigest())


if __name__ == "__main__":
    main()
