"""Reshape TapeAgents' recorded GAIA agent runs (ServiceNow/TapeAgents, the test data of
``tests/res/gaia_agent/``) into OpenAI-chat JSONL for ``libra.trace.convert.convert_openai_chat``.

The source: TapeAgents' ``GaiaAgent`` (gpt-4o-mini-2024-07-18, temperature 0.2, the repository's
``conf/gaia_openai.yaml`` / ``conf/llm/gpt4o_mini.yaml``) on GAIA validation level-1 questions.
Each run is a *tape* (``tapes/l1_taskNNN.json``: the question, the agent's steps, the
environment's observations, the answer); every step the model wrote carries the ``prompt_id`` of
the LLM call that produced it, and ``tapedata.sqlite.gz`` holds those calls (``LLMCalls``:
the full prompt messages, the output, ``prompt_length_tokens``, ``output_length_tokens``,
``timestamp``). TapeAgents' ``test_gaia_agent`` replays every tape against these calls, so tape
and calls agree. Rules:

* run: one per tape (40), id ``gaia-l1/<task number>``; the LLM calls are the distinct
  ``prompt_id``s of its steps in tape order (each call wrote exactly one step: checked);
* prompt: the first call's prompt messages (system; the instructions with the planning step
  schemas; the question; the planning request);
* turn: one per LLM call. The call's output (one JSON step) is an assistant message with one
  tool call whose arguments are that JSON and whose name is the tool the step asked for:
  ``web_search`` (search_action: web, wiki or youtube), ``read_document`` (read_document_action:
  a URL or an attached file converted to text, first page), ``next_page``, ``python``
  (python_code_action), ``watch_video`` (watch_video_action); a thought (plan_thought,
  list_of_facts_thought, reasoning_thought, reading_result_thought, ...) runs no tool and the
  agent calls the model again at once: tool ``think`` (as ADaPT's and WebShop's ``think``
  actions in sets 33 and 14). The last call's ``gaia_answer_action`` is a plain assistant
  message (no tool; finish ``stop``);
* return of turn k: what the prompt of call k+1 adds to the prompt of call k (by message
  content; the model's own earlier steps, re-rendered as assistant messages, are not counted
  again): the observation (search results, page text, code output, failure) as a tool message
  with outcome ``error`` for ``action_execution_failure``, a page observation with an ``error``,
  or code with a non-zero exit code, else ``ok``; the agent's new user messages (the request of the
  next node, and once per run the instructions message rewritten with the execution step
  schemas) as user messages after it. A think turn whose next prompt adds nothing gets an empty
  tool message (so the converter keeps the calls apart). An earlier page observation that the
  next prompt shows shortened (3 times) is not counted again (the trace cannot shrink);
  a node request that the next prompt drops stays in the trace's context. No latency field
  (the calls have timestamps, the tools no times);
* reward: 1.0 when the answer matches GAIA's ``Final answer`` under GAIA's scorer (TapeAgents'
  ``examples/gaia_agent/scorer.py``: numbers as floats after removing ``$ % ,``; lists split on
  ``,``/``;`` element-wise; strings without whitespace, lower case, punctuation removed), else 0.0;
* step: task-number order, ``--runs-per-step`` runs a step (8: 5 steps); group: sha1 (first 12
  hex) of the prompt messages (every question distinct: groups of 1).

Usage: python reshape_gaia_tapeagents.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--trace OUT.jsonl.gz]
``--trace`` converts OUT.jsonl in-process with ``libra.trace.convert.convert_openai_chat``
(tokenizer ``auto``), reads the trace back with ``libra.trace.reader`` (validation) and prints
its shape. Run from the repository root so that ``libra`` imports. Nothing from the snapshot is
imported or executed; the script only reads blobs with ``git``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import hashlib
import json
import os
import re
import sqlite3
import statistics
import string
import subprocess
import tempfile

DEFAULT_COMMIT = "8bed3e22a42d7fd70ab8159e0d3d3ac423e5accd"
FOLDER = "tests/res/gaia_agent"
MODEL = "gpt-4o-mini-2024-07-18"  # conf/llm/gpt4o_mini.yaml at the commit
TOOLS = {"search_action": "web_search", "read_document_action": "read_document", "next_page_action": "next_page",
         "python_code_action": "python", "watch_video_action": "watch_video"}
ANSWER = "gaia_answer_action"
OBSERVATIONS = {"search_results_observation", "page_observation", "code_execution_result",
                "action_execution_failure", "video_observation", "image_observation"}


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


# GAIA's scorer as TapeAgents' examples/gaia_agent/scorer.py writes it (re-implemented, not imported).
def _number(s: str) -> float:
    for ch in "$%,":
        s = s.replace(ch, "")
    try:
        return float(s)
    except ValueError:
        return float("inf")


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _norm(s: str, remove_punct: bool = True) -> str:
    s = re.sub(r"\s", "", s).lower()
    return s.translate(str.maketrans("", "", string.punctuation)) if remove_punct else s


def gaia_correct(answer: str, truth: str) -> bool:
    if _is_float(truth):
        return _number(answer) == float(truth)
    if any(ch in truth for ch in ",;"):
        gt, ma = re.split("[,;]", truth), re.split("[,;]", answer)
        if len(gt) != len(ma):
            return False
        return all(_number(m) == float(g) if _is_float(g) else _norm(m, False) == _norm(g, False) for m, g in zip(ma, gt))
    return _norm(answer) == _norm(truth)


def kind_of(text: str) -> str | None:
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        return None
    return v.get("kind") if isinstance(v, dict) else None


def obs_outcome(text: str) -> str:
    v = json.loads(text)
    if v["kind"] == "action_execution_failure":
        return "error"
    if v["kind"] == "code_execution_result":
        return "ok" if (v.get("result") or {}).get("exit_code", 0) == 0 else "error"
    if v.get("error"):
        return "error"
    return "ok"


def conversation(tape: dict, calls: dict, name: str, counts: collections.Counter, log: dict) -> tuple[list[dict], float]:
    pids: list[str] = []
    kinds: dict[str, list[str]] = collections.defaultdict(list)
    for s in tape["steps"]:
        p = s["metadata"]["prompt_id"]
        if p and s["kind"] != "set_next_node":  # set_next_node is the agent's, stamped with the call's id
            kinds[p].append(s["kind"])
        if p and p not in pids:
            pids.append(p)
    prompts = [json.loads(calls[p]["prompt"])["messages"] for p in pids]
    outputs = [json.loads(calls[p]["output"])["content"] for p in pids]
    for p, out in zip(pids, outputs):
        if kinds[p] != [kind_of(out)]:
            raise SystemExit(f"{name}: call {p} wrote {kind_of(out)} but the tape has {kinds[p]}")
    if kind_of(outputs[-1]) != ANSWER or any(kind_of(o) == ANSWER for o in outputs[:-1]):
        raise SystemExit(f"{name}: the answer is not the last call")
    for m in (m for ms in prompts for m in ms):
        if not isinstance(m["content"], str):
            raise SystemExit(f"{name}: non-text message content")
    msgs = [{"role": m["role"], "content": m["content"]} for m in prompts[0]]
    for k, out in enumerate(outputs):
        kind = kind_of(out)
        counts[f"call output {kind}"] += 1
        if k == len(outputs) - 1:
            msgs.append({"role": "assistant", "content": out})
            break
        tool = TOOLS.get(kind, "think")
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": tool, "arguments": out}}]})
        prev, nxt = prompts[k], prompts[k + 1]
        old = {(m["role"], m["content"]) for m in prev}
        new_set = {(m["role"], m["content"]) for m in nxt}
        obs, extra = [], []
        for j, m in enumerate(nxt):
            if (m["role"], m["content"]) in old or m["role"] == "assistant":
                continue
            if m["role"] != "user":
                raise SystemExit(f"{name}: call {k + 1} adds a {m['role']} message")
            if j < len(prev) - 1 and (prev[j]["role"], prev[j]["content"]) not in new_set and len(m["content"]) < len(prev[j]["content"]):
                counts["earlier observation shown shortened (not counted again)"] += 1
                continue
            if kind_of(m["content"]) in OBSERVATIONS:
                obs.append(m["content"])
            else:
                extra.append(m["content"])
                counts["agent user message added: " + ("instructions rewritten" if j == 1 else "node request")] += 1
        if tool == "think" and obs:
            raise SystemExit(f"{name}: an observation after a thought")
        if tool != "think" and len(obs) != 1:
            raise SystemExit(f"{name}: {len(obs)} observations after {kind}")
        outcome = obs_outcome(obs[0]) if obs else "ok"
        counts[f"tool {tool} outcome {outcome}" + (f" ({kind_of(obs[0])})" if obs else "")] += 1
        if tool == "think" and not extra:
            counts["think turns with nothing added (empty tool message)"] += 1
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": obs[0] if obs else "", "outcome": outcome})
        msgs.extend({"role": "user", "content": e} for e in extra)
    answer = json.loads(outputs[-1]).get("answer")
    answer = "" if answer is None else str(answer)
    truth = tape["metadata"]["task"]["Final answer"]
    if answer != str(tape["metadata"].get("result", answer)):
        counts["answer differs from the tape's result"] += 1
    ok = gaia_correct(answer, truth)
    pt = [calls[p]["pt"] for p in pids]
    ot = [calls[p]["ot"] for p in pids]
    ts = [datetime.datetime.fromisoformat(calls[p]["ts"]) for p in pids]
    log["calls"].append(len(pids))
    log["sent"].append(sum(pt) + sum(ot))
    log["last"].append(pt[-1] + ot[-1])
    log["pt"].extend(pt)
    log["ot"].extend(ot)
    log["gap"].extend(round((b - a).total_seconds(), 3) for a, b in zip(ts, ts[1:]))
    log["wall"].append(round((ts[-1] - ts[0]).total_seconds(), 3))
    counts[f"run {name}: {len(pids)} calls, real last prompt+output {pt[-1] + ot[-1]}, answer {answer!r} vs {truth!r}: "
           f"{'correct' if ok else 'wrong'}"] += 1
    return msgs, 1.0 if ok else 0.0


def reshape(gitdir: str, commit: str, runs_per_step: int):
    counts: collections.Counter = collections.Counter()
    listing = git(gitdir, "ls-tree", "-r", commit, FOLDER).decode().splitlines()
    tapes, db = [], None
    for line in listing:
        meta, path = line.split("\t", 1)
        blob = meta.split()[2]
        if path.endswith("tapedata.sqlite.gz") or (path.startswith(f"{FOLDER}/tapes/") and path.endswith(".json")):
            raw = git(gitdir, "cat-file", "-p", blob)
            counts[f"log {path} blob {blob} sha256 {hashlib.sha256(raw).hexdigest()}"] += 1
            if path.endswith(".gz"):
                db = gzip.decompress(raw)
            else:
                tapes.append((int(re.search(r"(\d+)\.json$", path).group(1)), json.loads(raw)))
    with tempfile.TemporaryDirectory() as tmp:
        dbp = os.path.join(tmp, "tapedata.sqlite")
        with open(dbp, "wb") as f:
            f.write(db)
        con = sqlite3.connect(dbp)
        calls = {r[0]: {"prompt": r[1], "output": r[2], "pt": r[3], "ot": r[4], "ts": r[5]} for r in con.execute(
            "select prompt_id, prompt, output, prompt_length_tokens, output_length_tokens, timestamp from LLMCalls")}
        con.close()
    counts[f"LLMCalls rows in tapedata.sqlite: {len(calls)}"] += 1
    log: dict[str, list] = collections.defaultdict(list)
    out = []
    used = set()
    for i, (num, tape) in enumerate(sorted(tapes, key=lambda x: x[0])):
        name = f"l1_task{num:03d}"
        msgs, reward = conversation(tape, calls, name, counts, log)
        used |= {s["metadata"]["prompt_id"] for s in tape["steps"] if s["metadata"]["prompt_id"]}
        first = next(j for j, m in enumerate(msgs) if m["role"] == "assistant")
        prompt = json.dumps([[m["role"], m["content"]] for m in msgs[:first]], ensure_ascii=False)
        out.append({"id": f"gaia-l1/{num:03d}", "step": i // runs_per_step,
                    "group": hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:12],
                    "reward": reward, "finish": "stop", "model": MODEL, "messages": msgs})
    counts[f"LLMCalls rows used by the tapes: {len(used)} (the rest belong to runs whose tapes are not committed)"] += 1
    print(f"log: LLM calls per run {quantiles(log['calls'])} ({sum(log['calls'])} in all)")
    print(f"log: prompt_length_tokens per call {quantiles(log['pt'])}; output_length_tokens per call {quantiles(log['ot'])}")
    print(f"log: per run, sum over calls of prompt + output tokens (what was sent and generated) {quantiles(log['sent'])} ({sum(log['sent']):,} in all)")
    print(f"log: per run, the last call's prompt + output tokens (real final context) {quantiles(log['last'])}")
    print(f"log: seconds between consecutive calls' timestamps {quantiles(log['gap'])}; first to last call per run {quantiles(log['wall'])}")
    return out, counts


def trace_stats(path: str) -> None:
    from libra.trace.reader import read_trajectories

    trajs = read_trajectories(path)  # validates every line
    steps = collections.Counter(t.step for t in trajs)
    groups = collections.Counter(t.group for t in trajs)
    turns = [len(t.turns) for t in trajs]
    ctx = [t.prompt_tokens + sum(u.gen_tokens + (u.tool_tokens or 0) for u in t.turns) for t in trajs]
    gen = [u.gen_tokens for t in trajs for u in t.turns]
    ret = [u.tool_tokens or 0 for t in trajs for u in t.turns if u.tool]
    lat = [u.tool_latency_s for t in trajs for u in t.turns if u.tool and u.tool_latency_s is not None]
    print(f"trace {path}: {len(trajs)} runs, {sum(turns)} turns, steps {dict(sorted(steps.items()))}")
    print(f"groups {len(groups)} sizes {sorted(collections.Counter(groups.values()).items())}")
    print(f"turns {quantiles(turns)}")
    print(f"final context {quantiles(ctx)} (> 8192: {sum(c > 8192 for c in ctx)}, "
          f"> 32768: {sum(c > 32768 for c in ctx)}, > 131072: {sum(c > 131072 for c in ctx)})")
    print(f"prompt {quantiles([t.prompt_tokens for t in trajs])}")
    print(f"gen/turn {quantiles(gen)} ({sum(gen):,} in all)")
    print(f"tool tokens/call {quantiles(ret)} ({len(ret)} calls, {sum(ret):,} in all)")
    by_tool: dict[str, list[int]] = collections.defaultdict(list)
    for t in trajs:
        for u in t.turns:
            if u.tool:
                by_tool[u.tool].append(u.tool_tokens or 0)
    for k, v in sorted(by_tool.items()):
        print(f"  tool tokens {k}: {quantiles(v)} ({len(v)})")
    print(f"tools {dict(collections.Counter(u.tool for t in trajs for u in t.turns if u.tool).most_common())}")
    print(f"outcomes {dict(collections.Counter(u.outcome for t in trajs for u in t.turns if u.tool))}")
    print(f"tool latencies recorded: {len(lat)} of {len(ret)}")
    reread = []  # tokens a call-by-call replay reads and writes: every call re-reads the context so far
    for t in trajs:
        c, tot = t.prompt_tokens, 0
        for u in t.turns:
            tot += c + u.gen_tokens
            c += u.gen_tokens + (u.tool_tokens or 0)
        reread.append(tot)
    print(f"per-run sum over calls of (context read + generated) {quantiles(reread)} ({sum(reread):,} in all)")
    print(f"finish {dict(collections.Counter(t.finish for t in trajs))}")
    print(f"reward {sorted(t.reward for t in trajs)} (mean {statistics.mean(t.reward for t in trajs):.3f})")
    for s in sorted(steps):
        sc = [c for t, c in zip(trajs, ctx) if t.step == s]
        st = sum(len(t.turns) for t in trajs if t.step == s)
        print(f"  step {s} runs {len(sc)} ctx {sc} turns {st}")
    for t, c in zip(trajs, ctx):
        print(f"  {t.id}: step {t.step} group {t.group} turns {len(t.turns)} prompt {t.prompt_tokens} ctx {c:,} reward {t.reward} finish {t.finish}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--runs-per-step", type=int, default=8)
    ap.add_argument("--trace", help="also convert to this Libra trace (.jsonl.gz) and validate it")
    args = ap.parse_args()
    commit = git(args.gitdir, "rev-parse", args.commit).decode().strip()
    out, counts = reshape(args.gitdir, commit, args.runs_per_step)
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
        print(f"converted {res.n_trajectories} trajectories to {res.output} (tokens: {res.tokenizer}; "
              f"finish {res.finish_counts}; skipped {len(res.skipped)}; rewarded {res.n_rewarded})")
        trace_stats(args.trace)


if __name__ == "__main__":
    main()
