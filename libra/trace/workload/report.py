"""Statistics of a trace beside the published figures its workload was calibrated to.

``trace_stats`` measures a trace (any trace: generated, converted or recorded), and
``stats_table`` puts those numbers beside the workload's ``TARGETS``. ``traces/README.md`` holds
generated tables between ``<!-- KIND:NAME -->`` markers (trace statistics, the parameter table,
the error-effect sweep); ``python -m libra.trace.workload.report traces/README.md`` rewrites them,
and a test fails if a trace or a default changes without its table.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from libra.errors import UserError
from libra.trace.columnar import StepArrays
from libra.trace.records import FINISHES, OUTCOMES
from libra.trace.workload.params import Target

#: Display names of the statistics, in table order.
LABELS: dict[str, str] = {
    "trajectories": "trajectories",
    "steps": "steps",
    "turns_p50": "turns per trajectory p50",
    "turns_p90": "turns per trajectory p90",
    "turns_p99": "turns per trajectory p99",
    "tool_calls_mean": "tool calls per trajectory (mean)",
    "gen_per_turn_p50": "generated tokens per turn p50",
    "gen_per_turn_p99": "generated tokens per turn p99",
    "gen_per_turn_p99_over_p50": "generated tokens per turn p99/p50",
    "tool_tokens_p50": "tool-return tokens per call p50",
    "tool_tokens_p99": "tool-return tokens per call p99",
    "final_len_p50": "final context length p50 (tokens)",
    "final_len_p99": "final context length p99 (tokens)",
    "final_len_p99_over_p50": "final context length p99/p50",
    "latency_p50_s": "tool latency p50 (s)",
    "latency_p90_s": "tool latency p90 (s)",
    "latency_p99_s": "tool latency p99 (s)",
    "latency_mean_s": "tool latency mean (s)",
    "latency_max_s": "tool latency max (s)",
    "error_rate": "tool calls with outcome error",
    "timeout_rate": "tool calls with outcome timeout",
    "finish_length": "trajectories ending on the context cap (length)",
    "finish_tool_limit": "trajectories ending on the step limit (tool_limit)",
    "remaining_after_error": "expected remaining turns after an error",
    "remaining_after_ok": "expected remaining turns after ok",
    "remaining_error_over_ok": "remaining turns after error / after ok",
    "stop_next_error_over_ok": "P(next turn is the last) after error / after ok",
    "next_gen_error_over_ok": "next generation after error / after ok (mean tokens)",
    "spearman_turns_len": "Spearman(turns, final length)",
    "final_len_failed_over_resolved": "final context length, failed / resolved (mean)",
    "reward_mean": "reward mean",
    "reward_first_step": "reward mean, first step",
    "reward_last_step": "reward mean, last step",
    "final_len_first_step": "final length mean, first step",
    "final_len_last_step": "final length mean, last step",
    "drift_gen_slope": "drift: generated tokens per trajectory, slope per step (relative)",
    "drift_turns_slope": "drift: turns per trajectory, slope per step (relative)",
}


def _q(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _rel_slope(steps: np.ndarray, means: np.ndarray) -> float:
    """Least-squares slope of ``means`` over ``steps``, relative to the fitted value at the first step."""
    if len(steps) < 2:
        return float("nan")
    slope, intercept = np.polyfit(steps.astype(float), means, 1)
    base = intercept + slope * steps[0]
    return float(slope / base) if base else float("nan")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def trace_stats(steps: Iterable[StepArrays]) -> dict[str, float]:
    """Measure a trace's steps: the statistics named in ``LABELS`` (NaN where undefined)."""
    sas = sorted(steps, key=lambda s: s.step)
    if not sas:
        raise UserError("trace has no trajectories to measure")
    ok, err, tmo = (OUTCOMES.index(o) for o in ("ok", "error", "timeout"))
    n_turns = np.concatenate([s.n_turns for s in sas])
    total = np.concatenate([s.total_tokens for s in sas])
    gen_traj = np.concatenate([s.total_gen_tokens for s in sas])
    gen = np.concatenate([s.gen_tokens for s in sas])
    ttok = np.concatenate([s.tool_tokens for s in sas])
    lat = np.concatenate([s.tool_latency_s for s in sas])
    tool = np.concatenate([s.tool_code for s in sas]) >= 0
    outcome = np.concatenate([s.outcome_code for s in sas])
    finish = np.concatenate([s.finish_code for s in sas])
    reward = np.concatenate([s.reward for s in sas])

    # per-turn position: k-th turn of its trajectory, and turns left after it
    offsets = np.zeros(len(n_turns) + 1, np.int64)
    np.cumsum(n_turns, out=offsets[1:])
    traj_of_turn = np.repeat(np.arange(len(n_turns)), n_turns)
    k = np.arange(len(gen)) - offsets[traj_of_turn]
    remaining = n_turns[traj_of_turn] - k - 1
    has_next = remaining > 0
    next_gen = np.where(has_next, np.r_[gen[1:], 0], 0)
    next_is_last = remaining == 1

    calls_lat = lat[tool & ~np.isnan(lat)]
    n_calls = int(tool.sum())
    is_err = outcome == err
    is_ok = outcome == ok
    rem_err = remaining[is_err].mean() if is_err.any() else float("nan")
    rem_ok = remaining[is_ok].mean() if is_ok.any() else float("nan")
    nxt_err = next_gen[is_err & has_next].mean() if (is_err & has_next).any() else float("nan")
    nxt_ok = next_gen[is_ok & has_next].mean() if (is_ok & has_next).any() else float("nan")
    stop_err = next_is_last[is_err & has_next].mean() if (is_err & has_next).any() else float("nan")
    stop_ok = next_is_last[is_ok & has_next].mean() if (is_ok & has_next).any() else float("nan")
    known = ~np.isnan(reward)
    resolved = known & (reward > 0)
    failed = known & (reward <= 0)
    len_res = total[resolved].mean() if resolved.any() else float("nan")
    len_fail = total[failed].mean() if failed.any() else float("nan")

    step_ids = np.array([s.step for s in sas])
    gen_means = np.array([s.total_gen_tokens.mean() for s in sas])
    turn_means = np.array([s.n_turns.mean() for s in sas])
    tool_calls = np.add.reduceat(tool.astype(np.int64), offsets[:-1])

    def step_reward(s: StepArrays) -> float:
        r = s.reward[~np.isnan(s.reward)]
        return float(r.mean()) if len(r) else float("nan")

    stats = {
        "trajectories": float(len(n_turns)),
        "steps": float(len(sas)),
        "turns_p50": _q(n_turns, 50),
        "turns_p90": _q(n_turns, 90),
        "turns_p99": _q(n_turns, 99),
        "tool_calls_mean": float(tool_calls.mean()),
        "gen_per_turn_p50": _q(gen, 50),
        "gen_per_turn_p99": _q(gen, 99),
        "tool_tokens_p50": _q(ttok[tool], 50),
        "tool_tokens_p99": _q(ttok[tool], 99),
        "final_len_p50": _q(total, 50),
        "final_len_p99": _q(total, 99),
        "latency_p50_s": _q(calls_lat, 50),
        "latency_p90_s": _q(calls_lat, 90),
        "latency_p99_s": _q(calls_lat, 99),
        "latency_mean_s": float(calls_lat.mean()) if len(calls_lat) else float("nan"),
        "latency_max_s": float(calls_lat.max()) if len(calls_lat) else float("nan"),
        "error_rate": float(is_err.sum() / n_calls) if n_calls else float("nan"),
        "timeout_rate": float((outcome == tmo).sum() / n_calls) if n_calls else float("nan"),
        "finish_length": float((finish == FINISHES.index("length")).mean()),
        "finish_tool_limit": float((finish == FINISHES.index("tool_limit")).mean()),
        "remaining_after_error": float(rem_err),
        "remaining_after_ok": float(rem_ok),
        "remaining_error_over_ok": _ratio(rem_err, rem_ok),
        "stop_next_error_over_ok": _ratio(stop_err, stop_ok),
        "next_gen_error_over_ok": _ratio(nxt_err, nxt_ok),
        "spearman_turns_len": _spearman(n_turns, total),
        "final_len_failed_over_resolved": _ratio(len_fail, len_res),
        "reward_mean": float(reward[known].mean()) if known.any() else float("nan"),
        "reward_first_step": step_reward(sas[0]),
        "reward_last_step": step_reward(sas[-1]),
        "final_len_first_step": float(sas[0].total_tokens.mean()),
        "final_len_last_step": float(sas[-1].total_tokens.mean()),
        "drift_gen_slope": _rel_slope(step_ids, gen_means),
        "drift_turns_slope": _rel_slope(step_ids, turn_means),
    }
    stats["gen_per_turn_p99_over_p50"] = _ratio(stats["gen_per_turn_p99"], stats["gen_per_turn_p50"])
    stats["final_len_p99_over_p50"] = _ratio(stats["final_len_p99"], stats["final_len_p50"])
    return {key: stats[key] for key in LABELS}


