"""Reshape the Ludo clembench runs (LLMs playing a 1x23 Ludo board game against the game master,
alone or against a programmatic opponent) into OpenAI-chat JSONL for
``libra-sim convert --from openai-chat`` (held-out set 41).

Input: a git directory of https://github.com/kimono998/ludo_clembench (the ``fetch`` tool's
snapshot, read with ``git --git-dir=... show``; nothing in it is executed or imported). Read, at
the snapshot's HEAD, every episode under ``results/<player>-t0.0--<other>-t0.0/ludo/<experiment>/
episode_<n>/`` that has a ``requests.json`` (written by clembench's ``GameMaster``: one entry per
model call, ``manipulated_prompt_obj`` = the full message list sent, ``raw_response_obj`` = the
model's answer text) and its ``scores.json`` (``episode scores``: ``Success``, ``Lose``,
``Aborted``, ``Main Score``, ...).

Conversation: each request's message list is the previous one plus the model's answer and the
game master's next message (checked for every episode; a run where it is not is skipped), so the
run is the last request's messages plus the last answer. The prompt is the messages before the
first answer (system message, then the rules, worked examples and the first board state / roll);
each answer is one turn; the game master's next message (board state, the roll, the opponent's
move, or a reprompt after an invalid move) is the turn's return, which ``convert`` names
``respond`` (an assistant text answered by a ``user`` message; outcome ok). The game's verdict
after the last answer is not in the messages: the last turn has no tool, ``finish`` stop.

Reward: ``Success`` of the episode scores (1 won, 0 lost or aborted); no ``scores.json``: null.
Groups: sha1 of the prompt messages plus the episode's dice rolls (``instance.json``): the same
game instance (rules variant, board, the whole roll sequence) played by each model. Steps: groups in sha1 order, ``--runs-per-step`` runs to a
step, never splitting a group.

Usage: python reshape_ludo.py SNAPSHOT_GIT_DIR OUT.jsonl [--runs-per-step 104]
Prints counters and a sha256 digest over the blobs read (sorted lines "<blob sha> <path>").
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import subprocess


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], capture_output=True, check=True
    ).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--runs-per-step", type=int, default=104)
    args = ap.parse_args()
    gd = args.gitdir
    counts: collections.Counter = collections.Counter()
    digest_lines: set[str] = set()

    blobs: dict[str, str] = {}
    for line in git(gd, "ls-tree", "-r", "HEAD", "results").decode().splitlines():
        meta, path = line.split("\t", 1)
        blobs[path] = meta.split()[2]
    convs = []
    for path in sorted(p for p in blobs if p.endswith("/requests.json")):
        ep_dir = path.rsplit("/", 1)[0]
        parts = ep_dir.split("/")  # results / players / ludo / experiment / episode_n
        players, experiment, episode = parts[1], parts[3], parts[4]
        player = players.split("--")[0].removesuffix("-t0.0")
        opponent = players.split("--")[1].removesuffix("-t0.0")
        reqs = json.loads(git(gd, "cat-file", "-p", blobs[path]))
        digest_lines.add(f"{blobs[path]} {path}")
        if not reqs:
            counts["empty requests.json"] += 1
            continue
        ok = all(
            reqs[k + 1]["manipulated_prompt_obj"][
                : len(reqs[k]["manipulated_prompt_obj"])
            ]
            == reqs[k]["manipulated_prompt_obj"]
            and len(reqs[k + 1]["manipulated_prompt_obj"])
            == len(reqs[k]["manipulated_prompt_obj"]) + 2
            for k in range(len(reqs) - 1)
        )
        if not ok:
            counts["skipped: requests are not one growing chat"] += 1
            continue
        msgs = [
            {"role": m["role"], "content": m["content"]}
            for m in reqs[-1]["manipulated_prompt_obj"]
        ]
        msgs.append({"role": "assistant", "content": str(reqs[-1]["raw_response_obj"])})
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        key = json.dumps(msgs[:first], ensure_ascii=False)
        inst_path = f"{ep_dir}/instance.json"
        if (
            inst_path in blobs
        ):  # the dice rolls of the whole game: same rolls, same instance
            digest_lines.add(f"{blobs[inst_path]} {inst_path}")
            inst = json.loads(git(gd, "cat-file", "-p", blobs[inst_path]))
            key += json.dumps(inst.get("rolls"))
        else:
            counts["episode without instance.json (grouped by prompt only)"] += 1
        group = hashlib.sha1(key.encode()).hexdigest()[:12]
        reward = None
        sc_path = f"{ep_dir}/scores.json"
        if sc_path in blobs:
            digest_lines.add(f"{blobs[sc_path]} {sc_path}")
            ep = json.loads(git(gd, "cat-file", "-p", blobs[sc_path])).get(
                "episode scores", {}
            )
            if ep.get("Success") is not None:
                reward = float(ep["Success"])
            verdict = (
                "success"
                if ep.get("Success")
                else ("aborted" if ep.get("Aborted") else "lost")
            )
            counts[f"episode {verdict}"] += 1
        else:
            counts["episode without scores.json (reward null)"] += 1
        mode = "vs programmatic" if opponent == "programmatic" else "single player"
        counts[f"mode {mode}"] += 1
        counts[f"model {player}"] += 1
        convs.append(
            {
                "id": f"{player}/{opponent}/{experiment}/{episode}",
                "group": group,
                "reward": reward,
                "finish": "stop",
                "model": player,
                "messages": msgs,
            }
        )

    by_group: dict[str, list] = collections.defaultdict(list)
    for c in convs:
        by_group[c["group"]].append(c)
    step, in_step = 0, 0
    out = []
    for g in sorted(by_group):
        if in_step and in_step + len(by_group[g]) > args.runs_per_step:
            step, in_step = step + 1, 0
        for c in by_group[g]:
            c["step"] = step
            out.append(c)
        in_step += len(by_group[g])
    with open(args.out, "w") as f:
        for c in out:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    for k in sorted(counts):
        print(f"{k}: {counts[k]}")
    sizes = collections.Counter(len(v) for v in by_group.values())
    print("group sizes", sorted(sizes.items()))
    rs = [c["reward"] for c in out if c["reward"] is not None]
    print("mean reward", round(sum(rs) / len(rs), 4) if rs else None, "over", len(rs))
    dig = hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest()
    print(f"digest {dig} ({len(digest_lines)} blobs)")
    print(
        f"wrote {len(out)} conversations of {len(by_group)} game instances in {step + 1} steps to {args.out}"
    )


if __name__ == "__main__":
    main()
