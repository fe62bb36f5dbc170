"""How a tool call ended, and which tool it was, from what an agent transcript shows.

Agent frameworks rarely record a structured status per tool call; the converters read it off
the observation text. Rules, in precedence order (documented in docs/trace-io.md):

1. **timeout** if the observation says the command timed out (mini-swe-agent's "timed out and
   has been killed", SWE-agent's "was cancelled because it took more than N seconds",
   ``TimeoutExpired``/``TimeoutError``, "timed out");
2. **error** if an exit code is known and non-zero; else, when no exit code is known, if the text
   shows a Python traceback, ``command not found``, ``No such file or directory``, a failed test
   summary (``N failed``, ``FAILED ...``, ``ERRORS``), an ``XxxError:`` line, or an agent tool's
   own rejection ("Your proposed edit has introduced new syntax error");
3. **ok** otherwise. A known exit code 0 is trusted over error-looking text (``cat`` of a log
   that contains a traceback is a successful ``cat``).
"""

from __future__ import annotations

import re

_TIMEOUT = re.compile(
    r"timed out|TimeoutExpired|TimeoutError|took (?:more|longer) than \d+ ?s|was cancelled because it took|"
    r"exceeded the (?:time|timeout) limit",
    re.IGNORECASE,
)
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|command not found|No such file or directory|"
    r"^\s*=+ .*\b\d+ (?:failed|errors?)\b|\b\d+ failed\b|^FAILED |^ERROR(?:S|:)? |"
    r"^\s*[A-Z]\w*(?:Error|Exception): |Your proposed edit has introduced new syntax error|"
    r"^(?:bash|sh|/bin/sh): .*: (?:syntax error|not found)",
    re.MULTILINE,
)
_RETURNCODE_TAG = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_WRAPPERS = frozenset({"sudo", "env", "time", "nohup", "exec", "command", "builtin"})
_PYTHON = re.compile(r"^python[\d.]*$")


def returncode_from_text(text: str) -> int | None:
    """The exit code mini-swe-agent's observation template prints (``<returncode>N</returncode>``)."""
    m = _RETURNCODE_TAG.search(text)
    return int(m.group(1)) if m else None


def classify_outcome(observation: str, returncode: int | None = None) -> str:
    """``ok``, ``error`` or ``timeout`` for one tool call (rules in the module docstring)."""
    if _TIMEOUT.search(observation):
        return "timeout"
    if returncode is None:
        returncode = returncode_from_text(observation)
    if returncode is not None:
        return "ok" if returncode == 0 else "error"
    return "error" if _ERROR.search(observation) else "ok"


def tool_name(command: str, default: str = "bash") -> str:
    """The tool a command invokes: its first word, after ``cd DIR &&`` prefixes, ``VAR=value``
    assignments and wrappers like ``sudo``/``timeout 30``; ``python3.11`` -> ``python``. An empty
    command gives ``default``. Agent-specific tools (``str_replace_editor``, ``submit``) come out
    as themselves because they are the first word of SWE-agent actions."""
    text = command.strip().lstrip("({ ")
    while True:  # drop leading "cd X &&" / "cd X;" segments
        m = re.match(r"^cd\s+\S+\s*(?:&&|;)\s*", text)
        if not m:
            break
        text = text[m.end():]
    words = text.replace("(", " ").split()
    i = 0
    while i < len(words):
        w = words[i]
        if _ENV_ASSIGN.match(w) or w in _WRAPPERS:
            i += 1
        elif w == "timeout":
            i += 1
            while i < len(words) and words[i].startswith("-"):
                takes_arg = words[i] in ("-s", "-k", "--signal", "--kill-after")
                i += 2 if takes_arg else 1
            i += 1  # the duration
        else:
            break
    if i >= len(words):
        return default
    name = words[i].rsplit("/", 1)[-1].strip("`'\";&|(){}") or default
    return "python" if _PYTHON.match(name) else name