def targets_for(workload: str | None) -> tuple[Target, ...]:
    """The published figures a workload is calibrated to (none for unknown workloads)."""
    from libra.trace.workload import WORKLOAD_TARGETS

    return WORKLOAD_TARGETS.get(workload or "", ())


def table_from_stats(stats: dict[str, float], targets: Sequence[Target]) -> pd.DataFrame:
    """One row per statistic: generated value beside the published figure, its source and band."""
    by_stat = {t.stat: t for t in targets}
    rows = []
    for key, label in LABELS.items():
        t = by_stat.get(key)
        value = stats[key]
        rows.append({
            "key": key,
            "statistic": label,
            "generated": value,
            "published": t.published if t else "",
            "source": t.source if t else "",
            "band": t.band if t else "",
            "in_band": (t.holds(value) if t else None),
        })
    return pd.DataFrame(rows)


def stats_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a trace and tabulate its statistics beside its workload's published figures."""
    from libra.trace.reader import open_trace

    reader = open_trace(path)
    workload = reader.header.workload if reader.header else None
    return table_from_stats(trace_stats(reader.steps()), targets_for(workload))


def fmt(value: float) -> str:
    """A number as the README shows it: 3 significant digits, whole numbers from 1,000 up."""
    if value != value:
        return "n/a"
    if abs(value) >= 1000:
        return f"{round(value):,}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


