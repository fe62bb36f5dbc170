"""Load SWE-agent (``*.traj``) and mini-swe-agent (``*.traj.json``) trajectory files.

Formats (read from the projects' own save code, SWE-agent 1.x and mini-swe-agent 1.x/2.x):

* **SWE-agent** ``.traj``: ``{"trajectory": [step...], "history": [message...], "info": {...}}``.
  A step has ``action``, ``observation``, ``response``, ``thought``, ``execution_time`` (s),
  ``query``; a history message has ``role``, ``content``, ``message_type``
  (``system_prompt``/``thought``/``action``/``observation``...), and optionally ``is_demo``,
  ``action``, ``tool_calls``. ``info`` has ``exit_status`` (``submitted``, ``exit_cost``,
  ``exit_context``, ``exit_format``, ``exit_error``, ``submitted (exit_cost)``...),
  ``submission``, ``model_stats``. Turns come from ``history``; the i-th assistant message takes
  ``execution_time`` and ``action`` of the i-th step when the counts agree (else latency null).
  Without a history, turns are rebuilt from the steps (prompt from the first step's ``query``).
* **mini-swe-agent** ``.traj.json``: ``{"info": {"exit_status", "submission", "model_stats",
  "config"}, "messages": [...], "trajectory_format": "mini-swe-agent-1"|"mini-swe-agent-1.1"}``.
  v1 messages are ``{role, content}``; actions are the fenced ``bash``/``mswea_bash_command``
  block of an assistant message (mini's own regex, or the run's ``config.agent.action_regex``;
  an untagged fence is no action). v2 messages are the model's native messages plus ``extra``:
  ``tool_calls`` (``{"command": ...}`` arguments) or ``extra.actions``, tool messages with
  ``extra.returncode``/``timestamp``, and a final ``{"role": "exit", "extra": {"exit_status"}}``.

``finish`` from the exit status: ``submitted`` -> stop; ``exit_cost``/``exit_context`` (also
"submitted (exit_cost)", an auto-submission at the cost limit) -> length; step or time limits
(mini's ``LimitsExceeded`` when the step limit was reached) -> tool_limit, and mini's
``LimitsExceeded`` below the step limit (the cost limit) -> length; any other exit (format,
API, environment errors, exceptions, interruptions) -> abort; no status -> null.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from libra.trace.convert.chat import AgentRun, Message, SkipRun, content_text
from libra.trace.records import Finish

SUFFIXES: tuple[str, ...] = (".traj.json", ".traj")
#: mini-swe-agent's own action regexes (v1 ``bash``, v2 ``mswea_bash_command`` fences): an untagged
#: fence is no action (models quote code in their thoughts with it), a run's recorded
#: ``config.agent.action_regex`` replaces this one.
_FENCE = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)


def instance_id_of(path: Path) -> str:
    """``django__django-11099.traj`` -> ``django__django-11099`` (same for ``.traj.json``)."""
    name = path.name
    for suf in SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return path.stem


def finish_from_status(status: Any, info: dict[str, Any]) -> Finish | None:
    """The trace ``finish`` for an agent's exit status (rules in the module docstring)."""
    if not isinstance(status, str) or not status.strip():
        return None
    s = status.strip().lower()
    if "exit_cost" in s or "exit_context" in s or "context_window" in s or "contextwindow" in s:
        return "length"
    if s.startswith("submitted"):
        return "stop"
    if s == "limitsexceeded":
        cfg = (info.get("config") or {}).get("agent") or {}
        step_limit = cfg.get("step_limit") if isinstance(cfg, dict) else None
        calls = (info.get("model_stats") or {}).get("api_calls")
        if isinstance(step_limit, int) and step_limit > 0 and isinstance(calls, int) and calls >= step_limit:
            return "tool_limit"
        return "length"
    if "step_limit" in s or "max_steps" in s or "total_execution_time" in s or "exit_steps" in s:
        return "tool_limit"
    return "abort"


