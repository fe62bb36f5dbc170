"""Prompts through a chat model's own template with tools (Qwen / Hermes tool calls), while the
bundled tiny policy keeps its own format. The template here is a compact Qwen-style one written
for the test (the tiny tokenizer has Qwen's special tokens); a real Qwen tokenizer brings its own."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from runtime_markers import needs_torch

QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call functions. Their signatures are within <tools></tools>:\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools>\n\nReturn each call as a JSON object within <tool_call></tool_call> tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{% if not tools %}{{ '<|im_start|>system\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The tiny policy's folder with a tool-aware chat template added to its tokenizer config."""
    from libra.runtime.tiny_model import DEFAULT_DIR

    d = tmp_path_factory.mktemp("chat") / "policy"
    shutil.copytree(DEFAULT_DIR, d)
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN_STYLE
    cfg_path.write_text(json.dumps(cfg))
    return str(d)


@needs_torch
def test_tiny_policy_keeps_its_format() -> None:
    from transformers import AutoTokenizer

    from libra.runtime.chat_format import TinyFormat, for_tokenizer
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tiny_model import DEFAULT_DIR, encode

    tok = AutoTokenizer.from_pretrained(DEFAULT_DIR)
    fmt = for_tokenizer(tok)
    assert isinstance(fmt, TinyFormat)
    assert fmt.prompt_ids("Compute 2*3+1.") == encode(tok, prompt_text("Compute 2*3+1."))


@needs_torch
def test_template_prompt_has_system_tools_and_question(chat_dir) -> None:
    from transformers import AutoTokenizer

    from libra.runtime.chat_format import SYSTEM_PROMPT, TemplateFormat, for_tokenizer

    tok = AutoTokenizer.from_pretrained(chat_dir)
    fmt = for_tokenizer(tok)
    assert isinstance(fmt, TemplateFormat) and fmt.stop_strings == ("<|im_end|>",)
    text = fmt.prompt_text("Compute 37*41+5.")
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT) and text.endswith("<|im_start|>user\nCompute 37*41+5.<|im_end|>\n<|im_start|>assistant\n")
    assert '"name": "python"' in text and '"name": "search"' in text and '"required": ["code"]' in text
    assert tok.decode(fmt.prompt_ids("Compute 37*41+5."), skip_special_tokens=False) == text


@needs_torch
def test_hermes_tool_calls_parse_and_tool_returns_render_as_the_template_does(chat_dir) -> None:
    from transformers import AutoTokenizer

    from libra.runtime.chat_format import for_tokenizer
    from libra.runtime.protocol import ToolCall

    fmt = for_tokenizer(AutoTokenizer.from_pretrained(chat_dir))
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(37*41+5)"}}\n</tool_call><|im_end|>'
    assert fmt.parse_tool_call("I will compute it.\n" + call) == ToolCall("python", "print(37*41+5)")
    assert fmt.parse_tool_call('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"capital of Norland\\"}"}</tool_call>') == \
        ToolCall("search", "capital of Norland")  # arguments as a JSON string, as some models emit
    assert fmt.parse_tool_call("<tool_call>\nprint(1)\n</tool_call>").name == "invalid"
    assert fmt.parse_tool_call('<tool_call>{"name": "python", "arguments": {}}</tool_call>').name == "invalid"
    assert fmt.parse_tool_call("<answer>7</answer><|im_end|>") is None
    assert fmt.response_text("1522\n") == ("\n<|im_start|>user\n<tool_response>\n1522\n\n</tool_response><|im_end|>\n"
                                           "<|im_start|>assistant\n")


@needs_torch
def test_episode_in_the_template_format_calls_the_tool_and_earns_the_reward(chat_dir) -> None:
    from libra.runtime.engines.base import TurnResult
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.episode import Episode
    from libra.runtime.tasks import Task
    from libra.runtime.tiny_model import encode
    from libra.runtime.tools.base import ToolResult

    eng = TorchEngine(chat_dir, seed=0)
    tok = eng.tokenizer
    from libra.runtime.chat_format import for_tokenizer

    fmt = for_tokenizer(tok)
    assert eng.stop_ids == {tok.convert_tokens_to_ids("<|im_end|>")}  # a turn ends at <|im_end|> only
    task = Task("t0", "math", "Compute 37*41+5.", "1522")
    ep = Episode("e", 0, "g", task, fmt.prompt_ids(task.question), fmt=fmt)
    dec = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    turn1 = encode(tok, '<tool_call>\n{"name": "python", "arguments": {"code": "print(37*41+5)"}}\n</tool_call><|im_end|>')
    call = ep.on_generation(TurnResult("e", tuple(turn1), (0.0,) * len(turn1), "stop", 0, 0, 0.0, 0.0), dec)
    assert call is not None and call.name == "python" and call.args == "print(37*41+5)"
    tr = ToolResult("1522\n", "ok", 0.01)
    text = ep.tool_text(tr)
    ep.on_tool_result(tr, encode(tok, text), text)
    turn2 = encode(tok, "<answer>1522</answer><|im_end|>")
    assert ep.on_generation(TurnResult("e", tuple(turn2), (0.0,) * len(turn2), "stop", 0, 0, 0.0, 0.0), dec) is None
    assert ep.finish == "stop" and ep.reward == 1.0
    assert dec(ep.context).endswith("<tool_response>\n1522\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n<answer>1522</answer><|im_end|>")
    # the engine generates from such a context (the tiny weights do not know the format: any tokens)
    out = eng.generate([ep.request()])
    assert out and out[0].traj_id == "e"
    assert os.path.isdir(chat_dir)
