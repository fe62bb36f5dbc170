"""Reshape DA-Code's committed DA-Agent trajectories (a data-science agent acting with Bash, Python
and SQL actions in a sandbox folder) into OpenAI-chat JSONL for
``libra-sim convert --from openai-chat`` (held-out set 40).

Input: a git directory of https://github.com/yiyihum/da-code (the ``fetch`` tool's snapshot, read
with ``git --git-dir=... show``; nothing in it is executed or imported). Read:

* every ``output/<model>/<task>/dabench/result.json`` in every commit that touched ``output/``
  (written by ``da_agent/agent/agents.py`` ``PromptAgent.get_trajectory``: ``Task``,
  ``system_message``, ``trajectory`` = list of {``observation`` (the observation the step
  answered), ``thought``, ``action``, ``code``, ``response`` (the model's raw text)}, plus
  ``finished`` and ``steps``). The same run was re-committed under several names (ids, then
  uuids); runs are de-duplicated by blob hash;
* every version of ``results/*.json`` (per-task evaluation rows: ``id``, ``total_score``,
  ``actions`` = [type, command or Python line count, result kind]) to find each run's score:
  a run gets the ``total_score`` of an evaluated row whose action list matches its own (type,
  Bash/SQL command, Python line count); no match -> reward null.

Conversation (as ``PromptAgent`` builds it): system = ``system_message`` (it embeds the task);
user = ``"Observation: You are in the folder now.\\n"`` (the agent's first observation); then per
step the assistant's ``response`` and, as the tool return, the next step's observation rendered
``"Observation: <obs>"``. Each Bash/Python/SQL action is one tool call (name ``bash``/``python``/
``sql``, arguments = the action's ``code``), added after the response text (the response already
holds the action text, so the call's arguments double-count it: at most a few hundred tokens, see
README). A step whose action could not be parsed gets tool ``invalid_action`` with the agent's
retry message as its return. ``Terminate(...)`` ends the run (``finish`` stop, no tool); a run
that stops without Terminate (20-step limit, repeated action) ends on its last call:
``tool_limit``, and that last call's return was not logged (tool_tokens 0).

Groups / steps: ``group`` = sha1 of the task text (the same task run several times); groups in
sha1 order, ``--runs-per-step`` runs to a step, never splitting a group.

Usage: python reshape_dacode.py SNAPSHOT_GIT_DIR OUT.jsonl [--runs-per-step 45]
Prints counters and a sha256 digest over the blobs read (sorted lines "<blob sha> <path>").
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import subprocess


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def signature_of_traj(traj: list[dict]) -> tuple:
    sig = []
    for s in traj:
        a = s.get("action") or ""
        kind = a.split("(", 1)[0] if "(" in a else "None"
        if kind == "Python":
            code = s.get("code") or ""
            sig.append((kind, len(code.split("\n"))))
        elif kind in ("Bash", "SQL"):
            sig.append((kind, (s.get("code") or "").strip()))
        else:
            sig.append((kind,))
    return tuple(sig)


def signature_of_row(actions: list) -> tuple:
    sig = []
    for a in actions:
        kind = str(a[0])
        if kind == "Python":
            sig.append((kind, a[1]))
        elif kind in ("Bash", "SQL"):
            sig.append((kind, str(a[1]).strip()))
        else:
            sig.append((kind,))
    return tuple(sig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--runs-per-step", type=int, default=45)
    args = ap.parse_args()
    gd = args.gitdir
    counts: collections.Counter = collections.Counter()
    digest_lines: set[str] = set()

    commits = git(gd, "log", "--all", "--format=%H", "--", "output/").decode().split()
    runs: dict[str, tuple[str, str, dict]] = {}  # blob -> (model, path, data)
    for c in commits:
        for line in git(gd, "ls-tree", "-r", c).decode().splitlines():
            meta, path = line.split("\t", 1)
            if not path.endswith("dabench/result.json") or not path.startswith("output/"):
                continue
            blob = meta.split()[2]
            if blob in runs:
                continue
            data = json.loads(git(gd, "cat-file", "-p", blob))
            if "trajectory" not in data:
                counts["result.json without trajectory"] += 1
                continue
            runs[blob] = (path.split("/")[1], path, data)
            digest_lines.add(f"{blob} {path}")

    # Scored rows of every version of results/*.json: signature -> scores.
    scores: dict[tuple, set] = collections.defaultdict(set)
    rcommits = git(gd, "log", "--all", "--format=%H", "--", "results/").decode().split()
    seen_blobs: set[str] = set()
    for c in rcommits:
        for line in git(gd, "ls-tree", "-r", c, "results/").decode().splitlines():
            meta, path = line.split("\t", 1)
            blob = meta.split()[2]
            if not path.endswith(".json") or blob in seen_blobs:
                continue
            seen_blobs.add(blob)
            try:
                d = json.loads(git(gd, "cat-file", "-p", blob))
            except (json.JSONDecodeError, subprocess.CalledProcessError):
                continue
            rows = d.get("results") if isinstance(d, dict) else d
            if not isinstance(rows, list):
                continue
            digest_lines.add(f"{blob} {path}")
            for r in rows:
                if isinstance(r, dict) and isinstance(r.get("actions"), list) and "total_score" in r:
                    scores[signature_of_row(r["actions"])].add(float(r["total_score"]))

    convs = []
    for blob, (model, path, d) in sorted(runs.items(), key=lambda kv: kv[1][1]):
        traj = d["trajectory"]
        task = d.get("Task") or ""
        group = hashlib.sha1(task.encode()).hexdigest()[:12]
        msgs = [{"role": "system", "content": d["system_message"]},
                {"role": "user", "content": "Observation: {}\n".format(traj[0]["observation"] if traj else "")}]
        finish = "tool_limit"
        for i, s in enumerate(traj):
            act = s.get("action") or "None"
            kind = act.split("(", 1)[0] if "(" in act else "None"
            m = {"role": "assistant", "content": s.get("response") or ""}
            if kind == "Terminate":
                msgs.append(m)
                finish = "stop"
                counts["last action Terminate"] += 1
                break
            name = {"Bash": "bash", "Python": "python", "SQL": "sql"}.get(kind, "invalid_action")
            counts[f"tool {name}"] += 1
            cid = f"c{i}"
            m["tool_calls"] = [{"id": cid, "type": "function",
                                "function": {"name": name, "arguments": json.dumps({"code": s.get("code") or ""})}}]
            msgs.append(m)
            if i + 1 < len(traj):
                msgs.append({"role": "tool", "tool_call_id": cid,
                             "content": "Observation: {}".format(traj[i + 1]["observation"])})
            else:
                msgs.append({"role": "tool", "tool_call_id": cid, "content": ""})
                counts["last action not Terminate (return not logged)"] += 1
        sig = signature_of_traj(traj)
        sc = scores.get(sig)
        reward = next(iter(sc)) if sc and len(sc) == 1 else None
        counts["reward matched" if reward is not None else ("reward ambiguous" if sc else "reward unmatched")] += 1
        counts[f"model {model}"] += 1
        counts[f"finish {finish}"] += 1
        convs.append({"id": f"{model}-{path.split('/')[2]}-{blob[:8]}", "group": group, "reward": reward,
                      "finish": finish, "model": model, "messages": msgs})

    # Steps: groups in sha1 order, about --runs-per-step runs each, no group split.
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
    print(f"wrote {len(out)} conversations of {len(by_group)} tasks in {step + 1} steps to {args.out}")


if __name__ == "__main__":
    main()
