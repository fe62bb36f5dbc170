"""Reshape the NegotiationArena trading-game logs (two LLM agents negotiating a resource trade
with each other, the paper's section-one cross-play of GPT-4, GPT-3.5, Claude-2 and Claude-2.1)
into OpenAI-chat JSONL for ``libra-sim convert --from openai-chat`` (held-out set 42).

Input: a git directory of https://github.com/vinid/NegotiationArena (the ``fetch`` tool's
snapshot, read with ``git --git-dir=... ls-tree / cat-file``; nothing in it is executed or
imported). The logs are not at the default branch's HEAD: they are read at ``--commit``
(default 2746b3cc..., the newest commit holding ``experiments/``), every
``experiments/section_one/.logs/trading_section_one/<epoch ms>/game_state.json`` (written by the
game's ``AlternatingGame``: ``players[i].conversation`` = the exact message list player i sent
to its model, plus its last answer; ``game_state[-1].summary`` = ``final_response``,
``player_outcome`` = each player's net resource change). The broken games the authors moved to
``.logs_error/`` are not read.

Conversation: one run per player per game (two runs a game). The prompt is the messages before
the player's first answer: the system prompt (rules, own resources, goal) and the first user
message (for the first mover, its role line; for the second, the first mover's public message
and proposed trade). Each answer is one turn; the next user message (the other player's public
message, answer and proposed trade: the other LLM's move) is the turn's return, which
``convert`` names ``respond`` (outcome ok). A game ends on ACCEPT or after 8 moves in all; the
other player's final move is not appended to a conversation, so the last turn has no tool.

Reward: the player's net resource change (sum of ``player_outcome`` over X and Y; the game is
zero-sum, 0 without a trade). finish: ``tool_limit`` when the game ran out of moves without an
accepted trade (``final_response`` NONE after 8 moves), else ``stop``.
Steps / groups: the games of each ordered model pair (60 each) in time order are cut into
chunks of ``--games-per-chunk`` (6); step k = chunk k of every pair (both players of a game in
one step); group = sha1 of the player's system prompt (rules, own resources, goal), its seat,
its and the opponent's model and the chunk: the same task against the same opponent, sampled 6
times (the system prompts are the same in every game, temperature 0.7; the second mover's first
user message is the other model's first move, so it is not part of the key).

Usage: python reshape_negotiationarena.py SNAPSHOT_GIT_DIR OUT.jsonl [--commit SHA] [--games-per-chunk 6]
Prints counters, an estimate of game wall times from the game folders' start times (games were
run one after another; not written to the trace) and a sha256 digest over the blobs read
(sorted lines "<blob sha> <path>").
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import statistics
import subprocess

GAME_DIR = "experiments/section_one/.logs/trading_section_one"
DEFAULT_COMMIT = "2746b3cc93810d138d8ab712a5fdb60ce733c7c7"


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], capture_output=True, check=True
    ).stdout


def net_change(outcome) -> float:
    if isinstance(outcome, dict):  # {"_type": "resource", "_value": {"X": dx, "Y": dy}}
        return float(sum(outcome["_value"].values()))
    return float(outcome)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--games-per-chunk", type=int, default=6)
    args = ap.parse_args()
    gd = args.gitdir
    commit = git(gd, "rev-parse", args.commit).decode().strip()
    counts: collections.Counter = collections.Counter()
    digest_lines: list[str] = []

    games = []
    for line in git(gd, "ls-tree", "-r", commit, GAME_DIR).decode().splitlines():
        meta, path = line.split("\t", 1)
        if not path.endswith("/game_state.json"):
            continue
        sha = meta.split()[2]
        digest_lines.append(f"{sha} {path}")
        d = json.loads(git(gd, "cat-file", "-p", sha))
        games.append((int(path.split("/")[-2]), path, d))
    games.sort(key=lambda g: g[0])

    # game wall time estimate: start of the next game minus this start (sequential runs)
    walls = []
    for (t0, _, d), (t1, _, _) in zip(games, games[1:]):
        gap = (t1 - t0) / 1000.0
        if gap < 600:  # skip breaks between batches
            walls.append((gap, len(d["game_state"]) - 2))

    by_pair: dict[tuple[str, str], list] = collections.defaultdict(list)
    for g in games:
        d = g[2]
        if d.get("class") != "TradingGame" or len(d["players"]) != 2:
            counts["skipped: not a two-player TradingGame"] += 1
            continue
        by_pair[(d["players"][0]["model"], d["players"][1]["model"])].append(g)

    out = []
    for pair in sorted(by_pair):
        for k, (ts, path, d) in enumerate(by_pair[pair]):
            chunk = k // args.games_per_chunk
            summary = d["game_state"][-1]["summary"]
            final = str(summary.get("final_response"))
            n_moves = len(d["game_state"]) - 2  # START and END entries around the moves
            no_deal = "ACCEPT" not in final
            counts[f"game final_response {final} ({'no deal' if no_deal else 'deal'})"] += 1
            for i, player in enumerate(d["players"]):
                conv = player["conversation"]
                msgs = [{"role": m["role"], "content": m["content"]} for m in conv]
                pattern = "".join(m["role"][0] for m in msgs)
                first = pattern.find("a")
                body = pattern[first:]
                if first < 1 or body != "au" * (len(body) // 2) + "a" * (len(body) % 2) or not body.endswith("a"):
                    counts["skipped run: not prompt + alternating answers/replies ending on an answer"] += 1
                    continue
                opponent = d["players"][1 - i]["model"]
                # the task instance: the system prompt (rules, own resources and goal, role); not the
                # second mover's first user message, which is the other model's first move
                system = [m for m in msgs[:first] if m["role"] == "system"]
                key = json.dumps(system, ensure_ascii=False) + f"|{i}|{player['model']}|{opponent}|{chunk}"
                group = hashlib.sha1(key.encode()).hexdigest()[:12]
                counts[f"model {player['model']}"] += 1
                counts[f"player {i} ({player['agent_name']}) turns {body.count('a')}"] += 1
                out.append(
                    {
                        "id": f"trading_section_one/{ts}/{player['agent_name'].replace(' ', '_')}",
                        "step": chunk,
                        "group": group,
                        "reward": net_change(summary["player_outcome"][i]),
                        "finish": "tool_limit" if no_deal and n_moves >= int(d.get("iterations", 8)) else "stop",
                        "model": player["model"],
                        "messages": msgs,
                    }
                )
    out.sort(key=lambda c: (c["step"], c["group"], c["id"]))
    with open(args.out, "w") as f:
        for c in out:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    for k in sorted(counts):
        print(f"{k}: {counts[k]}")
    print("model pairs", {f"{a} vs {b}": len(v) for a, b in sorted(by_pair) for v in [by_pair[(a, b)]]})
    groups = collections.Counter(c["group"] for c in out)
    print("group sizes", sorted(collections.Counter(groups.values()).items()))
    steps = collections.Counter(c["step"] for c in out)
    print("runs per step", dict(sorted(steps.items())))
    rs = [c["reward"] for c in out]
    print("reward (net resource change) mean", round(sum(rs) / len(rs), 4), "min", min(rs), "max", max(rs),
          "zero", sum(r == 0 for r in rs), "over", len(rs))
    if walls:
        gw = sorted(w for w, _ in walls)
        per_move = sorted(w / max(n, 1) for w, n in walls)

        def q(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(p * len(xs)))]

        print(f"game wall time estimate (s, {len(gw)} gaps < 600 s): min {gw[0]:.1f} median {statistics.median(gw):.1f} "
              f"p90 {q(gw, 0.9):.1f} max {gw[-1]:.1f}; per move median {statistics.median(per_move):.1f} p90 {q(per_move, 0.9):.1f}")
    dig = hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest()
    print(f"commit {commit}")
    print(f"digest {dig} ({len(digest_lines)} blobs)")
    print(f"wrote {len(out)} conversations of {len(games)} games in {len(steps)} steps to {args.out}")


if __name__ == "__main__":
    main()
