"""Lay out AutoCodeRover's three SWE-agent replication runs ("Swe-agent-rep") for `--from swe-agent`.

Usage: python reshape_sweagent_rep.py <src> <out_dir>

``src`` holds the three run folders of ``results/swe-agent-results/`` of nus-apr/auto-code-rover
(``cost_2_1``, ``cost_2_2``, ``cost_2_3``: SWE-agent's ``*.traj`` files, ``final_report.json``,
``all_preds.jsonl``, and ``args.yaml`` where the run kept one). Each run file is checked against
SWE-agent's save format of April 2024 (``sweagent/agent/agents.py`` at d469f49: ``{environment,
trajectory, history, info}``; the history is system prompt, issue, then one assistant message per
trajectory step, each followed by its observation as a user message) and written, changed only as
this folder's README ("Conversion") says, to ``out_dir/<NNN>-<sha1(instance)[:10]>/trial<k>/<instance>.traj``:

* ``info.resolved``: whether that trial's ``final_report.json`` lists the instance as resolved
  (reports are per trial, so they are not handed to the converter, which merges by instance id);
* ``replay_config.agent.model.name``: the run's model (``all_preds.jsonl``'s ``model_name_or_path``
  up to ``__``), where SWE-agent's later files keep it and the converter reads it;
* cost-limit exits (``exit_cost``, ``submitted (exit_cost)``): the last history message and
  trajectory step, SWE-agent's placeholder "Exit due to cost limit" (no model output), are removed;
  the run then ends on the observation of its last real action;
* ``early_exit`` (the environment failed on the last action and restarted): that step's observation,
  kept in the trajectory but not in the history (the loop ended), is appended as the last user message.

Folders are numbered so that sorted path order is: instances with all three trials, by hashed id,
then the instances with fewer trials; ``--runs-per-step`` (a multiple of 3) then cuts steps at group
edges. Only the standard library is used; nothing from outside this folder is imported.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import statistics
import sys
from pathlib import Path

TRIALS = ("cost_2_1", "cost_2_2", "cost_2_3")
COST_PLACEHOLDER = "Exit due to cost limit"  # forward_with_error_check on CostLimitExceededError
FINISH_NOTE = {"submitted": "stop", "submitted (exit_cost)": "length", "exit_cost": "length", "early_exit": "abort", None: "null"}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def load_trial(d: Path) -> tuple[dict[str, dict], set[str], str, dict]:
    report = json.loads((d / "final_report.json").read_text(encoding="utf-8"))
    resolved = set(report["resolved"])
    assert report["stats"]["resolved"] == len(resolved), d
    preds = [json.loads(x) for x in (d / "all_preds.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    names = {p["model_name_or_path"] for p in preds}
    assert len(names) == 1, names
    name = names.pop()
    args = d / "args.yaml"
    if args.exists():  # SWE-agent's saved ScriptArguments (not in cost_2_1)
        text = args.read_text(encoding="utf-8")
        m = re.search(r"^  model:\n(?:    host_url: \S+\n)?    model_name: (\S+)\n    per_instance_cost_limit: (\S+)\n", text, re.M)
        assert m and name.startswith(f"{m.group(1)}__") and float(m.group(2)) == 2.0, (d, m and m.groups())
        assert "data_path: princeton-nlp/SWE-bench_Lite" in text and "split: test" in text
    runs = {}
    for f in sorted(d.glob("*.traj")):
        runs[f.name[: -len(".traj")]] = json.loads(f.read_text(encoding="utf-8"))
    assert resolved <= set(runs), d
    assert {p["instance_id"] for p in preds} <= set(runs), d
    return runs, resolved, name, report["stats"]


def check_and_fix(iid: str, t: dict, stats: collections.Counter) -> dict:
    assert set(t) == {"environment", "trajectory", "history", "info"} and t["environment"] == "swe_main", iid
    h, steps, info = t["history"], t["trajectory"], t["info"]
    assert h[0]["role"] == "system" and h[1]["role"] == "user", iid
    assert all(m.get("agent") == "primary" and not m.get("is_demo") for m in h), iid
    for i, m in enumerate(h[2:]):  # assistant, user, assistant, ... ending on an assistant message
        assert m["role"] == ("assistant" if i % 2 == 0 else "user"), (iid, i)
    assert h[-1]["role"] == "assistant", iid
    assistants = [m for m in h if m["role"] == "assistant"]
    assert len(assistants) == len(steps) >= 1, iid
    assert all(m["action"] == s["action"] for m, s in zip(assistants, steps)), iid
    status = info.get("exit_status")
    assert ("submission" in info) == (isinstance(status, str) and status.startswith("submitted")), (iid, status)
    stats[f"exit status {status}"] += 1
    h, steps = list(h), list(steps)
    if status in ("exit_cost", "submitted (exit_cost)"):
        assert h[-1]["content"] == COST_PLACEHOLDER and steps[-1]["action"] == "exit_cost", iid
        h.pop()
        steps.pop()
        assert h[-1]["role"] == "user" and steps, iid
        stats["cost-limit placeholders removed"] += 1
    elif status == "early_exit":
        obs = steps[-1]["observation"]
        assert "RESTARTING PROCES" in obs, iid
        h.append({"role": "user", "content": obs, "agent": "primary"})
        stats["early_exit: last observation appended"] += 1
    elif status == "submitted":
        assert steps[-1]["action"].strip().startswith("submit"), iid
    else:
        assert status is None, (iid, status)
    ms = info["model_stats"]
    # calls the model answered that are not in the history: format/blocklist re-queries and, at the
    # cost limit, the call whose answer was discarded
    stats["api calls"] += ms["api_calls"]
    stats["api calls not in the history"] += ms["api_calls"] - len(steps)
    return {"environment": t["environment"], "trajectory": steps, "history": h, "info": dict(info)}


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    assert not out.exists() or not any(out.iterdir()), f"{out} is not empty"
    trials: dict[str, dict[int, dict]] = collections.defaultdict(dict)
    stats: collections.Counter = collections.Counter()
    models = set()
    digest = hashlib.sha256()
    for k, name in enumerate(TRIALS, 1):
        d = src / name
        for f in sorted(d.iterdir()):
            digest.update(f"{sha(f.read_bytes())}  {name}/{f.name}\n".encode())
        runs, resolved, model_path, rstats = load_trial(d)
        models.add(model_path)
        print(f"{name}: {len(runs)} runs; report {rstats}; model_name_or_path {model_path}")
        for iid, t in runs.items():
            fixed = check_and_fix(iid, t, stats)
            fixed["info"]["resolved"] = iid in resolved
            trials[iid][k] = fixed
    assert len(models) == 1, models
    model = models.pop().split("__")[0]
    order = sorted(trials, key=lambda i: (len(trials[i]) < len(TRIALS), hashlib.sha1(i.encode()).hexdigest()))
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    per = collections.Counter()
    for rank, iid in enumerate(order):
        folder = out / f"{rank:03d}-{hashlib.sha1(iid.encode()).hexdigest()[:10]}"
        per[len(trials[iid])] += 1
        for k, t in sorted(trials[iid].items()):
            t["replay_config"] = {"agent": {"model": {"name": model}}}
            p = folder / f"trial{k}" / f"{iid}.traj"
            p.parent.mkdir(parents=True)
            p.write_text(json.dumps(t, ensure_ascii=False), encoding="utf-8")
            n += 1
            stats["resolved" if t["info"]["resolved"] else "not resolved"] += 1
    print(n, "runs;", len(order), "instances; trials per instance", dict(sorted(per.items())), "; model", model)
    print(dict(sorted(stats.items())))
    solved = collections.Counter(sum(t["info"]["resolved"] for t in trials[i].values()) for i in order)
    print("instances by trials resolved", dict(sorted(solved.items())))
    turns = [len(t["trajectory"]) for i in order for t in trials[i].values()]
    print("model turns in the history min/median/max", min(turns), statistics.median(turns), max(turns))
    print("source files digest (sha256 of 'sha256  trial/file' lines)", digest.hexdigest())


if __name__ == "__main__":
    main()
