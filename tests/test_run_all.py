"""experiments/run_all.py's caching and markdown on tiny inputs (no replay runs: fast)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

EXP = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXP))

import exp_common as ec  # noqa: E402
import run_all  # noqa: E402

FAKE = '''
import json
from pathlib import Path
from exp_common import Figure, Section, finish_figure, pyplot
import {helper}
NAME = "{name}"
def inputs(size):
    return {{"size": size, "value": {value}}}
def run(ctx):
    calls = ctx.out / "calls.txt"
    calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    ax.set_ylabel("y (SIMULATED)")
    finish_figure(fig, ctx.dir / "f.png", "SIMULATED fake")
    return Section(NAME, "Fake experiment", "intro", [Figure("f.png", "SIMULATED fake", "what it means")], "body", {{}}, [])
'''


def _fake(tmp_path: Path, name: str, value: int, helper_body: str = "X = 1\n") -> Any:
    d = tmp_path / "mods"
    d.mkdir(exist_ok=True)
    (d / f"{name}_helper.py").write_text(helper_body)
    (d / f"{name}.py").write_text(FAKE.format(name=name, value=value, helper=f"{name}_helper"))
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    for m in (name, f"{name}_helper"):
        sys.modules.pop(m, None)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def test_an_experiment_reruns_only_when_what_it_depends_on_changes(tmp_path: Path) -> None:
    """Stamp hit: not run again; its inputs, its source, a module it imports or the code key
    changed: run again; a deleted figure: run again."""
    out = tmp_path / "out"
    _fake(tmp_path, "fake_exp_a", 1)
    calls = out / "calls.txt"
    sec, cached, _ = run_all.run_one("fake_exp_a", out, "smoke", 1, False, "code1")
    assert not cached and calls.read_text() == "x" and (out / "fake_exp_a" / "f.png").is_file()
    sec2, cached, _ = run_all.run_one("fake_exp_a", out, "smoke", 1, False, "code1")
    assert cached and calls.read_text() == "x" and sec2.figures[0].file == "f.png"
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code1")[1] is False  # another size
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code2")[1] is False  # the simulator changed
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code2")[1] is True
    _fake(tmp_path, "fake_exp_a", 2)  # its inputs changed
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code2")[1] is False
    _fake(tmp_path, "fake_exp_a", 2, helper_body="X = 2\n")  # a module it imports changed
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code2")[1] is False
    (out / "fake_exp_a" / "f.png").unlink()
    assert run_all.run_one("fake_exp_a", out, "quick", 1, False, "code2")[1] is False
    assert run_all.run_one("fake_exp_a", out, "quick", 1, True, "code2")[1] is False  # --force
    assert calls.read_text() == "x" * 7


def test_replays_are_cached_per_spec_and_code_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay is computed once per (spec, trace bytes, code key); a new spec computes only itself."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    done: list[str] = []

    def fake_group(items: Any) -> list[tuple[str, dict[str, Any]]]:
        done.extend(s.policy for _, s in items)
        return [(k, {"status": "ok", "throughput_tok_s": 1.0, "host_s": 0.0, "policy": s.policy}) for k, s in items]

    monkeypatch.setattr(ec, "run_group", fake_group)
    monkeypatch.setattr(ec, "code_key", lambda: "k1")
    ctx = ec.Context(tmp_path / "out", "x", "smoke", 1)
    a = ec.ReplaySpec(str(trace), "0:1", 8, "h100", "qwen3-8b", "libra")
    b = ec.ReplaySpec(str(trace), "0:1", 8, "h100", "qwen3-8b", "verl-colocated")
    r = ec.replays(ctx, [a, b], progress=False)
    assert [x["policy"] for x in r] == ["libra", "verl-colocated"] and done == ["libra", "verl-colocated"]
    c = ec.ReplaySpec(str(trace), "0:1", 8, "h100", "qwen3-8b", "libra", opts=(("join", "sync"),))
    r = ec.replays(ctx, [a, b, c], progress=False)
    assert done == ["libra", "verl-colocated", "libra"] and [x["cached"] for x in r] == [True, True, False]
    trace.write_text("{}\n{}\n")  # the trace's bytes changed
    from sim.sweep.cache import file_sha256

    file_sha256.cache_clear()  # the per-process memo of trace hashes (a new process would read the new bytes)
    ec.replays(ctx, [a], progress=False)
    assert len(done) == 4
    monkeypatch.setattr(ec, "code_key", lambda: "k2")  # the simulator or planner changed
    ec.replays(ctx, [a], progress=False)
    assert len(done) == 5


def test_results_page_links_figures_relative_to_docs_and_says_simulated(tmp_path: Path) -> None:
    out, docs = tmp_path / "experiments" / "results", tmp_path / "docs" / "results.md"
    secs = [ec.Section("a", "Alpha", "intro a", [ec.Figure("p.png", "SIMULATED p", "cap")], "body a", {}, ["a.csv"]),
            ec.Section("b", "Beta", "intro b", [], "", {}, [])]
    meta = {"size": "quick", "commit": "abc", "dirty": False, "code_key": "k"}
    text = run_all.compose_results(secs, out, docs, meta)
    assert "](../experiments/results/a/p.png)" in text and "](../experiments/results/a/a.csv)" in text
    assert text.count(ec.SIMULATED_NOTE) == 3 and "run_all.py --quick" in text and "1 figures" in text
    assert "[Alpha](#alpha)" in text and text.index("## Alpha") < text.index("## Beta")


def test_readme_block_is_inserted_once_and_only_it_is_rewritten() -> None:
    readme = "# T\n\nintro\n\n## What is in the box\n\ntable\n"
    secs = [ec.Section("end_to_end", "E", "i", data={"headline_table": "| h |\n| --- |\n| 1 |", "paper_gap": "- gap"}),
            ec.Section("regime_map", "R", "i", data={"answer": "It depends."})]
    block = run_all.readme_block(secs, "docs/results.md", "quick")
    once = run_all.update_readme(readme, block)
    assert once.startswith("# T\n\nintro\n\n## Results of the reproduction (SIMULATED)") and once.endswith("## What is in the box\n\ntable\n")
    assert "It depends." in once and "| 1 |" in once and "[docs/results.md](docs/results.md)" in once
    block2 = run_all.readme_block(secs[:1], "docs/results.md", "full")
    twice = run_all.update_readme(once, block2)
    assert twice.count(run_all.BEGIN) == 1 and "It depends." not in twice
    assert twice.replace(block2, "") == once.replace(block, "")


def test_figures_must_say_simulated(tmp_path: Path) -> None:
    plt = ec.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    with pytest.raises(ValueError, match="SIMULATED"):
        ec.finish_figure(fig, tmp_path / "a.png", "throughput")
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    ax.set_ylabel("tok/s")
    with pytest.raises(ValueError, match="y axis"):
        ec.finish_figure(fig, tmp_path / "b.png", "SIMULATED throughput")


def test_regime_text_names_what_the_winning_cells_share() -> None:
    """From the rows, not from hand-written words: the cells where a mechanism gains share an axis value."""
    import regime_map as rm

    base = {a: "x" for a in rm.AXES}
    rows = []
    for i, (kind, gain) in enumerate([("math", 1.10), ("math", 1.08), ("swe", 1.0), ("swe", 0.99), ("search", 1.01)]):
        r = dict(base, kind=kind, config=f"c{i}/h/K0/s0")
        r.update({m: 1.0 for m in rm.METRICS}, hetero=gain)
        rows.append(r)
    text = rm.describe(rows, "hetero")
    assert text.startswith("2 of 5 cells, all of them with kind=math") and "best 1.10x at c0/h/K0" in text
    assert rm.describe(rows, "hetero", above=False) == "0 of 5 cells"
    assert "No mechanism paid (> 3%) in 3 of 5 cells" in rm.answer(rows)


def test_every_experiment_module_has_the_run_all_interface() -> None:
    """Each listed experiment imports, names itself, and declares its inputs at every size."""
    for name in run_all.EXPERIMENTS:
        mod = importlib.import_module(name)
        assert mod.NAME == name and callable(mod.run)
        for size in ec.SIZES:
            json.dumps(mod.inputs(size), default=str)
