"""Reshape AutoCodeRover's three SWE-bench Lite runs (nus-apr/auto-code-rover, results/acr-run-{1,2,3}
at commit 7866b172, GPT-4 0125) into SWE-agent-style ``.traj`` files for ``libra-sim convert --from swe-agent``.

Usage: python reshape_acr_runs.py GIT_DIR OUT_DIR   (GIT_DIR: a clone or bare snapshot of the repository)

Standard library only; reads the files with ``git cat-file`` at the fixed commit below. Per run of a task
it reads every ``debug_agent_write_patch_N.json`` (cumulative: each is the previous one plus the next
write-patch try; the last is the whole main conversation), checks they extend each other, labels each
assistant message with the action the harness took on it (read off the harness message that answers it),
and writes ``OUT/<NNN>-<sha1(instance)[:10]>/trial<k>/<instance>.traj``. Only counts are derived later; the
written files hold the conversation text, so keep OUT outside the repository.
"""
from __future__ import annotations

import collections
import hashlib
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

COMMIT = "7866b172177d6d8f5021e86934f83f5176473275"
RUNS = ("acr-run-1", "acr-run-2", "acr-run-3")
SUFFIX = re.compile(r"_(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})$")

# The harness message that answers an assistant message -> the action it stands for.
ACTIONS = (
    (re.compile(r"^Result of (search_\w+)\("), None),                    # search API results (1+ calls)
    (re.compile(r"^Here are the code in buggy locations"), "bug_locations"),  # bug locations looked up
    (re.compile(r"^The buggy locations is not precise"), "bug_locations"),    # ... and not found
    (re.compile(r"^The search API calls seem not valid"), "select_apis"),     # proxy could not extract calls
    (re.compile(r"^Based on your analysis, answer below questions"), "next_prompt"),  # fixed follow-up prompt
    (re.compile(r"^Write a patch for the issue"), "next_prompt"),
    (re.compile(r"^Extracted a patch\."), "write_patch"),                # patch extracted: workflow ends
    (re.compile(r"^Your edit could not be applied"), "write_patch"),     # patch rejected: retry (3 tries)
)


