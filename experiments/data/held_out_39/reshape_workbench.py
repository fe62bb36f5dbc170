"""Reshape WorkBench's pre-computed agent runs (LangChain ReAct agents on sandboxed workplace tools:
email, calendar, web analytics, project management, CRM) into OpenAI-chat JSONL for
``libra-sim convert --from openai-chat`` (held-out set 39).

Input: a git directory of https://github.com/olly-styles/WorkBench (the ``fetch`` tool's snapshot,
read with ``git --git-dir=... show``; nothing in it is executed or imported). Read:

* ``data/results/<domain>/<model>_<all|domains>_<date>.csv``: one row per task (columns ``query``,
  ``function_calls``, ``full_response``, ``error``), written by ``src/evals/utils.py``
  ``generate_results``: ``full_response`` is ``str()`` of LangChain's agent result, a dict with
  ``input``, ``output`` and ``intermediate_steps`` = list of (``AgentAction(tool, tool_input, log)``,
  observation). It is parsed with ``ast.parse`` only (``AgentAction(...)``, numpy ``array(...)``
  and ``nan`` are read as syntax, never evaluated); an observation's text is its source segment
  (a string's value; a list/dict's repr, which is what ``str()`` put in the agent's scratchpad).
* ``data/processed/queries_and_answers/<domain>_queries_and_answers.csv``: each task's ground-truth
  action list and its ``domains`` (the toolkits of the ``domains`` tool selection).
* ``src/tools/*.py`` and ``src/tools/toolkits.py`` (read with ``ast``): each ``@tool`` function's
  name, signature and docstring, to rebuild the system prompt (below);
  ``src/data_generation/data_generation_utils.py``: ``HARDCODED_CURRENT_TIME``.

Prompt. The agent is LangChain's ``STRUCTURED_CHAT_ZERO_SHOT_REACT_DESCRIPTION`` (langchain 0.1.11,
langchain-core 0.1.29 per ``requirements.txt``) with WorkBench's date sentence prepended. The system
message is rebuilt as that agent renders it: date sentence + "\\n\\n".join(PREFIX, one line per
tool ``"<name>: <name><signature> - <docstring>, args: <args schema>"``, FORMAT_INSTRUCTIONS with
the tool names, SUFFIX) (the three LangChain constants are copied below); the user message is the
task. ``all`` runs list all 27 tools; ``domains`` runs only the task's toolkits plus the company
directory. The args schema is rendered as pydantic v1 does for un-annotated parameters
(``{'title': ...}`` plus ``'default'`` when not None): a reconstruction, a few tokens per tool.

Turns. Each intermediate step is one model turn: the assistant message is the step's ``log`` with
its ```` ``` ```` JSON action blob taken out, plus one tool call (name = the LangChain tool name,
arguments = the parsed ``tool_input``; the blob re-rendered as a Qwen/Hermes tool call); the tool
message is what LangChain appends to the scratchpad: ``"\\nObservation: <obs>\\nThought: "`` (the
first one also carries the agent's one-time "This was your previous work ..." preamble). Outcome:
``error`` when the observation is a string reporting a failure (``outcome_of``), else ``ok``. A run
that ended normally gets a last turn with the final answer rendered as LangChain's
``{"action": "Final Answer", "action_input": <output>}`` blob (the final turn's thought text is not
logged). ``finish``: ``stop``; ``tool_limit`` when LangChain stopped it at ``max_iterations=20``;
``abort`` when it stopped earlier (``max_execution_time=120`` s). Rows whose ``full_response`` is
empty (the agent raised: output parsing error, context window exceeded, an exception in a tool)
are not converted (counted).

Reward: 1 if the run raised no error and its side-effect actions equal the ground truth's as
WorkBench's ``is_exact_match`` defines it (sorted, lower-cased, newlines escaped), else 0. The
paper's own metric (``is_correct``: compare sandbox states after executing both action lists)
needs the sandbox code executed and is not used; exact match implies it in practice (caveat).

Groups / steps: ``group`` = ``<domain>-<row>-<all|domains>`` (the same task and the same system
prompt: 5 models for ``domains``, 3 for ``all``); tasks ordered by sha1 of ``<domain>-<row>``,
``--tasks-per-step`` tasks to a step (both groups of a task in the same step).
No tool latency is logged (the tools are in-process pandas functions), so none is written.

Usage: python reshape_workbench.py SNAPSHOT_GIT_DIR OUT.jsonl [--tasks-per-step 69]
Prints counters and a sha256 digest over the files read (sorted lines "<sha256>  <path>").
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import hashlib
import io
import json
import re
import subprocess

csv.field_size_limit(1 << 30)

# LangChain 0.1.x langchain/agents/structured_chat/prompt.py (MIT), after str.format (braces single).
PREFIX = "Respond to the human as helpfully and accurately as possible. You have access to the following tools:"
FORMAT_INSTRUCTIONS = """Use a json blob to specify a tool by providing an action key (tool name) and an action_input key (tool input).

