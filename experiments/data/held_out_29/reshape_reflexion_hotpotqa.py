"""Reshape Reflexion's (noahshinn/reflexion) committed HotpotQA ReAct trial logs into `--from openai-chat` JSONL.

Usage: python reshape_reflexion_hotpotqa.py <dir holding hotpotqa_runs/> <out.jsonl>

Why a reshaping step: the logs are plain-text dumps (``util.log_react_trial``), not chat messages.
After each trial the notebook printed *every* agent's prompt without the few-shot examples
(``remove_fewshot(agent._build_agent_prompt())``: the question, the reflections gathered so far,
and the trial's scratchpad of ``Thought n:`` / ``Action n:`` / ``Observation n:`` lines), sorted
into correct / incorrect / halted agents. Agents already correct are not run again but are
printed again, so which agents really ran in a trial has to be worked out (those not correct after
the previous trial), and each run has to be cut into model turns and tool returns. This script
does that and writes one OpenAI-format chat line per run (rules in this folder's README,
"Conversion"). Only the structure and the texts needed for token counting go into the
intermediate file; the converter keeps counts, not text.

Read: ``hotpotqa_runs/root/ReAct/reflexion/100_questions_5_trials.txt`` (ReAct + Reflexion,
5 trials), ``hotpotqa_runs/root/ReAct/base/100_questions_5_trials.txt`` (plain ReAct, the failed
questions run again 4 times without reflections), ``hotpotqa_runs/prompts.py`` and
``hotpotqa_runs/fewshots.py`` (the instruction and the six few-shot examples every prompt held).
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass

LOGS: dict[str, str] = {  # config -> log file (under hotpotqa_runs/root/)
    "reflexion": "ReAct/reflexion/100_questions_5_trials.txt",
    "base": "ReAct/base/100_questions_5_trials.txt",
}
TRIAL = re.compile(r"^BEGIN TRIAL (\d+)\nTrial summary: Correct: (\d+), Incorrect: (\d+), Halted: (\d+)\n", re.MULTILINE)
SECTION = re.compile(r"^-{13} BEGIN (CORRECT|INCORRECT|HALTED) AGENTS -+\n", re.MULTILINE)
KEY = re.compile(r"\nCorrect answer: ([^\n]*)\n\n")
STEP = re.compile(r"\n(Thought|Action|Observation) (\d+): ?")
ACTION = re.compile(r"^(\w+)\[(.*)\]$", re.DOTALL)  # the agent's parse_action (which also needs a non-empty argument)


@dataclass
class Block:
    """One printed agent: its question, answer key, reflections text and scratchpad."""

    section: str
    question: str
    key: str
    reflections: str
    scratchpad: str


def literal(path: str, name: str) -> str:
    """The string constant ``name`` assigned at module level in ``path`` (read, not imported)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, str), name
            return value
    raise KeyError(name)


