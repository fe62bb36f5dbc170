#!/usr/bin/env python
"""Measure a few single-process GRPO steps (torch engine + plain torch learner, no Ray) on one
device and put the measured stage times next to the cost evaluator's predictions for the same
work, with or without a calibration fitted on this machine.

    python scripts/measure_vs_predict.py --device cpu --gpu cpu [--calibration calib.json] --out DIR
    python scripts/measure_vs_predict.py --device cuda --gpu h200 --calibration calib.json --out DIR

Prediction of a rollout: this script sends the torch engine one request per call (no batching,
so each iteration's time is the model's own at batch 1), so the work is, per
trajectory and turn, a prefill of the new context tokens (``prefill_s(1, new, cached)``) and one
decode iteration per generated token at batch 1 (``decode_s(1, 1, context)``). Training: one
``train_iter_s`` per mini-batch on the step's tokens plus the old-policy ``forward_s``. Writes
``measured_vs_predicted.csv`` and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--gpu", default="cpu", help="cost-model catalog name of the device (cpu, h200, ...)")
    p.add_argument("--calibration", default=None, help="calibration JSON from libra-calibrate fit (default: datasheet constants)")
    p.add_argument("--model", default=None, help="model folder (default: the bundled tiny policy)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="out/measure_vs_predict")
    a = p.parse_args(argv)
    import numpy as np
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from cost_models import CostEvaluator
    from cost_models.training import TrainStrategy
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.episode import Episode
    from libra.runtime.grpo import Sample, group_advantages
    from libra.runtime.chat_format import for_tokenizer
    from libra.runtime.tasks import TaskSet
    from libra.runtime.tiny_model import encode, model_dir
    from libra.runtime.tools import ToolBox
    from libra.runtime.trainer import Learner

    mdir = model_dir(a.model)
    ev = CostEvaluator(a.gpu, os.path.join(mdir, "config.json"), calibration=a.calibration, gpus_per_node=1)
    eng = TorchEngine(mdir, device=a.device)
    fmt = for_tokenizer(eng.tokenizer)
    learner = Learner(mdir, backend="torch", device=a.device, mini_batches=2)
    tools = ToolBox()
    ts = TaskSet({"math": 1, "math2": 1, "search": 1}, seed=0)
    strat = TrainStrategy(1, 1, 1)
    rows = []
    for step in range(a.steps):
        eps = []
        for i, t in enumerate(ts.batch(step, a.prompts)):
            ids = fmt.prompt_ids(t.question)
            eps += [Episode(f"s{step}-{i}-{g}", step, f"p{i}", t, ids, seed=step * 1000 + i * 10 + g, fmt=fmt) for g in range(a.group)]
        pred_roll = 0.0
        meas_engine = 0.0
        t0 = time.perf_counter()
        for ep in eps:
            while not ep.done:
                req = ep.request()
                if a.device == "cuda":
                    torch.cuda.synchronize()
                r = eng.generate([req])[0]
                meas_engine += r.prefill_s + r.decode_s
                pred_roll += float(ev.prefill_s(1, max(r.prefill_tokens, 1), r.cached_tokens))
                ctx = np.arange(len(req.context), len(req.context) + max(len(r.tokens) - 1, 0))
                if len(ctx):
                    pred_roll += float(np.sum(ev.decode_s(1, 1, ctx)))
                call = ep.on_generation(r, lambda x: eng.tokenizer.decode(x, skip_special_tokens=False))
                if call is not None:
                    tr = tools.call(call.name, call.args)
                    text = ep.tool_text(tr)
                    ep.on_tool_result(tr, encode(eng.tokenizer, text), text)
        meas_roll = time.perf_counter() - t0
        adv = group_advantages([e.reward for e in eps], [e.group for e in eps])
        samples = [Sample(tuple(e.context), tuple(e.gen_mask), float(x)) for e, x in zip(eps, adv)]
        st = learner.train_step(samples)
        tokens = int(st["tokens"])
        seq = max(len(e.context) for e in eps)
        pred_train = float(ev.forward_s(strat, tokens, seq)) + 2 * float(ev.train_iter_s(strat, tokens // 2, seq))
        rows.append({"step": step, "measured_engine_s": meas_engine, "predicted_engine_s": pred_roll, "measured_rollout_wall_s": meas_roll,
                     "measured_train_s": st["train_s"], "predicted_train_s": pred_train, "gen_tokens": sum(len(e.context) for e in eps),
                     "trained_tokens": tokens, "reward": float(np.mean([e.reward for e in eps]))})
        eng.load_state_dict(learner.state_dict())
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "measured_vs_predicted.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"device {a.device} ({a.gpu}), calibration {a.calibration or 'none (datasheet constants)'}")
    print(f"{'step':>4} {'engine meas':>11} {'engine pred':>11} {'ratio':>6} {'train meas':>10} {'train pred':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['step']:>4} {r['measured_engine_s']:>11.3f} {r['predicted_engine_s']:>11.3f} {r['predicted_engine_s'] / r['measured_engine_s']:>6.2f} "
              f"{r['measured_train_s']:>10.3f} {r['predicted_train_s']:>10.3f} {r['predicted_train_s'] / r['measured_train_s']:>6.2f}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"device": a.device, "gpu": a.gpu, "calibration": a.calibration, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
