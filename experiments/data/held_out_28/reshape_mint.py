"""Reshape MINT (xingyaoww/mint-bench) committed run logs into `--from openai-chat` JSONL.

Usage: python reshape_mint.py <dir holding data/outputs> <out.jsonl> MODEL [MODEL ...]

Reads data/outputs/<model>/F=None/max5_p2+tool+cd/<category>/<subset>/results.jsonl (MINT's
5-turn, 2-proposal setting without language feedback) and writes one OpenAI-format chat line per
run (rules in this folder's README, "Conversion"). Only the structure and the texts needed for
token counting go into the intermediate file; the converter keeps counts, not text.
"""

from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import re
import sys

SETTING = "F=None/max5_p2+tool+cd"
SUBSETS = ["humaneval", "mbpp", "alfworld", "gsm8k", "hotpotqa", "math", "mmlu", "theoremqa"]
EXECUTE = re.compile(r"<execute>(.*?)</execute>", re.DOTALL)
SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
INVALID = "Observation:\nI don't understand your input."
WRONG = "Observation:\nYour answer is wrong."
# an execution that raised (IPython's traceback / error lines, as MINT's Python tool returns them)
EXEC_ERROR = re.compile(r"Traceback \(most recent call last\)|^\s*Cell In\[\d+\], line \d+|^\w*(Error|Exception)\b|^-{20,}\s*$", re.MULTILINE)


def action(text: str) -> str:
    """MINT's parser (`LMAgent.lm_output_to_action`, `GeneralEnv.parse_action`): a reply holding
    "<solution>" is a proposal (counted even when no closed, non-empty <solution>...</solution> can
    be parsed); else the joined non-empty <execute>...</execute> blocks are run; else invalid."""
    if "<solution>" in text:
        return "solution"
    if "\n".join(i.strip() for i in EXECUTE.findall("\n" + text + "\n")):
        return "execute"
    return "invalid"


def main() -> None:
    root, out, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    stats: collections.Counter = collections.Counter()
    rows = []
    for subset in SUBSETS:
        order: dict | None = None
        for model in models:
            paths = glob.glob(os.path.join(root, "data/outputs", model, SETTING, "*", subset, "results.jsonl"))
            assert len(paths) == 1, (model, subset, paths)
            recs = [json.loads(x) for x in open(paths[0], encoding="utf-8") if x.strip()]
            ids = [r["task"]["task_id"] for r in recs]
            assert len(ids) == len(set(ids)), (model, subset, "duplicate task ids")
            if order is None:
                order = {t: k for k, t in enumerate(sorted(ids, key=lambda t: (str(type(t)), t)))}
            assert set(ids) == set(order), (model, subset, "task set differs between models")
            for r in recs:
                s, tid = r["state"], r["task"]["task_id"]
                stats[f"model {model}"] += 1
                if s["terminate_reason"] == "error":
                    stats["left out: inference raised (terminate_reason error)"] += 1
                    continue
                h = s["history"]
                assert h[0]["role"] == "user" and h[-1]["role"] == "assistant", (model, subset, tid)
                msgs = [{"role": "user", "content": h[0]["content"]}]
                prev = "user"
                n_actions = 0
                for k, m in enumerate(h[1:], 1):
                    if m["role"] == "assistant":
                        assert prev == "user", (model, subset, tid, k)
                        a = action(m["content"])
                        n_actions += 1
                        last = k == len(h) - 1
                        out_m = {"role": "assistant", "content": m["content"]}
                        if a == "execute" or (a == "solution" and not last):
                            name = "execute" if a == "execute" else "propose_solution"
                            out_m["tool_calls"] = [{"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": ""}}]
                        msgs.append(out_m)
                        stats[f"action {a}"] += 1
                    else:
                        assert m["role"] == "user"
                        if prev == "user":  # a model reply MINT did not log (empty): an invalid action
                            assert m["content"].startswith(INVALID), (model, subset, tid, k)
                            msgs.append({"role": "assistant", "content": ""})
                            stats["invalid action without a logged reply"] += 1
                            stats["action invalid"] += 1
                            n_actions += 1
                        kind = action(msgs[-1]["content"]) if msgs[-1]["content"] else "invalid"
                        text = m["content"]
                        if kind == "invalid":
                            assert text.startswith(INVALID), (model, subset, tid, k, text[:80])
                            outcome = "error"
                        elif kind == "solution":
                            assert text.startswith((WRONG, INVALID)), (model, subset, tid, k, text[:80])
                            stats["propose_solution unparsed" if text.startswith(INVALID) else "propose_solution wrong"] += 1
                            outcome = "error"
                        else:
                            body = text.split("\nYou have ", 1)[0]
                            outcome = "error" if EXEC_ERROR.search(body) else "ok"
                        stats[f"{'propose_solution' if kind == 'solution' else kind} {outcome}"] += 1
                        msgs.append({"role": "tool", "tool_call_id": f"c{k - 1}", "content": text, "outcome": outcome})
                    prev = m["role"]
                stats[f"actions {n_actions}"] += 1
                last_kind = action(h[-1]["content"])
                reason = s["terminate_reason"]
                if last_kind == "solution":
                    finish = "stop"  # the answer ends the run (graded at once)
                elif last_kind == "execute":
                    # the last code ran (MINT executes it, then the run ends); its output is not logged
                    msgs.append({"role": "tool", "tool_call_id": f"c{len(h) - 1}", "content": "", "outcome": "ok"})
                    finish = "tool_limit"
                    stats[f"last action execute ({reason})"] += 1
                else:
                    assert reason == "max_steps", (model, subset, tid, reason)
                    finish = "tool_limit"
                    stats["last action invalid (max_steps)"] += 1
                assert reason in ("task_success", "max_steps", "max_propose_steps"), reason
                assert (reason == "task_success") == bool(s["success"]), (model, subset, tid)
                stats[f"terminate {reason}"] += 1
                pos = order[tid]
                rows.append((pos % 5, SUBSETS.index(subset), pos, models.index(model), {
                    "id": f"mint-{subset}-{tid}-{model}", "step": pos % 5, "group": f"mint-{subset}-{tid}",
                    "reward": 1.0 if s["success"] else 0.0, "finish": finish, "model": model, "messages": msgs}))
    rows.sort(key=lambda r: r[:4])
    with open(out, "w", encoding="utf-8") as f:
        for *_k, rec in rows:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    steps = collections.Counter(r[0] for r in rows)
    print(len(rows), "runs; steps", sorted(steps.items()), "; solved", sum(r[4]["reward"] == 1 for r in rows))
    print(dict(sorted(stats.items())))
    print("sha256", hashlib.sha256(open(out, "rb").read()).hexdigest())


if __name__ == "__main__":
    main()
