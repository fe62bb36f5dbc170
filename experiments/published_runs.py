"""Published RL runs, replayed: predicted (SIMULATED) vs published, row by row.

    .venv/bin/python experiments/published_runs.py [--out experiments/results/published_runs]

The rows are ``experiments/data/published_runs/rl_runs_published.csv`` (27 published runs: SkyRL,
RLinf, verl recipes, AReaL, NeMo Gym; copied with its SOURCES file, which gives every source,
commit and caveat). A row is replayed when its configuration gives what a replay needs: the GPU,
the model (a catalog name or its Hugging Face ``config.json``, under ``models/`` beside the CSV),
the GPU split, the rollout TP, the training layout, the batch and the generated length. Every
other row is listed with the reason it cannot be replayed; nothing is guessed to make it fit.
What a row does not state and the replay still needs (prompt length, the spread of response
lengths, turns per trajectory) is an assumption written in the row's ``assumed`` field and in the
output table.

Each replayable row becomes a synthetic trace with the row's batch, group size, turns and mean
generated length (lognormal lengths, sigma 0.6, capped at the row's maximum), replayed by
``sim.replay.replay_policy`` with the row's framework layout pinned (``verl-colocated`` for
colocated runs, ``verl-static-uniform`` with the split for disaggregated ones), noise off, and
compared per published stage: whole step, rollout (generation), log-prob forward passes and the
training update. Steady state: the first step is dropped when more than one is replayed.

Besides the rows, a within-source ratio check uses ``rl_step_breakdowns.csv`` rows where the
absolute lengths are unpublished but the same workload runs colocated and disaggregated (verl's
fully_async recipe, Qwen2.5-Math-7B on H20): the ratio of the training stage's time per sample x
GPU, disaggregated over colocated, cancels the unknown lengths.

Every predicted number is SIMULATED.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra.cluster import ClusterSpec  # noqa: E402
from libra.trace.columnar import StepArrays  # noqa: E402
from libra.trace.records import Trajectory, Turn  # noqa: E402
from sim.costs import load_costs  # noqa: E402
from sim.loop import SimConfig  # noqa: E402
from sim.metrics import RunResult  # noqa: E402
from sim.replay import replay_policy  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_runs"
MODELS = DATA / "models"


@dataclass(frozen=True)
class Replay:
    """What one published row is replayed as (every field from the row or its script, except
    ``assumed``, which says what the source does not give)."""

    gpu: str
    model: str  # catalog name or a directory under MODELS holding config.json
    n_gpus: int
    colocated: bool
    rollout_tp: int
    train_tp: int = 1
    train_pp: int = 1
    train_ep: int | None = None
    split: tuple[int, int] | None = None  # disaggregated: (rollout, train) GPUs
    max_staleness: int = 0
    samples: int = 512
    group_size: int = 8
    turns: int = 1
    gen_mean: float = 1000.0  # generated tokens per trajectory, all turns
    gen_max: int = 8192
    prompt: int = 512
    tool_tokens: int = 0  # per tool call
    tool_latency_s: float = 0.0
    kl: bool = False
    mini_batches: int = 4  # optimizer steps per RL step (generated / training global batch)
    steps: int = 2
    published: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    assumed: str = ""

    def model_arg(self) -> str:
        d = MODELS / self.model / "config.json"
        return str(d) if d.exists() else self.model


#: Rows that replay. Stage names: step, rollout, logprob (old policy, + reference with kl),
#: update (the optimizer pass).
REPLAYS: dict[int, Replay] = {
    10: Replay("h100", "qwen2.5-3b-instruct", 8, True, rollout_tp=2, samples=2560, group_size=5, turns=3, gen_mean=658,
               gen_max=2000, prompt=400, tool_tokens=300, tool_latency_s=0.5, steps=1,
               published={"logprob": 39.0, "update": 48.0},
               assumed="Avg Num Tokens read as generated tokens per sample; prompt 400, 3 turns, 300 retrieved tokens per search (Search-R1 top-3); rollout 4 x TP2 as the FSDP script"),
    11: Replay("h100", "qwen2.5-7b-instruct", 8, True, rollout_tp=2, samples=2560, group_size=5, turns=3, gen_mean=819,
               gen_max=2000, prompt=400, tool_tokens=300, tool_latency_s=0.5, steps=1,
               published={"logprob": 46.0, "update": 93.0},
               assumed="as row 10"),
    12: Replay("h100", "qwen3-30b-a3b", 32, True, rollout_tp=8, train_tp=2, train_ep=8, samples=2560, group_size=5, turns=3,
               gen_mean=1158, gen_max=2000, prompt=400, tool_tokens=300, tool_latency_s=0.5, steps=1,
               published={"logprob": 145.0, "update": 189.0},
               assumed="as row 10; training TP2 EP8 over 32 GPUs (the script's layout; the page's DP4 is read as per EP group)"),
    15: Replay("h100", "deepseek-r1-distill-qwen-1.5b", 8, True, rollout_tp=2, train_tp=2, samples=512, group_size=8,
               gen_mean=14255, gen_max=28000, prompt=600,
               published={"step": 363.55, "rollout": 260.92, "logprob": 17.51, "update": 66.53},
               assumed="512 sequences = 'Batch Size Per DP 128' x DP4; prompt 600; lengths lognormal sigma 0.6 capped at the 28,672 context"),
    16: Replay("h100", "deepseek-r1-distill-qwen-1.5b", 8, True, rollout_tp=2, train_tp=2, samples=512, group_size=8,
               gen_mean=13975, gen_max=28000, prompt=600,
               published={"step": 346.33, "rollout": 266.08, "logprob": 17.78, "update": 61.12},
               assumed="as row 15 (RLinf's own step)"),
    17: Replay("h100", "deepseek-r1-distill-qwen-7b", 64, True, rollout_tp=2, train_tp=1, samples=2048, group_size=16,
               gen_mean=10426, gen_max=27648, prompt=600, kl=True,
               published={"step": 447.36, "rollout": 325.09, "logprob": 42.32, "update": 73.01},
               assumed="GPU type not stated: H100 assumed; FSDP + Ulysses SP4 priced as ZeRO data parallelism over 64 GPUs; prompt 600"),
}

#: NeMo RL's performance summary (``nemo_rl_performance.csv``: GRPO on OpenMathInstruct-2, H100,
#: Megatron training, vLLM generation; layouts from the named recipes). G-Average Seq len is
#: prompt + response; a 200-token prompt is assumed (the math problem in the chat template).
_NEMO_PROMPT = 200


def _nemo(model: str, n: int, coloc: bool, gen_tp: int, ttp: int, tpp: int, tep: int | None, avg: int, step_s: float,
          split: tuple[int, int] | None = None, k: int = 0, samples: int = 2048, t_gbs: int = 512, t_max: int = 4096,
          note: str = "") -> Replay:
    return Replay("h100", model, n, coloc, rollout_tp=gen_tp, train_tp=ttp, train_pp=tpp, train_ep=tep, split=split,
                  max_staleness=k, samples=samples, group_size=32, gen_mean=avg - _NEMO_PROMPT, gen_max=t_max - _NEMO_PROMPT,
                  prompt=_NEMO_PROMPT, kl=True, mini_batches=max(1, samples // t_gbs), steps=max(3, k + 3),
                  published={"step": step_s},
                  assumed=f"prompt {_NEMO_PROMPT} tokens; reference-model KL forward; lognormal lengths sigma 0.6 capped at T-Max" + note)


NEMO: dict[str, Replay] = {
    "nemo05_llama8b_on": _nemo("llama-3.1-8b", 16, True, 1, 1, 2, None, 1019, 92.8),
    "nemo05_llama8b_1off": _nemo("llama-3.1-8b", 16, False, 1, 1, 1, None, 1123, 64.8, split=(8, 8), k=1),
    "nemo05_qwen30b_on": _nemo("qwen3-30b-a3b", 32, True, 2, 1, 1, 8, 3196, 198.0),
    "nemo05_qwen30b_1off": _nemo("qwen3-30b-a3b", 32, False, 2, 1, 2, 8, 3201, 154.0, split=(16, 16), k=1),
    "nemo06_qwen30b_8off": _nemo("qwen3-30b-a3b", 192, False, 2, 1, 1, 8, 3206, 34.5, split=(64, 128), k=8),
    "nemo05_qwen32b_on": _nemo("qwen3-32b", 32, True, 4, 4, 4, None, 3251, 376.0),
    "nemo05_qwen32b_1off": _nemo("qwen3-32b", 64, False, 4, 4, 4, None, 3252, 200.0, split=(32, 32), k=1),
    "nemo05_qwen235b_1off": _nemo("qwen3-235b-a22b", 256, False, 8, 4, 8, 16, 5707, 203.0, split=(128, 128), k=1,
                                  samples=512, t_gbs=512, t_max=8192),
}

#: Rows that do not replay, and why (each read from the row and its SOURCES entry).
NOT_REPLAYED: dict[int, str] = {
    8: "wall clock of 40 steps including eval every 4 steps and checkpoints; no lengths, turns or tool latencies published (Docker SWE sandboxes)",
    9: "as row 8 (ThunderAgent variant)",
    13: "Qwen3.5-9B is a hybrid linear-attention architecture the cost model does not describe; response lengths not published",
    14: "as row 13 (with MTP speculative decoding, not modelled)",
    18: "hardware and script variant not stated (133 s is 'original performance' quoted by RLinf)",
    19: "H20-3e; lengths not published and concurrency's relation to batch not stated",
    20: "as row 19", 21: "as row 19", 22: "as row 19", 23: "as row 19",
    24: "Ascend NPU (no NPU profile); batch not published",
    25: "as row 24",
    26: "Ascend NPU; throughput unit not printed",
    27: "as row 26", 28: "as row 26",
    29: "per-step time not asserted (250 vs 1000 PPO steps conflict, see SOURCES); hardware per extract",
    30: "as row 29", 31: "as row 29", 32: "as row 29", 33: "as row 29 (verl baseline via a third-party extract)",
    34: "model and GPU not stated; order-of-magnitude anchor only",
}


def synthetic_step(r: Replay, step: int, seed: int) -> StepArrays:
    """One step of ``r.samples`` trajectories shaped as the row: lognormal generated lengths of
    mean ``r.gen_mean`` (sigma 0.6, clipped to [16, gen_max]), split evenly over ``r.turns``
    turns with a tool call between them."""
    rng = np.random.default_rng([seed, step])
    sigma = 0.6
    mu = math.log(r.gen_mean) - sigma * sigma / 2
    gen = np.clip(rng.lognormal(mu, sigma, r.samples), 16, r.gen_max).astype(int)
    trajs = []
    for i, g in enumerate(gen):
        k = r.turns
        per = max(1, int(g) // k)
        turns = [Turn(per, "search", r.tool_latency_s, r.tool_tokens, "ok") for _ in range(k - 1)]
        turns.append(Turn(int(g) - per * (k - 1), None))
        trajs.append(Trajectory(id=f"s{step}-t{i}", step=step, prompt_tokens=r.prompt, turns=tuple(turns),
                                group=f"g{i // r.group_size}", reward=float(rng.random()), finish="stop"))
    return StepArrays.from_trajectories(step, trajs)


def replay(r: Replay, seed: int = 0) -> RunResult:
    """The simulated run of ``r`` (every step, SIMULATED): its layout pinned, noise off, and an
    asynchronous row run at its own staleness. ``verl-static-uniform`` alone plans verl's
    one-step-off loop (staleness 1) in any class K, so a K-steps-off run (NeMo RL's 8 steps off)
    must ask for K: ``max_staleness`` only allows it."""
    # the run's declared limits, as a trace header would give them: without them a baseline's
    # memory check assumes 64K-token sequences and picks ZeRO-3 + recompute for layouts the run
    # ran without (Qwen3-32B TP4 PP4: 170 s instead of 71 s of update)
    cluster = ClusterSpec(r.n_gpus, r.gpu, r.model_arg(), max_context=r.prompt + r.gen_max,
                          max_response_tokens=r.gen_max, max_turns=r.turns)
    costs = load_costs(r.gpu, r.model_arg())
    steps = [synthetic_step(r, s, seed) for s in range(r.steps)]
    cfg = SimConfig(noise_sigma=0.0, seed=seed, kl=0.1 if r.kl else 0.0, max_staleness=r.max_staleness,
                    staleness=r.max_staleness or None, mode="async" if r.max_staleness else None,
                    mini_batches=r.mini_batches)
    opts: dict[str, object] = dict(rollout_tp=r.rollout_tp, train_tp=r.train_tp, train_pp=r.train_pp)
    if r.train_ep:
        opts["train_ep"] = r.train_ep
    if r.colocated:
        res = replay_policy(steps, "verl-colocated", cluster, cfg, costs=costs, **opts)
    else:
        res = replay_policy(steps, "verl-static-uniform", cluster, cfg, costs=costs, split=r.split, **opts)
    return res


def replay_row(r: Replay, seed: int = 0) -> dict[str, float]:
    """Predicted seconds per published stage (steady state: the first K + 1 steps dropped when
    more than that ran)."""
    res = replay(r, seed)
    skip = 1 + r.max_staleness  # the pipeline fills over the first K + 1 steps
    ms = res.steps[skip:] if len(res.steps) > skip else res.steps[-1:]
    mean = lambda f: float(np.mean([getattr(m, f) for m in ms]))  # noqa: E731
    return {"step": mean("step_s"), "rollout": mean("rollout_makespan_s"), "logprob": mean("forward_s"), "update": mean("update_s")}


def ratio_check() -> list[dict[str, object]]:
    """verl fully_async (Qwen2.5-Math-7B, H20, FSDP2): the training stage's GPU-seconds per
    sample, disaggregated (fully_async, 2048 samples per trainer step on N/2 GPUs) over
    colocated (8192 samples on N GPUs), published vs predicted. Lengths are unpublished and
    cancel in the ratio; 8K generated tokens are assumed for the prediction."""
    from cost_models.calibration.rl_steps import H20  # the datasheet H20 the overhead fit uses
    from cost_models.evaluator import CostEvaluator
    from cost_models.operators.roofline import RooflineOperators
    from cost_models.strategy import TrainStrategy

    model = str(MODELS / "qwen2.5-7b-instruct" / "config.json")
    ev = CostEvaluator(H20, model, ops=RooflineOperators(H20))
    seq = 8192 + 512
    pub = {32: (107.71 + 269.8, 313.81), 64: (70.26 + 133.41, 156.98), 128: (53.92 + 113.81, 113.16)}
    out = []
    for n, (coloc_s, async_s) in pub.items():
        def stage(gpus: int, samples: int) -> float:
            s = TrainStrategy(tp=1, pp=1, dp=gpus, zero_stage=3)
            tok = samples * seq
            return ev.forward_s(s, tok, seq) + ev.train_iter_s(s, tok, seq)
        pred_c = stage(n, 8192) * n / 8192
        pred_a = stage(n // 2, 2048) * (n // 2) / 2048
        published = (async_s * (n // 2) / 2048) / (coloc_s * n / 8192)
        out.append({"gpus": n, "published_ratio": published, "predicted_ratio": pred_a / pred_c})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "published_runs"))
    ap.add_argument("--rows", default="", help="comma-separated row ids (default: all)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(DATA / "rl_runs_published.csv", newline="") as f:
        rows = {int(r["row_id"]): r for r in csv.DictReader(f)}
    picked = [x for x in a.rows.split(",") if x]
    want = {int(x) for x in picked if x.isdigit()} or (set() if picked else set(rows))
    table: list[dict[str, object]] = []
    for rid in sorted(want):
        row = rows[rid]
        if rid not in REPLAYS:
            table.append({"row": rid, "system": row["system_measured"][:60], "stage": "-", "published_s": "", "predicted_s": "",
                          "error": "", "note": "not replayed: " + NOT_REPLAYED.get(rid, "no replay spec")})
            continue
        r = REPLAYS[rid]
        pred = replay_row(r)
        for stage, pub in r.published.items():
            table.append({"row": rid, "system": row["system_measured"][:60], "stage": stage, "published_s": pub,
                          "predicted_s": round(pred[stage], 2), "error": pred[stage] / pub - 1, "note": r.assumed})
        print(f"row {rid}: " + ", ".join(f"{s} {pred[s]:.1f} s (published {p:.1f})" for s, p in r.published.items()), flush=True)
    with open(DATA / "nemo_rl_performance.csv", newline="") as f:
        nemo_rows = {r["id"]: r for r in csv.DictReader(f)}
    for nid, r in NEMO.items():
        if picked and nid not in picked:
            continue
        row = nemo_rows[nid]
        pred = replay_row(r)
        system = f"NeMo RL {row['release']} {row['model']} {row['policy']} {row['n_gpus']} H100"
        table.append({"row": nid, "system": system, "stage": "step", "published_s": r.published["step"],
                      "predicted_s": round(pred["step"], 2), "error": pred["step"] / r.published["step"] - 1,
                      "note": r.assumed, "loop": "colocated sync" if r.colocated else f"{r.split[0]}:{r.split[1]} async K={r.max_staleness}",
                      "rollout_s": round(pred["rollout"], 1), "train_s": round(pred["logprob"] + pred["update"], 1)})
        print(f"{nid}: step {pred['step']:.1f} s (published {r.published['step']:.1f}); rollout {pred['rollout']:.1f}, "
              f"log-prob {pred['logprob']:.1f}, update {pred['update']:.1f}", flush=True)
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]) + ["loop", "rollout_s", "train_s"], restval="")
        w.writeheader()
        w.writerows(table)
    ratios = ratio_check()
    lines = ["# Published RL runs: predicted (SIMULATED) vs published", "",
             "`python experiments/published_runs.py`; rows from `experiments/data/published_runs/rl_runs_published.csv`.", "",
             "| row | system | stage | published s | predicted s | error | assumptions / why not replayed |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for t in table:
        err = f"{t['error']:+.0%}" if isinstance(t["error"], float) else ""
        lines.append(f"| {t['row']} | {t['system']} | {t['stage']} | {t['published_s']} | {t['predicted_s']} | {err} | {t['note']} |")
    errs = {s: [abs(t["error"]) for t in table if t["stage"] == s and isinstance(t["error"], float)] for s in ("step", "rollout", "logprob", "update")}
    lines += ["", "Mean absolute percentage error per stage (replayed rows):", ""]
    for s, e in errs.items():
        if e:
            lines.append(f"- {s}: {100 * np.mean(e):.0f}% over {len(e)} rows")
    lines += ["", "Within-source ratio (verl fully_async, Qwen2.5-Math-7B, H20, FSDP2): training GPU-seconds per sample, "
              "disaggregated / colocated:", "", "| GPUs | published | predicted |", "| ---: | ---: | ---: |"]
    for q in ratios:
        lines.append(f"| {q['gpus']} | {q['published_ratio']:.2f} | {q['predicted_ratio']:.2f} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
