"""Generated tokens/s of the torch rollout engine, one request per ``generate`` call
("sequential") vs all requests in one call ("batched"), on the bundled tiny policy. Not a test,
no assertions: it prints a table.

Each round is what a rollout instance does with ``B`` trajectories: turn 1 from fresh prompts,
then turn 2 after a tool return is appended (that turn reuses each trajectory's KV). Both modes
sample the same tokens (same per-request seeds), so tokens/s compare like for like. Best of
``--repeats`` rounds.

    .venv-run/bin/python benchmarks/torch_engine_batching.py [--batches 1 4 8 16] [--threads 1]
    .venv-run/bin/python benchmarks/torch_engine_batching.py --engine-file /tmp/old_torch_engine.py  # A/B another version
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from typing import Any


def load_engine_class(path: str | None) -> Any:
    """``TorchEngine`` from the package, or from a file (to compare with another version)."""
    if path is None:
        from libra.runtime.engines.torch_engine import TorchEngine

        return TorchEngine
    spec = importlib.util.spec_from_file_location("bench_torch_engine", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.TorchEngine


def one_round(engine: Any, prompts: list[tuple[int, ...]], tool_ids: tuple[int, ...], batched: bool, tag: str,
              max_new_tokens: int, temperature: float) -> tuple[int, float]:
    """(tokens generated, seconds) for two turns of ``len(prompts)`` trajectories."""
    from libra.runtime.engines.base import TurnRequest

    def call(reqs: list[TurnRequest]) -> list[Any]:
        if batched:
            return engine.generate(reqs)
        return [engine.generate([r])[0] for r in reqs]

    t0 = time.perf_counter()
    first = [TurnRequest(f"{tag}-{i}", p, max_new_tokens, temperature, seed=1000 + i) for i, p in enumerate(prompts)]
    r1 = call(first)
    second = [TurnRequest(q.traj_id, q.context + r.tokens + tool_ids, max_new_tokens, temperature, seed=2000 + i)
              for i, (q, r) in enumerate(zip(first, r1))]
    r2 = call(second)
    secs = time.perf_counter() - t0
    engine.drop([q.traj_id for q in first])
    return sum(len(r.tokens) for r in r1 + r2), secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engine-file", default=None, help="a torch_engine.py to load TorchEngine from instead")
    args = ap.parse_args()

    from libra.runtime.protocol import prompt_text, tool_response_text
    from libra.runtime.tasks import TaskSet
    from libra.runtime.tiny_model import encode, model_dir

    engine = load_engine_class(args.engine_file)(model_dir(), device=args.device, threads=args.threads)
    tasks = TaskSet({"math": 1, "math2": 1, "search": 1}, seed=0).batch(0, max(args.batches))
    prompts = [tuple(encode(engine.tokenizer, prompt_text(t.question))) for t in tasks]
    tool_ids = tuple(encode(engine.tokenizer, tool_response_text("1234")))
    one_round(engine, prompts[:2], tool_ids, True, "warm", args.max_new_tokens, args.temperature)  # first-call costs

    print(f"torch engine, tiny policy, {args.device}, threads={args.threads}, 2 turns/trajectory, "
          f"max_new_tokens={args.max_new_tokens}, temperature={args.temperature}, best of {args.repeats}")
    print(f"{'batch':>5} {'tokens':>7} {'seq tok/s':>10} {'batched tok/s':>14} {'speedup':>8}")
    for b in args.batches:
        rates = {}
        for batched in (False, True):
            best, tokens = float("inf"), 0
            for rep in range(args.repeats):
                tokens, secs = one_round(engine, prompts[:b], tool_ids, batched, f"b{b}-{batched}-{rep}", args.max_new_tokens, args.temperature)
                best = min(best, secs)
            rates[batched] = (tokens, tokens / best)
        assert rates[False][0] == rates[True][0], "both modes must generate the same tokens"
        print(f"{b:>5} {rates[True][0]:>7} {rates[False][1]:>10.0f} {rates[True][1]:>14.0f} {rates[True][1] / rates[False][1]:>7.2f}x")


if __name__ == "__main__":
    main()
