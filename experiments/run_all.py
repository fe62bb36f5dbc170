"""Regenerate every result: run each experiment, then rebuild docs/results.md and the README's summary.

    .venv/bin/python experiments/run_all.py [--quick | --smoke] [--out experiments/results] [--jobs N]
        [--only NAME[,NAME...]] [--force] [--docs docs/results.md] [--readme README.md] [--no-docs]

Each experiment (``EXPERIMENTS``, one module in experiments/) writes CSV + PNG + ``summary.md`` and
``section.json`` under ``<out>/<name>/``. Two caches keep a rerun to what changed:

* per replay (``exp_common.replays``, and ``libra-sim sweep``'s own cache for the regime map):
  keyed on the replay's specification, the trace's bytes and the code key of ``cost_models``,
  ``libra`` and ``sim``; a planner change recomputes every replay, a plotting change none;
* per experiment (``stamp.json``): a hash of the experiment's source and the experiment modules
  it imports, ``exp_common``, its ``inputs(size)`` and the code key. A matching stamp (and the
  files it lists present) skips the experiment entirely.

Then ``docs/results.md`` is rebuilt from the sections (figures linked relative to docs/) and the
block between ``<!-- results-summary -->`` and ``<!-- /results-summary -->`` in README.md is
rewritten with the headline table (Libra vs each baseline per workload) and the regime map's
answer; nothing else of the README is touched (the markers are added once, before "## What is in
the box", if missing). ``--quick`` is sized to finish in under 10 minutes on 2 cores, ``--smoke``
in seconds (CI). Every number is SIMULATED and every page says so.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from exp_common import ROOT, SIMULATED_NOTE, Context, Section, atomic_write, code_key, digest, save_section, sha256_file  # noqa: E402

#: Every experiment, in the order docs/results.md shows them.
EXPERIMENTS: tuple[str, ...] = (
    "regime_map", "end_to_end", "waterfall", "cmlfq_ablation", "mechanisms", "workload_characterization", "kv_migration", "tp_efficiency",
    "planner_scaling", "fidelity", "join", "scale", "hardware",
)
BEGIN, END = "<!-- results-summary -->", "<!-- /results-summary -->"
README_ANCHOR = "## What is in the box"


def local_imports(path: Path) -> list[Path]:
    """The experiment modules ``path`` imports (transitively), itself included: what its stamp hashes."""
    seen: list[Path] = []
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen or not p.is_file():
            continue
        seen.append(p)
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for n in names:
                cand = p.parent / f"{n.split('.')[0]}.py"
                if cand.is_file():
                    todo.append(cand)
    return sorted(seen)


def stamp(mod: ModuleType, size: str, code: str) -> str:
    """What an experiment's result depends on, as one hash (see the module docstring)."""
    files = local_imports(Path(mod.__file__))  # type: ignore[arg-type]
    return digest({"size": size, "code": code, "inputs": mod.inputs(size),
                   "sources": {f.name: sha256_file(f) for f in files}})[:24]


def is_cached(folder: Path, want: str) -> bool:
    """Whether ``folder`` holds a result with stamp ``want`` and every file its section names."""
    try:
        st = json.loads((folder / "stamp.json").read_text())
        sec = json.loads((folder / "section.json").read_text())
    except (OSError, ValueError):
        return False
    files = [f["file"] for f in sec.get("figures", [])] + list(sec.get("csv", []))
    return st.get("stamp") == want and all((folder / f).is_file() for f in files)


def run_one(name: str, out: Path, size: str, jobs: int, force: bool, code: str) -> tuple[Section, bool, float]:
    """Run (or reuse) one experiment; returns its section, whether it was cached, and its wall s."""
    mod = importlib.import_module(name)
    ctx = Context(out, name, size, jobs)
    want = stamp(mod, size, code)
    t0 = time.perf_counter()
    if not force and is_cached(ctx.dir, want):
        sec = Section.from_json(json.loads((ctx.dir / "section.json").read_text()))
        return sec, True, time.perf_counter() - t0
    sec = mod.run(ctx)
    save_section(ctx, sec)
    atomic_write(ctx.dir / "stamp.json", json.dumps({"stamp": want, "size": size, "code_key": code}, indent=1))
    return sec, False, time.perf_counter() - t0


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def compose_results(sections: Sequence[Section], out: Path, docs: Path, meta: dict[str, Any]) -> str:
    """docs/results.md from the sections: figures linked relative to ``docs``'s folder."""
    n_fig = sum(len(s.figures) for s in sections)
    lines = [
        "# Results (SIMULATED)", "",
        "<!-- generated by experiments/run_all.py: do not edit by hand, rerun it -->", "",
        SIMULATED_NOTE, "",
        f"Regenerate with `python experiments/run_all.py{'' if meta['size'] == 'full' else ' --' + meta['size']}` "
        f"(this page: size `{meta['size']}`, commit `{meta['commit']}`{', with uncommitted changes' if meta['dirty'] else ''}, "
        f"code key `{meta['code_key']}`). {len(sections)} experiments, {n_fig} figures; each section's CSV is linked under it, "
        "and each experiment runs alone as `python experiments/<name>.py --size quick`.", "",
    ]
    lines += [f"{i + 1}. [{s.title}](#{_anchor(s.title)})" for i, s in enumerate(sections)] + [""]
    for s in sections:
        prefix = os.path.relpath(out / s.name, docs.parent).replace(os.sep, "/") + "/"
        lines += [s.markdown(prefix), ""]
    return "\n".join(lines).rstrip() + "\n"


