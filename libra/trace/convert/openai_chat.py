"""Load conversations in the OpenAI chat messages format (``libra-sim convert --from openai-chat``).

One conversation per JSONL line, either a JSON list of messages or an object::

    {"id": "t1", "step": 3, "group": "task-17", "reward": 1.0, "finish": "stop", "model": "...",
     "messages": [
       {"role": "system", "content": "..."},
       {"role": "user", "content": "..."},
       {"role": "assistant", "content": "...", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "python", "arguments": "{\\"code\\": \\"...\\"}"}}]},
       {"role": "tool", "tool_call_id": "c1", "content": "...", "latency_s": 0.42, "outcome": "ok"},
       {"role": "assistant", "content": "The answer is 7."}]}

* roles ``system``/``developer``/``user`` before the first assistant message are the prompt;
  each assistant message is a turn (consecutive ones are one generation); ``tool`` messages
  (and ``user`` messages between turns: environment feedback) are the tool return;
* the turn's tool is the first tool call's function name (a legacy ``function_call`` too); an
  assistant message followed by tool messages but without calls is ``format_error``; one without
  calls answered by a ``user`` message is a reply to a (simulated) user, tool ``respond``
  (tau-bench's action name for it), outcome ok: the user's answer is its return;
* per-tool latency, when recorded: ``latency_s``, ``tool_latency_s``, ``duration_s`` or
  ``duration_ms`` on the tool message (several results of one turn: their sum) or on the call;
* outcome, when recorded: ``outcome`` (ok/error/timeout), ``is_error``/``error`` (bool),
  ``returncode``/``exit_code`` on the tool message; else read off the text
  (``outcome.classify_outcome``);
* ``finish``: the trace's own values, or OpenAI's ``finish_reason`` (stop, length,
  tool_calls -> tool_limit, content_filter -> abort); absent: null;
* ``reward`` (or ``score``); ``group`` (else conversations of one step with the same prompt
  messages form a group, as GRPO samples do); ``step`` (else ``--step``); ``id`` (else
  ``FILE-STEM:LINE``).

Token counts render what a Qwen/Hermes chat template puts in the context: each message's text
plus 5 framing tokens, a call as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``,
a result as ``<tool_response>\\n...\\n</tool_response>``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from libra.trace.convert.chat import AgentRun, Message, SkipRun, content_text, record_fields
from libra.trace.convert.jsonl import Line
from libra.trace.records import FINISHES, Finish

_PROMPT_ROLES = ("system", "developer", "user")
_FINISH_REASONS: dict[str, Finish] = {"tool_calls": "tool_limit", "function_call": "tool_limit", "content_filter": "abort"}
_OUTCOMES = ("ok", "error", "timeout")
#: Tool of an assistant turn without tool calls that a ``user`` message answers: a multi-turn chat
#: with a (simulated) user, as in tau-bench, whose agents name this action ``respond``.
RESPOND_TOOL = "respond"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0 else None


def _latency(d: dict[str, Any]) -> float | None:
    for key in ("latency_s", "tool_latency_s", "duration_s"):
        v = _number(d.get(key))
        if v is not None:
            return v
    ms = _number(d.get("duration_ms"))
    return ms / 1000.0 if ms is not None else None


def _call_text(call: dict[str, Any]) -> tuple[str, str | None, float | None]:
    """(the call as a Qwen/Hermes template renders it, the function name, a latency recorded on
    the call)."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name") if isinstance(fn.get("name"), str) and fn.get("name") else None
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # kept as the text the model wrote
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>", name, _latency(call)


def _outcome(m: dict[str, Any], where: str) -> tuple[str | None, int | None]:
    """(recorded outcome, recorded exit code) of a tool message."""
    out = m.get("outcome")
    if out is not None:
        if out not in _OUTCOMES:
            raise SkipRun(f"{where}.outcome must be one of ok, error, timeout, got {out!r}")
        return out, None
    for key in ("is_error", "error"):
        if isinstance(m.get(key), bool):
            return ("error" if m[key] else "ok"), None
    for key in ("returncode", "exit_code"):
        rc = m.get(key)
        if isinstance(rc, int) and not isinstance(rc, bool):
            return None, rc
    return None, None


