"""The chat transcript format the tiny policy speaks, and how tool calls are parsed from it.

Why a fixed, tiny format: the bundled policy is a small model trained from scratch on synthetic
transcripts, so the format must be short and unambiguous. It mirrors Qwen's chat template
(``<|im_start|>``/``<|im_end|>``, ``<tool_call>``/``<tool_response>``), so a real Qwen model
with a tool-calling template can be dropped in by changing only these strings.

A transcript::

    <|im_start|>user\\nCompute 37*41+5.<|im_end|>\\n<|im_start|>assistant\\n
    <tool_call>python\\nprint(37*41+5)</tool_call>          <- turn 1 stops here (tool call)
    <tool_response>1522</tool_response>                     <- the tool's return, appended
    <answer>1522</answer><|im_end|>                         <- turn 2 stops here (finish)

A generation stops at ``</tool_call>`` (a tool call: run it, append its response, continue) or at
``<|im_end|>`` (the trajectory is done).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
ANSWER = "<answer>"
ANSWER_END = "</answer>"
PAD = "<|pad|>"

#: Every special token, in the id order the bundled tokenizer gives them (ids 0..8).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, ANSWER, ANSWER_END)
#: Generation stops on these: a tool call ends a turn, ``<|im_end|>`` ends the trajectory.
STOP_STRINGS: tuple[str, ...] = (TOOL_CALL_END, IM_END)

_CALL_RE = re.compile(re.escape(TOOL_CALL) + r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\n(?P<args>.*?)" + re.escape(TOOL_CALL_END) + r"\s*$", re.S)
_ANSWER_RE = re.compile(re.escape(ANSWER) + r"(?P<a>.*?)" + re.escape(ANSWER_END), re.S)


def prompt_text(question: str) -> str:
    """The prompt a trajectory starts from: the user's question and the assistant header."""
    return f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"


def tool_response_text(output: str) -> str:
    """What is appended to the context after a tool call returns ``output``."""
    return f"\n{TOOL_RESPONSE}{output}{TOOL_RESPONSE_END}\n"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A parsed call: tool ``name`` with its free-text ``args`` (code for python, a query for search)."""

    name: str
    args: str


def parse_tool_call(turn_text: str) -> ToolCall | None:
    """The tool call that ends ``turn_text`` (one generation), or None if it ends otherwise.

    A turn that stopped at ``</tool_call>`` but is malformed (no ``<tool_call>NAME\\n`` header)
    yields ``ToolCall("invalid", text)``: the backend answers it with an error response, as a
    real tool server would, instead of silently ending the trajectory.
    """
    if not turn_text.rstrip().endswith(TOOL_CALL_END):
        return None
    m = _CALL_RE.search(turn_text)
    if m is None:
        return ToolCall("invalid", turn_text)
    return ToolCall(m.group("name"), m.group("args"))


def parse_answer(text: str) -> str | None:
    """The final ``<answer>...</answer>`` in a completion (stripped), or None when there is none."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None