def _anchor(title: str) -> str:
    """GitHub's heading anchor for ``title``."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def readme_block(sections: Sequence[Section], docs_link: str, size: str) -> str:
    """The README's results block: the link, the headline table and the regime map's answer."""
    by = {s.name: s for s in sections}
    out = [BEGIN, f"Every figure and table of the reproduction is in [{docs_link}]({docs_link}), regenerated by "
           f"`python experiments/run_all.py{'' if size == 'full' else ' --' + size}` (this block too; SIMULATED numbers, "
           f"size `{size}`)."]
    if "end_to_end" in by and by["end_to_end"].data.get("headline_table"):
        out += ["", "Libra against each baseline on the bundled traces, 48 A800 (SIMULATED; ratios of generated-token "
                "throughput, K = staleness class):", "", by["end_to_end"].data["headline_table"]]
        if by["end_to_end"].data.get("paper_gap"):
            out += ["", by["end_to_end"].data["paper_gap"] + f"\n- **Why**, and every other figure: [{docs_link}]({docs_link})."]
    if "regime_map" in by and by["regime_map"].data.get("answer"):
        out += ["", "**Regime map (SIMULATED).** " + by["regime_map"].data["answer"]]
    out.append(END)
    return "\n".join(out)


def update_readme(text: str, block: str) -> str:
    """``text`` with the marked block replaced by ``block`` (inserted before the README's
    "What is in the box" section, under a heading of its own, when the markers are missing)."""
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END)
        return text[:a] + block + text[b:]
    new = "## Results of the reproduction (SIMULATED)\n\n" + block + "\n\n"
    if README_ANCHOR in text:
        i = text.index(README_ANCHOR)
        return text[:i] + new + text[i:]
    return text.rstrip() + "\n\n" + new


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="reduced sizes: under 10 minutes on 2 cores")
    g.add_argument("--smoke", action="store_true", help="tiny sizes: seconds (CI); not results")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes for the replays")
    ap.add_argument("--only", default=None, help="comma list of experiments (docs still list every section found)")
    ap.add_argument("--force", action="store_true", help="ignore the per-experiment stamps (replay caches still apply)")
    ap.add_argument("--docs", default=str(ROOT / "docs" / "results.md"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--no-docs", action="store_true", help="write the results only, not docs/results.md or the README")
    a = ap.parse_args(argv)
    size = "smoke" if a.smoke else "quick" if a.quick else "full"
    out = Path(a.out).resolve()
    names = [n for n in (a.only.split(",") if a.only else EXPERIMENTS)]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        print(f"run_all: unknown experiment(s) {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    code = code_key()
    t_all = time.perf_counter()
    sections: dict[str, Section] = {}
    timing: dict[str, dict[str, Any]] = {}
    for n in names:
        print(f"run_all [{size}]: {n} ...", file=sys.stderr, flush=True)
        sec, cached, wall = run_one(n, out, size, a.jobs, a.force, code)
        sections[n] = sec
        timing[n] = {"cached": cached, "wall_s": round(wall, 1)}
        print(f"run_all [{size}]: {n} {'cached' if cached else 'done'} in {wall:.1f} s", file=sys.stderr, flush=True)
    for n in EXPERIMENTS:  # sections of earlier runs complete the page when --only ran a few
        if n not in sections and (out / n / "section.json").is_file():
            sections[n] = Section.from_json(json.loads((out / n / "section.json").read_text()))
    ordered = [sections[n] for n in EXPERIMENTS if n in sections]
    total = round(time.perf_counter() - t_all, 1)
    meta = {"size": size, "commit": _git("rev-parse", "--short", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "code_key": code, "wall_s": total, "experiments": timing}
    atomic_write(out / "run_all.json", json.dumps(meta, indent=1))
    if not a.no_docs:
        docs, readme = Path(a.docs).resolve(), Path(a.readme).resolve()
        atomic_write(docs, compose_results(ordered, out, docs, meta))
        link = os.path.relpath(docs, readme.parent).replace(os.sep, "/")
        text = readme.read_text() if readme.is_file() else ""
        atomic_write(readme, update_readme(text, readme_block(ordered, link, size)))
        print(f"run_all: wrote {docs} ({sum(len(s.figures) for s in ordered)} figures) and the results block of {readme}", file=sys.stderr)
    print(f"run_all [{size}]: {len(names)} experiments in {total} s ("
          + ", ".join(f"{n} {t['wall_s']} s{' cached' if t['cached'] else ''}" for n, t in timing.items()) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
