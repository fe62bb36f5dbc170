"""Reshape the TALES (tale-suite) Jericho text-game logs into OpenAI-chat conversations and,
optionally, a Libra trace.

Source: https://github.com/microsoft/tale-suite (MIT), folder ``logs_gpt4o/`` as committed in
6430f6f6f9cfd49a7537631f89103212cacf48ff (2024-10-21; the same blobs were first committed in
3a4333f5dfcea22a09fe9abf29966f4ad6aae23d the same day and the folder was removed later). Each log
file ``logs_gpt4o/tw-bench_<agent uid>/<env>/a0_s20241001.jsonl`` is one episode of one agent on one
Jericho game (Detective or Zork1), one JSON line per game step with ``Step``, ``Score``,
``Max Score``, ``Normalized Score``, ``Moves``, ``Observation`` (what the agent saw), ``Action``
(the parsed command), ``Feedback`` (the game's answer to it), ``Prompt`` (the messages sent: a dict
``{"messages": [...]}`` or a markdown rendering), ``Response`` (the model's text) and
``Token Usage`` (tale-suite's tiktoken count of that call's prompt and response).

One conversation per distinct log file (a file whose blob is byte-identical to an earlier one is
skipped and counted):

* prompt: the ``system`` message of the first step's logged prompt (the plain LLMAgent prompt, or
  the walkthrough agent's prompt with the game's numbered walkthrough) and a ``user`` message with
  the first step's ``Observation``;
* each step is a turn: an assistant message with the model's ``Response`` as text when it differs
  from the parsed ``Action`` (it never does in these logs) and one tool call named by the action's
  verb (``go`` for directions; ``take``, ``drop``, ``open``, ``read``, ``examine``, ``look``,
  ``inventory``, ... from a fixed list; anything else ``other``) with arguments
  ``{"command": Action}``; then a ``tool`` message with the ``Feedback`` text; ``outcome``
  ``error`` when the feedback is a parser/world refusal (a fixed list of Inform/Infocom phrases,
  e.g. "You can't go that way", "I don't know the word") or a game over ("*** You have died ***",
  "RESTART, RESTORE"), else ``ok``; no latency (the logs hold no times);
* finish ``tool_limit``: every episode ran to the harness's step limit (100 or 200 steps) without
  the game being won, so the last command still runs; reward = the last step's
  ``Score / Max Score`` (tale-suite's normalized score);
* step: the runs sorted by log path, ``--runs-per-step`` (2) a step; group: sha1 (first 12 hex) of
  the prompt messages (system prompt + first observation): runs that saw the same prompt form a
  group (the same game and agent prompt, over models and history limits).

Usage: python reshape_tales.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--runs-per-step 2]
                               [--trace OUT.jsonl.gz]
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

DEFAULT_COMMIT = "6430f6f6f9cfd49a7537631f89103212cacf48ff"
FOLDER = "logs_gpt4o"
DIRECTIONS = {"n", "s", "e", "w", "ne", "nw", "se", "sw", "u", "d", "up", "down", "north", "south",
              "east", "west", "northeast", "northwest", "southeast", "southwest", "go", "walk",
              "run", "enter", "exit", "climb", "in", "out"}
ALIASES = {"x": "examine", "l": "look", "i": "inventory", "get": "take", "pick": "take",
           "z": "wait", "look": "look", "examine": "examine", "inventory": "inventory",
           "inv": "inventory", "check": "examine", "search": "examine", "inspect": "examine"}
VERBS = {"take", "drop", "open", "close", "read", "examine", "look", "inventory", "put", "give",
         "talk", "ask", "tell", "say", "eat", "shoot", "wait", "help", "score", "push", "pull",
         "turn", "move", "unlock", "lock", "kill", "attack", "wear", "light", "show", "use"}
REFUSALS = ("you can't go that way", "i don't know the word", "you can't see any such thing",
            "that's not a verb i recognise", "that's not a verb i recognize",
            "i didn't understand that sentence", "i only understood you as far as",
            "you can't use multiple objects", "that sentence isn't one i recognise",
            "there is a wall there", "i don't understand", "you don't see", "you can't do that",
            "you aren't carrying", "you're not carrying", "you need to be holding",
            "you are not holding", "you don't have", "nothing happens", "you can't", "i beg your pardon")
GAME_OVER = ("*** you have died ***", "restart, restore")


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


def tool_name(action: str) -> str:
    words = re.findall(r"[a-z]+", action.lower())
    if not words:
        return "other"
    w = words[0]
    if w in DIRECTIONS:
        return "go"
    w = ALIASES.get(w, w)
    return w if w in VERBS else "other"


def outcome(feedback: str, counts: collections.Counter) -> str:
    f = feedback.lower()
    if any(p in f for p in GAME_OVER):
        counts["tool returns: game over (error)"] += 1
        return "error"
    if any(p in f for p in REFUSALS):
        counts["tool returns: refusal (error)"] += 1
        return "error"
    return "ok"


def system_text(prompt) -> str:
    if isinstance(prompt, dict):
        for m in prompt.get("messages", []):
            if m.get("role") == "system":
                return str(m.get("content", ""))
        return ""
    m = re.search(r"#### System\n\n```\n(.*?)\n```", str(prompt), re.S)
    return m.group(1) if m else ""


def reshape(gitdir: str, commit: str, per_step: int):
    counts: collections.Counter = collections.Counter()
    logstats: dict = {"token_usage": [], "steps": []}
    listing = git(gitdir, "ls-tree", "-r", commit, FOLDER).decode().splitlines()
    seen: dict[str, str] = {}
    runs = []
    for line in sorted(listing, key=lambda s: s.split("\t", 1)[1]):
        meta, path = line.split("\t", 1)
        blob = meta.split()[2]
        raw = git(gitdir, "cat-file", "-p", blob)
        if blob in seen:
            counts[f"skipped duplicate log (same blob as {seen[blob]})"] += 1
            continue
        seen[blob] = path
        counts[f"log {path} blob {blob} sha256 {hashlib.sha256(raw).hexdigest()}"] += 1
        rows = [json.loads(x) for x in raw.decode("utf-8").splitlines() if x.strip()]
        uid, game = path.split("/")[1], path.split("/")[2]
        model = re.search(r"LLMAgent_(.+?)_s\d+", uid).group(1)
        system = system_text(rows[0]["Prompt"])
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": str(rows[0]["Observation"])}]
        for k, r in enumerate(rows):
            action, response = str(r["Action"]), str(r["Response"])
            logstats["token_usage"].append(r["Token Usage"])
            name = tool_name(action)
            counts[f"tool {name}"] += 1
            msgs.append({"role": "assistant",
                         "content": response if response.strip() != action.strip() else "",
                         "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                             "name": name, "arguments": json.dumps({"command": action}, ensure_ascii=False)}}]})
            fb = str(r["Feedback"])
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": fb, "outcome": outcome(fb, counts)})
        logstats["steps"].append(len(rows))
        last = rows[-1]
        reward = round(float(last["Score"]) / float(last["Max Score"]), 6)
        runs.append({"path": path, "uid": uid, "game": game, "model": model, "reward": reward,
                     "finish": "tool_limit", "messages": msgs})
        counts[f"run {game} {uid}: {len(rows)} steps, score {last['Score']}/{last['Max Score']}"] += 1
    out = []
    for k, r in enumerate(runs):
        prompt = json.dumps([[m["role"], m["content"]] for m in r["messages"][:2]], ensure_ascii=False)
        out.append({"id": f"tales/{r['game']}/{r['uid']}", "step": k // per_step,
                    "group": hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:12],
                    "reward": r["reward"], "finish": r["finish"], "model": r["model"],
                    "messages": r["messages"]})
    print(f"log: Token Usage per call (tale-suite's tiktoken count of prompt + response) "
          f"{quantiles(logstats['token_usage'])} over {len(logstats['token_usage'])} calls")
    print(f"log: steps per episode {sorted(logstats['steps'])}")
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
    print(f"finish {dict(collections.Counter(t.finish for t in trajs))}")
    print(f"reward {sorted(t.reward for t in trajs)}")
    for s in sorted(steps):
        sc = [c for t, c in zip(trajs, ctx) if t.step == s]
        st = sum(len(t.turns) for t in trajs if t.step == s)
        print(f"  step {s} runs {len(sc)} ctx {sc} turns {st}")
    for t, c in zip(trajs, ctx):
        print(f"  {t.id}: step {t.step} group {t.group} turns {len(t.turns)} prompt {t.prompt_tokens} ctx {c:,} reward {t.reward}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--runs-per-step", type=int, default=2)
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
