"""Framework-neutral agent runs (chat messages) and their conversion into trace trajectories.

Every agent framework saves a conversation: a prompt (system + task messages), then model turns,
each followed by what the environment returned. Loaders (``swe_agent.py``, ``openai_chat.py``,
``verl.py``) turn a framework's file or line into an ``AgentRun``; ``run_to_trajectory`` turns that into a ``Trajectory``:

* ``prompt_tokens``: every message before the first (non-demonstration) assistant message;
* one turn per assistant message; its ``gen_tokens`` count its text plus tool-call arguments;
  assistant messages with no environment message between them are one generation (merged);
* the messages after a turn until the next assistant message are the tool return
  (``tool_tokens``); the tool is the action's first word (``outcome.tool_name``), or
  ``format_error`` when the framework could not parse an action and replied with a correction;
* ``outcome``: the one the log recorded on a tool message (``Message.outcome``), else
  ``outcome.classify_outcome`` of the text; latency from the framework when it recorded one (on
  the assistant message, or the sum over the turn's tool messages);
* on the last turn the tool is dropped (``tool: null``) unless ``finish`` allows a trailing call,
  because a submission's echo is never fed back to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libra.trace.convert.outcome import classify_outcome, tool_name
from libra.trace.records import FINISHES_WITH_TRAILING_TOOL, Finish, Trajectory, Turn
from libra.trace.tokens import TokenCounter

#: Tool name for a turn whose output held no parseable action (the framework answered with a
#: format correction instead of running anything).
FORMAT_ERROR_TOOL = "format_error"


class SkipRun(Exception):
    """This file holds no convertible run (no model turn at all); the message says why."""


def record_fields(rec: dict[str, Any], default_step: int, reward_keys: tuple[str, ...]) -> tuple[int, str | int | None, Any]:
    """(step, group, reward) of one JSONL record, as every line-per-run converter reads them:
    ``step`` an integer >= 0 (default ``default_step``), ``group`` a string or integer, the reward
    the first present non-null key of ``reward_keys``, a number. Raises ``SkipRun`` naming the rule."""
    step = rec.get("step", default_step)  # the default is the caller's (a converter may pass a marker)
    if "step" in rec and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise SkipRun(f"step must be an integer >= 0, got {step!r}")
    group = rec.get("group")
    if group is not None and not isinstance(group, (str, int)):
        raise SkipRun(f"group must be a string, got {group!r}")
    reward = next((rec[k] for k in reward_keys if rec.get(k) is not None), None)
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward):
        raise SkipRun(f"reward must be a number, got {reward!r}")
    return step, group, reward


@dataclass
class Message:
    """One chat message. ``command`` is the action an assistant message asked for (None when
    none could be parsed); ``returncode``/``timestamp``/``latency_s``/``outcome`` are what the
    framework recorded, when it did."""

    role: str
    text: str
    is_demo: bool = False
    command: str | None = None
    returncode: int | None = None
    timestamp: float | None = None
    latency_s: float | None = None
    outcome: str | None = None


@dataclass
class AgentRun:
    """One agent run as loaded from a file, before token counting."""

    path: str
    instance_id: str
    messages: list[Message]
    exit_status: str | None
    finish: Finish | None
    reward: float | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def content_text(content: Any) -> str:
    """The text of a message ``content``: a string, or a list of parts (``{"type": "text",
    "text": ...}``, OpenAI/Anthropic style); non-text parts (images) count as nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return str(content)


def _latency(turn_msg: Message, obs: list[Message]) -> float | None:
    if turn_msg.latency_s is not None:
        return max(0.0, float(turn_msg.latency_s))
    known = [m.latency_s for m in obs if m.latency_s is not None]
    if known:  # per tool result (several results: the calls ran one after another)
        return round(sum(max(0.0, float(x)) for x in known), 6)
    if obs and turn_msg.timestamp is not None and obs[0].timestamp is not None:
        dt = obs[0].timestamp - turn_msg.timestamp  # epoch floats: keep microseconds, drop float noise
        return round(dt, 6) if dt >= 0 else None
    return None


def run_to_trajectory(run: AgentRun, counter: TokenCounter, traj_id: str, step: int, group: str | None) -> Trajectory:
    """The trajectory of one agent run (rules in the module docstring)."""
    msgs = [m for m in run.messages if m.role != "exit"]
    first = next((i for i, m in enumerate(msgs) if m.role == "assistant" and not m.is_demo), None)
    if first is None:
        raise SkipRun("no model turn (no assistant message)")
    prompt = sum(counter.message(m.text) for m in msgs[:first])
    # Group: each assistant run (merged) followed by its environment messages.
    blocks: list[tuple[list[Message], list[Message]]] = []
    for m in msgs[first:]:
        if m.role == "assistant":
            if blocks and not blocks[-1][1]:
                blocks[-1][0].append(m)  # no environment reply in between: one generation
            else:
                blocks.append(([m], []))
        else:
            blocks[-1][1].append(m)
    turns: list[Turn] = []
    for gen_msgs, obs in blocks:
        gen = sum(counter.message(m.text) for m in gen_msgs)
        if not obs:
            turns.append(Turn(gen, None))
            continue
        actor = gen_msgs[-1]
        command = next((m.command for m in reversed(gen_msgs) if m.command is not None), None)
        tool = tool_name(command) if command is not None else FORMAT_ERROR_TOOL
        obs_text = "\n".join(m.text for m in obs)
        rc = next((m.returncode for m in obs if m.returncode is not None), None)
        # several results (parallel calls): the worst of them is the turn's
        recorded = max((m.outcome for m in obs if m.outcome is not None), key=("ok", "error", "timeout").index, default=None)
        outcome = "error" if tool == FORMAT_ERROR_TOOL else recorded or classify_outcome(obs_text, rc)
        tool_tokens = sum(counter.message(m.text) for m in obs)
        turns.append(Turn(gen, tool, _latency(actor, obs), tool_tokens, outcome))  # type: ignore[arg-type]
    last = turns[-1]
    if last.tool is not None and run.finish not in FINISHES_WITH_TRAILING_TOOL:
        turns[-1] = Turn(last.gen_tokens, None)
    return Trajectory(
        id=traj_id,
        step=step,
        prompt_tokens=max(1, prompt),
        turns=tuple(turns),
        group=group,
        reward=run.reward,
        finish=run.finish,
    )
