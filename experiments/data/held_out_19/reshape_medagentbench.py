"""Rebuild AgentBench's MedAgentBench runs (THUDM/AgentBench 45ae4f9, outputs/Jan17v1) as ShareGPT
ReAct JSONL for ``libra-sim convert --from sharegpt-react``.

Input, in the working folder, extracted from commit 45ae4f9e334a901c8cc427a0809a3dbd19adbc94 with
``git show`` under the same paths: outputs/Jan17v1/<agent>/medagentbench-std/runs.jsonl for the five
agents, overall.json for the four that have one (gemini-2.0 has none), and
data/medagentbench/test_data_v1.json (the 100 tasks; index i of a run is test case i). Output:
medagentbench-jan17v1.jsonl, one run per line, ordered by (step, task, agent).

Each run's ``output.history`` is [user prompt, agent, user, agent, ...]: the task harness
(src/server/tasks/medagentbench/__init__.py at the same commit) sent one user message (the prompt
template with the 9 FHIR function definitions and the case), then per round read the agent's text:
``GET url`` -> a live GET on the FHIR server, answered ``Here is the response from the GET
request:\\n...`` or ``Error in sending the GET request: ...``; ``POST url\\n{json}`` -> nothing is sent,
the payload is only parsed, answered ``POST request accepted ...`` or ``Invalid POST request``;
``FINISH([...])`` -> the run ends (status completed); anything else -> the run ends (status agent
invalid action). Nothing is executed here; the script checks every run against those rules.

Written per run: ``system``-less ShareGPT ``conversations``: ``human`` = the prompt, then per round a
``gpt`` message = the agent's text exactly, preceded by one marker line ``Action: fhir_get`` /
``Action: fhir_post`` when the harness ran it as a GET / POST (the converter reads the tool name off
that line), and a ``human`` message = the harness's reply exactly, with ``outcome`` ok, or error for
``Error in sending the GET request`` (HTTP 400s) and ``Invalid POST request``. The last ``gpt``
message (FINISH, or the unparseable action) gets no marker and no reply: a turn without a tool.
``finish`` stop (completed) or abort (agent invalid action); ``reward`` 1/0 from overall.json's
``completedCorrect`` / ``completedIncorrect``, 0 for an invalid action (the harness's accuracy counts
it as wrong), null for gemini-2.0's completed runs (no overall.json). ``step`` = (n - 1) // 2 for
test case ``taskC_n`` (n = 1..10: each step holds 2 cases of each of the 10 task types),
``group`` = the test case id (the up-to-5 agents' runs of one case), ``id``
``medagentbench-<case>-<agent>``.
"""

import collections
import hashlib
import json
import re

AGENTS = ["deepseekv3", "gemini-2.0", "gpt-4o-mini", "gpt-4o", "llama-3.3"]  # output folder names
MODEL = {"deepseekv3": "deepseek-ai/DeepSeek-V3", "gemini-2.0": "google/gemini-2.0-flash-exp",
         "gpt-4o-mini": "gpt-4o-mini", "gpt-4o": "gpt-4o-2024-11-20",
         "llama-3.3": "meta-llama/Llama-3.3-70B-Instruct-Turbo"}  # configs/agents/api_agents.yaml
API_BASE = "http://34.170.56.151:8080/fhir/"  # configs/tasks/medagentbench.yaml

# MedAgentBench_prompt at 45ae4f9 (src/server/tasks/medagentbench/__init__.py, blob 5a44e3aa)
TEMPLATE = """You are an expert in using FHIR functions to assist medical professionals. You are given a question and a set of possible functions. Based on the question, you will need to make one or more function/tool calls to achieve the purpose.

1. If you decide to invoke a GET function, you MUST put it in the format of
GET url?param_name1=param_value1&param_name2=param_value2...

2. If you decide to invoke a POST function, you MUST put it in the format of
POST url
[your payload data in JSON format]

3. If you have got answers for all the questions and finished all the requested tasks, you MUST call to finish the conversation in the format of (make sure the list is JSON loadable.)
FINISH([answer1, answer2, ...])

Your response must be in the format of one of the three cases, and you can call only one function each time. You SHOULD NOT include any other text in the response.

Here is a list of functions in JSON format that you can invoke. Note that you should use {api_base} as the api_base.
{functions}

Context: {context}
Question: {question}"""
# gpt-4o and gpt-4o-mini ran (10:32 PST) with an earlier local edit of that line: no "(make sure ...)"
EARLIER = " (make sure the list is JSON loadable.)"
ACTION_LINE = re.compile(r"^\s*(?:Action|Act)(?:\s*\d+)?\s*:|^\s*Final Answer\s*:", re.IGNORECASE | re.MULTILINE)

GET_OK = "Here is the response from the GET request:\n"
GET_ERR = "Error in sending the GET request: "
POST_OK = ("POST request accepted and executed successfully. Please call FINISH if you have got answers "
           "for all the questions and finished all the requested tasks")
POST_BAD = "Invalid POST request"
FINISH_NUDGE = ". Please call FINISH if you have got answers for all the questions and finished all the requested tasks"


def seen_by_harness(text):
    """The text the harness parsed: gemini-2.0 wrapped its actions in a ```tool_code fence, which the
    run removed before the harness saw it (its error messages quote the URL without it; the removal
    is not in the published code); a ```json fence was not removed (those runs ended as invalid)."""
    s = text.strip()
    if s.startswith("```tool_code"):
        s = s[len("```tool_code"):].strip()
        s = s[:-3].strip() if s.endswith("```") else s
    return s


