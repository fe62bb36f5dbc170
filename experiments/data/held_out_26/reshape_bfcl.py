"""Rebuild BFCL v4 multi-turn runs of gpt-oss-120b served by vLLM (bbrowning/bfcl-vllm-results,
``results/`` at commit f98223a) as OpenAI-format chat JSONL for ``libra-sim convert --from openai-chat``.

Input: the folder ``results/`` extracted from commit f98223aef4e7a560e2d2d69849dfb04eed260a52
(``git archive <commit> results``), passed as the first argument. Read, for each of the five runs in
``RUNS`` and each category in ``CATEGORIES``: ``<run>/result/openai_gpt-oss-120b/multi_turn/
BFCL_v4_multi_turn_<category>_result.json`` (one task per line: ``{id, result, input_token_count,
output_token_count, latency, inference_log}``, or ``{id, result, traceback}`` when inference raised)
and ``<run>/score/openai_gpt-oss-120b/multi_turn/BFCL_v4_multi_turn_<category>_score.json`` (a
summary line ``{accuracy, correct_count, total_count}``, then one line per failed task). Output: the
JSONL file named by the second argument, one run per line, ordered by (step, category, task, run);
a few per-run statistics of the logged counts are printed.

How a run was made (BFCL's multi-turn FC loop, ``bfcl_eval/model_handler/base_handler.py``; nothing is
executed here): the task's involved API classes (file system, Twitter, math, ticketing, travel,
trading, vehicle control, messaging: in-process Python objects) are instantiated from the task's
initial state; for each of the task's user turns (``begin_of_turn_query``: the user's request, or for
a ``miss_func`` holdout turn the fixed "I have updated some more functions ..." message when the
withheld function is added) the model is queried with the whole history and the tools (function
calling through vLLM's OpenAI-compatible server); every call it returns is executed on those
objects in order (the result, or ``Error during execution: ...``) and the model is queried again,
until it returns no call (``Empty response from the model. Proceed to next turn.``: its text answer;
BFCL logs only decoded calls, so that text is not in the log), its reply cannot be decoded into
calls (``Error decoding the model response. Proceed to next turn.``: nothing is executed), or the
step counter passed 20 (``Model has been forced to quit after 20 steps.``: it is checked after each
step, so on the 21st step of a user turn, whose calls ran; BFCL then stops the whole task, and no
later user turn is run). ``state_info`` entries (snapshots of the API objects between user turns) are
not messages and are skipped.

Written per run: ``messages`` = the first user request (the prompt); per step an assistant message
whose ``tool_calls`` are the decoded calls (``function.name`` = the function, ``arguments`` = its
JSON arguments), then one ``tool`` message per call in order with ``content`` = the logged result
and ``outcome`` = ``error`` when the result is ``Error during execution: ...`` or an object whose
``error`` key is set, else ``ok``; a step without calls is an assistant message with empty text; a
step whose calls could not be decoded is an assistant message holding the undecoded calls as
text and no ``tool_calls`` (nothing ran); the next user turn's request follows as a ``user``
message. ``finish``: ``tool_limit`` when the step limit ended the task (its last calls ran), else
``stop``. Runs whose inference raised (``traceback``, no ``inference_log``) are
left out and counted. ``reward`` = 0.0 when the task is in the score file's failures, else 1.0
(checked against the summary's ``correct_count``); ``group`` = the task id (the five runs of one
task); ``step`` = the task's number mod 5; ``model`` = the run's name; ``id``
``bfcl-<task id>-<run>``.
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

#: The five runs of gpt-oss-120b at f98223a: vLLM v0.10.2, v0.11.0, main of 2025-11-12, and two
#: builds of Ben Browning's harmony tool-calling fixes on that main.
RUNS = ["v0.10.2", "v0.11.0", "2025-11-12-main", "2025-11-12-harmony-fixes", "2025-11-12-harmony-fixes-2"]
#: ``long_context`` is also listed there, but its files (4 MiB and more) are not in the snapshot.
CATEGORIES = ["base", "miss_func", "miss_param"]
MODEL_DIR = "openai_gpt-oss-120b"
N_STEPS = 5
MAXIMUM_STEP_LIMIT = 20  # BFCL's; checked after each step, so a user turn has at most 21 steps
MAX_STEPS_PER_TURN = MAXIMUM_STEP_LIMIT + 1
TASK = re.compile(r"^multi_turn_(base|miss_func|miss_param)_(\d+)$")
EMPTY = "Empty response from the model. Proceed to next turn."
DECODE_ERROR = "Error decoding the model response. Proceed to next turn."
FORCED = f"Model has been forced to quit after {MAXIMUM_STEP_LIMIT} steps."
DECODED = "Successfully decoded model response."


def outcome_of(result: Any) -> str:
    """``error`` for BFCL's execution error text or an ``{"error": ...}`` result (JSON or a Python
    repr, as ``execute_multi_turn_func_call`` writes non-JSON results), else ``ok``."""
    if not isinstance(result, str):
        raise ValueError(f"tool result is not text: {result!r:.80}")
    if result.startswith("Error during execution:"):
        return "error"
    for parse in (json.loads, ast.literal_eval):
        try:
            v = parse(result)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return "error" if isinstance(v, dict) and v.get("error") else "ok"
    return "ok"


def reshape_run(d: dict[str, Any], where: str, counts: collections.Counter[str]) -> tuple[list[dict[str, Any]], str]:
    """(OpenAI-format messages, finish) of one logged run; raises ``ValueError`` naming what broke."""
    turns = [t for t in d["inference_log"] if isinstance(t, dict)]
    for t in d["inference_log"]:
        if isinstance(t, list) and any(e.get("role") != "state_info" for e in t):
            raise ValueError(f"{where}: a list entry that is not state_info")
    steps_per_turn = [sum(1 for k in t if k.startswith("step_")) for t in turns]
    if steps_per_turn != [len(x) for x in d["input_token_count"]] or steps_per_turn != [len(x) for x in d["output_token_count"]]:
        raise ValueError(f"{where}: steps per turn {steps_per_turn} differ from the token count lists")
    out: list[dict[str, Any]] = []
    finish = "stop"
    for ti, t in enumerate(turns):
        keys = list(t)
        if keys[0] != "begin_of_turn_query" or keys[1:] != [f"step_{i}" for i in range(len(keys) - 1)] or len(keys) < 2:
            raise ValueError(f"{where}: turn {ti}: keys {keys}")
        q = t["begin_of_turn_query"]
        if len(q) != 1 or q[0].get("role") != "user" or not isinstance(q[0].get("content"), str):
            raise ValueError(f"{where}: turn {ti}: expected one user message")
        out.append({"role": "user", "content": q[0]["content"]})
        counts["user turns"] += 1
        n = len(keys) - 1
        if n > MAX_STEPS_PER_TURN:
            raise ValueError(f"{where}: turn {ti}: {n} steps")
        for si in range(n):
            ev = t[f"step_{si}"]
            if ev[0].get("role") != "assistant" or not isinstance(ev[0].get("content"), list):
                raise ValueError(f"{where}: turn {ti} step {si}: no assistant entry first")
            calls = ev[0]["content"]
            logs = [e["content"] for e in ev if e["role"] == "handler_log"]
            tools = [e for e in ev if e["role"] == "tool"]
            if any(e["role"] not in ("assistant", "handler_log", "tool") for e in ev):
                raise ValueError(f"{where}: turn {ti} step {si}: unexpected role")
            last = si == n - 1
            if logs == [DECODED, EMPTY]:
                if calls or tools or not last:
                    raise ValueError(f"{where}: turn {ti} step {si}: an empty reply must end the user turn, without calls")
                out.append({"role": "assistant", "content": ""})
                counts["steps without calls (text answer, not logged)"] += 1
                continue
            if logs == [DECODE_ERROR]:
                if tools or not last or not calls:
                    raise ValueError(f"{where}: turn {ti} step {si}: an undecodable reply runs nothing and ends the user turn")
                out.append({"role": "assistant", "content": json.dumps(calls, ensure_ascii=False)})
                counts["steps not decoded (nothing ran)"] += 1
                continue
            if logs not in ([DECODED], [DECODED, FORCED]) or not calls:
                raise ValueError(f"{where}: turn {ti} step {si}: handler logs {logs} with {len(calls)} calls")
            if (logs == [DECODED, FORCED]) != (last and n == MAX_STEPS_PER_TURN):
                raise ValueError(f"{where}: turn {ti} step {si}: the step limit is logged only on step {MAX_STEPS_PER_TURN}")
            if len(tools) != len(calls):
                raise ValueError(f"{where}: turn {ti} step {si}: {len(calls)} calls, {len(tools)} results")
            rendered = []
            for j, c in enumerate(calls):
                if not isinstance(c, dict) or len(c) != 1:
                    raise ValueError(f"{where}: turn {ti} step {si}: call {c!r:.80}")
                (name, args), = c.items()
                rendered.append({"id": f"call_{ti}_{si}_{j}", "type": "function", "function": {"name": name, "arguments": args}})
            out.append({"role": "assistant", "content": "", "tool_calls": rendered})
            counts["calls"] += len(calls)
            if len(calls) > 1:
                counts["steps with several calls"] += 1
            for j, e in enumerate(tools):
                oc = outcome_of(e["content"])
                out.append({"role": "tool", "tool_call_id": f"call_{ti}_{si}_{j}", "content": e["content"], "outcome": oc})
                counts[f"tool results {oc}"] += 1
            if last:
                if logs != [DECODED, FORCED]:
                    raise ValueError(f"{where}: turn {ti}: ends on calls without the step limit")
                counts["tasks ended by the step limit"] += 1
                if ti != len(turns) - 1:
                    raise ValueError(f"{where}: turn {ti}: the step limit ends the task, yet later turns follow")
                finish = "tool_limit"
    return out, finish


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="the extracted results/ folder")
    ap.add_argument("output", type=Path)
    a = ap.parse_args(argv)
    counts: collections.Counter[str] = collections.Counter()
    rows: list[tuple[tuple[int, int, int, int], dict[str, Any]]] = []
    logged: dict[str, list[int]] = collections.defaultdict(list)
    for ri, run in enumerate(RUNS):
        for ci, cat in enumerate(CATEGORIES):
            base = a.results / run
            res = read_jsonl(base / "result" / MODEL_DIR / "multi_turn" / f"BFCL_v4_multi_turn_{cat}_result.json")
            score = read_jsonl(base / "score" / MODEL_DIR / "multi_turn" / f"BFCL_v4_multi_turn_{cat}_score.json")
            summary, failed = score[0], {s["id"] for s in score[1:]}
            ids = [d["id"] for d in res]
            if len(ids) != len(set(ids)) or summary["total_count"] != len(ids) or summary["correct_count"] != len(ids) - len(failed) or not failed <= set(ids):
                raise ValueError(f"{run}/{cat}: score file does not match the results ({summary}, {len(failed)} failed, {len(ids)} tasks)")
            for d in res:
                m = TASK.match(d["id"])
                if m is None or m.group(1) != cat:
                    raise ValueError(f"{run}/{cat}: unexpected id {d['id']!r}")
                where = f"{run}/{d['id']}"
                if "inference_log" not in d:
                    if "traceback" not in d or d["id"] not in failed:
                        raise ValueError(f"{where}: no inference_log, no traceback, or not scored as failed")
                    counts["left out: inference raised (traceback)"] += 1
                    continue
                msgs, finish = reshape_run(d, where, counts)
                counts[f"finish {finish}"] += 1
                k = int(m.group(2))
                rec = {"id": f"bfcl-{d['id']}-{run}", "step": k % N_STEPS, "group": d["id"], "model": f"gpt-oss-120b@vllm-{run}",
                       "reward": 0.0 if d["id"] in failed else 1.0, "finish": finish, "messages": msgs}
                rows.append(((k % N_STEPS, ci, k, ri), rec))
                inp, outp = d["input_token_count"], d["output_token_count"]
                logged["first input tokens"].append(inp[0][0])
                logged["last input tokens"].append(inp[-1][-1])
                logged["output tokens per step"].extend(x for t in outp for x in t)
                logged["output tokens per run"].append(sum(x for t in outp for x in t))
                logged["model latency per step (ms)"].extend(round(1000 * x) for t in d["latency"] for x in t)
    rows.sort(key=lambda r: r[0])
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for _, r in rows)
    a.output.write_text(text, encoding="utf-8")
    steps = collections.Counter(r["step"] for _, r in rows)
    print(f"{len(rows)} runs; steps {sorted(steps.items())}; solved {sum(r['reward'] for _, r in rows):.0f}")
    print(dict(sorted(counts.items())))
    for k, v in logged.items():
        print(f"logged {k}: min {min(v)} / median {statistics.median(v)} / max {max(v)} / sum {sum(v)}")
    print("sha256", hashlib.sha256(text.encode("utf-8")).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
