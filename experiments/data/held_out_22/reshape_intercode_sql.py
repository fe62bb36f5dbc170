"""Rebuild InterCode-SQL's multi-turn runs (princeton-nlp/intercode 69922e2, data/results/sql) as
ShareGPT ReAct JSONL for ``libra-sim convert --from sharegpt-react``.

Input, in the working folder, extracted from commit 69922e2f331b36a7d94b5da4a7ed10289e6c4c94 with
``git show`` under the same paths: data/results/sql/<model>/ic_sql_multiturn_<model>_10_turns.json for
the seven models below (InterCode's ``eval_n_turn.py`` logs: ``{task index: {task_id, query,
turn_history: {actions, observations, rewards, valid_action}, summary: {max_reward, ...},
hardness}}``), and experiments/utils/prompts.py (InterCode's prompt templates: string constants and
classes, no imports; executed here to render the prompt text). Output: intercode-sql-spider-dev.jsonl,
one run per line, ordered by (step, task id, model).

The loop that wrote the logs (experiments/eval_n_turn.py at the same commit): per Spider-dev task,
up to 10 turns of: ask the policy for a reply, parse it with ``sql_parser``; when no SQL statement
could be parsed, answer with the template's retry message ("No SQL code was found in your last
response. ...", or in some runs an earlier wording "Format your SQL command as follows: ...";
nothing is executed, reward 0); else execute it on the task's MySQL database
(observation: the fetched rows as a Python list, None for a statement without a result set, or
"Error executing query: ..."; ``valid_action`` = it executed), then score it against the gold query
(IoU of the rows, scaled by rank correlation, 0..1); the run ends at reward 1 or after 10 turns. A
policy call that raised (PaLM returning no candidate) logs the action ``blocked`` (reward 0, no
observation) and ends the run.

Written per run: ``system`` = the ``game_sql`` template's instructions, ``human`` = its query message;
then per turn a ``gpt`` message = the logged action exactly (the parsed SQL, or the whole reply when
no SQL was found), preceded by one marker line ``Action: <keyword>`` when the action was executed
(the converter reads the tool name off that line: the statement's first word, lower-cased,
``select``/``show``/``describe``/``desc``/..., or ``not_sql`` when that word is not an SQL keyword),
and a ``human`` message = the observation as the template renders it for the next request
(``get_obs_msg``: the rows cut to 50 or the text to 1,000 characters as ``ChatGPTPolicy`` does, the
turn's reward and the query again), with ``outcome`` ok / error from ``valid_action``. A retry turn
has no marker (the converter makes it ``format_error``, outcome error) and the retry message as its
reply. The last turn of a solved run (reward 1) gets no marker and no reply (``finish: stop``);
a run that used all 10 turns keeps its last reply (``finish: tool_limit``: the statement ran and was
scored); a ``blocked`` run drops the failed call and keeps the last reply (``finish: abort``).
``reward`` is the run's ``max_reward`` (0..1; 1 = solved), ``group`` the task (``spider-dev-<id>``:
the seven models' runs of one question), ``step`` = task id mod 5, ``id``
``intercode-sql-<task id>-<model>``.
"""

import ast
import collections
import hashlib
import json
import re

MODELS = ["gpt-4", "gpt-3.5", "text-davinci-003", "chat-bison-001", "text-bison-001", "starchat", "vicuna"]  # folder names
MODEL = {"gpt-4": "gpt-4", "gpt-3.5": "gpt-3.5-turbo", "text-davinci-003": "text-davinci-003",
         "chat-bison-001": "chat-bison-001", "text-bison-001": "text-bison-001",
         "starchat": "starchat", "vicuna": "vicuna"}
SQL_WORDS = {"select", "show", "describe", "desc", "with", "use", "alter", "update", "create", "insert",
             "delete", "drop", "explain"}
RETRY_NEW = "No SQL code was found in your last response."
RETRY_OLD = "Format your SQL command as follows:\n```SQL\nYour SQL code here\n```\n"
ACTION_LINE = re.compile(r"^\s*(?:Action|Act)(?:\s*\d+)?\s*:|^\s*Final Answer\s*:", re.IGNORECASE | re.MULTILINE)
N_STEPS = 5

ns = {}
exec(open("experiments/utils/prompts.py").read(), ns)  # InterCode's templates (no imports)