tests = json.load(open("data/medagentbench/test_data_v1.json"))
funcs = json.load(open("data/medagentbench/funcs_v1.json"))
assert len(tests) == 100
rows, stats = [], collections.Counter()
for agent in AGENTS:
    base = f"outputs/Jan17v1/{agent}/medagentbench-std"
    runs = [json.loads(s) for s in open(f"{base}/runs.jsonl")]
    graded = None
    if agent != "gemini-2.0":
        overall = json.load(open(f"{base}/overall.json"))
        graded = {r["index"]: r for r in overall["custom"]["raw_results"]}
        assert len(graded) == overall["total"] == len(runs) == 100
        ok = sum(r["status"] == "completedCorrect" for r in graded.values())
        assert ok / 100 == overall["custom"]["accuracy"], agent
    assert len({r["index"] for r in runs}) == len(runs)
    for r in runs:
        out, idx = r["output"], r["index"]
        assert r["error"] is None and out["index"] == idx, (agent, idx)
        case = tests[idx]
        cid = case["id"]
        cat, n = re.fullmatch(r"task(\d+)_(\d+)", cid).groups()
        assert int(cid.split("_")[0][4:]) * 10 + int(n) - 11 == idx  # index i is taskC_n, i = 10(C-1) + n-1
        h = out["history"]
        roles = [m["role"] for m in h]
        assert roles == ["user", "agent"] * (len(h) // 2) and len(h) % 2 == 0, (agent, idx, roles)
        prompt = TEMPLATE.replace("{api_base}", API_BASE).replace("{functions}", json.dumps(funcs)).replace(
            "{context}", case["context"]).replace("{question}", case["instruction"])
        if agent in ("gpt-4o", "gpt-4o-mini"):
            prompt = prompt.replace(EARLIER, "", 1)
        assert h[0]["content"] == prompt, (agent, idx)
        conv = [{"from": "human", "value": h[0]["content"]}]
        for k in range(1, len(h), 2):
            text = h[k]["content"]
            assert not ACTION_LINE.search(text), (agent, idx, k)  # the converter must read only our marker
            act = seen_by_harness(text)
            last = k == len(h) - 1
            if last:
                if out["status"] == "completed":
                    assert act.startswith("FINISH(") and out["result"] == act[len("FINISH("):-1], (agent, idx)
                else:
                    assert out["status"] == "agent invalid action" and out["result"] is None, (agent, idx)
                    assert not act.startswith(("GET", "POST", "FINISH(")), (agent, idx)
                conv.append({"from": "gpt", "value": text})
                stats["last " + ("FINISH" if out["status"] == "completed" else "invalid")] += 1
                break
            reply = h[k + 1]["content"]
            if act.startswith("GET"):
                url = act[3:].strip() + "&_format=json"
                if reply.startswith(GET_OK):
                    assert reply.endswith(FINISH_NUDGE), (agent, idx, k)
                    tool, outcome = "fhir_get", "ok"
                else:
                    assert reply.startswith(GET_ERR) and reply.endswith(url), (agent, idx, k, reply[:200])
                    assert "400 Client Error" in reply
                    tool, outcome = "fhir_get", "error"
            elif act.startswith("POST"):
                try:
                    json.loads("\n".join(act.split("\n")[1:]))
                    valid = True
                except ValueError:
                    valid = False
                assert reply == (POST_OK if valid else POST_BAD), (agent, idx, k, reply[:100])
                tool, outcome = "fhir_post", "ok" if valid else "error"
            else:
                raise AssertionError((agent, idx, k, act[:80]))
            stats[(tool, outcome)] += 1
            conv.append({"from": "gpt", "value": f"Action: {tool}\n{text}"})
            conv.append({"from": "human", "value": reply, "outcome": outcome})
        if graded is not None:
            g = graded[idx]
            assert g["history"] == h and g["result"] == out["result"]
            reward = {"completedCorrect": 1.0, "completedIncorrect": 0.0, "agent invalid action": 0.0}[g["status"]]
            assert g["status"].startswith(out["status"])
        else:
            reward = None if out["status"] == "completed" else 0.0
        rows.append({"id": f"medagentbench-{cid}-{agent}", "step": (int(n) - 1) // 2, "group": cid,
                     "reward": reward, "finish": "stop" if out["status"] == "completed" else "abort",
                     "model": MODEL[agent], "conversations": conv,
                     "_order": ((int(n) - 1) // 2, int(cat), int(n), AGENTS.index(agent))})
        stats[agent] += 1

rows.sort(key=lambda x: x["_order"])
for x in rows:
    del x["_order"]
with open("medagentbench-jan17v1.jsonl", "w") as f:
    for x in rows:
        f.write(json.dumps(x, ensure_ascii=False) + "\n")
by_step = collections.Counter(x["step"] for x in rows)
rew = collections.Counter((x["model"].split("/")[-1], x["reward"]) for x in rows)
print(len(rows), "runs;", "steps", sorted(by_step.items()), ";", dict(sorted(stats.items(), key=str)))
print("rewards", sorted(rew.items(), key=str))
print("sha256", hashlib.sha256(open("medagentbench-jan17v1.jsonl", "rb").read()).hexdigest())