def parse_blocks(text: str) -> list[tuple[int, tuple[int, int, int], list[Block]]]:
    """(trial, (correct, incorrect, halted) as summarised, printed agents) per trial of a log."""
    heads = list(TRIAL.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        secs = list(SECTION.finditer(body))
        blocks: list[Block] = []
        for j, s in enumerate(secs):
            chunk = body[s.end(): secs[j + 1].start() if j + 1 < len(secs) else len(body)]
            pos = 0
            for m in KEY.finditer(chunk):
                raw = chunk[pos: m.start()].strip("\n")
                pos = m.end()
                t1 = raw.find("\nThought 1:")
                assert raw.startswith("Question: ") and t1 > 0, raw[:200]
                head, scratch = raw[:t1], raw[t1:]
                # "Question: {question}{reflections}": the reflections start with the header sentence
                r = head.find("You have attempted to answer")
                q, refl = (head[len("Question: "):r], head[r:]) if r > 0 else (head[len("Question: "):], "")
                blocks.append(Block(s.group(1), q.strip(), m.group(1), refl, scratch))
            assert not chunk[pos:].strip().strip("#").strip(), chunk[pos:][:200]  # the next trial's rule line
        out.append((int(h.group(1)), (int(h.group(2)), int(h.group(3)), int(h.group(4))), blocks))
    return out


def steps_of(scratch: str) -> list[tuple[str, str, str | None]]:
    """(thought, action, observation or None) per step of a scratchpad, checking the numbering."""
    parts = STEP.split(scratch)
    assert parts[0] == "", parts[0][:100]
    items = [(parts[k], int(parts[k + 1]), parts[k + 2]) for k in range(1, len(parts), 3)]
    steps: list[tuple[str, str, str | None]] = []
    for k in range(0, len(items), 3):
        trio = items[k: k + 3]
        n = len(steps) + 1
        assert [x[0] for x in trio] == ["Thought", "Action", "Observation"][: len(trio)] and all(x[1] == n for x in trio), trio
        assert len(trio) == 3, ("a step without an observation", trio)
        steps.append((trio[0][2], trio[1][2], trio[2][2]))
    return steps


def main() -> None:
    root, out = sys.argv[1], sys.argv[2]
    hp = os.path.join(root, "hotpotqa_runs")
    instruction = literal(os.path.join(hp, "prompts.py"), "REACT_INSTRUCTION").split("Here are some examples:")[0]
    examples = literal(os.path.join(hp, "fewshots.py"), "WEBTHINK_SIMPLE6")
    stats: collections.Counter = collections.Counter()
    runs: list[dict] = []
    questions: set[str] = set()
    for config, rel in LOGS.items():
        trials = parse_blocks(open(os.path.join(hp, "root", rel), encoding="utf-8").read())
        assert [t for t, _s, _b in trials] == list(range(1, len(trials) + 1)), config
        solved_before: set[str] = set()
        prev_blocks: dict[str, Block] = {}
        for trial, summary, blocks in trials:
            by_q: dict[str, Block] = {}
            for b in blocks:
                if b.question in by_q:
                    # base log: a few agents that finished with a wrong answer after their last
                    # allowed step are printed under INCORRECT and again under HALTED (the same
                    # scratchpad); the trial summary counts them once, as incorrect
                    a = by_q[b.question]
                    assert (a.section, b.section) == ("INCORRECT", "HALTED") and a.scratchpad == b.scratchpad, (config, trial, b.question)
                    stats[f"{config} trial {trial}: printed as incorrect and halted (kept as incorrect)"] += 1
                    continue
                by_q[b.question] = b
            counts = collections.Counter(b.section for b in by_q.values())
            assert counts["CORRECT"] == summary[0] and counts["INCORRECT"] == summary[1], (config, trial, counts, summary)
            if counts["HALTED"] != summary[2]:  # base trials 2-5: one more agent printed as halted than summarised
                stats[f"{config} trial {trial}: halted printed {counts['HALTED']}, summarised {summary[2]}"] += 1
            if trial == 1:
                assert len(by_q) >= 99, (config, len(by_q))
                questions |= set(by_q)
            assert set(by_q) <= questions, (config, trial)
            for q in sorted(questions - solved_before):  # the agents that ran in this trial
                b = by_q.get(q)
                if b is None:
                    stats["left out: ran but printed in no section (neither finished nor halted)"] += 1
                    continue
                assert b.section != "CORRECT" or q not in solved_before
                if config == "base" or trial == 1:
                    assert not b.reflections, (config, trial, q)
                elif not b.reflections:
                    # a failed agent printed again without any reflection and with the previous
                    # trial's scratchpad unchanged did not run again (its reflect()/run evidently
                    # failed): one question, trials 2-5
                    assert q in prev_blocks and prev_blocks[q].scratchpad == b.scratchpad, (config, trial, q)
                    stats["left out: reflexion agent not run again (reprint without reflections)"] += 1
                    continue
                else:
                    assert b.reflections.count("You have attempted") == 1, (config, trial, q)
                if trial > 1 and q in prev_blocks and prev_blocks[q].scratchpad == b.scratchpad:
                    stats[f"{config}: run identical to the previous trial's (kept)"] += 1
                steps = steps_of(b.scratchpad)
                prompt = instruction + "Here are some examples:\n" + examples + "\n(END OF EXAMPLES)\n" + f"Question: {b.question}" + b.reflections
                msgs: list[dict] = [{"role": "user", "content": prompt}]
                for n, (thought, action, obs) in enumerate(steps, 1):
                    m = ACTION.match(action.strip())
                    kind = m.group(1) if m and m.group(2) else None
                    last = n == len(steps)
                    turn: dict = {"role": "assistant", "content": f"\nThought {n}: {thought}\nAction {n}: {action}"}
                    if kind == "Finish":
                        assert last and obs in ("Answer is CORRECT", "Answer is INCORRECT"), (config, trial, q, obs)
                        assert (obs == "Answer is CORRECT") == (b.section == "CORRECT"), (config, trial, q)
                        msgs.append(turn)  # the answer ends the run; its verdict is never shown to the model
                        stats["action Finish"] += 1
                        break
                    if kind in ("Search", "Lookup"):
                        tool = kind.lower()
                        turn["tool_calls"] = [{"id": f"c{n}", "type": "function", "function": {"name": tool, "arguments": ""}}]
                        if kind == "Search":
                            bad = obs.startswith(("Could not find", "Could not find that page"))
                        else:
                            bad = obs.startswith(("No Results", "No More Results", "The last page Searched was not found"))
                        outcome = "error" if bad else "ok"
                        stats[f"{tool} {outcome}"] += 1
                    else:  # parse_action failed or an unknown action type: "Invalid Action..."
                        assert obs.startswith("Invalid Action"), (config, trial, q, action, obs[:80])
                        tool, outcome = "invalid", "error"
                        stats[f"action invalid ({action.split('[')[0][:20]})"] += 1
                    msgs.append(turn)
                    msgs.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"\nObservation {n}: {obs}", "outcome": outcome})
                if b.section == "HALTED":
                    assert ACTION.match(steps[-1][1].strip()) is None or not steps[-1][1].startswith("Finish"), (config, trial, q)
                    finish = "tool_limit"  # the step limit (6) or the 3,896-token prompt limit: the last call ran
                    stats["halted at step %d" % len(steps)] += 1
                else:
                    assert steps[-1][1].strip().startswith("Finish"), (config, trial, q)
                    finish = "stop"
                stats[f"{config} trial {trial} {b.section.lower()}"] += 1
                runs.append({"config": config, "trial": trial, "question": q, "reward": 1.0 if b.section == "CORRECT" else 0.0,
                             "finish": finish, "messages": msgs})
            solved_before |= {q for q, b in by_q.items() if b.section == "CORRECT"}
            prev_blocks = by_q
    order = {q: k for k, q in enumerate(sorted(questions))}
    rows = []
    for r in runs:
        pos = order[r["question"]]
        qid = "q" + hashlib.sha1(r["question"].encode("utf-8")).hexdigest()[:10]
        rows.append((pos % 5, pos, list(LOGS).index(r["config"]), r["trial"], {
            "id": f"reflexion-hotpotqa-{qid}-{r['config']}-t{r['trial']}", "step": pos % 5, "group": f"reflexion-hotpotqa-{qid}",
            "reward": r["reward"], "finish": r["finish"], "model": "text-davinci-003", "messages": r["messages"]}))
    rows.sort(key=lambda x: x[:4])
    with open(out, "w", encoding="utf-8") as f:
        for *_k, rec in rows:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    steps_c = collections.Counter(x[0] for x in rows)
    print(len(rows), "runs; steps", sorted(steps_c.items()), "; questions", len(questions), "; solved", sum(x[4]["reward"] == 1 for x in rows))
    print(dict(sorted(stats.items())))
    print("sha256", hashlib.sha256(open(out, "rb").read()).hexdigest())


if __name__ == "__main__":
    main()
