"""Cut every run of a Libra trace at a context limit, as an RL rollout with that max context ends it.

Why: ColorBrowserAgent re-built its prompt each step with only the current page, but the trace
format appends every turn's tool return to one growing context, so the converted runs reach
1,560,260 tokens, which the agent never held (README, caveat 1). An RL run of such an agent bounds
the context (verl's and SkyRL's max response length, a browser-RL recipe's history window): a
trajectory whose next turn would not fit ends with ``finish: "length"``. The turns kept are the
log's own, unchanged; a run is cut before the first turn whose generation would cross the limit,
or after a generation whose tool return would (that call is dropped with its return: the run ends
on the generation, ``tool: null``). Rewards are kept as logged (a cut run's reward is its logged
outcome; an RL run would score the truncated trajectory, usually 0: a caveat, not modelled).

Usage: python truncate_context.py IN.jsonl.gz OUT.jsonl.gz LIMIT
Only the standard library; deterministic (byte-identical output for the same input).
"""

from __future__ import annotations

import gzip
import json
import sys


def cut(rec: dict, limit: int) -> tuple[dict, bool]:
    """``rec`` with its turns cut at ``limit`` context tokens; True when it was cut."""
    ctx = int(rec["prompt_tokens"])
    kept: list[dict] = []
    for turn in rec["turns"]:
        gen = int(turn.get("gen_tokens", 0))
        if ctx + gen > limit:
            break
        ctx += gen
        tool_tokens = int(turn.get("tool_tokens") or 0)
        if turn.get("tool") is not None and ctx + tool_tokens > limit:
            kept.append({"gen_tokens": gen, "tool": None})
            return {**rec, "turns": kept, "finish": "length"}, True
        ctx += tool_tokens if turn.get("tool") is not None else 0
        kept.append(turn)
    if len(kept) == len(rec["turns"]):
        return rec, False
    if not kept:
        raise SystemExit(f"{rec['id']}: its prompt and first generation alone exceed {limit} tokens")
    last = {k: v for k, v in kept[-1].items() if k not in ("tool", "tool_latency_s", "tool_tokens", "outcome")}
    kept[-1] = {**last, "tool": None}
    return {**rec, "turns": kept, "finish": "length"}, True


def main() -> None:
    src, dst, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    n = n_cut = 0
    with gzip.open(src, "rt") as f, gzip.GzipFile(dst, "wb", mtime=0) as raw:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "header":
                rec = {**rec, "source": f"{rec.get('source', '')}; cut at {limit} context tokens (truncate_context.py)"}
            elif rec.get("type") == "trajectory":
                rec, was = cut(rec, limit)
                n += 1
                n_cut += was
            raw.write((json.dumps(rec, separators=(",", ":")) + "\n").encode())
    print(f"{n} runs, {n_cut} cut at {limit} context tokens")


if __name__ == "__main__":
    main()