Valid "action" values: "Final Answer" or {tool_names}

Provide only ONE action per $JSON_BLOB, as shown:

```
{{
  "action": $TOOL_NAME,
  "action_input": $INPUT
}}
```

Follow this format:

Question: input question to answer
Thought: consider previous and subsequent steps
Action:
```
$JSON_BLOB
```
Observation: action result
... (repeat Thought/Action/Observation N times)
Thought: I know what to respond
Action:
```
{{
  "action": "Final Answer",
  "action_input": "Final response to human"
}}
```"""
SUFFIX = """Begin! Reminder to ALWAYS respond with a valid json blob of a single action. Use tools if necessary. Respond directly if appropriate. Format is Action:```$JSON_BLOB```then Observation:.
Thought:"""
#: StructuredChatAgent._construct_scratchpad's preamble before the first step's log.
SCRATCHPAD_PREAMBLE = "This was your previous work (but I haven't seen any of it! I only see what you return as final answer):\n"
ITERATION_LIMIT = 20
STOPPED = "Agent stopped due to iteration limit or time limit."
TOOLKIT_ORDER = ["email", "calendar", "analytics", "project_management", "customer_relationship_manager"]

#: A tool return that reports a failure: WorkBench's tools return fixed strings ("Email not found.",
#: "Field not provided.", "Assignee email not valid ...", "Value to plot must be one of ...",
#: "Invalid recipient email address.", "Missing task details.", "Please provide all required
#: fields ..."), and LangChain answers an unknown tool name with "<x> is not a valid tool, try one of".
_ERROR = re.compile(r"not found|not provided|not valid|is not a valid tool|must be one of|^Invalid|^Missing|"
                    r"^Please provide|^No search parameters", re.IGNORECASE)
_BLOB = re.compile(r"(?:Action:\s*)?```(?:json)?\s*\{.*\}\s*```", re.DOTALL)


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def outcome_of(obs_node: ast.AST, text: str) -> str:
    if isinstance(obs_node, ast.Constant) and isinstance(obs_node.value, str) and _ERROR.search(text.strip()):
        return "error"
    return "ok"


def tool_specs(read) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """({toolkit: [tool name, ...] in toolkits.py order}, {tool name: prompt line}, side-effect tool names)."""
    lines: dict[tuple[str, str], tuple[str, str]] = {}
    for mod in TOOLKIT_ORDER + ["company_directory"]:
        tree = ast.parse(read(f"src/tools/{mod}.py").decode())
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            deco = [d for d in fn.decorator_list if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "tool"]
            if not deco:
                continue
            name = deco[0].args[0].value
            a = fn.args
            defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
            params, props = [], {}
            for arg, d in zip(a.args, defaults):
                p = arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation else "")
                if d is not None:
                    p += (" = " if arg.annotation else "=") + ast.unparse(d)
                params.append(p)
                prop = {"title": arg.arg.replace("_", " ").title()}
                dv = ast.literal_eval(d) if d is not None else None
                if dv is not None:
                    prop["default"] = dv
                props[arg.arg] = prop
            doc = (ast.get_docstring(fn, clean=False) or "").strip()
            desc = f"{name}({', '.join(params)}) - {doc}"
            # The template is str.format-ed once: the docstrings' {{ }} become { }.
            desc = desc.replace("{{", "{").replace("}}", "}")
            lines[(mod, fn.name)] = (name, f"{name}: {desc}, args: {props}")
    kits = ast.parse(read("src/tools/toolkits.py").decode())
    lists = {}
    for node in kits.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            lists[node.targets[0].id] = [(e.value.id, e.attr) for e in node.value.elts]
    order = lists["tools_with_side_effects"] + lists["tools_without_side_effects"]
    by_kit: dict[str, list[str]] = collections.defaultdict(list)
    prompt_line = {}
    for mod, fn in order:
        name, line = lines[(mod, fn)]
        by_kit[mod].append(name)
        prompt_line[name] = line
    side_effects = [lines[k][0] for k in lists["tools_with_side_effects"]]
    return by_kit, prompt_line, side_effects


def system_prompt(kits: list[str], by_kit, prompt_line, date_sentence: str) -> str:
    names = [n for k in kits for n in by_kit[k]] + by_kit["company_directory"]
    tools = "\n".join(prompt_line[n] for n in names)
    fmt = FORMAT_INSTRUCTIONS.replace("{tool_names}", ", ".join(names)).replace("{{", "{").replace("}}", "}")
    return date_sentence + "\n\n".join([PREFIX, tools, fmt, SUFFIX])


def function_name(action: str) -> str:
    return ".".join(action.split("(")[0].split(".")[0:2])


def exact_match(pred: list[str], truth: list[str], side_effects: list[str]) -> bool:
    pred = sorted(a.replace("\n", "\\n").lower() for a in pred if function_name(a) in side_effects)
    truth = sorted(a.replace("\n", "\\n").lower() for a in truth)
    return pred == truth


def node_value(node: ast.AST):
    """A parsed literal, with ``Name(...)(...)`` calls read as dicts and bare names as strings."""
    if isinstance(node, ast.Call):
        out = {kw.arg: node_value(kw.value) for kw in node.keywords}
        if node.args:
            out["__args__"] = [node_value(x) for x in node.args]
        return out
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Dict):
        return {node_value(k): node_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [node_value(x) for x in node.elts]
    return ast.literal_eval(node)


def convert_run(full_response: str, sys_prompt: str, count) -> tuple[list[dict], int, str]:
    """(messages, number of tool steps, final output)."""
    tree = ast.parse(full_response, mode="eval").body
    top = {k.value: v for k, v in zip(tree.keys, tree.values)}
    query = node_value(top["input"])
    output = node_value(top["output"])
    msgs = [{"role": "system", "content": sys_prompt}, {"role": "user", "content": query}]
    steps = top["intermediate_steps"].elts
    for i, step in enumerate(steps):
        action_node, obs_node = step.elts
        action = node_value(action_node)
        log = action.get("log", "")
        thought, n = _BLOB.subn("", log)
        count[f"action blob found in the log: {bool(n)}"] += 1
        args = action.get("tool_input")
        msgs.append({"role": "assistant", "content": thought.strip() if n else log, "tool_calls": [{
            "id": f"c{i}", "type": "function",
            "function": {"name": action.get("tool"), "arguments": json.dumps(args, ensure_ascii=False)}}]})
        if isinstance(obs_node, ast.Constant) and isinstance(obs_node.value, str):
            obs = obs_node.value
        else:
            obs = ast.get_source_segment(full_response, obs_node)
        out = outcome_of(obs_node, obs)
        count[f"tool outcome {out}"] += 1
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "outcome": out,
                     "content": (SCRATCHPAD_PREAMBLE if i == 0 else "") + f"\nObservation: {obs}\nThought: "})
    if output != STOPPED:
        blob = json.dumps({"action": "Final Answer", "action_input": output}, indent=2, ensure_ascii=False)
        msgs.append({"role": "assistant", "content": f"Action:\n```\n{blob}\n```"})
    return msgs, len(steps), output


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gitdir")
    ap.add_argument("out")
    ap.add_argument("--tasks-per-step", type=int, default=69)
    a = ap.parse_args()
    digest_lines: list[str] = []

    def read(path: str) -> bytes:
        raw = git(a.gitdir, "show", f"HEAD:{path}")
        digest_lines.append(f"{hashlib.sha256(raw).hexdigest()}  {path}")
        return raw

    by_kit, prompt_line, side_effects = tool_specs(read)
    m = re.search(r'HARDCODED_CURRENT_TIME = pd.to_datetime\("(\d{4})-(\d\d)-(\d\d)T(\d\d:\d\d:\d\d)"\)',
                  read("src/data_generation/data_generation_utils.py").decode())
    import datetime
    day = datetime.date(int(m[1]), int(m[2]), int(m[3]))
    date_sentence = (f"Today's date is {day.strftime('%A')}, {day.isoformat()} and the current time is {m[4]}. "
                     "Remember the current date and time when answering queries. Meetings must not start before 9am or end after 6pm.")
    files = git(a.gitdir, "ls-tree", "-r", "--name-only", "HEAD", "data/results").decode().split()
    count: collections.Counter = collections.Counter()
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    truth_cache: dict[str, dict[str, tuple[int, list[str], list[str]]]] = {}
    for path in sorted(f for f in files if f.endswith(".csv")):
        _, _, domain, fname = path.split("/")
        mm = re.match(r"(.+)_(all|domains)_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.csv$", fname)
        model, selection = mm[1], mm[2]
        if domain not in truth_cache:
            rows = csv.DictReader(io.StringIO(read(f"data/processed/queries_and_answers/{domain}_queries_and_answers.csv").decode()))
            truth_cache[domain] = {r["query"]: (k, ast.literal_eval(r["answer"]), ast.literal_eval(r["domains"]))
                                   for k, r in enumerate(rows)}
        truth = truth_cache[domain]
        for row in csv.DictReader(io.StringIO(read(path).decode())):
            k, gt, kits = truth[row["query"]]
            task = f"{domain}-{k:03d}"
            err = row["error"] or ""
            if not row["full_response"]:
                count[f"not converted (agent raised, no steps logged): {re.sub(r'[0-9]+', 'N', err[:40])!r}"] += 1
                continue
            kits = TOOLKIT_ORDER if selection == "all" else [t for t in TOOLKIT_ORDER if t in kits]
            msgs, n_steps, output = convert_run(row["full_response"], system_prompt(kits, by_kit, prompt_line, date_sentence), count)
            if output == STOPPED:
                finish = "tool_limit" if n_steps >= ITERATION_LIMIT else "abort"
            else:
                finish = "stop"
            pred = ast.literal_eval(row["function_calls"]) if row["function_calls"] else []
            reward = 1.0 if not err and exact_match(pred, gt, side_effects) else 0.0
            count[f"finish {finish}"] += 1
            count[f"model {model} tools {selection}"] += 1
            count[f"model {model} tools {selection} reward"] += reward
            runs[task].append({"id": f"workbench-{task}-{selection}-{model}", "group": f"{task}-{selection}",
                               "reward": reward, "finish": finish, "model": model, "messages": msgs})
    order = sorted(runs, key=lambda t: hashlib.sha1(t.encode()).hexdigest())
    n = 0
    groups = collections.Counter()
    with open(a.out, "w", encoding="utf-8") as f:
        for ti, task in enumerate(order):
            for rec in sorted(runs[task], key=lambda r: r["id"]):
                groups[rec["group"]] += 1
                f.write(json.dumps({"id": rec["id"], "step": ti // a.tasks_per_step,
                                    **{k: v for k, v in rec.items() if k != "id"}}, ensure_ascii=False) + "\n")
                n += 1
    for k, v in sorted(count.items()):
        if k.endswith(" reward"):
            print(f"{k}: {v / count[k[:-len(' reward')]]:.4f}")
        else:
            print(f"{k}: {v}")
    print("group sizes", sorted(collections.Counter(groups.values()).items()))
    print("success", round(sum(r["reward"] for v in runs.values() for r in v) / n, 4))
    print("digest", hashlib.sha256("\n".join(sorted(digest_lines)).encode()).hexdigest(), f"({len(digest_lines)} files)")
    print(f"wrote {n} conversations of {len(order)} tasks in {len(groups)} groups to {a.out}")


if __name__ == "__main__":
    main()