def markdown_table(df: pd.DataFrame) -> str:
    """The table as Markdown (what ``traces/README.md`` shows between its stats markers)."""
    lines = ["| statistic | generated | published figure | source | band |", "| --- | --- | --- | --- | --- |"]
    for row in df.itertuples(index=False):
        lines.append(f"| {row.statistic} | {fmt(row.generated)} | {row.published} | {row.source} | {row.band} |")
    return "\n".join(lines)


#: README blocks this module renders: ``<!-- KIND:NAME -->`` ... ``<!-- /KIND:NAME -->``.
BLOCK_KINDS: tuple[str, ...] = ("files", "stats", "params", "effect")
_MARKER = re.compile(r"<!-- (?P<kind>files|stats|params|effect):(?P<name>[\w.-]+) -->\n(?:(?P<body>.*?)\n)?"
                     r"<!-- /(?P=kind):(?P=name) -->", re.S)
#: Error-effect strengths the README's sweep shows, and the trace shape it generates for each.
EFFECT_SWEEP: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
SWEEP_SHAPE: dict[str, int] = {"steps": 20, "batch": 512, "group_size": 8, "seed": 0}


def regen_command(path: str | os.PathLike[str]) -> str:
    """The ``libra-sim gen`` command that rewrites a generated trace, from its own header."""
    from libra.trace.reader import open_trace
    from libra.trace.workload import make_params

    reader = open_trace(path)
    h = reader.header
    meta = h.metadata if h else {}
    if not h or meta.get("generator") != "libra.trace.workload":
        raise UserError(f"{os.fspath(path)}: not written by libra-sim gen (no generator header)")
    defaults = make_params(h.workload or "").as_dict()
    parts = [f"libra-sim gen --workload {h.workload} --steps {meta['steps']} --batch {meta['batch']} "
             f"--group-size {meta['group_size']} --seed {meta['seed']}"]
    if meta.get("first_step"):
        parts.append(f"--first-step {meta['first_step']}")
    parts += [f"--param {k}={v}" for k, v in meta["params"].items() if defaults.get(k) != v]
    parts.append(f"--force -o {os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))), os.path.basename(path))}")
    return " ".join(parts)


