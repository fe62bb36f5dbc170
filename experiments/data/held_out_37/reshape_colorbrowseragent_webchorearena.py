"""Reshape ColorBrowserAgent's published WebChoreArena trajectories (BrowserGym) into OpenAI-chat
JSONL for ``libra-sim convert --from openai-chat`` (held_out_37). Standard library only; reads the
MadeAgents/browser-agent snapshot with ``git cat-file`` at a fixed commit. Adapted from
held_out_35's ``reshape_colorbrowseragent_webarena.py`` (same agent, same step files).

    python reshape_colorbrowseragent_webchorearena.py <MadeAgents/browser-agent git dir> OUT.jsonl

One line per WebChoreArena task directory (538). Each holds BrowserGym ``steps_info_<k>.json``
(``obs`` k: the page after action k-1, ``action`` k: the operator's output on it, ``profiling``: the
environment step that produced obs k) and ``summary_info.json``. Unlike WebArena, **no run logs were
committed** for WebChoreArena, so the Summarizer's progress summaries (part of every operator call
after the first) and the run settings (model, tips) cannot be read: the tool returns here hold no
summary, and the system prompt is rebuilt without site tips (``run_webchorearena.py``'s default,
``--tips False``).

* prompt: a ``system`` message with the operator's system prompt rebuilt from ``agent/agent.py``
  (``bid`` mode, no tips; every WebChoreArena task has one site group in ``run_webchorearena.py``, so
  no homepage block) and the action-space text rebuilt from the BrowserGym action functions; a
  ``user`` message with the goal, the open tabs, the accessibility tree of obs 0 and "No progress
  made yet.";
* turn k: the assistant message is ``action`` k verbatim, one tool call named by the action's
  function (``invalid`` when the ``<action>`` block holds no call), empty arguments; the tool message
  is the tabs and accessibility tree of obs k+1 and the last-action error (if any); ``latency_s`` is
  ``profiling.env_stop - env_start`` of step k+1; ``outcome`` ``timeout`` for a ``TimeoutError``,
  ``error`` for any other ``last_action_error``, else ``ok``;
* end: as in held_out_35 (``stop`` when ``terminated``, ``tool_limit`` when only ``truncated``,
  ``abort`` with an ``err_msg``); ``reward``: ``cum_reward`` clipped to 1 (the repository's rule);
  ``group`` ``webchorearena-<task id>``; ``id`` ``colorbrowseragent-webchorearena-<task id>``.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import random
import re
import subprocess
import sys
from typing import Any

COMMIT = "cbdadd8a5a87d29e0b9afcaef360e5934f5a5638"
ROOT = "trajectories/webchorearena"
AGENT = "agent/agent.py"
FUNCS = "thirdparty/BrowserGym/browsergym/core/src/browsergym/core/action/functions.py"
# run_webchorearena.py: the site group of a task is website_dict[task_id // 10000]
WEBSITE = {1: "shopping_admin", 2: "shopping", 3: "reddit", 4: "gitlab", 5: "cross"}
# ACTION_SUBSETS["webarena"] of browsergym/core/action/highlevel.py, then the agent's custom actions
WEBARENA_ACTIONS = ["scroll", "keyboard_press", "click", "fill", "hover", "tab_focus", "new_tab", "go_back",
                    "go_forward", "goto", "tab_close", "select_option", "send_msg_to_user", "report_infeasible"]
CUSTOM_ACTIONS = ["take_note", "calculate", "press", "focus"]
# WebArena's standard ports (the tips and the homepage block name the sites by WA_* variables)
PORTS = {"WA_SHOPPING": ":7770", "WA_SHOPPING_ADMIN": ":7780/admin", "WA_REDDIT": ":9999", "WA_GITLAB": ":8023",
         "WA_WIKIPEDIA": ":8888/wikipedia_en_all_maxi_2022-05/A/User:The_other_Kiwix_guy/Landing",
         "WA_MAP": ":3000", "WA_HOMEPAGE": ":4399", "WA_FULL_RESET": ":7565"}
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - \d+ - ([\w.]+) - (\w+) - (.*)$")


class Repo:
    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir
        out = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", COMMIT], check=True,
                             capture_output=True, text=True).stdout
        self.blobs = {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines()}
        self.proc = subprocess.Popen(["git", "--git-dir", git_dir, "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.digest_lines: list[str] = []

    def read(self, path: str) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((self.blobs[path] + "\n").encode())
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            raise SystemExit(f"{path}: object {self.blobs[path]} missing from the snapshot")
        data = self.proc.stdout.read(int(header[2]))
        self.proc.stdout.read(1)
        self.digest_lines.append(f"{hashlib.sha256(data).hexdigest()}  {path}")
        return data


# ---- the operator's prompt, rebuilt from the committed sources (nothing of them is executed) ----

def fstring(node: ast.AST, env: dict[str, Any]) -> str:
    """The value of a (f-)string node, with names, ``os.environ[...]``, ``.rstrip(...)`` and
    ``self.action_set.describe(...)`` taken from ``env``."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(fstring(v, env) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return fstring(node.value, env)
    if isinstance(node, ast.Name):
        return str(env[node.id])
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):  # os.environ["WA_..."]
        return str(env[node.slice.value])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "rstrip":
            return fstring(node.func.value, env).rstrip(*(a.value for a in node.args))  # type: ignore[attr-defined]
        if node.func.attr == "describe":
            return str(env["__describe__"])
    raise ValueError(f"unsupported node {ast.dump(node)[:80]}")


