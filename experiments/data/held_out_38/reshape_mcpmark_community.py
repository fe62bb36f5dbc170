"""Reshape the MCPMark community experiments (MCP-server tool-use agents on GitHub, Notion and
PostgreSQL) into OpenAI-chat JSONL for ``libra-sim convert --from openai-chat`` (held-out set 38).

Input: a git directory of https://github.com/eval-sys/mcpmark-community-experiments (the ``fetch``
tool's snapshot, read with ``git --git-dir=... cat-file``; nothing in it is executed). Read, per
run: ``mcp_servers/<service>/<server>/run-<k>/<task>/messages.json`` (the OpenAI Agents SDK /
Responses-API item list the MCPMark harness saved: the user task, then ``message`` (assistant
text), ``function_call`` and ``function_call_output`` items) and the ``meta.json`` beside it
(``execution_result.success``, ``error_message``, ``turn_count``, ``agent_execution_time``,
``token_usage``, model names). Standard library only.

Mapping: one model response = the run of non-output items (assistant text and/or function calls)
between tool outputs, rendered as one assistant message with ``tool_calls`` (the call's function
name = the MCP tool name, arguments verbatim); each ``function_call_output`` is a ``tool`` message
(content = the output text verbatim; ``outcome`` from
``outcome_of``: error text in the first 300 characters -> error, a timeout notice -> timeout). Two supabase runs were saved as Chat-Completions
messages instead (``convert_chat``). A response with no call ends the run (``finish: "stop"``);
a run whose item list ends on a tool output was cut by the harness (error, timeout or turn limit:
``finish: "abort"``, or ``"tool_limit"`` when the error names the turn limit). A run whose
``messages.json`` is absent from the snapshot (objects of 4 MiB or more are not stored) is skipped. ``reward`` = 1 if
MCPMark's verifier passed (``execution_result.success``) else 0. ``group`` = service/server/task
(the 4 runs of one task on one MCP server implementation); steps: groups ordered by sha1 of the
group name, ``--groups-per-step`` groups to a step (a group never spans two steps).
No tool latency is recorded per call (only the run's ``agent_execution_time``), so none is written.

Usage: python reshape_mcpmark_community.py SNAPSHOT_GIT_DIR OUT.jsonl [--groups-per-step 42]
Prints counters and a sha256 digest over the files read (sorted lines "<sha256>  <path>").
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import json
import re
import subprocess

ROOT = "mcp_servers"


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


#: An MCP tool result that reports a failure: the servers return errors as text (GitHub's
#: "failed to ...: 422 Validation Failed", Postgres "Error: syntax error ...", "Error executing SQL
#: query", Notion's "CRITICAL ERROR"/"Error:"), often inside a JSON envelope, and no is-error flag
#: survives in the saved item; so the first 300 characters are matched. A timeout notice -> timeout.
_ERROR = re.compile(r"[Ff]ailed to |Error executing|Error:|CRITICAL ERROR|Validation Failed|"
                    r'"isError": ?true|\bERROR:')
_TIMEOUT = re.compile(r"timed out|TimeoutError|timeout exceeded", re.IGNORECASE)


def outcome_of(output: str) -> str:
    head = output[:300]
    if _TIMEOUT.search(head):
        return "timeout"
    return "error" if _ERROR.search(head) else "ok"


def assistant_text(content) -> str:
    """An assistant ``message`` item's text: the content is a list of ``output_text`` parts, saved
    as its Python repr (a string) by the harness; parsed with ``ast.literal_eval``."""
    parts = content
    if isinstance(content, str):
        try:
            parts = ast.literal_eval(content)
        except (ValueError, SyntaxError):
            return content
    if isinstance(parts, list):
        return "".join(p.get("text", "") for p in parts if isinstance(p, dict))
    return str(parts)


def convert_chat(items: list[dict]) -> tuple[list[dict], bool]:
    """The few runs saved as Chat-Completions messages (2 supabase runs: ``system``, ``user``,
    ``assistant`` with ``tool_calls`` as a Python-repr string, ``tool``): the same messages, calls
    parsed."""
    msgs: list[dict] = []
    for it in items:
        m = {"role": it["role"], "content": it.get("content") or ""}
        if it["role"] == "assistant":
            calls = it.get("tool_calls")
            if isinstance(calls, str) and calls not in ("", "None"):
                calls = ast.literal_eval(calls)
            if calls:
                m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": c["function"].get("arguments", "")}} for c in calls]
        elif it["role"] == "tool":
            m["tool_call_id"] = it.get("tool_call_id")
            m["outcome"] = outcome_of(m["content"])
        msgs.append(m)
    return msgs, bool(msgs) and msgs[-1]["role"] == "tool"


def convert(items: list[dict]) -> tuple[list[dict], bool]:
    """(OpenAI chat messages, whether the list ends on a tool output)."""
    if any(it.get("type") is None and it.get("role") in ("system", "assistant", "tool") for it in items):
        return convert_chat(items)
    msgs: list[dict] = []
    i = 0
    while i < len(items) and items[i].get("role") == "user" and items[i].get("type") is None:
        msgs.append({"role": "user", "content": items[i]["content"]})
        i += 1
    cur: dict | None = None
    ends_on_output = False
    for it in items[i:]:
        t = it.get("type")
        if t == "function_call_output":
            cur = None
            out = str(it.get("output", ""))
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": out, "outcome": outcome_of(out)})
            ends_on_output = True
            continue
        ends_on_output = False
        if cur is None:
            cur = {"role": "assistant", "content": ""}
            msgs.append(cur)
        if t == "message":
            cur["content"] += assistant_text(it.get("content"))
        elif t == "function_call":
            cur.setdefault("tool_calls", []).append({"id": it["call_id"], "type": "function", "function": {
                "name": it["name"], "arguments": it.get("arguments", "")}})
        else:
            raise SystemExit(f"unknown item type {t!r}")
    return msgs, ends_on_output


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--groups-per-step", type=int, default=42)
    a = ap.parse_args()
    files = git(a.gitdir, "ls-tree", "-r", "--name-only", "HEAD", ROOT).decode().split("\n")
    runs = sorted(f[: -len("/messages.json")] for f in files if f.endswith("/messages.json"))
    digest_lines = []
    count: collections.Counter = collections.Counter()
    by_group: dict[str, list[dict]] = collections.defaultdict(list)
    for run in runs:
        service, server, rk, task = run.split("/")[1:5]
        if subprocess.run(["git", "--git-dir", a.gitdir, "cat-file", "-e", f"HEAD:{run}/messages.json"],
                          capture_output=True).returncode != 0:
            count[f"messages.json absent from the snapshot (not converted): {run}"] += 1
            continue
        raw_m = git(a.gitdir, "show", f"HEAD:{run}/messages.json")
        raw_meta = git(a.gitdir, "show", f"HEAD:{run}/meta.json")
        digest_lines += [f"{hashlib.sha256(raw_m).hexdigest()}  {run}/messages.json",
                         f"{hashlib.sha256(raw_meta).hexdigest()}  {run}/meta.json"]
        meta = json.loads(raw_meta)
        msgs, ends_on_output = convert(json.loads(raw_m))
        res = meta.get("execution_result") or {}
        err = res.get("error_message") or ""
        if not any(m["role"] == "assistant" for m in msgs):
            count[f"no model turn (not converted; success {res.get('success')}, error {err[:60]!r})"] += 1
            continue
        if ends_on_output:
            finish = "tool_limit" if "turn" in err.lower() else "abort"
        else:
            finish = "stop"
        count[f"finish {finish} (success {res.get('success')}, error set {bool(err)})"] += 1
        if err:
            count[f"error message: {re.sub(r'[0-9]+', 'N', err[:60])!r}"] += 1
        model = meta.get("litellm_run_model_name") or meta.get("model_name")
        count[f"service {service} server {server} model {model}"] += 1
        group = f"{service}/{server}/{task}"
        by_group[group].append({"id": f"mcpmark-{service}-{server}-{rk}-{task}", "group": group,
                                "reward": 1.0 if res.get("success") else 0.0, "finish": finish,
                                "model": model, "messages": msgs})
    order = sorted(by_group, key=lambda g: hashlib.sha1(g.encode()).hexdigest())
    n = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for gi, g in enumerate(order):
            for rec in sorted(by_group[g], key=lambda r: r["id"]):
                rec = {"id": rec["id"], "step": gi // a.groups_per_step, **{k: v for k, v in rec.items() if k != "id"}}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
    for k, v in sorted(count.items()):
        print(f"{k}: {v}")
    print("group sizes", sorted(collections.Counter(len(v) for v in by_group.values()).items()))
    print("success", round(sum(r["reward"] for v in by_group.values() for r in v) / n, 4))
    print("digest", hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest(), f"({len(digest_lines)} files)")
    print(f"wrote {n} conversations in {len(order)} groups to {a.out}")


if __name__ == "__main__":
    main()
