"""Rebuild AgentDojo's benign (no-attack) benchmark runs (ethz-spylab/agentdojo, ``runs/`` at
commit 96046ab) as OpenAI-format chat JSONL for ``libra-sim convert --from openai-chat``.

Input: the folder ``runs/`` extracted from commit 96046ab54a99f5e5ec86b920ea9a2d8ae24ea6d8
(``git archive <commit> runs``; the same ``runs`` tree, 472cbb2e, stands until a fork deleted it),
passed as the first argument; only the ``<pipeline>/<suite>/<task>/none/none.json`` files of the 22 undefended
pipelines in ``PIPELINES`` are read. Each file is one run written by AgentDojo's ``TraceLogger``
(src/agentdojo/logging.py): ``{suite_name, pipeline_name, user_task_id, injection_task_id: null,
attack_type, injections: {}, messages, error, utility, security, duration[, evaluation_timestamp,
agentdojo_package_version, benchmark_version]}``. Output: the JSONL file named by the second
argument, one run per line, ordered by (step, suite, task, pipeline).

How a run was made (src/agentdojo/agent_pipeline/agent_pipeline.py, tool_execution.py and
benchmark.py at the same commit; nothing is executed here): the pipeline is ``[SystemMessage,
InitQuery, LLM, ToolsExecutionLoop([ToolsExecutor, LLM], max_iters=15)]``: the system message, the
task's prompt as the user message, one model call, then while the last assistant message has tool
calls (at most 15 rounds): every call of that message is run in-process on the suite's in-memory
environment (the result dumped as YAML, or the exception text in ``error``), then the model is
called again. ``run_task_without_injection_tasks`` catches context-length and provider 500 errors
(``error`` = "Skipping task ..."; utility False) and the run ends there.

Written per run: ``messages`` = the logged messages with content blocks joined into text; an
assistant message's ``tool_calls`` rendered in the OpenAI layout (``function.name`` = the called
function, ``arguments`` = its JSON arguments); a tool message's ``content`` = what the model was
shown (``error`` when the call raised, else the result: every LLM adapter in
src/agentdojo/agent_pipeline/llms/ sends the error text in that case) and ``outcome`` ``error`` /
``ok`` from ``error``. ``finish``: ``abort`` when the run ended on a caught API error, ``tool_limit``
when the last assistant message still asked for tools (the 15 rounds were used; its calls never
ran), else ``stop`` (the model answered without a call). Runs whose API error came before any
model reply (no assistant message) are left out and counted. ``reward`` = 1.0 / 0.0 from
``utility`` (the task's own check of the final environment and answer), ``group`` =
``<suite>/<task>`` (the pipelines' runs of one task), ``step`` = the task's index in its suite
(user tasks by number, then injection tasks by number) mod 5, ``model`` = the pipeline name,
``id`` ``agentdojo-<suite>-<task>-<pipeline>``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

#: Undefended pipelines (``runs/<name>``): one model each, ``defense: None`` in ``from_config``.
#: The defended variants (``-repeat_user_prompt``, ``-tool_filter``, ``-spotlighting_with_delimiting``,
#: ``-transformers_pi_detector``) add messages or model calls and are not read.
PIPELINES = [
    "Meta-SecAlign-70B", "claude-3-5-sonnet-20240620", "claude-3-5-sonnet-20241022",
    "claude-3-7-sonnet-20250219", "claude-3-haiku-20240307", "claude-3-opus-20240229",
    "claude-3-sonnet-20240229", "command-r", "command-r-plus", "gemini-1.5-flash-001",
    "gemini-1.5-flash-002", "gemini-1.5-pro-001", "gemini-1.5-pro-002", "gemini-2.0-flash-001",
    "gemini-2.0-flash-exp", "gpt-3.5-turbo-0125", "gpt-4-0125-preview", "gpt-4-turbo-2024-04-09",
    "gpt-4o-2024-05-13", "gpt-4o-mini-2024-07-18", "meta-llama_Llama-3-70b-chat-hf",
    "meta-llama_Llama-3.3-70B-Instruct",
]
SUITES = ["workspace", "travel", "banking", "slack"]
MAX_ITERS = 15  # ToolsExecutionLoop's default, used by from_config
N_STEPS = 5
TASK = re.compile(r"^(user|injection)_task_(\d+)$")


def text_of(content: Any) -> str:
    """A logged message's text: a string, null, or (newer logs) a list of ``{type: text, content}``
    blocks, joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for b in content:
            if not isinstance(b, dict) or b.get("type") != "text":
                raise ValueError(f"unexpected content block {b!r:.80}")
            parts.append(b.get("content") or "")
        return "".join(parts)
    raise ValueError(f"unexpected content {content!r:.80}")


def task_key(task: str) -> tuple[int, int]:
    """Sort key: user tasks by number, then injection tasks by number."""
    m = TASK.match(task)
    if m is None:
        raise ValueError(f"unexpected task id {task!r}")
    return (0 if m.group(1) == "user" else 1, int(m.group(2)))