def assignments(fn: ast.FunctionDef, names: set[str], branch: str = "bid") -> dict[str, ast.AST]:
    """The string assigned to each name in ``fn`` (in the ``self.mode == "bid"`` branch when the
    assignment is in an if/elif on the mode)."""
    out: dict[str, ast.AST] = {}

    def visit(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and s.targets[0].id in names:
                out.setdefault(s.targets[0].id, s.value)
            elif isinstance(s, ast.If):
                test = ast.unparse(s.test)
                if "self.mode" in test:
                    visit(s.body if repr(branch) in test or f'"{branch}"' in test else s.orelse)
                else:
                    visit(s.body)
    visit(fn.body)
    return out


def action_space(funcs_src: str) -> str:
    """``HighLevelActionSet(subsets=["webarena", "custom"], multiaction=False).describe()``: signature,
    docstring description and examples of each action (``highlevel.py``), rebuilt statically."""
    defs = {n.name: n for n in ast.parse(funcs_src).body if isinstance(n, ast.FunctionDef)}
    actions = []
    for name in dict.fromkeys(WEBARENA_ACTIONS + CUSTOM_ACTIONS):
        fn = defs[name]
        sig = f"{name}({ast.unparse(fn.args)})" + (f" -> {ast.unparse(fn.returns)}" if fn.returns else "")
        doc = ast.get_docstring(fn) or ""
        head, _, ex = doc.partition("Examples:")
        desc = " ".join(x.strip() for x in head.splitlines() if x.strip())
        examples = []
        for line in ex.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                call = ast.parse(line, mode="eval").body
            except SyntaxError:
                continue
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                args = [repr(ast.literal_eval(a)) for a in call.args]
                args += [f"{k.arg}={ast.literal_eval(k.value)!r}" for k in call.keywords]
                examples.append(f"{call.func.id}({', '.join(args)})")
        actions.append((name, sig, desc, examples))
    text = f"\n{len(actions)} different types of actions are available.\n\n"
    for _name, sig, desc, examples in actions:
        text += f"\n{sig}\n"
        text += f"\n    Description: {desc}\n"
        if examples:
            text += "\n    Examples:\n"
            for e in examples:
                text += f"\n        {e}\n\n"
    text += "\nOnly a single action can be provided at once."
    picked = [e for n in ("fill", "click", "mouse_click", "keyboard_type") for a in actions if a[0] == n for e in a[3]]
    random.Random(1).shuffle(picked)
    text += f" Example:\n{picked[0]}\n" if picked else "\n\n"
    return text


class PromptBuilder:
    def __init__(self, repo: Repo) -> None:
        src = repo.read(AGENT).decode("utf-8")
        # only the method is parsed: the file uses a Python 3.12 f-string elsewhere
        start = src.index("    def get_system_msgs(")
        end = src.index("\n    def ", start + 10)
        fn = ast.parse("class BroswerAgent:\n" + src[start:end]).body[0].body[0]  # type: ignore[attr-defined]
        assert isinstance(fn, ast.FunctionDef)
        self.nodes = assignments(fn, {"action_instruct", "act", "act2", "example_action", "base_instructions",
                                      "action_space_text", "next_action_instruction"})
        # the homepage block: the f-string added to base_instructions when nav_multipages
        self.homepage = next(s.value for s in ast.walk(fn) if isinstance(s, ast.AugAssign)
                             and "Homepage" in ast.unparse(s.value))
        self.describe = action_space(repo.read(FUNCS).decode("utf-8"))
        self.repo = repo
        self.tips: dict[str, str] = {}

    def tip(self, name: str) -> str | None:
        path = f"agent/tips/{name}.txt"
        if path not in self.repo.blobs:
            return None
        if name not in self.tips:
            self.tips[name] = self.repo.read(path).decode("utf-8")
        return self.tips[name]

    def system(self, group: str, sites: list[str], host: str) -> str:
        env: dict[str, Any] = {k: host + v for k, v in PORTS.items()}
        for k in ("action_instruct", "act", "act2", "example_action"):
            env[k] = fstring(self.nodes[k], env)
        base = fstring(self.nodes["base_instructions"], env)
        # run_webchorearena.py defaults to --tips False: no "# Task Tips" block (the setting is not logged)
        if len(sites) > 1:
            base += fstring(self.homepage, env)
        env["__describe__"] = self.describe
        space = fstring(self.nodes["action_space_text"], env)
        nxt = fstring(self.nodes["next_action_instruction"], env)
        return "\n".join([base, space, nxt])


# ---- the run ----

def observation(obs: dict[str, Any]) -> str:
    """The per-step part of the operator's user message (``get_user_msgs_nonchat``): tabs and
    accessibility tree (the goal and the fixed parts are in the prompt)."""
    parts = ["# Currently open tabs\n"]
    for i, (url, title) in enumerate(zip(obs["open_pages_urls"], obs["open_pages_titles"])):
        marker = " (active tab)" if i == obs["active_page_index"] else ""  # a list in the log: never equal, as in the agent
        parts.append(f"Tab {i}{marker}\n  Title: {title}\n  URL: {url}\n")
    parts.append(f"# Current page Accessibility Tree\n\n{obs['axtree_txt']}\n")
    return "\n".join(parts)


def summaries(log: str) -> dict[int, str]:
    """The Summarizer's output before the operator call of each step (``Progress summary generated:``)."""
    entries: list[list[str]] = []
    for line in log.split("\n"):
        m = LOG_LINE.match(line)
        if m:
            entries.append([m.group(2), m.group(4)])
        elif entries:
            entries[-1][1] += "\n" + line
    out, step = {}, -1
    for name, msg in entries:
        if name.endswith("loop") and (m2 := re.match(r"Starting step (\d+)\.", msg)):
            step = int(m2.group(1))
        elif name.endswith("loop") and msg.startswith("Environment stepped."):
            step += 1  # the next agent call is on the new page (also the finally-block call, which logs no step)
        elif msg.startswith("Progress summary generated:"):
            assert step not in out, "two summaries for one step"
            out[step] = msg.split("\n", 1)[1].strip() if "\n" in msg else ""
    return out


def tool_of(action: str) -> str:
    m = re.search(r"<action>(.*?)</action>", action, flags=re.DOTALL)
    call = re.search(r"([A-Za-z_]\w*)\s*\(", m.group(1)) if m else None
    return call.group(1) if call else "invalid"


def outcome(err: str) -> str:
    if not err:
        return "ok"
    return "timeout" if err.lstrip().startswith("TimeoutError") else "error"


def main(git_dir: str, out: str) -> None:
    repo = Repo(git_dir)
    prompts = PromptBuilder(repo)
    tasks = sorted({int(p.split("/")[3][5:]) for p in repo.blobs if p.startswith(f"{ROOT}/results/task_")})
    stats: collections.Counter[str] = collections.Counter()
    rows = []
    for tid in tasks:
        d = f"{ROOT}/results/task_{tid}"
        summary = json.loads(repo.read(f"{d}/summary_info.json"))
        group_name = WEBSITE[tid // 10000]
        stats[f"site group {group_name}"] += 1
        ks = sorted(int(p.rsplit("_", 1)[1][:-5]) for p in repo.blobs if p.startswith(f"{d}/steps_info_"))
        assert ks == list(range(len(ks))), (tid, ks)
        try:
            steps = [json.loads(repo.read(f"{d}/steps_info_{k}.json")) for k in ks]
        except SystemExit as e:  # a step file of 4 MiB or more is absent from the snapshot
            stats[f"step file missing from the snapshot (not converted): {e}"] += 1
            continue
        sums: dict[int, str] = {}  # no run log committed: no progress summaries
        acts = [s.get("action") for s in steps]
        n_act = next((i for i, a in enumerate(acts) if not a), len(acts))  # actions 0..n_act-1
        reward = min(float(summary.get("cum_reward") or 0.0), 1.0)
        if n_act == 0:
            stats[f"no agent action (not converted; err_msg {summary.get('err_msg') is not None}, reward {reward})"] += 1
            continue
        obs0 = steps[0]["obs"]
        host = re.match(r"https?://[^/:]+", obs0["open_pages_urls"][0]).group(0)  # type: ignore[union-attr]
        sites = [group_name]
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.system(group_name, sites, host)},
            {"role": "user", "content": "\n".join([f"# Goal\n{obs0['goal']}", observation(obs0),
                                                   "# Progress Summary\nNo progress made yet.\n"])}]
        if summary.get("err_msg") is not None:
            finish = "abort"
        elif summary.get("terminated"):
            finish = "stop"
        elif summary.get("truncated"):
            finish = "tool_limit"
        else:
            finish = None
        stats[f"finish {finish} (terminated {summary.get('terminated')}, truncated {summary.get('truncated')})"] += 1
        for k in range(n_act):
            tool = tool_of(acts[k])
            if k == len(steps) - 1:
                # the finally-block call of the modified loop.py on the last page: generated, never executed
                stats[f"final generation on the last page (finish {finish})"] += 1
                msgs.append({"role": "assistant", "content": acts[k]})
                break
            msgs.append({"role": "assistant", "content": acts[k], "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": tool, "arguments": ""}}]})
            nxt = steps[k + 1]
            if not nxt.get("obs"):
                stats["call without a following observation"] += 1
                break
            err = nxt["obs"].get("last_action_error") or ""
            text = observation(nxt["obs"])
            if err:
                text += f"\n# Error message from last action\n\n{err}\n"
            if k + 1 in sums:
                text += f"\n# Progress Summary\n{sums[k + 1]}\n"
                stats["tool returns with a progress summary"] += 1
            else:
                stats["tool returns without a progress summary (no log committed)"] += 1
            prof = nxt.get("profiling") or {}
            lat = prof.get("env_stop", 0) - prof.get("env_start", 0) if prof.get("env_start") else None
            oc = outcome(err)
            stats[f"tool {tool} {oc}"] += 1
            if k + 1 == len(steps) - 1:
                stats[f"last executed call {tool} (finish {finish})"] += 1
            msg = {"role": "tool", "tool_call_id": f"c{k}", "content": text, "outcome": oc}
            if lat is not None and lat >= 0:
                msg["latency_s"] = round(lat, 3)
            else:
                stats["tool call without env timing"] += 1
            msgs.append(msg)
        else:
            stats[f"run ending on a tool return (finish {finish})"] += 1
        stats[f"reward {reward:g}"] += 1
        gid = f"webchorearena-{tid}"
        rows.append((hashlib.sha1(gid.encode()).hexdigest(), {
            "id": f"colorbrowseragent-{gid}", "group": gid, "reward": reward, "finish": finish,
            "model": "unknown", "messages": msgs}))
    rows.sort(key=lambda r: r[0])
    with open(out, "w", encoding="utf-8") as f:
        for _k, rec in rows:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    for k in sorted(stats):
        print(f"{k}: {stats[k]}")
    print(f"success (clipped cum_reward over {len(tasks)} tasks): {sum(min(float(json.loads(repo.read(f'{ROOT}/results/task_{t}/summary_info.json')).get('cum_reward') or 0), 1.0) for t in tasks) / len(tasks):.4f}")
    print(f"wrote {len(rows)} conversations to {out}")
    lines = sorted(set(repo.digest_lines))
    print(f"source digest over {len(lines)} files (sha256 of sorted 'sha256  path' lines):",
          hashlib.sha256("\n".join(lines).encode()).hexdigest())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
