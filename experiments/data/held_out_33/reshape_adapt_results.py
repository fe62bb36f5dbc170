"""Reshape ADaPT's published ALFWorld and TextCraft results into OpenAI-chat JSONL for
``libra-sim convert --from openai-chat`` (held_out_33). Standard library only; reads the
archiki/ADaPT snapshot with ``git show`` at a fixed commit.

    python reshape_adapt_results.py <archiki/ADaPT git dir> OUT.jsonl

One line per task whose stored executor ``trace`` is non-empty. The trace is the concatenated
text of ADaPT's executor runs (`` action\\nobservation\\n>`` per LLM call); each action becomes an
assistant message with one tool call (name: the command's verb, ``think`` for thoughts) and its
observation the tool message. A run that ends with ``think: Task completed!/failed!`` ends with
that thought as a plain assistant message (finish ``stop``); a run the environment ended as won
keeps its last action and observation (finish ``stop``); any other run ends on its last action
and observation (finish ``tool_limit``: the executor hit its action or patience limit). The prompt is
the executor's own few-shot prompt, rebuilt from the repository (see the README).
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import re
import subprocess
import sys

COMMIT = "ecdc4ab0030b4be9be122622d8ea78f8c59c44c4"
FILES = {
    "alfworld": "results/ADaPT_maxd3_alfworld_text_davinci_003.json",
    "textcraft": "results/ADaPT_maxd3_textcraft_gpt-3.5-turbo-instruct.json",
}
MODELS = {"alfworld": "text-davinci-003", "textcraft": "gpt-3.5-turbo-instruct"}
VERBS = {
    "alfworld": {"go", "open", "close", "take", "put", "use", "look", "inventory", "heat", "cool", "clean", "slice", "examine"},
    "textcraft": {"get", "craft", "inventory"},
}


def show(git_dir: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True).stdout


def textcraft_prompt(src: str) -> str:
    """The executor prompt prefix of run_textcraft.py: its string assignments, evaluated alone."""
    keep = {"environment_context", "atomic_examples", "react_trajectory", "atomic_exec_prompt"}
    body = [n for n in ast.parse(src).body
            if isinstance(n, (ast.Assign, ast.AugAssign))
            and {t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)} & keep]
    ns: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), "run_textcraft.py", "exec"), ns)  # literals and joins only
    return "You are a helpful assistant playing Minecraft\n" + ns["environment_context"] + ns["atomic_exec_prompt"]


def alfworld_prompt(exdict: dict) -> str:
    """run_alfworld.py's default ('atomic') executor prompt for text-davinci-003."""
    p = "Here is a demo of actions you can perform.\n\n" + exdict["room"] + "\n\n"
    for i in range(len(exdict) - 1):
        p += exdict[f"action_{i}"] + "\n\n"
    p += ('Here is a complex task for you to perform. If you think you have finished the task, think "Task completed!". '
          'If after trying your best, you conclude that the task is infeasible, think "Task failed!".')
    head = ('Interact with a household to solve a task. Commands "heat", "cool", and "clean" are high-level shortcuts, so you '
            'should only use "go to" commands before them. Do not use "open"/"put"/"take" commands if you plan to use '
            '"clean"/"heat"/"cool". Do not make assumptions if an object is hot/clean/cool without verifying.\n')
    return head + p


def steps_of(trace: str) -> tuple[list[tuple[str, str]], int]:
    """(action, observation) pairs of a stored trace, and the number of executor runs in it."""
    pairs, runs = [], 0
    for k, chunk in enumerate(re.split(r"\n>", trace)):
        if not chunk.strip():
            continue
        if k == 0 or chunk.startswith("\n"):
            runs += 1
        lines = chunk.strip("\n").split("\n")
        pairs.append((lines[0].strip().lstrip("> ").strip(), "\n".join(lines[1:]).strip()))
    return pairs, runs


def verb(env: str, action: str) -> str:
    if action.startswith("think"):
        return "think"
    w = action.split(" ", 1)[0].rstrip(":").lower()
    return w if w in VERBS[env] else "invalid"


def main(git_dir: str, out: str) -> None:
    digest_lines, rows, stats = [], [], collections.Counter()
    tc_src = show(git_dir, "run_textcraft.py")
    ex_src = show(git_dir, "prompts/alfworld_atomic_exec_prompts.json")
    prompts = {"textcraft": textcraft_prompt(tc_src.decode()), "alfworld": alfworld_prompt(json.loads(ex_src))}
    for name, raw in (("run_textcraft.py", tc_src), ("prompts/alfworld_atomic_exec_prompts.json", ex_src)):
        digest_lines.append(f"{hashlib.sha256(raw).hexdigest()}  {name}")
    subruns = []
    for env, path in FILES.items():
        raw = show(git_dir, path)
        digest_lines.append(f"{hashlib.sha256(raw).hexdigest()}  {path}")
        data = json.loads(raw)
        tasks = ([(f"{t}/{n}", v) for t, d in data.items() if t != "overall" for n, v in d.items()] if env == "alfworld"
                 else [(n, v) for n, v in data.items() if n != "overall"])
        for tid, v in tasks:
            reward = 1.0 if v["reward"] in (True, 1, 1.0) else 0.0
            stats[f"{env} tasks"] += 1
            stats[f"{env} reward {reward:g}"] += 1
            pairs, runs = steps_of(v.get("trace") or "")
            if not pairs:
                stats[f"{env} empty trace (not converted), reward {reward:g}"] += 1
                continue
            subruns.append(runs)
            problem = v["problem"] if env == "alfworld" else v["commands"] + "Goal: " + v["problem"]
            msgs = [{"role": "system", "content": prompts[env]}, {"role": "user", "content": problem}]
            last = pairs[-1][0].lower()
            ends = last.startswith("think") and ("task completed" in last or "task failed" in last)
            for j, (act, obs) in enumerate(pairs):
                name = verb(env, act)
                stats[f"action {env}/{name}"] += 1
                if ends and j == len(pairs) - 1:
                    msgs.append({"role": "assistant", "content": act})
                    break
                bad = obs.startswith("Nothing happens") or obs.startswith("Could not")
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{j}", "type": "function", "function": {"name": name, "arguments": json.dumps({"command": act})}}]})
                msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": obs, "outcome": "error" if bad else "ok"})
            gid = f"{env}/{tid}"
            # stop: the executor ended on a final thought, or the environment ended the task as won
            # (its last action's observation is kept); else the action/patience limit ended it
            finish = "stop" if ends or reward == 1.0 else "tool_limit"
            stats[f"{env} finish {finish} ({'final thought' if ends else 'won by env' if reward == 1.0 else 'limit'})"] += 1
            rows.append((hashlib.sha1(gid.encode()).hexdigest(), {
                "id": gid, "group": gid, "reward": reward, "finish": finish,
                "model": MODELS[env], "messages": msgs}))
    rows.sort(key=lambda r: r[0])
    with open(out, "w", encoding="utf-8") as f:
        for _h, r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    for k in sorted(stats):
        print(f"{k}: {stats[k]}")
    subruns.sort()
    print("executor runs per task min/median/max", subruns[0], subruns[len(subruns) // 2], subruns[-1])
    print(f"wrote {len(rows)} conversations to {out}")
    print("source digest (sha256 of sorted 'sha256  path' lines):",
          hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest())
    for line in sorted(digest_lines):
        print("  ", line)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
