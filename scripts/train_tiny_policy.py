#!/usr/bin/env python
"""Build (or rebuild) the bundled tiny tool-using policy: tokenizer + small Qwen2, warmed up on
synthetic transcripts of the bundled tasks, then check that it emits well-formed tool calls.

    .venv-run/bin/python scripts/train_tiny_policy.py [--out DIR] [--steps N] [--seed S]

Seeded: the same torch version and thread count give the same weights. The result is small
(< 5 MB) and is shipped in libra/runtime/assets/tiny-policy; rerun this after changing the task
format in libra/runtime/protocol.py or tasks.py.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from libra.runtime.tiny_model import DEFAULT_DIR, TinySpec

    d = TinySpec()
    p.add_argument("--out", default=DEFAULT_DIR)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--p-tool", type=float, default=d.p_tool, help="share of warm-up transcripts that use the tool")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--check", type=int, default=48, help="sample this many tasks afterwards and report tool-call well-formedness")
    p.add_argument("--write-corpus", action="store_true", help="rewrite assets/corpus.jsonl from tasks.build_corpus() first")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from libra.runtime import tasks
    from libra.runtime.tiny_model import train_tiny_policy

    if a.write_corpus:
        tasks.write_corpus(tasks.build_corpus())
    spec = TinySpec(steps=a.steps, seed=a.seed, p_tool=a.p_tool, batch=a.batch, lr=a.lr)
    stats = train_tiny_policy(a.out, spec)
    if a.check:
        from libra.runtime.engines.torch_engine import TorchEngine
        from libra.runtime.evaluate import evaluate_policy

        eng = TorchEngine(a.out, seed=a.seed)
        stats["check"] = evaluate_policy(eng, n=a.check, seed=1234)
    print(json.dumps(stats, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