def git(gd: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={gd}", *args], check=True, capture_output=True).stdout


def ls(gd: str, path: str) -> list[tuple[str, str, str]]:
    out = git(gd, "ls-tree", COMMIT, path.rstrip("/") + "/").decode()
    return [(t, b, p) for _m, t, b, p in (line.split(None, 3) for line in out.splitlines())]


def action_of(text: str) -> str:
    for rx, name in ACTIONS:
        m = rx.match(text)
        if m:
            return name or m.group(1)
    raise ValueError(f"unknown harness message: {text[:80]!r}")


def main(gd: str, out: str) -> None:
    outp = Path(out)
    digest_lines: list[str] = []
    c: collections.Counter[str] = collections.Counter()
    runs: dict[str, dict[str, dict]] = {}
    models = set()
    per_run_turns = []
    for k, run in enumerate(RUNS, 1):
        rep_raw = git(gd, "cat-file", "blob", f"{COMMIT}:results/{run}/final_report.json")
        digest_lines.append(f"{hashlib.sha256(rep_raw).hexdigest()}  {run}/final_report.json")
        report = json.loads(rep_raw)
        resolved = set(report["resolved"])
        print(f"{run}: report {report['stats']}")
        for typ, _b, cat_path in ls(gd, f"results/{run}"):
            if typ != "tree" or cat_path.endswith("eval_logs"):
                continue
            for typ2, _b2, task_path in ls(gd, cat_path):
                if typ2 != "tree":
                    continue
                name = task_path.rsplit("/", 1)[1]
                inst = SUFFIX.sub("", name)
                assert inst != name, name
                files = {p.rsplit("/", 1)[1]: b for _t, b, p in ls(gd, task_path)}
                dbg = sorted((f for f in files if f.startswith("debug_agent_write_patch_")), key=lambda f: int(re.findall(r"\d+", f)[0]))
                assert dbg, task_path
                convs = []
                for f in dbg + ["cost.json"]:
                    raw = git(gd, "cat-file", "blob", files[f])
                    digest_lines.append(f"{hashlib.sha256(raw).hexdigest()}  {run}/{cat_path.rsplit('/', 1)[1]}/{name}/{f}")
                    convs.append(json.loads(raw))
                cost = convs.pop()
                models.add(cost["model"])
                for a, b in zip(convs, convs[1:]):  # cumulative files
                    assert b[: len(a)] == a, (task_path, "write-patch files do not extend each other")
                msgs = convs[-1]
                assert [m["role"] for m in msgs[:3]] == ["system", "user", "user"], task_path
                assert msgs[1]["content"].startswith("<issue>"), task_path
                history = []
                for i, m in enumerate(msgs):
                    assert m["role"] in ("system", "user", "assistant"), m["role"]
                    h = {"role": m["role"], "content": m["content"]}
                    if m["role"] == "assistant":
                        nxt = msgs[i + 1] if i + 1 < len(msgs) else None
                        if nxt is not None:
                            assert nxt["role"] == "user", (task_path, i)
                            h["action"] = action_of(nxt["content"])
                            c[f"action {h['action']}"] += 1
                        else:
                            c["assistant message with no answer (last)"] += 1
                    history.append(h)
                last = msgs[-1]
                if last["role"] == "user" and last["content"].startswith("Extracted a patch."):
                    status = "submitted"
                elif last["role"] == "user" and last["content"].startswith("Your edit could not be applied"):
                    status = "exit_step_limit (write_patch tries)"
                else:
                    raise ValueError(f"{task_path}: unexpected end {last['role']}: {last['content'][:60]!r}")
                c[f"exit {status}"] += 1
                c[f"write_patch files {len(dbg)}"] += 1
                per_run_turns.append(sum(m["role"] == "assistant" for m in msgs))
                ok = inst in resolved
                c["resolved" if ok else "not resolved"] += 1
                traj = {
                    "environment": "auto-code-rover",
                    "trajectory": [],
                    "history": history,
                    "info": {"exit_status": status, "resolved": ok, "model_stats": {
                        "total_input_tokens": cost["total_input_tokens"], "total_output_tokens": cost["total_output_tokens"],
                        "total_cost": cost["total_cost"], "elapsed_seconds": cost["elapsed_seconds"]}},
                    "replay_config": {"agent": {"model": {"name": cost["model"]}}},
                }
                assert inst not in runs.setdefault(inst, {}), (inst, run)
                runs[inst][k] = traj
    assert len(models) == 1, models
    order = sorted(runs, key=lambda s: hashlib.sha1(s.encode()).hexdigest())
    for n, inst in enumerate(order):
        for k, traj in sorted(runs[inst].items()):
            d = outp / f"{n:03d}-{hashlib.sha1(inst.encode()).hexdigest()[:10]}" / f"trial{k}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{inst}.traj").write_text(json.dumps(traj), encoding="utf-8")
    sizes = collections.Counter(len(v) for v in runs.values())
    print(f"{sum(len(v) for v in runs.values())} runs; {len(runs)} instances; trials per instance {dict(sizes)}; model {models.pop()}")
    print(dict(sorted(c.items())))
    solved = collections.Counter(sum(t["info"]["resolved"] for t in v.values()) for v in runs.values())
    print("instances by trials resolved", dict(sorted(solved.items())))
    print("assistant messages per run min/median/max", min(per_run_turns), statistics.median(per_run_turns), max(per_run_turns))
    digest_lines.sort(key=lambda line: line.split("  ", 1)[1])
    print(f"source files read: {len(digest_lines)}; digest (sha256 of sorted 'sha256  path' lines)",
          hashlib.sha256("\n".join(digest_lines).encode()).hexdigest())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