def _tool_call_text(tool_calls: Any) -> tuple[str, str | None]:
    """(text of all tool-call arguments, the first call's ``command`` argument if any)."""
    if not isinstance(tool_calls, list):
        return "", None
    texts: list[str] = []
    command: str | None = None
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            continue
        args = fn.get("arguments")
        texts.append(f"{fn.get('name', '')} {args if isinstance(args, str) else json.dumps(args)}")
        parsed = args
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError:
                parsed = None
        if command is None and isinstance(parsed, dict):
            c = parsed.get("command") or parsed.get("cmd")
            if isinstance(c, str):
                command = c
            elif isinstance(fn.get("name"), str):  # a non-shell tool: its name is the tool
                command = fn["name"]
    return "\n".join(texts), command


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _load_swe_agent(path: Path, data: dict[str, Any]) -> AgentRun:
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    steps = data.get("trajectory") if isinstance(data.get("trajectory"), list) else []
    history = data.get("history") if isinstance(data.get("history"), list) else []
    messages: list[Message] = []
    if history:
        for h in history:
            if not isinstance(h, dict):
                continue
            role = h.get("role", "user")
            text = content_text(h.get("content"))
            command = h.get("action") if isinstance(h.get("action"), str) else None
            if role == "assistant":
                extra_text, call_cmd = _tool_call_text(h.get("tool_calls"))
                if extra_text and extra_text not in text:
                    text = f"{text}\n{extra_text}" if text else extra_text
                command = command if command is not None else call_cmd
                if command is None:
                    command = ""  # SWE-agent only records parsed actions: an empty one is still one
            messages.append(Message(role, text, is_demo=bool(h.get("is_demo")), command=command))
        assistants = [m for m in messages if m.role == "assistant" and not m.is_demo]
        if steps and len(steps) == len(assistants):
            for m, st in zip(assistants, steps):
                if isinstance(st, dict):
                    m.latency_s = _number(st.get("execution_time"))
                    if isinstance(st.get("action"), str):
                        m.command = st["action"]
    elif steps:
        first = steps[0] if isinstance(steps[0], dict) else {}
        for q in first.get("query") or []:
            if isinstance(q, dict) and q.get("role") != "assistant":
                messages.append(Message(q.get("role", "user"), content_text(q.get("content"))))
        for st in steps:
            if not isinstance(st, dict):
                continue
            messages.append(Message("assistant", content_text(st.get("response")), command=str(st.get("action") or ""),
                                    latency_s=_number(st.get("execution_time"))))
            obs = st.get("observation")
            if obs is not None:
                messages.append(Message("user", content_text(obs)))
    status = info.get("exit_status")
    model = None
    rc = data.get("replay_config")
    if isinstance(rc, str):
        try:
            rc = json.loads(rc)
        except json.JSONDecodeError:
            rc = None
    if isinstance(rc, dict):
        name = ((rc.get("agent") or {}).get("model") or {}).get("name")
        model = name if isinstance(name, str) else None
    resolved = info.get("resolved")
    return AgentRun(str(path), instance_id_of(path), messages, status if isinstance(status, str) else None,
                    finish_from_status(status, info), 1.0 if resolved is True else 0.0 if resolved is False else None,
                    model)


def _action_regex(info: dict[str, Any]) -> re.Pattern[str]:
    """The run's own ``config.agent.action_regex`` when it recorded one that compiles, else ``_FENCE``."""
    agent = (info.get("config") or {}).get("agent") if isinstance(info.get("config"), dict) else None
    pattern = agent.get("action_regex") if isinstance(agent, dict) else None
    if isinstance(pattern, str) and pattern:
        try:
            return re.compile(pattern, re.DOTALL)
        except re.error:
            pass
    return _FENCE


def _load_mini(path: Path, data: dict[str, Any]) -> AgentRun:
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    status = info.get("exit_status")
    fence = _action_regex(info)
    messages: list[Message] = []
    for m in data.get("messages") or []:
        if not isinstance(m, dict):
            continue
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        kind = m.get("type")
        role = m.get("role") or {"function_call": "assistant", "reasoning": "assistant",
                                 "function_call_output": "tool"}.get(kind, "user")
        text = content_text(m.get("content") if "content" in m else m.get("output", m.get("summary")))
        msg = Message(role, text, timestamp=_number(extra.get("timestamp")))
        if role == "assistant":
            call_text, command = _tool_call_text(m.get("tool_calls"))
            if kind == "function_call":
                call_text, command = _tool_call_text([{"function": {"name": m.get("name"), "arguments": m.get("arguments")}}])
            actions = extra.get("actions")
            if isinstance(actions, list) and actions and isinstance(actions[0], dict) and isinstance(actions[0].get("command"), str):
                command = actions[0]["command"]
            if command is None:
                found = fence.findall(text)
                command = found[0].strip() if len(found) == 1 else None
            msg.text = f"{text}\n{call_text}" if call_text else text
            msg.command = command
        elif role == "exit":
            if status in (None, "") and isinstance(extra.get("exit_status"), str):
                status = extra["exit_status"]
        else:
            rc = extra.get("returncode")
            msg.returncode = rc if isinstance(rc, int) and not isinstance(rc, bool) else None
        messages.append(msg)
    # v1 (no "exit" message) appends the terminating exception's text as a last user message
    # ("Submitted" carries the submission, "LimitsExceeded" is empty): the run is over, so it is
    # no observation the model saw.
    has_exit = any(m.role == "exit" for m in messages)
    if not has_exit and isinstance(status, str) and status and messages and messages[-1].role == "user":
        if any(m.role == "assistant" for m in messages):
            messages[-1].role = "exit"
    cfg = (info.get("config") or {}).get("model") if isinstance(info.get("config"), dict) else None
    model = cfg.get("model_name") if isinstance(cfg, dict) and isinstance(cfg.get("model_name"), str) else None
    resolved = info.get("resolved")
    return AgentRun(str(path), instance_id_of(path), messages, status if isinstance(status, str) else None,
                    finish_from_status(status, info), 1.0 if resolved is True else 0.0 if resolved is False else None,
                    model)


def load_run(path: Path) -> AgentRun:
    """Load one trajectory file of either framework (told apart by its keys, not its name)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SkipRun(f"unreadable: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SkipRun(f"invalid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise SkipRun("not a JSON object")
    if isinstance(data.get("messages"), list):
        return _load_mini(path, data)
    if isinstance(data.get("trajectory"), list) or isinstance(data.get("history"), list):
        return _load_swe_agent(path, data)
    raise SkipRun("neither a SWE-agent trajectory (trajectory/history) nor a mini-swe-agent one (messages)")
