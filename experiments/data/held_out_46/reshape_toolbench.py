"""Reshape ToolBench's example DFSDT answer trees (ChatGPT function calling on real RapidAPI tools)
into OpenAI-chat conversations and, optionally, a Libra trace.

Source: https://github.com/OpenBMB/ToolBench (Apache-2.0), folder ``data_example/answer/`` as
committed in d56fdd89faf8c91fa135090b212bb9057ee5cfc2 (``main``, 2025-05-21). Each file
``data_example/answer/G<k>_answer/<query id>_ChatGPT_DFS_woFilter_w2.json`` is one query of the
ToolBench test groups G1 (single tool), G2 (intra-category multi-tool) or G3 (intra-collection
multi-tool), solved by ToolBench's DFSDT search (``toolbench/inference/Algorithms/DFS.py``,
``with_filter=False``, beam 2, chain depth limit 12 nodes, at most 200 model calls) with
``chatgpt_function`` as the model. A file holds ``win``, the whole search ``tree`` (nodes of type
``Thought`` (the model's text), ``Action`` (the function called) and ``Action Input`` (its
arguments, with the tool's ``observation`` and ``observation_code``), and the ``expand_num`` the
search stamped on the node each model call ended at), ``forward_args`` and ``answer_generation``
(``query``, ``function``: the function schemas sent with every call, ``query_count``: model calls,
``total_tokens``: OpenAI usage summed over them, ``finish_type``, ``train_messages``: the
messages of the answer chain).

One conversation per file, its turns being the model calls in the order the search made them:

* the calls: the nodes with ``expand_num`` > 0, in ``expand_num`` order, are where the calls
  ended (one per call: their count equals ``query_count`` in every file); a call's nodes are the
  one it ended at and its ancestors up to the previous call's end (or the root);
* prompt: the system message (from ``train_messages``; for the 2 files without them rebuilt from
  ToolBench's template with the tool names, the tool descriptions, not in the file, as "None"),
  followed by the function schemas as a Qwen/Hermes template would put them (``<tools>`` with
  one JSON schema a line), and the user message with the query;
* each call is an assistant message: the ``Thought`` text as content (when the call wrote one)
  and the function call (``Action`` name, ``Action Input`` arguments); then a ``tool`` message
  with the observation, outcome from the harness's status code (0 ok; 3 final answer, 4 "give up
  and restart": ok, Finish calls; 5 timeout; 1 hallucinated function name, 2 bad Finish
  arguments, 6-12 RapidAPI errors (not working, unauthorized, unsubscribed, rate limits,
  "Message error", request failed): error). The tool is the RapidAPI tool the function belongs
  to (``...for tool "X"`` in its schema), ``Finish`` for Finish, and
  ``invalid_hallucination_function_name`` (the harness's own rename) for unknown names;
* a call that wrote text without a function call gets an empty tool message, so the next call
  stays a separate turn (the converter reads it as ``format_error``, outcome ``error``);
* backtracking: when the search expanded a node a second time it sent ToolBench's
  ``DIVERSITY_PROMPT`` with the earlier candidates (rebuilt here exactly as ``DFS.py`` does,
  ``mento-carlo-action-value`` 0.0 as ``compute_weight`` returns); that user message is added
  before the call, so it counts as input of the turn before. The earlier branch's messages stay
  in the (append-only) conversation: see the README's caveat on context;
* finish: a run that found an answer ends with its ``Finish(give_answer)`` call (no tool message:
  ``tool: null``, finish ``stop``, reward 1.0); a run whose search ended without one (tree or
  budget exhausted) ends after its last call's return (finish ``tool_limit``, reward 0.0);
* step: step k holds the k-th file (by query id) of G1, G2 and G3 (5 steps of 3 runs); group:
  sha1 (first 12 hex) of the prompt messages (every query is distinct: groups of 1).

Usage: python reshape_toolbench.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--trace OUT.jsonl.gz]
``--trace`` converts OUT.jsonl in-process with ``libra.trace.convert.convert_openai_chat``
(tokenizer ``auto``), reads the trace back with ``libra.trace.reader`` (validation) and prints
its shape. Run from the repository root so that ``libra`` imports. Nothing from the snapshot is
imported or executed; the script only reads blobs with ``git``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import statistics
import subprocess

DEFAULT_COMMIT = "d56fdd89faf8c91fa135090b212bb9057ee5cfc2"
FOLDER = "data_example/answer"
MODEL = "gpt-3.5-turbo-16k-0613"  # chatgpt_function_model.py's default; the files say "ChatGPT"
SYSTEM_TEMPLATE = (  # toolbench/inference/Prompts/ReAct_prompts.py + rapidapi.py's task description
    "You are AutoGPT, you can use many tools(functions) to do the following task.\n"
    "First I will give you the task description, and your task start.\n"
    "At each step, you need to give your thought to analyze the status now and what to do next, with a function call to actually excute your step.\n"
    "After the call, you will get the call result, and you are now in a new state.\n"
    "Then you will analyze your status now, then decide what to do next...\n"
    "After many (Thought-call) pairs, you finally perform the task, then you can give your finial answer.\n"
    "Remember: \n"
    "1.the state change is irreversible, you can't go back to one of the former state, if you want to restart the task, say \"I give up and restart\".\n"
    "2.All the thought is short, at most in 5 sentence.\n"
    "3.You can do more then one trys, so if your plan is to continusly try some conditions, you can do one of the conditions per try.\n"
    "Let's Begin!\n"
    "Task description: You should use functions to help handle the real time user querys. Remember:\n"
    "1.ALWAYS call \"Finish\" function at the end of the task. And the final answer should contain enough information to show to the user,"
    "If you can't handle the task, or you find that function calls always fail(the function is not valid now), use function Finish->give_up_and_restart.\n"
    "2.Do not use origin tool names, use only subfunctions' names.\n"
    "You have access of the following tools:\n")
DIVERSITY_PROMPT = (  # toolbench/inference/Prompts/Tree_search_prompts.py
    "This is not the first time you try this task, all previous trails failed.\n"
    "Before you generate my thought for this state, I will first show you your previous actions for this state, "
    "and then you must generate actions that is different from all of them. Here are some previous actions candidates:\n"
    "{previous_candidate}\n"
    "Remember you are now in the intermediate state of a trail, you will first analyze the now state and previous "
    "action candidates, then make actions that is different from all the previous.")
OK_CODES = {0, 3, 4}
TIMEOUT_CODES = {5}
HALLUCINATED = "invalid_hallucination_function_name"


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


def tool_of(functions: list[dict]) -> dict[str, str]:
    """Function name -> the RapidAPI tool it belongs to (``Finish`` -> ``Finish``)."""
    out = {}
    for f in functions:
        m = re.search(r'subfunction for tool "([^"]+)"', f.get("description", ""))
        out[f["name"]] = re.sub(r"\W+", "_", m.group(1)) if m else f["name"]
    return out


def outcome(code, counts: collections.Counter) -> str:
    counts[f"tool returns: status code {code}"] += 1
    if code in OK_CODES:
        return "ok"
    return "timeout" if code in TIMEOUT_CODES else "error"


def diversity_message(parent: dict, earlier: list[dict]) -> str | None:
    """The DIVERSITY_PROMPT DFS.py sent when it expanded ``parent`` again (None: it sent none)."""
    js_list = []
    for child in earlier:
        node = child
        while not node["is_terminal"] and node["node_type"] != "Action Input" and node["children"]:
            node = node["children"][0]
        if node["node_type"] == "Action Input":
            js_list.append({"name": node["_father"]["description"], "arguments": node["description"],
                            "function_output": node["observation"], "mento-carlo-action-value": 0.0})
    if not js_list:
        return None
    des = f"{json.dumps(js_list, indent=2)}\n"
    if parent.get("observation", "") != "":
        des += f"again, your former observation: {parent['observation']}\n"
    return DIVERSITY_PROMPT.replace("{previous_candidate}", des)


def conversation(d: dict, path: str, counts: collections.Counter) -> tuple[list[dict], str, float]:
    ag = d["answer_generation"]
    functions = ag["function"]
    tools = tool_of(functions)
    nodes = []

    def walk(n, father):
        n["_father"] = father
        nodes.append(n)
        for c in n["children"]:
            walk(c, n)

    root = d["tree"]["tree"]
    walk(root, None)
    ends = sorted((n for n in nodes if n["expand_num"] > 0), key=lambda n: n["expand_num"])
    if len(ends) != ag["query_count"]:
        raise SystemExit(f"{path}: {len(ends)} call ends but query_count {ag['query_count']}")
    end_ids = {id(n) for n in ends}
    tm = ag.get("train_messages")
    if tm:
        system, user = tm[-1][0]["content"], tm[-1][1]["content"]
    else:
        counts["prompt rebuilt from the template (no train_messages)"] += 1
        names = list(dict.fromkeys(t for t in tools.values() if t != "Finish"))
        system = SYSTEM_TEMPLATE + "".join(f"{k + 1}.{t}: None\n" for k, t in enumerate(names))
        user = f"\n{ag['query']}\nBegin!\n"
    schemas = "\n".join(json.dumps({"type": "function", "function": f}, ensure_ascii=False) for f in functions)
    msgs = [{"role": "system", "content": f"{system}\n\n# Tools\n\n<tools>\n{schemas}\n</tools>"},
            {"role": "user", "content": user}]
    answered = False
    for k, end in enumerate(ends):
        chain = [end]
        while chain[-1]["_father"] is not None and id(chain[-1]["_father"]) not in end_ids and chain[-1]["_father"] is not root:
            chain.append(chain[-1]["_father"])
        chain.reverse()
        parent = chain[0]["_father"]
        earlier = parent["children"][:parent["children"].index(chain[0])]
        if earlier:
            div = diversity_message(parent, earlier)
            counts["calls after backtracking"] += 1
            if div is not None:
                counts["diversity prompts sent"] += 1
                msgs.append({"role": "user", "content": div})
        thought = next((n["description"] for n in chain if n["node_type"] == "Thought"), "")
        action = next((n for n in chain if n["node_type"] == "Action"), None)
        inp = next((n for n in chain if n["node_type"] == "Action Input"), None)
        if action is None:
            counts["calls without a function call (text only)"] += 1
            msgs.append({"role": "assistant", "content": thought})
            if k < len(ends) - 1:
                msgs.append({"role": "tool", "content": ""})
            continue
        code = inp["observation_code"]
        fn = action["description"]
        # rapidapi.py resolves a name by suffix (``function["name"].endswith(action_name)``)
        fn = fn if fn in tools else next((f for f in tools if fn and f.endswith(fn)), fn)
        name = HALLUCINATED if code == 1 else tools.get(fn, HALLUCINATED)
        counts[f"tool {name if name in ('Finish', HALLUCINATED) else 'rapidapi'}"] += 1
        msgs.append({"role": "assistant", "content": thought, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": inp["description"]}}]})
        if code == 3:
            if k != len(ends) - 1:
                raise SystemExit(f"{path}: a final answer before the last call")
            answered = True
            counts["tool returns: status code 3 (final answer, no return kept)"] += 1
            break
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": inp["observation"], "outcome": outcome(code, counts)})
    if answered != bool(d["win"]):
        raise SystemExit(f"{path}: win {d['win']} but answered {answered}")
    return msgs, "stop" if answered else "tool_limit", 1.0 if answered else 0.0


def reshape(gitdir: str, commit: str):
    counts: collections.Counter = collections.Counter()
    listing = git(gitdir, "ls-tree", "-r", commit, FOLDER).decode().splitlines()
    by_group: dict[str, list] = collections.defaultdict(list)
    logstats = {"query_count": [], "total_tokens": []}
    for line in listing:
        meta, path = line.split("\t", 1)
        if not path.endswith(".json"):
            continue
        blob = meta.split()[2]
        raw = git(gitdir, "cat-file", "-p", blob)
        counts[f"log {path} blob {blob} sha256 {hashlib.sha256(raw).hexdigest()}"] += 1
        g = path.split("/")[2].split("_")[0]
        qid = int(path.rsplit("/", 1)[1].split("_")[0])
        by_group[g].append((qid, path, json.loads(raw)))
    out = []
    for g in sorted(by_group):
        by_group[g].sort()
    n_steps = max(len(v) for v in by_group.values())
    for step in range(n_steps):
        for g in sorted(by_group):
            if step >= len(by_group[g]):
                continue
            qid, path, d = by_group[g][step]
            msgs, finish, reward = conversation(d, path, counts)
            ag = d["answer_generation"]
            logstats["query_count"].append(ag["query_count"])
            logstats["total_tokens"].append(ag["total_tokens"])
            counts[f"run {g}/{qid}: {ag['query_count']} calls, win {d['win']}, finish_type {ag['finish_type']}, "
                   f"{len(ag['function']) - 1} functions, OpenAI total_tokens {ag['total_tokens']}"] += 1
            prompt = json.dumps([[m["role"], m["content"]] for m in msgs[:2]], ensure_ascii=False)
            out.append({"id": f"toolbench/{g}/{qid}", "step": step,
                        "group": hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:12],
                        "reward": reward, "finish": finish, "model": MODEL, "messages": msgs})
    print(f"log: model calls per run (query_count) {quantiles(logstats['query_count'])} ({sum(logstats['query_count'])} in all)")
    print(f"log: OpenAI total_tokens per run (all calls' prompts + completions) {quantiles(logstats['total_tokens'])} "
          f"({sum(logstats['total_tokens']):,} in all)")
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
    print(f"reward {sorted(t.reward for t in trajs)}")
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
    ap.add_argument("--trace", help="also convert to this Libra trace (.jsonl.gz) and validate it")
    args = ap.parse_args()
    commit = git(args.gitdir, "rev-parse", args.commit).decode().strip()
    out, counts = reshape(args.gitdir, commit)
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
