"""Load verl's rollout dumps (``libra-sim convert --from verl``).

With ``trainer.rollout_data_dir=DIR`` verl's ``RayPPOTrainer._dump_generations`` writes
``DIR/{global_step}.jsonl`` after every training step: one line per sample, ``{"input": prompt
text, "output": response text, "gts": ground truth, "score": reward, "step": global step, ...}``
plus the reward function's extra keys (``acc``, ``pred``...). Both texts are decoded with
``skip_special_tokens=True``, so the chat template's ``<|im_start|>``/``<|im_end|>`` are gone,
while Qwen/Hermes tool markup, which is text, stays: a multi-turn response holds the model's
generations, each tool call as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, and
the environment's ``<tool_response>...</tool_response>`` blocks between them.

Split into turns at the markers: a turn's generation runs up to and including its last
consecutive ``</tool_call>``; the tool return is everything up to the last ``</tool_response>``
before the next generation (the role words the template put around it included); the rest is
the next turn. The tool is the first call's ``name`` (``format_error`` when the call's JSON has
no name). ``finish``: ``length`` when the output ends inside an unclosed ``<tool_call>`` (cut at
the response limit), ``tool_limit`` when it ends with calls that got no response (turn limit),
else null (a response cut at the limit mid-text cannot be told from a finished one). Rewards are
``score``; samples of one prompt (verl writes the ``n`` samples of a prompt one after another)
form a group; the step is the line's ``step``, else the file name's number, else ``--step``.
Latencies are not in the dump (null: replay uses the workload's latency model).
"""

from __future__ import annotations

import json
import re
from typing import Any

from libra.trace.convert.chat import FORMAT_ERROR_TOOL, AgentRun, Message, SkipRun, content_text
from libra.trace.convert.jsonl import Line
from libra.trace.records import Finish

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESP_OPEN, RESP_CLOSE = "<tool_response>", "</tool_response>"
_CALLS_RUN = re.compile(r"\s*<tool_call>.*?</tool_call>", re.DOTALL)


def _call_name(block: str) -> str | None:
    """The ``name`` of the first call in a run of ``<tool_call>`` blocks."""
    m = re.search(r"<tool_call>(.*?)</tool_call>", block, re.DOTALL)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1).strip())
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]:
        return str(obj["name"])
    found = re.search(r'"name"\s*:\s*"([^"]+)"', m.group(1))  # loose JSON: a name is still a name
    return found.group(1) if found else None


def split_turns(output: str) -> tuple[list[tuple[str, str | None, str | None]], Finish | None]:
    """``[(generation text, tool name or None, tool return text or None), ...]`` and the finish
    the markup shows (rules in the module docstring)."""
    turns: list[tuple[str, str | None, str | None]] = []
    pos = 0
    n = len(output)
    while True:
        start = output.find(CALL_OPEN, pos)
        if start < 0:
            turns.append((output[pos:], None, None))
            return turns, None
        close = output.find(CALL_CLOSE, start)
        if close < 0:  # cut inside a call: the response limit
            turns.append((output[pos:], None, None))
            return turns, "length"
        end = close + len(CALL_CLOSE)
        while True:  # parallel calls: consecutive <tool_call> blocks are one turn's
            m = _CALLS_RUN.match(output, end)
            if not m:
                break
            end = m.end()
        gen = output[pos:end]
        name = _call_name(gen) or FORMAT_ERROR_TOOL
        nxt = output.find(CALL_OPEN, end)
        region_end = nxt if nxt >= 0 else n
        last_resp = output.rfind(RESP_CLOSE, end, region_end)
        if output.find(RESP_OPEN, end, region_end) < 0 or last_resp < 0:
            if nxt < 0 and not output[end:].strip():  # calls that got no response: the turn limit
                turns.append((gen, name, None))
                return turns, "tool_limit"
            turns.append((gen, name, ""))  # a call answered with nothing the dump shows
            pos = end
            continue
        resp_end = last_resp + len(RESP_CLOSE)
        turns.append((gen, name, output[end:resp_end]))
        pos = resp_end


def _step_from_name(line: Line) -> int | None:
    m = re.match(r"(\d+)", line.path.name)
    return int(m.group(1)) if m else None


def load_sample(line: Line, default_step: int) -> tuple[AgentRun, int, str]:
    """One dump line as an ``AgentRun``, with its step and the prompt text (samples of one prompt
    form a group). Raises ``SkipRun`` with the reason when the line cannot be converted."""
    if line.error is not None:
        raise SkipRun(line.error)
    rec = line.value
    if not isinstance(rec, dict):
        raise SkipRun("not a JSON object (expected verl's {input, output, score, step})")
    missing = [k for k in ("input", "output") if not isinstance(rec.get(k), (str, list))]
    if missing:
        raise SkipRun(f"no {' or '.join(repr(k) for k in missing)} text (verl's dump has input, output, score, step)")
    prompt, output = content_text(rec["input"]), content_text(rec["output"])
    if not prompt.strip():
        raise SkipRun("empty 'input' (the prompt)")
    step: Any = rec.get("step")
    if step is None:
        step = _step_from_name(line)
    if step is None:
        step = default_step
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SkipRun(f"step must be an integer >= 0, got {step!r}")
    score = rec.get("score", rec.get("reward"))
    if isinstance(score, list) and len(score) == 1:
        score = score[0]
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float)) or score != score):
        raise SkipRun(f"score must be a number, got {score!r}")
    turns, finish = split_turns(output)
    messages = [Message("user", prompt)]
    for gen, tool, ret in turns:
        messages.append(Message("assistant", gen, command=tool))
        if ret is not None:
            messages.append(Message("tool", ret))
    run = AgentRun(line.where, f"s{step}-l{line.lineno}", messages, None, finish, float(score) if score is not None else None)
    return run, step, prompt
