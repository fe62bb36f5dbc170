"""Rebuild ReAct's WebShop runs (ysymyth/ReAct, WebShop.ipynb) as ShareGPT ReAct JSONL for
``libra-sim convert --from sharegpt-react``.

Input: WebShop.ipynb (git blob 67cb9f878de242951a7804a31bb5da4264111a29) in the working folder.
Output: webshop-react-text-davinci-002.jsonl, one run per line, in the log's episode order.

The notebook's cell ``res1 = run_episodes(prompt1, 500)`` printed every episode as
``-----------------`` / episode index / ``Action: A`` + ``Observation: O`` blocks (the first
action is the harness's ``reset``) / ``N avg_score success_rate fail_rate`` / ``-------------``.
Only its stdout stream is read (one stderr DeprecationWarning is interleaved in the outputs).
Nothing is executed: ``prompt1`` (the one-shot ReAct demonstration every request began with) is
read from the prompt cell's source with ``ast``.
"""

import ast
import json
import re

nb = json.load(open("WebShop.ipynb"))
cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
prompt1 = None
for c in cells:
    for node in ast.parse("".join(c["source"])).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["prompt1"]:
            prompt1 = ast.literal_eval(node.value)
run_cell = next(c for c in cells if "".join(c["source"]).strip() == "res1 = run_episodes(prompt1, 500)")
text = "".join("".join(o["text"]) for o in run_cell["outputs"] if o.get("name") == "stdout")

parts = re.split(r"^-----------------\n(\d+)\n", text, flags=re.M)
assert parts[0] == "" and len(parts) == 1 + 2 * 500
MAX_ITER = 15  # webshop_run: for i in range(15): reset + at most 14 model actions are executed
rows, prev_total = [], 0.0
for k, (idx, body) in enumerate(zip(parts[1::2], parts[2::2])):
    assert int(idx) == k
    m = re.search(r"\n(\d+) ([0-9.e-]+) ([0-9.e-]+) ([0-9.e-]+)\n-------------\n", body)
    assert m and int(m.group(1)) == k + 1
    total = float(m.group(2)) * (k + 1)  # running mean score -> this episode's score
    score_from_avg, prev_total = total - prev_total, total
    run = body[: m.start()]
    blocks = run.split("\n\nAction: ")
    assert blocks[0].startswith("Action: reset\nObservation: ")
    steps = []
    for b in blocks:
        action, sep, obs = b.partition("\nObservation: ")
        assert sep and "\n" not in action  # the model's action is one line (stop=["\n"])
        steps.append((action.removeprefix("Action: ") if not steps else action, obs))
    steps[-1] = (steps[-1][0], steps[-1][1].removesuffix("\n"))
    (_, first_obs), acts = steps[0], steps[1:]
    last_action, last_obs = acts[-1]
    bought = last_action == "click[Buy Now]" and last_obs != "Invalid action!"  # env.step's done
    if not bought:
        assert len(acts) == MAX_ITER - 1, (k, len(acts))  # the loop ran out: return 0
    sm = re.fullmatch(r"Your score \(min 0\.0, max 1\.0\): ([0-9.]+)", last_obs) if bought else None
    reward = float(sm.group(1)) if sm else 0.0  # an end page without a score line: the harness's 0.0
    assert abs(reward - score_from_avg) < 1e-6, (k, reward, score_from_avg)
    conv = [{"from": "system", "value": prompt1}, {"from": "human", "value": first_obs}]
    for j, (a, o) in enumerate(acts):
        conv.append({"from": "gpt", "value": f"Action: {a}"})
        if bought and j == len(acts) - 1:
            break  # the score page after Buy Now is never shown to the model
        conv.append({"from": "human", "value": f"Observation: {o}", "outcome": "error" if o == "Invalid action!" else "ok"})
    rows.append({"id": f"webshop-fixed_{k}", "group": f"fixed_{k}", "reward": reward,
                 "finish": "stop" if bought else "tool_limit", "model": "text-davinci-002", "conversations": conv})

with open("webshop-react-text-davinci-002.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(len(rows), "runs;", sum(r["finish"] == "stop" for r in rows), "bought;",
      f"mean score {sum(r['reward'] for r in rows) / len(rows):.6f};", sum(r["reward"] == 1 for r in rows), "at 1.0")
