#!/usr/bin/env python
"""Evaluate the tiny policy on held-out tasks (seeded), before and after a libra-run:
mean reward, share of trajectories calling a tool, share of well-formed calls.

    python scripts/eval_policy.py [--run OUT_DIR] [--n 96] [--seed 999]

With ``--run``, the newest plain-torch checkpoint in OUT_DIR/ckpt is evaluated next to the
starting weights (the bundled policy or ``--model``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--run", default=None, help="a libra-run output folder (trainer: torch) to evaluate its last checkpoint")
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--seed", type=int, default=999, help="task seed (the run's tasks use its own seed; 999 is held out)")
    p.add_argument("--temperature", type=float, default=1.0)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.evaluate import evaluate_policy
    from libra.runtime.tiny_model import model_dir

    eng = TorchEngine(model_dir(a.model))
    out = {"start": evaluate_policy(eng, n=a.n, seed=a.seed, temperature=a.temperature)}
    if a.run:
        found = sorted(glob.glob(os.path.join(a.run, "ckpt", "step*.pt")))
        if not found:
            print(f"no plain-torch checkpoint in {a.run}/ckpt", file=sys.stderr)
            return 2
        ck = torch.load(found[-1], map_location="cpu", weights_only=False)
        eng.load_state_dict(ck["model"])
        out["after"] = evaluate_policy(eng, n=a.n, seed=a.seed, temperature=a.temperature)
        out["checkpoint"] = found[-1]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