def reshape_run(d: dict[str, Any], where: str, counts: collections.Counter[str]) -> tuple[list[dict[str, Any]], str] | None:
    """(OpenAI-format messages, finish) of one logged run, or None when it holds no model reply.
    Checks the run against the pipeline's rules and raises ``ValueError`` naming what broke."""
    msgs = d["messages"]
    roles = [m["role"] for m in msgs]
    if roles[:2] != ["system", "user"] or "system" in roles[2:] or "user" in roles[2:]:
        raise ValueError(f"{where}: expected system, user, then assistant/tool messages: {roles[:4]}")
    if "assistant" not in roles:
        if d["error"] is None:
            raise ValueError(f"{where}: no assistant message and no error")
        counts["left out: API error before any reply"] += 1
        return None
    out: list[dict[str, Any]] = [{"role": "system", "content": text_of(msgs[0]["content"])},
                                 {"role": "user", "content": text_of(msgs[1]["content"])}]
    pending: list[tuple[str | None, str]] = []  # (logged id, id written) of calls still unanswered
    n_assistant = 0
    for k, m in enumerate(msgs[2:], start=2):
        if m["role"] == "assistant":
            if pending:
                raise ValueError(f"{where}: messages[{k}]: assistant before all calls were answered")
            n_assistant += 1
            calls = m.get("tool_calls") or []
            rendered = []
            for j, c in enumerate(calls):
                cid = c.get("id") or f"call_{k}_{j}"  # older logs' (Gemini's) calls carry no or an empty id
                rendered.append({"id": cid, "type": "function",
                                 "function": {"name": c["function"], "arguments": json.dumps(c.get("args") or {}, ensure_ascii=False)}})
                pending.append((c.get("id") or None, cid))
                counts["calls"] += 1
            if len(calls) > 1:
                counts["turns with several calls"] += 1
            msg: dict[str, Any] = {"role": "assistant", "content": text_of(m.get("content"))}
            if rendered:
                msg["tool_calls"] = rendered
            out.append(msg)
        elif m["role"] == "tool":
            if not pending:
                raise ValueError(f"{where}: messages[{k}]: tool result without a call")
            logged, cid = pending.pop(0)  # ToolsExecutor answers the calls in order
            if (m.get("tool_call_id") or None) != logged:
                raise ValueError(f"{where}: messages[{k}]: tool_call_id {m.get('tool_call_id')!r} != {logged!r}")
            err = m.get("error")
            shown = err if err is not None else text_of(m.get("content"))
            out.append({"role": "tool", "tool_call_id": cid, "content": shown, "outcome": "error" if err is not None else "ok"})
            counts["tool results error" if err is not None else "tool results ok"] += 1
        else:
            raise ValueError(f"{where}: messages[{k}]: unexpected role {m['role']!r}")
    last = msgs[-1]
    if d["error"] is not None:
        if last["role"] != "tool" or pending:
            raise ValueError(f"{where}: an API error should end the run right after tool results")
        finish = "abort"
    elif last["role"] == "assistant" and last.get("tool_calls"):
        if n_assistant != MAX_ITERS + 1:
            raise ValueError(f"{where}: unanswered calls after {n_assistant} replies (expected {MAX_ITERS + 1})")
        finish = "tool_limit"
    elif last["role"] == "assistant":
        finish = "stop"
    else:
        raise ValueError(f"{where}: run ends on a tool result without an error")
    if finish != "tool_limit" and n_assistant > MAX_ITERS + 1:
        raise ValueError(f"{where}: {n_assistant} replies, more than the loop allows")
    return out, finish


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="the runs/ folder extracted from ethz-spylab/agentdojo at 96046ab")
    ap.add_argument("output", type=Path, help="JSONL to write (e.g. agentdojo-benign-22.jsonl)")
    args = ap.parse_args(argv)

    counts: collections.Counter[str] = collections.Counter()
    records: list[tuple[tuple[int, int, tuple[int, int], int], dict[str, Any]]] = []
    tasks: dict[str, set[str]] = {s: set() for s in SUITES}
    files = []
    for pi, pipe in enumerate(PIPELINES):
        for suite in SUITES:
            for f in sorted((args.runs / pipe / suite).glob("*/none/none.json")):
                files.append((pi, pipe, suite, f.parent.parent.name, f))
                tasks[suite].add(f.parent.parent.name)
    index = {s: {t: i for i, t in enumerate(sorted(ts, key=task_key))} for s, ts in tasks.items()}
    for pi, pipe, suite, task, f in files:
        d = json.loads(f.read_text(encoding="utf-8"))
        where = str(f.relative_to(args.runs))
        if (d["suite_name"], d["user_task_id"]) != (suite, task) or d["pipeline_name"] not in (pipe, "local"):
            raise ValueError(f"{where}: names in the file disagree with its path")
        if d["pipeline_name"] == "local":  # models served by AgentDojo's ``local`` LLM (vLLM endpoint)
            counts[f"pipeline_name local: {pipe}"] += 1
        if d.get("injection_task_id") is not None or d.get("injections"):
            raise ValueError(f"{where}: not a run without injections")
        got = reshape_run(d, where, counts)
        if got is None:
            continue
        messages, finish = got
        step = index[suite][task] % N_STEPS
        rec = {"id": f"agentdojo-{suite}-{task}-{pipe}", "step": step, "group": f"{suite}/{task}",
               "model": pipe, "reward": 1.0 if d["utility"] else 0.0, "finish": finish, "messages": messages}
        counts[f"finish {finish}"] += 1
        counts[f"model {pipe}"] += 1
        records.append(((step, SUITES.index(suite), task_key(task), pi), rec))
    records.sort(key=lambda r: r[0])
    with args.output.open("w", encoding="utf-8") as out:
        for _key, rec in records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    steps = collections.Counter(rec["step"] for _k, rec in records)
    print(len(records), "runs; steps", sorted(steps.items()))
    print(dict(sorted(counts.items())))
    print("sha256", hashlib.sha256(args.output.read_bytes()).hexdigest(), file=sys.stderr)


if __name__ == "__main__":
    main()
