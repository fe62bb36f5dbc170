"""Rebuild ReAct's FEVER runs (ysymyth/ReAct, FEVER.ipynb) as ShareGPT ReAct JSONL for
``libra-sim convert --from sharegpt-react``.

Input, in the working folder: FEVER.ipynb (git blob 943596629da840fe97d2fdcac01559489440c514)
and prompts/fever.json (git blob 9a90695b4fea5f71a1b0844b6f4b016602004127, read with ``json``:
its ``webthink_simple3`` entry is the few-shot prompt every request began with); optionally
data/paper_dev.jsonl (blob 722231a8bda19c99a80919900b13c084123ca37a) to cross-check each printed
claim and gold label against the dev split. Output: fever-react-text-davinci-002.jsonl, one run
per line, in the log's episode order.

The notebook's cell ``for i in idxs[:500]: r, info = webthink(i, to_print=True) ...`` printed
every episode as ``IDX Claim: ...`` / per step ``Thought i: T\\nAction i: A\\nObservation i: O\\n``
(``print`` adds a newline), preceded by ``ohh... RAW`` when the model's output held no
``\\nAction i: `` (the harness then kept RAW's first line as the thought and asked the model again
for the action alone) / the final ``info`` dict / ``EM_SUM N EM_MEAN SECONDS_PER_EPISODE`` /
``-----------``. Only that cell's stdout is read; nothing is executed. Every episode's parse is
checked by printing it back exactly as the harness did.
"""

import ast
import json
import os
import re

nb = json.load(open("FEVER.ipynb"))
prompt = json.load(open("prompts/fever.json"))["webthink_simple3"]
cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
run_cell = next(c for c in cells if "r, info = webthink(i, to_print=True)" in "".join(c["source"]))
assert all(o.get("name") == "stdout" for o in run_cell["outputs"])
text = "".join("".join(o["text"]) for o in run_cell["outputs"])
dev = None
if os.path.exists("data/paper_dev.jsonl"):
    dev = [json.loads(s) for s in open("data/paper_dev.jsonl")]

episodes = text.split("-----------\n\n")
assert episodes[-1] == "" and len(episodes) == 501
MAX_STEPS = 7  # webthink: for i in range(1, 8); then a harness finish[] (no model call, not printed)
rows, prev_sum, prev_secs = [], 0, 0.0
extra_gens = []
for k, ep in enumerate(episodes[:-1]):
    head, _, rest = ep.partition("\n")
    idx, claim = re.fullmatch(r"(\d+) (Claim: .*)", head).groups()
    m = re.search(r"(\{'steps'.*\}) \n\n(\d+) (\d+) ([0-9.]+) ([0-9.e-]+)\n\Z", rest)
    info = ast.literal_eval(m.group(1))
    em_sum, n = int(m.group(2)), int(m.group(3))
    assert n == k + 1 and em_sum - prev_sum == info["em"], (k, em_sum, prev_sum, info)
    prev_sum = em_sum
    assert info["question_idx"] == int(idx)
    if dev is not None:
        assert f"Claim: {dev[int(idx)]['claim']}" == claim and dev[int(idx)]["label"] == info["gt_answer"], k
    body, pos, steps = rest[: m.start()], 0, []
    for i in range(1, MAX_STEPS + 1):
        if pos == len(body):
            break
        raw = None
        if body.startswith("ohh... ", pos):  # print('ohh...', thought_action)
            j = body.index(f"\nThought {i}: ", pos)
            raw, pos = body[pos + len("ohh... "): j], j + 1
        assert body.startswith(f"Thought {i}: ", pos), (k, i, body[pos: pos + 80])
        a = body.index(f"\nAction {i}: ", pos)
        o = body.index(f"\nObservation {i}: ", a)
        nxt = re.compile(rf"\n\n(?=Thought {i + 1}: |ohh\.\.\. |\Z)")
        e = nxt.search(body, o).start()
        thought = body[pos + len(f"Thought {i}: "): a]
        action = body[a + len(f"\nAction {i}: "): o]
        obs = body[o + len(f"\nObservation {i}: "): e]
        pos = e + 2
        if raw is not None:
            assert raw.strip().split("\n")[0] == thought, (k, i)
            extra_gens.append((k, i, raw))
        steps.append((thought, action, obs, raw))
    assert pos == len(body), (k, body[pos: pos + 80])
    # the parse prints back to the logged text exactly
    back = f"{idx} {claim}\n" + "".join(
        (f"ohh... {r}\n" if r is not None else "") + f"Thought {i}: {t}\nAction {i}: {a}\nObservation {i}: {o}\n\n"
        for i, (t, a, o, r) in enumerate(steps, 1)) + rest[m.start():]
    assert back == ep, k
    done = steps[-1][2].startswith("Episode finished, reward = ")
    assert done or len(steps) == MAX_STEPS, k
    if done:
        assert steps[-1][2] == f"Episode finished, reward = {info['em']}\n" and info["steps"] == len(steps), k
    else:
        assert info["steps"] == MAX_STEPS + 1 and info["answer"] == "", k  # the harness's finish[]
    conv = [{"from": "system", "value": prompt}, {"from": "human", "value": claim}]
    for i, (t, a, o, _) in enumerate(steps, 1):
        # An action with a newline in it (the model wrote blank lines after "Action i:"; the
        # harness lower-cased only that newline, so the env rejected it) is written with its
        # newlines escaped, so the converter reads no action from it (format_error) rather than
        # the "Finish[...]" on its later line, which the env did not run.
        shown = a.replace("\n", "\\n") if "\n" in a else a
        if "\n" in a:
            assert o.startswith("Invalid action: "), (k, i)
        conv.append({"from": "gpt", "value": f"Thought {i}: {t}\nAction {i}: {shown}"})
        if done and i == len(steps):
            break  # "Episode finished, reward = X" is never shown to the model
        # no "outcome" field: the log records none, so the converter applies its ReAct rule
        # (Invalid action, Could not find ... Similar, No more results: error; else ok)
        conv.append({"from": "human", "value": f"Observation {i}: {o}"})
    rows.append({"id": f"fever-paper_dev-{idx}", "group": f"paper_dev-{idx}", "reward": float(info["em"]),
                 "finish": "stop" if done else "tool_limit", "model": "text-davinci-002", "conversations": conv})

with open("fever-react-text-davinci-002.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(len(rows), "runs;", sum(r["finish"] == "stop" for r in rows), "finished by the model;",
      f"EM {sum(r['reward'] for r in rows) / len(rows):.3f};", len(extra_gens), "re-asked actions (ohh...)")