def files_markdown(directory: str) -> str:
    """The table of bundled traces in ``directory`` and the command that regenerates each."""
    from libra.trace.reader import open_trace

    lines = ["| file | workload | model hint | steps x trajectories (prompts x samples) | turns | size |",
             "| --- | --- | --- | --- | --- | --- |"]
    commands = []
    for name in sorted(f for f in os.listdir(directory) if f.endswith(".jsonl.gz")):
        path = os.path.join(directory, name)
        reader = open_trace(path)
        summary = reader.validate()
        h = reader.header
        meta = h.metadata if h else {}
        shape = (f"{meta.get('steps')} x {meta.get('batch'):,} "
                 f"({meta.get('batch', 0) // max(1, meta.get('group_size', 1))} x {meta.get('group_size')})")
        lines.append(f"| `{name}` | {h.workload if h else ''} | {h.model if h else ''} | {shape} | "
                     f"{summary.n_turns:,} | {os.path.getsize(path) / 1e6:.2f} MB |")
        commands.append(regen_command(path))
    return "\n".join(lines + ["", "```sh", *commands, "```"])


def params_markdown() -> str:
    """Every parameter with each workload's default, its meaning and the default's source."""
    from libra.trace.workload import DOCS, WORKLOADS

    defaults = {name: cls() for name, cls in WORKLOADS.items()}
    sources = {name: cls.sources() for name, cls in WORKLOADS.items()}
    names = list(WORKLOADS)
    lines = [f"| parameter | {' | '.join(names)} | meaning | sources ({', '.join(names)}) |",
             "| --- " * (len(names) + 3) + "|"]
    for field_name in next(iter(WORKLOADS.values())).field_names():
        vals = " | ".join(f"{getattr(defaults[n], field_name):g}" for n in names)
        srcs = "; ".join(sources[n][field_name] for n in names)
        lines.append(f"| `{field_name}` | {vals} | {DOCS[field_name]} | {srcs} |")
    return "\n".join(lines)


def effect_sweep_markdown() -> str:
    """How the tool-error effect scales with ``error_effect``: the same seeded traces, only it varied.

    With ``error_effect = 0`` the contrast between after-error and after-ok is what the shared
    difficulty alone produces (errors and long trajectories both come from hard prompts); the
    rows above it show the causal part growing with the parameter.
    """
    from libra.trace.workload import WORKLOADS, generate_steps

    lines = ["| workload | error_effect | error rate | remaining turns after error | after ok | ratio | "
             "P(last next) error/ok | next gen error/ok | turns p50 | final length p50 |",
             "| --- " * 10 + "|"]
    sh = SWEEP_SHAPE
    for name in WORKLOADS:
        for e in EFFECT_SWEEP:
            st = trace_stats(generate_steps(name, sh["steps"], sh["batch"], sh["group_size"], sh["seed"], error_effect=e))
            cells = [name, f"{e:g}"] + [fmt(st[k]) for k in (
                "error_rate", "remaining_after_error", "remaining_after_ok", "remaining_error_over_ok",
                "stop_next_error_over_ok", "next_gen_error_over_ok", "turns_p50", "final_len_p50")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_block(kind: str, name: str, directory: str) -> str:
    """The body of one README block; ``stats`` blocks read ``directory/NAME.jsonl.gz``."""
    if kind == "files":
        return files_markdown(directory)
    if kind == "stats":
        return markdown_table(stats_table(os.path.join(directory, f"{name}.jsonl.gz")))
    if kind == "params":
        return params_markdown()
    if kind == "effect":
        return effect_sweep_markdown()
    raise UserError(f"unknown README block kind {kind!r}; known: {', '.join(BLOCK_KINDS)}")


def readme_blocks(readme_text: str) -> dict[tuple[str, str], str]:
    """The generated blocks a README holds, ``(kind, name) -> body``."""
    return {(m["kind"], m["name"]): m["body"] or "" for m in _MARKER.finditer(readme_text)}


def update_readme(readme_path: str | os.PathLike[str]) -> list[str]:
    """Rewrite every generated block of the README; returns ``KIND:NAME`` of each block done."""
    path = os.fspath(readme_path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    directory = os.path.dirname(os.path.abspath(path))
    done: list[str] = []

    def repl(m: re.Match[str]) -> str:
        kind, name = m["kind"], m["name"]
        done.append(f"{kind}:{name}")
        return f"<!-- {kind}:{name} -->\n{render_block(kind, name, directory)}\n<!-- /{kind}:{name} -->"

    new = _MARKER.sub(repl, text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m libra.trace.workload.report README`` rewrites its tables; ``... TRACE`` prints one."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m libra.trace.workload.report (traces/README.md | TRACE.jsonl.gz)", file=sys.stderr)
        return 2
    try:
        if args[0].endswith(".md"):
            print("updated:", ", ".join(update_readme(args[0])))
        else:
            print(markdown_table(stats_table(args[0])))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
