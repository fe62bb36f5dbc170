"""The bundled task sets: arithmetic/code tasks checked by value, and search-style questions
answered from the bundled corpus. Every task has a checkable answer, so rewards are exact.

Why synthetic tasks: CI and a laptop must run real RL (real tools, real rewards, a reward that
goes up) in minutes on CPU with a model trained from scratch. The tasks are built so that the
tool is the only reliable way to the answer: a tiny model cannot multiply two-digit numbers in
its head, and the corpus facts are invented (no prior can know them).

Task kinds (``TaskSet`` mixes them by weight):

- ``math``: "Compute A*B+C." -> python ``print(A*B+C)`` -> answer the printed value.
- ``math2``: "Compute A*B+C*D." -> one or two python calls -> answer.
- ``search``: "What is the capital of Zorvia?" -> search ``Zorvia capital`` -> answer the city
  named in the returned document.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from libra.errors import UserError
from libra.runtime.protocol import ANSWER, ANSWER_END, IM_END, TOOL_CALL, TOOL_CALL_END, parse_answer

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
CORPUS_PATH = os.path.join(ASSETS, "corpus.jsonl")
KINDS: tuple[str, ...] = ("math", "math2", "search")
FACTS: tuple[str, ...] = ("capital", "river", "language")


@dataclass(frozen=True, slots=True)
class Task:
    """One prompt: its question, the exact answer that earns reward 1, and its kind."""

    id: str
    kind: str
    question: str
    answer: str


@dataclass(frozen=True, slots=True)
class Doc:
    """One corpus document."""

    id: str
    text: str


def load_corpus(path: str = CORPUS_PATH) -> list[Doc]:
    """The retrieval corpus: one JSON object ``{"id", "text"}`` per line."""
    docs: list[Doc] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    docs.append(Doc(str(d["id"]), str(d["text"])))
                except (ValueError, KeyError, TypeError) as exc:
                    raise UserError(f"{path}:{n}: a corpus line must be a JSON object with 'id' and 'text' ({exc})") from None
    except FileNotFoundError:
        raise UserError(f"corpus {path} does not exist") from None
    if not docs:
        raise UserError(f"corpus {path} holds no documents")
    return docs


@lru_cache(maxsize=4)
def corpus_facts(path: str = CORPUS_PATH) -> dict[tuple[str, str], str]:
    """``(country, fact) -> value`` parsed from the corpus documents ``"C fact V."``."""
    out: dict[tuple[str, str], str] = {}
    for d in load_corpus(path):
        words = d.text.rstrip(".").split()
        if len(words) == 3 and words[1] in FACTS:
            out[(words[0], words[1])] = words[2]
    return out


def make_task(kind: str, rng: random.Random, index: int, facts: dict[tuple[str, str], str] | None = None) -> Task:
    """One seeded task of ``kind`` (see the module docstring)."""
    if kind == "math":
        a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(1, 99)
        return Task(f"math-{index}", kind, f"Compute {a}*{b}+{c}.", str(a * b + c))
    if kind == "math2":
        a, b, c, d = rng.randint(11, 99), rng.randint(2, 9), rng.randint(11, 99), rng.randint(2, 9)
        return Task(f"math2-{index}", kind, f"Compute {a}*{b}+{c}*{d}.", str(a * b + c * d))
    if kind == "search":
        facts = facts if facts is not None else corpus_facts()
        keys = sorted(k for k in facts if k[1] == "capital")
        country, fact = keys[rng.randrange(len(keys))]
        return Task(f"search-{index}", kind, f"What is the {fact} of {country}?", facts[(country, fact)])
    raise UserError(f"unknown task kind {kind!r}; known: {', '.join(KINDS)}")


class TaskSet:
    """A seeded stream of tasks mixing kinds by weight; ``batch(step, n)`` is reproducible."""

    def __init__(self, weights: dict[str, float], seed: int = 0) -> None:
        bad = sorted(set(weights) - set(KINDS))
        if bad:
            raise UserError(f"tasks: unknown kind(s) {', '.join(bad)}; known: {', '.join(KINDS)}")
        if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise UserError("tasks: weights must be >= 0 and sum to > 0, e.g. {math: 1, search: 1}")
        self.kinds = sorted(weights)
        self.weights = [float(weights[k]) for k in self.kinds]
        self.seed = seed

    def batch(self, step: int, n: int) -> list[Task]:
        """The ``n`` prompts of RL step ``step`` (same seed and step -> same tasks)."""
        rng = random.Random(self.seed * 1_000_003 + step)
        kinds = rng.choices(self.kinds, weights=self.weights, k=n)
        return [make_task(k, rng, step * 100_000 + i) for i, k in enumerate(kinds)]


def reward(task: Task, completion: str) -> float:
    """1.0 when the completion's final ``<answer>`` equals the task's answer, else 0.0."""
    got = parse_answer(completion)
    return 1.0 if got is not None and got == task.answer else 0.0


def demo_completion(task: Task, rng: random.Random, use_tool: bool) -> list[tuple[str, str | None]]:
    """A synthetic assistant transcript for supervised warm-up, as segments ``(text, tool_output)``.

    Each segment is model text ending in a tool call, followed by the tool's true output (the
    trainer computes it the same way the tools do); the last segment has output None and ends
    the trajectory. With ``use_tool`` False the transcript answers directly with a guess: the
    warm-up mixes both so the policy starts imperfect and RL has something to learn (use the
    tool, copy its result).
    """
    if not use_tool:
        if task.kind == "search":
            vals = sorted({v for (_, f), v in corpus_facts().items() if f == "capital"})
            guess = rng.choice(vals)
        else:
            guess = str(int(task.answer) + rng.choice([-1, 1]) * rng.randint(1, 30))
        return [(f"{ANSWER}{guess}{ANSWER_END}{IM_END}", None)]
    if task.kind == "search":
        country = task.question.rstrip("?").split()[-1]
        fact = task.question.split()[3]
        doc = f"{country} {fact} {task.answer}."
        return [(f"{TOOL_CALL}search\n{country} {fact}{TOOL_CALL_END}", doc), (f"{ANSWER}{task.answer}{ANSWER_END}{IM_END}", None)]
    expr = task.question[len("Compute ") : -1]
    if task.kind == "math2" and rng.random() < 0.5:
        left, right = expr.split("+")
        first = str(eval(left, {"__builtins__": {}}))  # noqa: S307 - our own digits-only expression
        return [
            (f"{TOOL_CALL}python\nprint({left}){TOOL_CALL_END}", first),
            (f"{TOOL_CALL}python\nprint({first}+{right}){TOOL_CALL_END}", task.answer),
            (f"{ANSWER}{task.answer}{ANSWER_END}{IM_END}", None),
        ]
    return [(f"{TOOL_CALL}python\nprint({expr}){TOOL_CALL_END}", task.answer), (f"{ANSWER}{task.answer}{ANSWER_END}{IM_END}", None)]


def build_corpus(n_countries: int = 48, seed: int = 7) -> list[Doc]:
    """The bundled corpus: invented countries with a capital, a river and a language each.

    Deterministic (``scripts/train_tiny_policy.py --write-corpus`` rewrites assets/corpus.jsonl
    from it); names are built from syllables so no pretrained prior knows the facts.
    """
    rng = random.Random(seed)
    syl = ["zor", "vi", "qua", "lem", "tes", "ka", "mir", "do", "bel", "ran", "os", "tu", "fen", "ga", "lo", "pri", "sa", "nek"]

    def name(parts: int) -> str:
        return "".join(rng.choice(syl) for _ in range(parts)).capitalize()

    used: set[str] = set()

    def fresh(parts: int) -> str:
        while True:
            n = name(parts)
            if n not in used:
                used.add(n)
                return n

    docs = []
    for i in range(n_countries):
        c = fresh(3)
        for fact in FACTS:
            docs.append(Doc(f"{c.lower()}-{fact}", f"{c} {fact} {fresh(2)}."))
    return docs


def write_corpus(docs: Sequence[Doc], path: str = CORPUS_PATH) -> None:
    """Write ``docs`` as the JSONL corpus file."""
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "text": d.text}) + "\n")