def _finish(value: Any, field: str = "finish") -> Finish | None:
    if value is None:
        return None
    if value in FINISHES:
        return value  # type: ignore[no-any-return]
    if value in _FINISH_REASONS:
        return _FINISH_REASONS[value]
    raise SkipRun(f"{field} must be one of {', '.join(FINISHES)} (or an OpenAI finish_reason), got {value!r}")


def prompt_key(messages: list[dict[str, Any]]) -> str:
    """A short digest of the prompt messages: conversations with the same prompt are samples of
    one task (a GRPO group) when the log names no group."""
    prompt = []
    for m in messages:
        if m.get("role") == "assistant":
            break
        prompt.append([m.get("role"), content_text(m.get("content"))])
    return hashlib.sha1(json.dumps(prompt, ensure_ascii=False).encode("utf-8")).hexdigest()[:12]


def load_conversation(line: Line, default_step: int) -> tuple[AgentRun, int, str | None]:
    """One line as an ``AgentRun``, with its step and group (None: derive from the prompt).
    Raises ``SkipRun`` with the reason when the line holds no convertible conversation."""
    where = line.where
    v = line.value
    if line.error is not None:
        raise SkipRun(line.error)
    rec: dict[str, Any] = {"messages": v} if isinstance(v, list) else v if isinstance(v, dict) else {}
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise SkipRun("no 'messages' list (expected a JSON list of messages or an object with 'messages')")
    step, group, reward = record_fields(rec, default_step, ("reward", "score"))
    finish = _finish(rec.get("finish", rec.get("finish_reason")))
    messages: list[Message] = []
    seen_assistant = False
    for k, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise SkipRun(f"messages[{k}] must be an object with a 'role'")
        role = m["role"]
        text = content_text(m.get("content"))
        if role == "assistant":
            seen_assistant = True
            calls = m.get("tool_calls") if isinstance(m.get("tool_calls"), list) else []
            if isinstance(m.get("function_call"), dict):
                calls = [*calls, {"function": m["function_call"]}]
            rendered = [_call_text(c) for c in calls if isinstance(c, dict)]
            name = next((n for _t, n, _l in rendered if n), None)
            lat = [x for _t, _n, x in rendered if x is not None]
            body = "\n".join([text, *(t for t, _n, _l in rendered)]) if rendered else text
            messages.append(Message("assistant", body, command=name, latency_s=sum(lat) if lat else None))
            if "finish_reason" in m and k == len(msgs) - 1 and finish is None:
                finish = _finish(m["finish_reason"], f"messages[{k}].finish_reason")
        elif role == "tool" or role == "function" or (role in ("user", "ipython") and seen_assistant):
            outcome, rc = _outcome(m, f"messages[{k}]") if role != "user" else (None, None)
            if role == "user" and messages[-1].role == "assistant" and messages[-1].command is None:
                messages[-1].command, outcome = RESPOND_TOOL, "ok"  # the user answers a text reply
            shown = f"<tool_response>\n{text}\n</tool_response>" if role != "user" else text
            messages.append(Message("tool" if role != "user" else "user", shown, latency_s=_latency(m), outcome=outcome, returncode=rc))
        elif role in _PROMPT_ROLES:
            messages.append(Message(role, text))
        else:
            raise SkipRun(f"messages[{k}]: unknown role {role!r} (system, developer, user, assistant, tool)")
    if not seen_assistant:
        raise SkipRun("no model turn (no assistant message)")
    tid = rec.get("id")
    run = AgentRun(where, str(tid) if isinstance(tid, (str, int)) and str(tid) else f"{line.path.name.split('.')[0]}:{line.lineno}",
                   messages, None, finish, float(reward) if reward is not None else None,
                   rec.get("model") if isinstance(rec.get("model"), str) else None)
    return run, step, str(group) if group is not None else None
