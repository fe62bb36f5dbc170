"""How a trajectory's text is laid out for the policy: the bundled tiny policy's fixed format,
or a real chat model's own chat template with tool schemas (Qwen / Hermes tool calls).

Why two: the tiny policy (``protocol``) was trained from scratch on a short tag syntax and has no
chat template; a real chat model learns nothing from prompts it was never tuned on, so for it
the prompt is ``tokenizer.apply_chat_template`` with a system prompt and the tools' JSON schemas
(as verl's and SkyRL's agent loops build it), a tool call is the Hermes form
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` that Qwen templates teach, a turn
ends at ``<|im_end|>``, and the tool's return is whatever the template renders for a ``tool``
message (computed as the difference of two renderings, so the template decides). ``for_tokenizer``
picks the template form when the tokenizer's template knows tools, the tiny form otherwise.
Both answer with ``<answer>...</answer>`` (the system prompt asks for it), so rewards are the same.
"""

from __future__ import annotations

import json
import re
from typing import Any

from libra.runtime import protocol
from libra.runtime.protocol import ToolCall

#: The tools' JSON schemas (OpenAI function format, what chat templates render).
TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "python", "description": "Run a Python 3 program in a sandbox and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}}, "required": ["code"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the document collection and return the best-matching document.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}},
                       "required": ["query"]}}},
)
#: The argument each tool reads (the sandbox runs ``code``, the retriever searches ``query``).
TOOL_ARG = {"python": "code", "search": "query"}
SYSTEM_PROMPT = ("You are a careful assistant. Use the tools when they help: call one, read its result, and continue. "
                 "When you are done, give the final answer as <answer>ANSWER</answer>.")

_HERMES_RE = re.compile(r"<tool_call>\s*(?P<body>.*?)\s*</tool_call>", re.S)


class TinyFormat:
    """The bundled tiny policy's transcript format (``protocol``)."""

    kind = "tiny"
    stop_strings: tuple[str, ...] = protocol.STOP_STRINGS

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, question: str) -> list[int]:
        return _encode(self.tokenizer, protocol.prompt_text(question))

    def parse_tool_call(self, turn_text: str) -> ToolCall | None:
        return protocol.parse_tool_call(turn_text)

    def response_text(self, output: str) -> str:
        return protocol.tool_response_text(output)


class TemplateFormat:
    """A chat model's own template with tools (see the module docstring)."""

    kind = "chat-template"
    stop_strings: tuple[str, ...] = (protocol.IM_END,)

    def __init__(self, tokenizer: Any, system: str = SYSTEM_PROMPT) -> None:
        self.tokenizer, self.system = tokenizer, system

    def _render(self, messages: list[dict[str, Any]], gen: bool) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tools=list(TOOL_SCHEMAS), add_generation_prompt=gen, tokenize=False))

    def prompt_text(self, question: str) -> str:
        return self._render([{"role": "system", "content": self.system}, {"role": "user", "content": question}], True)

    def prompt_ids(self, question: str) -> list[int]:
        return _encode(self.tokenizer, self.prompt_text(question))

    def parse_tool_call(self, turn_text: str) -> ToolCall | None:
        """The turn's (last) Hermes tool call; a ``<tool_call>`` whose body is not a JSON object
        with a known tool's argument is ``ToolCall("invalid", body)`` (answered with an error)."""
        found = _HERMES_RE.findall(turn_text)
        if not found:
            return ToolCall("invalid", turn_text) if "<tool_call>" in turn_text else None
        body = found[-1]
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            return ToolCall(str(name), str(args[TOOL_ARG[name]]) if name in TOOL_ARG else json.dumps(args))
        except (ValueError, KeyError, TypeError):
            return ToolCall("invalid", body)

    def response_text(self, output: str) -> str:
        """What follows the assistant's turn (which ended with ``<|im_end|>``) when a tool returns
        ``output``: the template's rendering of a ``tool`` message plus the next assistant header."""
        base = [{"role": "user", "content": "q"}]
        head = self._render(base, False)
        full = self._render(base + [{"role": "tool", "content": output}], True)
        if not full.startswith(head):
            raise ValueError("the chat template does not render a tool message as an append")
        cut = len(head) - 1 if head.endswith("\n") else len(head)  # the generated turn stops at <|im_end|>, before its newline
        return full[cut:]


def for_tokenizer(tokenizer: Any) -> TinyFormat | TemplateFormat:
    """The template form when the tokenizer has a chat template that renders tools, else the tiny one."""
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, str) and "tools" in tpl:
        return TemplateFormat(tokenizer)
    return TinyFormat(tokenizer)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
