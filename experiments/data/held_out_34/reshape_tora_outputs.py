"""Reshape ToRA's published GSM8K model outputs into OpenAI-chat JSONL for
``libra-sim convert --from openai-chat`` (held_out_34). Standard library only; reads the
microsoft/ToRA snapshot with ``git show`` at a fixed commit.

    python reshape_tora_outputs.py <microsoft/ToRA git dir> OUT.jsonl

One line per (model, GSM8K test question). ToRA's stored ``code[0]`` is the whole completion after
``<|assistant|>``: the model's generations with each interpreter result appended as
``\\n```output\\n<result>\\n```\\n`` (``infer/inference.py``). The text is split at those blocks:
each generation before a block is an assistant message with one tool call ``python`` (empty
arguments: the code is in the text) and the block the tool message; the text after the last block
is the final assistant message (finish ``stop``). The reward is ToRA's own check
(``eval/grader.py: math_equal``) of the stored ``pred`` against ``gt``, re-implemented here for the
numeric case (and the plain string case); the mean per model is compared with the committed
``.metrics`` file.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import re
import subprocess
import sys

COMMIT = "213c1c995038c73fab10343814df7a42f990f026"
MODELS = ["tora-70b-v1.0", "tora-code-34b-v1.0"]
RUN = "src/outputs/llm-agents/{m}/gsm8k/test_tora_-1_seed0_t0.0_s0_e1319"
OUTPUT = re.compile(r"\n```output\n(.*?)\n```\n", re.DOTALL)
# the executor returns stdout, else its report: "Done", the traceback's last line, or "Timeout Error"
ERROR = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")
LIMIT = "Reach max function call limit."


def show(git_dir: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True).stdout


def is_digit(s: object) -> bool:
    try:
        float(str(s).replace(",", ""))
        return True
    except ValueError:
        return False


def math_equal(pred: str, ref: str) -> bool:
    """ToRA's ``math_equal`` for what GSM8K needs: numbers (with the percentage variants,
    rel_tol 1e-4), else strings equal once brackets/braces are removed (the sympy step is not
    re-run; the script reports how many predictions reach it)."""
    if is_digit(pred) and is_digit(ref):
        p, r = float(str(pred).replace(",", "")), float(str(ref).replace(",", ""))
        return any(math.isclose(x, p, rel_tol=1e-4) for x in (r / 100, r, r * 100))
    if not pred:
        return False
    strip = lambda s: re.sub(r"[{}()]", "", str(s).strip())  # noqa: E731
    return strip(pred) == strip(ref)


def outcome(result: str) -> str:
    if result.startswith("Timeout Error") or "TimeoutError" in result.split(":", 1)[0]:
        return "timeout"
    return "error" if ERROR.match(result) else "ok"


def main(git_dir: str, out: str) -> None:
    digest_lines, rows, stats = [], [], collections.Counter()
    tasks: dict[str, set[int]] = {}
    for model in MODELS:
        raw = show(git_dir, RUN.format(m=model) + ".jsonl")
        metrics = show(git_dir, RUN.format(m=model) + ".metrics")
        for name, blob in ((RUN.format(m=model) + ".jsonl", raw), (RUN.format(m=model) + ".metrics", metrics)):
            digest_lines.append(f"{hashlib.sha256(blob).hexdigest()}  {name}")
        recs = [json.loads(x) for x in raw.decode("utf-8").splitlines() if x.strip()]
        tasks[model] = {r["idx"] for r in recs}
        assert len(tasks[model]) == len(recs), model
        solved = 0
        for r in recs:
            assert len(r["code"]) == 1 and len(r["pred"]) == 1, (model, r["idx"])  # n_sampling 1
            code, pred = r["code"][0], r["pred"][0]
            if not is_digit(pred):
                stats[f"{model} pred not a number (string check; sympy step not re-run)"] += 1
            reward = 1.0 if math_equal(pred, r["gt"]) else 0.0
            solved += reward == 1.0
            parts = OUTPUT.split(code)
            gens, results = parts[0::2], parts[1::2]
            assert LIMIT not in code, (model, r["idx"])  # no run reached the 4-call limit
            msgs = [{"role": "user", "content": r["question"]}]
            for k, res in enumerate(results):
                msgs.append({"role": "assistant", "content": gens[k], "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "python", "arguments": ""}}]})
                oc = outcome(res)
                stats[f"python {oc}"] += 1
                msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"```output\n{res}\n```", "outcome": oc})
            final = gens[-1]
            msgs.append({"role": "assistant", "content": final})
            stats[f"{model} calls {len(results)}"] += 1
            stats[f"{model} final with boxed" if "boxed" in final else f"{model} final without boxed"] += 1
            if not final.strip():
                stats[f"{model} empty final generation"] += 1
            gid = f"gsm8k-{r['idx']}"
            rows.append((hashlib.sha1(gid.encode()).hexdigest(), MODELS.index(model), {
                "id": f"tora-{gid}-{model}", "group": gid, "reward": reward, "finish": "stop",
                "model": model, "messages": msgs}))
        stored = metrics.decode().split("Mean score: [", 1)[1].split("]", 1)[0]
        stats[f"{model} solved {solved} of {len(recs)} ({100 * solved / len(recs):.1f}%; .metrics says {stored})"] += 1
    assert tasks[MODELS[0]] == tasks[MODELS[1]], "task sets differ"
    rows.sort(key=lambda r: r[:2])
    with open(out, "w", encoding="utf-8") as f:
        for *_k, rec in rows:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    for k in sorted(stats):
        print(f"{k}: {stats[k]}")
    print(f"wrote {len(rows)} conversations to {out}")
    print("source digest (sha256 of sorted 'sha256  path' lines):",
          hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest())
    for line in sorted(digest_lines):
        print("  ", line)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
