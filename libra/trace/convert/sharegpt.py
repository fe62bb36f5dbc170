"""Load ReAct-style agent runs in the ShareGPT conversation format (``libra-sim convert --from sharegpt-react``).

The agent-tuning datasets published with AgentTuning (THUDM's AgentInstruct: ALFWorld, WebShop,
Mind2Web, KG, OS, DB), FireAct (HotpotQA ReAct trajectories) and the ShareGPT-style exports of
many RL frameworks store one run per JSON line as::

    {"id": "hotpotqa_17", "step": 0, "group": "q17", "reward": 1.0,
     "conversations": [
       {"from": "system", "value": "Solve a question answering task with interleaving Thought, Action, Observation steps ..."},
       {"from": "human", "value": "Question: Which magazine was started first, Arthur's Magazine or First for Women?"},
       {"from": "gpt", "loss": true, "value": "Thought 1: I need to search both.\\nAction 1: Search[Arthur's Magazine]"},
       {"from": "human", "value": "Observation 1: Arthur's Magazine (1844-1846) was an American literary periodical ..."},
       {"from": "gpt", "loss": true, "value": "Thought 2: ...\\nAction 2: Finish[Arthur's Magazine]"}]}

(a bare JSON list of those messages is accepted too, and so is FireAct's OpenAI fine-tuning layout
``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}`` whose user
messages after the first model turn are the ReAct observations). Rules:

* ``from``: ``system`` and the ``human``/``user`` messages before the first model turn are the
  prompt; ``gpt``/``assistant``/``model`` messages are model turns; a ``human``/``user``/
  ``observation``/``tool``/``function`` message after a model turn is the environment's reply
  (the ReAct observation). AgentInstruct marks the trained-on model messages with
  ``"loss": true``; a model message with ``"loss": false`` before the first trained one is part of
  the prompt (its in-context acknowledgement or demonstration), as are ``human`` messages around it;
* the action is the model text's **last** ``Action:``/``Action N:``/``Act:`` line: ``Name[arg]``
  (ReAct: ``Search[...]``, ``Lookup[...]``, ``Finish[...]``), ``Name(arg)``, or LangChain's
  ``Action: name`` with an ``Action Input:`` line; the tool is ``Name`` lower-cased. A model turn
  answered by the environment without a parseable action is ``format_error``;
* the final answer action (``finish``/``final answer``/``answer``) ends the run: ``finish`` is
  ``stop`` (a trailing observation after it, which ReAct loggers print, is not a tool call); a run
  that ends on another action is ``finish: null`` unless the line gives one;
* outcome: ``outcome`` (ok/error/timeout) on the observation message when recorded, else ReAct's
  own failure replies (``Could not find ...``, ``Invalid action``, ``No more results``,
  ``There were no results``) are ``error``, else ``outcome.classify_outcome`` of the text;
* latency: ``latency_s``/``duration_s``/``duration_ms`` on the observation message when recorded
  (ReAct logs usually record none: the trace then says null and the replay draws it);
* ``reward`` (or ``score``, ``em``, ``f1`` in that order), ``group`` (else runs of one step with
  the same prompt), ``step`` (else ``--step``), ``id`` (else ``FILE-STEM:LINE``), ``finish``.
"""

from __future__ import annotations

import re
from typing import Any

from libra.trace.convert.chat import AgentRun, Message, SkipRun, content_text, record_fields
from libra.trace.convert.jsonl import Line
from libra.trace.convert.openai_chat import _finish, _latency
from libra.trace.convert.outcome import classify_outcome