def keyword(action):
    w = action.split()[0].strip("`").lower() if action.split() else ""
    return w if w in SQL_WORDS else "not_sql"


def model_view(obs):
    """The observation as ChatGPTPolicy passed it to the template: a result list cut to its first 50
    rows, a string to 1,000 characters. The log holds ``str(observation)``; a list is recognised by
    parsing (not evaluating) that text, and cut at the end of its 50th element."""
    if obs.startswith("["):
        try:
            node = ast.parse(obs, mode="eval").body
        except SyntaxError:
            node = None
        if isinstance(node, ast.List):
            if not node.elts:
                return []  # the template prints "No output"
            if len(node.elts) > 50:
                e = node.elts[49]
                assert e.end_lineno == 1
                return obs.encode()[:e.end_col_offset].decode() + "]"
            return obs
    if obs == "None":
        return obs  # a statement without a result set (observation None, printed as None)
    return obs[:1000]


rows, stats = [], collections.Counter()
for m in MODELS:
    d = json.load(open(f"data/results/sql/{m}/ic_sql_multiturn_{m}_10_turns.json"))
    for k, v in d.items():
        tid = v["task_id"]
        assert int(k) == tid and v["environment"] == "ic_sql" and v["dataset"] == "./data/spider/dev_spider.json"
        th, s = v["turn_history"], v["summary"]
        acts, obss, rews, oks = th["actions"], th["observations"], th["rewards"], th["valid_action"]
        blocked = acts[-1] == "blocked"
        if blocked:
            assert "blocked" not in acts[:-1] and rews[-1] == 0 and len(obss) == len(oks) == len(acts) - 1 >= 1
            acts, rews = acts[:-1], rews[:-1]
        assert len(acts) == len(obss) == len(rews) == len(oks) >= 1, (m, k)
        assert s["max_reward"] == max(th["rewards"]) and s["turns_max"] == 10
        solved = rews[-1] == 1
        assert solved == (s["max_reward"] == 1) and all(r < 1 for r in rews[:-1])
        assert solved or blocked or len(acts) == 10, (m, k)
        tpl = ns["TemplateSQLGame"]("SQL", "MySQL Database")  # --template game_sql: PROMPT_MAP["game_sql"](language, SETTING_MAP["sql"])
        conv = [{"from": "system", "value": tpl.get_init_msg()},
                {"from": "human", "value": tpl.get_query_msg(v["query"])}]
        for i, (a, o, r, ok) in enumerate(zip(acts, obss, rews, oks)):
            assert isinstance(a, str) and not ACTION_LINE.search(a), (m, k, i)
            last = i == len(acts) - 1
            retry = o.startswith(RETRY_NEW) or o == RETRY_OLD
            if retry:
                assert r == 0
                stats["retry valid_action=True" if ok else "retry"] += 1
                conv.append({"from": "gpt", "value": a})
                conv.append({"from": "human", "value": tpl.get_obs_msg(o, r), "outcome": "error"})
                continue
            tool = keyword(a)
            if last and solved:
                conv.append({"from": "gpt", "value": a})  # the answer: scored, never shown back
                stats["last solved " + tool] += 1
                break
            stats[(tool, "ok" if ok else "error")] += 1
            conv.append({"from": "gpt", "value": f"Action: {tool}\n{a}"})
            conv.append({"from": "human", "value": tpl.get_obs_msg(model_view(o), r), "outcome": "ok" if ok else "error"})
        finish = "stop" if solved else "abort" if blocked else "tool_limit"
        stats[finish] += 1
        rows.append({"id": f"intercode-sql-{tid:04d}-{m}", "step": tid % N_STEPS, "group": f"spider-dev-{tid}",
                     "reward": float(s["max_reward"]), "finish": finish, "model": MODEL[m],
                     "conversations": conv, "_order": (tid % N_STEPS, tid, MODELS.index(m))})
    stats[m] = len(d)

rows.sort(key=lambda x: x["_order"])
for x in rows:
    del x["_order"]
with open("intercode-sql-spider-dev.jsonl", "w") as f:
    for x in rows:
        f.write(json.dumps(x, ensure_ascii=False) + "\n")
print(len(rows), "runs;", "steps", sorted(collections.Counter(x["step"] for x in rows).items()))
print(dict(sorted(stats.items(), key=str)))
print("sha256", hashlib.sha256(open("intercode-sql-spider-dev.jsonl", "rb").read()).hexdigest())
