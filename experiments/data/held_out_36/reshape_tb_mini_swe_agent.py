"""Reshape the Terminal-Bench leaderboard's mini-swe-agent + Claude Sonnet 4 runs into OpenAI-chat
JSONL for ``libra-sim convert --from openai-chat`` (held-out set 36).

Input: a git directory of https://github.com/laude-institute/terminal-bench-leaderboard (the
``fetch`` tool's snapshot, read with ``git --git-dir=... cat-file``; nothing in it is executed).
Read, per trial under ``results/terminal-bench-core@0.1.1/20250825_swe-agent-mini_claude-4-sonnet/
<run>/<task>/<trial>/``: ``sessions/agent.cast`` (the asciinema v2 recording of the agent's tmux
pane: timestamped terminal output) and ``results.json`` (``task_id``, ``is_resolved``,
``failure_mode``, agent start/end times). Standard library only.

What mini-swe-agent (1.7.0, 1.8.1 or 1.9.0: whatever each trial's install got) prints in its interactive (``-y``) mode is the whole conversation it
sends to the model: ``System:`` (system prompt), ``User:`` (task prompt), then per step
``mini-swe-agent (step N, $cost):`` + the model's answer, then ``User:`` + the observation
(``<returncode>N</returncode><output>...</output>``, a timeout notice or a format-error notice),
ending with ``Saved trajectory to ...``. Each printed block carries the cast's timestamp, so the
tool latency of step N is the time from the answer's print to the next ``User:`` header (the
command runs in between; spinner frames and ANSI codes are dropped).

Output: one line per trial in which mini-swe-agent ran (a trial whose install failed, "mini:
command not found", has no model turn and is left out, as is one that crashed before its first
step):
``{"id", "group" (task id), "step", "reward" (1 if resolved else 0), "finish", "model", "messages"}``.

Usage: python reshape_tb_mini_swe_agent.py SNAPSHOT_GIT_DIR OUT.jsonl [--steps 4]
Prints counters and a sha256 digest over the files read (sorted lines "<sha256>  <path>").
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import subprocess
import sys

BASE = "results/terminal-bench-core@0.1.1/20250825_swe-agent-mini_claude-4-sonnet"
MODEL = "claude-sonnet-4-0"

_SPIN = re.compile(r"(?:\r\x1b\[2K)?(?:\x1b\[32m)?[\u2800-\u28ff](?:\x1b\[0m)? Waiting for the LM to respond\.\.\.")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Z0-9]|\x1b[=>]")
_STEP = re.compile(r"\nmini-swe-agent \(step (\d+), \$([0-9.]+)\):\n")
_USER = "\nUser:\n"
_SEP = re.compile(r"\n?\u2500{20,}\n")
_PROMPT = re.compile(r"\n?root@[0-9a-f]{6,}:[^\n#]*# ")
_BASH = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
_RC = re.compile(r"^<returncode>(-?\d+)</returncode>")
_TIMEOUT = "The last command <command>"
#: LiteLLM's logging error (a missing optional dependency), printed to the pane by a background
#: thread after each model call, often inside the answer or observation text: not part of the
#: conversation, dropped.
#: Spinner frames and ANSI codes split over two events (left by the per-event cleaning) too.
_NOISE = re.compile(r"\d\d:\d\d:\d\d - LiteLLM:ERROR:.*?\nImportError: Missing dependency[^\n]*\n?|"
                    r"[\u2800-\u28ff](?:\x1b\[[0-9;]*m)? Waiting for the LM to respond\.\.\.|\x1b\[[0-9;?]*[A-Za-z]", re.DOTALL)
_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_WRAPPERS = frozenset({"sudo", "env", "time", "nohup", "exec", "command", "builtin"})


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def tool_of(command: str) -> str:
    """The program a bash action runs: its first word after ``cd X &&``, ``VAR=value``, wrappers
    and ``timeout N`` (the rule of the converter's ``tool_name``); ``python3.11`` -> ``python``."""
    text = command.strip().lstrip("({ ")
    while True:
        m = re.match(r"^cd\s+\S+\s*(?:&&|;)\s*", text)
        if not m:
            break
        text = text[m.end():]
    words = text.replace("(", " ").split()
    i = 0
    while i < len(words):
        w = words[i]
        if _ENV_ASSIGN.match(w) or w in _WRAPPERS:
            i += 1
        elif w == "timeout":
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in ("-s", "-k", "--signal", "--kill-after") else 1
            i += 1
        else:
            break
    if i >= len(words):
        return "bash"
    name = words[i].rsplit("/", 1)[-1].strip("`'\";&|(){}") or "bash"
    return "python" if re.match(r"^python[\d.]*$", name) else name


def clean_cast(raw: str) -> tuple[str, list[int], list[float], float]:
    """(cleaned output text, start offset of each kept event, its time in s, the last event's time)."""
    lines = raw.splitlines()
    header = json.loads(lines[0])
    parts: list[str] = []
    offs: list[int] = []
    times: list[float] = []
    n = 0
    last_t = 0.0
    for ln in lines[1:]:
        if not ln.strip():
            continue
        t, kind, data = json.loads(ln)
        last_t = float(t)
        if kind != "o":
            continue
        d = _ANSI.sub("", _SPIN.sub("", data)).replace("\r\n", "\n").replace("\r", "")
        if not d:
            continue
        offs.append(n)
        times.append(float(t))
        parts.append(d)
        n += len(d)
    assert header.get("version") == 2
    s = "".join(parts)
    spans = [(m.start(), m.end()) for m in _NOISE.finditer(s)]
    if spans:  # drop the LiteLLM blocks and spinner leftovers, shifting the event offsets
        kept, new_offs, j, cut = [], [], 0, 0
        prev = 0
        for a, b in spans:
            kept.append(s[prev:a])
            prev = b
        kept.append(s[prev:])
        for o in offs:
            while j < len(spans) and spans[j][1] <= o:
                cut += spans[j][1] - spans[j][0]
                j += 1
            inside = j < len(spans) and spans[j][0] <= o
            new_offs.append((spans[j][0] if inside else o) - cut)
        s, offs = "".join(kept), new_offs
    return s, offs, times, last_t


def time_at(offs: list[int], times: list[float], pos: int) -> float:
    """Time of the event that printed character ``pos``."""
    lo, hi = 0, len(offs) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offs[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return times[lo]


def parse_trial(raw_cast: str, res: dict, counts: collections.Counter) -> dict | None:
    s, offs, times, last_t = clean_cast(raw_cast)
    start = s.find("This is mini-swe-agent version")
    if start < 0:
        counts["trial without mini-swe-agent output (install failed: not converted)"] += 1
        return None
    sys_at = s.find("\nSystem:\n", start)
    user_at = s.find(_USER, sys_at)
    first_step = _STEP.search(s, user_at)
    if sys_at < 0 or user_at < 0 or first_step is None:
        counts["mini-swe-agent started but made no step (not converted)"] += 1
        return None
    system = s[sys_at + len("\nSystem:\n"):user_at].strip("\n")
    sep = _SEP.search(s, user_at + len(_USER))
    task = s[user_at + len(_USER):(sep.start() if sep and sep.start() < first_step.start() else first_step.start())].strip("\n")
    end_m = _PROMPT.search(s, first_step.end())
    end = end_m.start() if end_m else len(s)
    msgs: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    steps = [m for m in _STEP.finditer(s, first_step.start()) if m.start() < end]
    finish = None
    tail = ""
    for k, m in enumerate(steps):
        nxt = steps[k + 1].start() if k + 1 < len(steps) else end
        u = s.find(_USER, m.end(), nxt)
        body_end = u if u >= 0 else nxt
        content = s[m.end():body_end].strip("\n")
        t_gen = time_at(offs, times, max(m.end(), body_end - 1))
        blocks = _BASH.findall(content)
        msg: dict = {"role": "assistant", "content": content}
        if len(blocks) == 1:
            msg["tool_calls"] = [{"id": f"c{k + 1}", "type": "function", "function": {"name": tool_of(blocks[0]), "arguments": "{}"}}]
        if u < 0:  # the log ends before any answer to this step: killed while the command ran
            msgs.append(msg)
            if res.get("failure_mode") == "agent_timeout" or k + 1 == len(steps):
                # the time the command had run when the recording stopped (a lower bound); under
                # 1 s it says nothing (the run was cut as the command started): null
                lat = round(max(0.0, last_t - t_gen), 3)
                msgs.append({"role": "tool", "tool_call_id": f"c{k + 1}", "content": "", "latency_s": lat if lat >= 1.0 else None, "outcome": "timeout"})
                counts[f"last command still running when the recording ended (empty return, timeout, latency {'to the end' if lat >= 1.0 else 'null'})"] += 1
                finish = "abort"
            break
        obs_start = u + len(_USER)
        sep = _SEP.search(s, obs_start, nxt)
        obs_end = sep.start() if sep else nxt
        obs = s[obs_start:obs_end].strip("\n")
        t_obs = time_at(offs, times, u + 1)
        if _SUBMIT in "".join(blocks) and (obs.startswith("Saved trajectory") or not obs):
            msg.pop("tool_calls", None)
            msgs.append(msg)
            finish = "stop"
            counts["submitted (echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT): final turn, no tool"] += 1
            break
        if "LiteLLM" in obs[:200] or obs.startswith("Saved trajectory") or (not obs.startswith("<returncode>") and not obs.startswith(_TIMEOUT) and "tool_calls" in msg):
            # mini stopped after this answer (an exception printed as the last User message)
            tail = obs[:120]
            msgs.append(msg)
            finish = "abort"
            counts[f"ended by an exception after step {k + 1}'s answer: {re.sub(r'[0-9]+', 'N', tail.splitlines()[0] if tail else '')[:70]}"] += 1
            break
        tool: dict = {"role": "tool", "content": obs, "latency_s": round(max(0.0, t_obs - t_gen), 3)}
        if "tool_calls" in msg:
            tool["tool_call_id"] = f"c{k + 1}"
            rc = _RC.match(obs)
            if obs.startswith(_TIMEOUT):
                tool["outcome"] = "timeout"
            elif rc:
                tool["outcome"] = "ok" if int(rc.group(1)) == 0 else "error"
            counts[f"tool outcome {tool.get('outcome')}"] += 1
        else:
            counts[f"format error ({len(blocks)} bash blocks): the correction is the tool return"] += 1
        msgs.append(msg)
        msgs.append(tool)
    else:
        finish = "abort"
        counts["recording ended while waiting for the model (after a tool return)"] += 1
    if finish is None:
        finish = "abort"
    counts[f"finish {finish} (failure_mode {res.get('failure_mode')}, resolved {res.get('is_resolved')})"] += 1
    return {"messages": msgs, "finish": finish}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    commit = git(a.gitdir, "rev-parse", "HEAD").decode().strip()
    files = git(a.gitdir, "ls-tree", "-r", "--name-only", commit, BASE).decode().splitlines()
    fileset = set(files)
    trials = sorted({f.rsplit("/sessions/", 1)[0] for f in files if f.endswith("/sessions/agent.cast")})
    counts: collections.Counter = collections.Counter()
    digest_lines = []
    runs = []
    for tr in trials:
        raw = git(a.gitdir, "cat-file", "-p", f"{commit}:{tr}/sessions/agent.cast")
        digest_lines.append(f"{hashlib.sha256(raw).hexdigest()}  {tr}/sessions/agent.cast")
        res: dict = {}
        if f"{tr}/results.json" in fileset:
            rb = git(a.gitdir, "cat-file", "-p", f"{commit}:{tr}/results.json")
            digest_lines.append(f"{hashlib.sha256(rb).hexdigest()}  {tr}/results.json")
            res = json.loads(rb)
        else:
            counts["trial without results.json"] += 1
        rel = tr[len(BASE) + 1:]
        run_dir, task_dir = rel.split("/")[0], rel.split("/")[1]
        task_id = res.get("task_id") or task_dir
        r = parse_trial(raw.decode("utf-8", "replace"), res, counts)
        if r is None:
            continue
        runs.append({"id": f"tb-mini-sonnet4-{task_id}-{run_dir}", "group": f"tb-{task_id}", "task": task_id, "run": run_dir,
                     "reward": (1.0 if res.get("is_resolved") else 0.0) if res else None, "finish": r["finish"], "model": MODEL, "messages": r["messages"]})
        counts[f"run folder {run_dir}: converted"] += 1
        counts[f"reward {(1 if res.get('is_resolved') else 0) if res else None} (is_resolved {res.get('is_resolved')}, failure_mode {res.get('failure_mode')})"] += 1
    # Steps: tasks ordered by sha1 of the group name, step = position mod --steps; a group's runs
    # stay together in one step, in run-folder order.
    groups = sorted({r["group"] for r in runs}, key=lambda g: hashlib.sha1(g.encode()).hexdigest())
    step_of = {g: i % a.steps for i, g in enumerate(groups)}
    runs.sort(key=lambda r: (step_of[r["group"]], groups.index(r["group"]), r["run"]))
    with open(a.out, "w", encoding="utf-8") as f:
        for r in runs:
            r["step"] = step_of[r["group"]]
            del r["task"], r["run"]
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    for k in sorted(counts):
        print(f"{k}: {counts[k]}")
    sizes = collections.Counter(collections.Counter(r["group"] for r in runs).values())
    print("commit", commit, "trials", len(trials), "runs written", len(runs), "groups", len(groups), "group sizes", sorted(sizes.items()))
    print("runs per step", sorted(collections.Counter(r["step"] for r in runs).items()))
    print("digest of files read", hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest(), "files", len(digest_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