_MODEL = ("gpt", "assistant", "model", "chatgpt", "bot")
_PROMPT = ("system", "human", "user")
_ENV = ("human", "user", "observation", "tool", "function", "environment")
_ACTION = re.compile(r"^\s*(?:Action|Act)(?:\s*\d+)?\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ACTION_INPUT = re.compile(r"^\s*Action Input(?:\s*\d+)?\s*:", re.IGNORECASE | re.MULTILINE)
_NAME = re.compile(r"^([A-Za-z_][\w\-]*)\s*(?:\[|\(|$)")
_FINAL = frozenset({"finish", "final_answer", "final answer", "answer"})
#: ReAct's own replies to a failed action (its Wikipedia environment), read as outcome ``error``
_REACT_ERROR = re.compile(r"Could not find|Invalid action|No more results|There were no results|Similar: \[", re.IGNORECASE)
_OUTCOMES = ("ok", "error", "timeout")


def parse_action(text: str) -> str | None:
    """The tool name of a ReAct model turn's last action (lower-cased), or None when the text
    holds none. ``Action 2: Search[Colorado orogeny]`` -> ``search``; ``Action: python`` (LangChain,
    input on the next line) -> ``python``; ``Final Answer: ...`` -> ``finish``."""
    found = _ACTION.findall(text)
    if not found:
        return "finish" if re.search(r"^\s*Final Answer\s*:", text, re.IGNORECASE | re.MULTILINE) else None
    act = found[-1].strip().strip("`*")
    m = _NAME.match(act)
    if m is None:
        low = act.lower()
        return "finish" if low.startswith("final answer") else None
    name = m.group(1).lower()
    return "finish" if name in _FINAL or act.lower().startswith("final answer") else name


def _env_outcome(m: dict[str, Any], text: str, where: str) -> str:
    out = m.get("outcome")
    if out is not None:
        if out not in _OUTCOMES:
            raise SkipRun(f"{where}.outcome must be one of ok, error, timeout, got {out!r}")
        return str(out)
    if _REACT_ERROR.search(text):
        return "error"
    return classify_outcome(text)


def load_sharegpt(line: Line, default_step: int) -> tuple[AgentRun, int, str | None]:
    """One line as an ``AgentRun`` with its step and group (None: derive from the prompt); rules in
    the module docstring. Raises ``SkipRun`` with the reason when the line holds no run."""
    if line.error is not None:
        raise SkipRun(line.error)
    v = line.value
    rec: dict[str, Any] = {"conversations": v} if isinstance(v, list) else v if isinstance(v, dict) else {}
    conv = rec.get("conversations", rec.get("conversation", rec.get("messages")))
    if not isinstance(conv, list) or not conv:
        raise SkipRun("no 'conversations' (or 'messages') list (expected ShareGPT messages {\"from\": ..., \"value\": ...})")
    step, group, reward = record_fields(rec, default_step, ("reward", "score", "em", "f1"))
    finish = _finish(rec.get("finish"))
    for k, m in enumerate(conv):
        if not isinstance(m, dict) or not isinstance(m.get("from", m.get("role")), str):
            raise SkipRun(f"conversations[{k}] must be an object with 'from' (or 'role')")
    roles = [str(m.get("from", m.get("role"))).lower() for m in conv]
    unknown = next((k for k, r in enumerate(roles) if r not in _MODEL + _PROMPT + _ENV), None)
    if unknown is not None:
        raise SkipRun(f"conversations[{unknown}]: unknown 'from' {roles[unknown]!r} (system, human, gpt, observation)")
    trained = [k for k, r in enumerate(roles) if r in _MODEL and conv[k].get("loss") is not False]
    if not trained:
        raise SkipRun("no model turn (no gpt message, or every one is marked loss: false)")
    first = trained[0]
    messages: list[Message] = []
    last_action: str | None = None
    ended = False  # the final answer was given: what follows is not a tool return
    for k, (m, role) in enumerate(zip(conv, roles)):
        text = content_text(m.get("value", m.get("content")))
        if k < first:
            messages.append(Message("system" if role == "system" else "user", text))
            continue
        if ended:
            continue
        if role in _MODEL:
            last_action = parse_action(text)
            if last_action == "finish":
                messages.append(Message("assistant", text, command=None))
                ended = True
                continue
            messages.append(Message("assistant", text, command=last_action))
        elif role in _ENV:
            where = f"conversations[{k}]"
            messages.append(Message("tool", text, latency_s=_latency(m), outcome=_env_outcome(m, text, where)))
        else:  # a system message mid-run: environment text
            messages.append(Message("tool", text, outcome="ok"))
    if finish is None and ended:
        finish = "stop"
    tid = rec.get("id")
    run = AgentRun(line.where, str(tid) if isinstance(tid, (str, int)) and str(tid) else f"{line.path.name.split('.')[0]}:{line.lineno}",
                   messages, None, finish, float(reward) if reward is not None else None,
                   rec.get("model") if isinstance(rec.get("model"), str) else None)
    return run, step, str(group) if group is not None else None
