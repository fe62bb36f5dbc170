"""``libra-sim sweep``: grid validation, the configuration hash and cache, the summary's verdicts,
a tiny end-to-end sweep, the Ray path (with a stand-in ray module), and the CI-size grid."""

from __future__ import annotations

import csv
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from libra.errors import UserError
from sim.cli import main
from sim.sweep.cache import code_key, run_key, workload_key
from sim.sweep.grid import load_grid, parse_grid
from sim.sweep.run import Task, _result_record
from sim.sweep.staleness import class_config, runs_in_class
from sim.sweep.summary import classify, compare, totals

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "traces" / "swe-qwen3-14b.jsonl.gz")


def _grid(**over: Any) -> dict[str, Any]:
    """A tiny valid grid: 2 configurations (sync and async) x 2 policies."""
    g: dict[str, Any] = {
        "name": "tiny",
        "policies": ["libra", "verl-static-uniform"],
        "workloads": {"swe": {"generate": {"workload": "swe", "steps": 2, "batch": 16, "group_size": 8, "seed": 0,
                                           "max_context": 16384}}},
        "clusters": {"c8": {"gpus": 8, "gpu": "h100", "model": "qwen3-8b"}},
        "sweeps": [{"workloads": ["swe"], "clusters": ["c8"], "max_staleness": [0, 1]}],
    }
    g.update(over)
    return g


def _write(tmp_path: Path, doc: Any, name: str = "grid.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False) if not isinstance(doc, str) else doc)
    return str(p)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("mutate, keypath, rule", [
    (lambda g: g.update(polices=["libra"]), "polices", "unknown key"),
    (lambda g: g.update(policies=["libra", "verl-static-unifrom"]), "policies[1]", "unknown policy"),
    (lambda g: g.update(policies=["libra"]), "policies", "at least one baseline"),
    (lambda g: g["clusters"]["c8"].update(gpus=0), "clusters.c8.gpus", "integer in [1,"),
    (lambda g: g["clusters"]["c8"].update(gpu="h900"), "clusters.c8.gpu", "unknown GPU"),
    (lambda g: g["clusters"]["c8"].update(model="qwen9"), "clusters.c8.model", "not a catalog model"),
    (lambda g: g["clusters"]["c8"].update(engine="vllm-1999"), "clusters.c8.engine", "unknown engine profile"),
    (lambda g: g["clusters"]["c8"].pop("model"), "clusters.c8.model", "is required"),
    (lambda g: g["workloads"]["swe"]["generate"].update(batch=12), "workloads.swe.generate", "multiple of group_size"),
    (lambda g: g["workloads"]["swe"]["generate"].update(workload="chess"), "workloads.swe.generate.workload", "must be one of"),
    (lambda g: g["workloads"]["swe"]["generate"].update(drfit=0.1), "workloads.swe.generate.drfit", "unknown key"),
    (lambda g: g["workloads"]["swe"]["generate"].update(max_context=100), "workloads.swe.generate.max_context", "must exceed"),
    (lambda g: g["workloads"].update(t={"trace": "nope.jsonl.gz"}), "workloads.t.trace", "no such file"),
    (lambda g: g["workloads"].update(t={"trace": TRACE, "steps": "5:2"}), "workloads.t.steps", "greater than A"),
    (lambda g: g["workloads"].update(t={"generate": {}, "trace": TRACE}), "workloads.t", "exactly one of"),
    (lambda g: g["sweeps"][0].update(max_staleness=[-1]), "sweeps[0].max_staleness[0]", "integer >= 0"),
    (lambda g: g["sweeps"][0].update(clusters=["c9"]), "sweeps[0].clusters[0]", "unknown cluster"),
    (lambda g: g["sweeps"][0].update(policies=["verl-static-uniform"]), "sweeps[0].policies", "must include the subject"),
    (lambda g: g.update(replay={"noise": 2}), "replay.noise", "in [0, 1]"),
    (lambda g: g.update(replay={"streaming": "yes"}), "replay.streaming", "true, false or null"),
    (lambda g: g.update(sweeps=[]), "sweeps", "non-empty list"),
])
def test_grid_errors_name_file_keypath_and_rule(tmp_path: Path, mutate: Any, keypath: str, rule: str) -> None:
    g = _grid()
    mutate(g)
    path = _write(tmp_path, g)
    with pytest.raises(UserError) as ei:
        load_grid(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: {keypath}: "), msg
    assert rule in msg and "\n" not in msg


def test_grid_error_is_one_line_exit_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = _grid()
    g["clusters"]["c8"]["gpu"] = "h900"
    out = tmp_path / "out"
    assert main(["sweep", _write(tmp_path, g), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "clusters.c8.gpu: unknown GPU 'h900'" in err[0]
    assert not (out / "cache").exists() and not (out / "traces").exists()  # nothing ran
    assert main(["sweep", _write(tmp_path, "a: [1,", "bad.yaml"), "--out", str(out)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_expansion_and_staleness_classes(tmp_path: Path) -> None:
    g = _grid(policies=["libra", "verl-colocated", "verl-static-uniform"])
    grid = parse_grid(g, "mem.yaml")
    assert [c.id for c in grid.configurations] == ["swe/c8/K0/s0", "swe/c8/K1/s0"]
    sync, asyn = grid.configurations
    assert sync.policies == ("libra", "verl-colocated", "verl-static-uniform")
    assert asyn.policies == ("libra", "verl-colocated", "verl-static-uniform")  # a sync policy runs in every class
    assert runs_in_class("verl-colocated", 1) and runs_in_class("verl-colocated", 0)  # sync runs in every class
    assert not runs_in_class("areal-static-optimal", 0) and runs_in_class("areal-static-optimal", 1)  # async by design
    from sim.loop import SimConfig

    assert class_config(SimConfig(), 0).staleness_class == 0 and class_config(SimConfig(), 0).mode is None
    assert class_config(SimConfig(), 2).staleness_class == 2 and class_config(SimConfig(mode="async"), 2).mode is None


def test_streaming_is_each_policys_choice_unless_the_grid_pins_it(tmp_path: Path) -> None:
    # a grid that says nothing of streaming must not pin it: the old default (False) handed every
    # policy --no-streaming, so Libra's planner could never pick its streamed sync loop in a sweep
    # (search-bundled/h100-32-14b/K0: 63.9 s/step pinned vs 50.5 s its own choice, SIMULATED)
    assert parse_grid(_grid(), "mem.yaml").configurations[0].replay.streaming is None
    pinned = parse_grid(_grid(replay={"streaming": False}), "mem.yaml").configurations[0]
    assert pinned.replay.streaming is False


# ---------------------------------------------------------------- hashing
def test_run_key_covers_what_changes_a_result_and_nothing_else(tmp_path: Path) -> None:
    code = code_key()
    base = parse_grid(_grid(), "a.yaml").configurations[0]
    k = run_key(base, "libra", code)
    assert k == run_key(parse_grid(_grid(), "elsewhere/b.yaml").configurations[0], "libra", code)  # deterministic
    renamed = _grid(clusters={"other-name": {"gpus": 8, "gpu": "h100", "model": "qwen3-8b"}})
    renamed["sweeps"][0]["clusters"] = ["other-name"]
    assert run_key(parse_grid(renamed, "a.yaml").configurations[0], "libra", code) == k  # names do not enter
    assert run_key(base, "verl-static-uniform", code) != k
    assert run_key(base, "libra", "another-code-key") != k
    changed = []
    for mutate in (lambda g: g["clusters"]["c8"].update(gpus=16), lambda g: g["clusters"]["c8"].update(gpu="h200"),
                   lambda g: g["clusters"]["c8"].update(engine="trtllm-2024"), lambda g: g["sweeps"][0].update(seeds=[1]),
                   lambda g: g["workloads"]["swe"]["generate"].update(seed=3),
                   lambda g: g["workloads"]["swe"]["generate"].update(drift=0.2), lambda g: g.update(replay={"noise": 0.0})):
        g = _grid()
        mutate(g)
        changed.append(run_key(parse_grid(g, "a.yaml").configurations[0], "libra", code))
    assert k not in changed and len(set(changed)) == len(changed)
    assert run_key(parse_grid(_grid(), "a.yaml").configurations[1], "libra", code) != k  # the K=1 configuration


def test_trace_key_is_the_file_bytes(tmp_path: Path) -> None:
    from sim.sweep.grid import TraceWorkload

    a = tmp_path / "a.jsonl.gz"
    b = tmp_path / "b.jsonl.gz"
    a.write_bytes(Path(TRACE).read_bytes())
    b.write_bytes(Path(TRACE).read_bytes())
    assert workload_key(TraceWorkload(str(a))) == workload_key(TraceWorkload(str(b)))
    assert workload_key(TraceWorkload(str(a), "0:2")) != workload_key(TraceWorkload(str(a)))


def test_code_key_follows_sources_and_data(tmp_path: Path) -> None:
    for pkg in ("cost_models", "libra", "sim"):
        (tmp_path / pkg / "data").mkdir(parents=True)
        (tmp_path / pkg / "x.py").write_text("A = 1\n")
    (tmp_path / "sim" / "sweep").mkdir()
    k0 = code_key(str(tmp_path))
    (tmp_path / "sim" / "sweep" / "summary.py").write_text("# the summary's format is not a result\n")
    (tmp_path / "libra" / "notes.txt").write_text("not code\n")
    assert code_key.__wrapped__(str(tmp_path)) == k0
    (tmp_path / "cost_models" / "data" / "engine.json").write_text("{}")
    k1 = code_key.__wrapped__(str(tmp_path))
    (tmp_path / "libra" / "x.py").write_text("A = 2\n")
    k2 = code_key.__wrapped__(str(tmp_path))
    assert len({k0, k1, k2}) == 3


# ---------------------------------------------------------------- summary
def _rec(tok: float | None, status: str = "ok") -> dict[str, Any]:
    return {"status": status, "throughput_tok_s": tok, "mean_step_s": 1.0, "error": None if status == "ok" else "Boom: x"}


def test_classification_on_synthetic_rows() -> None:
    assert classify(1.031) == "win" and classify(1.03) == "tie" and classify(0.97) == "tie" and classify(0.969) == "loss"
    base = ("verl-colocated", "verl-static-uniform", "areal-static-optimal")
    c = compare("a", 0, {"libra": _rec(110), "verl-colocated": _rec(100), "verl-static-uniform": _rec(90)}, "libra", base)
    assert (c.outcome, c.best_baseline, round(c.ratio, 3)) == ("win", "verl-colocated", 1.1)
    c = compare("b", 1, {"libra": _rec(98), "areal-static-optimal": _rec(100), "verl-static-uniform": _rec(50)}, "libra", base)
    assert (c.outcome, c.best_baseline) == ("tie", "areal-static-optimal")
    # the best baseline failed: the comparison is with the best that ran, and the failure is named
    c = compare("c", 0, {"libra": _rec(80), "verl-colocated": _rec(None, "failed"), "verl-static-uniform": _rec(100)}, "libra", base)
    assert (c.outcome, c.best_baseline, c.failed) == ("loss", "verl-static-uniform", ["verl-colocated"])
    # an ablation in the grid is not a baseline
    c = compare("d", 0, {"libra": _rec(100), "libra-cmlfq": _rec(500), "verl-static-uniform": _rec(100)}, "libra", base)
    assert c.outcome == "tie" and c.best_baseline == "verl-static-uniform"
    sf = compare("e", 0, {"libra": _rec(None, "failed"), "verl-static-uniform": _rec(100)}, "libra", base)
    nb = compare("f", 1, {"libra": _rec(100), "verl-static-uniform": _rec(None, "failed")}, "libra", base)
    assert (sf.outcome, sf.ratio, nb.outcome, nb.ratio) == ("subject-failed", None, "no-baseline", None)
    comps = [compare("a", 0, {"libra": _rec(110), "verl-colocated": _rec(100)}, "libra", base),
             compare("b", 1, {"libra": _rec(90), "areal-static-optimal": _rec(100)}, "libra", base), sf, nb]
    t = totals(comps, [_rec(1), _rec(None, "failed"), _rec(None, "failed")])
    assert t.outcomes == {"win": 1, "tie": 0, "loss": 1, "subject-failed": 1, "no-baseline": 1}
    assert t.by_class["K=0"]["win"] == 1 and t.by_class["K=1"]["loss"] == 1
    assert (round(t.worst_ratio, 3), t.worst_config, t.failed_runs, t.runs) == (0.9, "b", 2, 3)


def test_a_run_that_lost_trajectories_is_failed() -> None:
    from sim.metrics import RunResult

    step = types.SimpleNamespace(step=0, n_traj=16, completed=15, rollout_makespan_s=1.0, train_s=1.0, step_s=2.0,
                                 gen_tokens=100, trained_tokens=100, n_rollout_gpus=4, n_train_gpus=4)
    res = RunResult(policy="libra", mode="sync", steps=[step], wall_s=2.0)  # type: ignore[list-item]
    cfg = parse_grid(_grid(), "a.yaml").configurations[0]
    rec = _result_record(Task(cfg, (("libra", "h"),), TRACE, None, "k"), "libra", "h", res, 0.1)
    assert rec["status"] == "failed" and not rec["all_completed"] and rec["error"].startswith("IncompleteRun")
    step.completed = 16
    res.max_staleness = 1  # the replay says it ran another class than its configuration's (K=0)
    rec = _result_record(Task(cfg, (("libra", "h"),), TRACE, None, "k"), "libra", "h", res, 0.1)
    assert rec["status"] == "failed" and rec["all_completed"] and rec["error"].startswith("WrongStalenessClass")


# ---------------------------------------------------------------- end to end
def _results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def test_tiny_sweep_end_to_end_and_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    path = _write(tmp_path, _grid())
    assert main(["sweep", path, "--out", str(out), "--jobs", "1"]) == 0
    doc = _results(out)
    assert doc["simulated"] is True and doc["computed_runs"] == 4 and doc["cached_runs"] == 0
    assert [c["config"] for c in doc["configurations"]] == ["swe/c8/K0/s0", "swe/c8/K1/s0"]
    for c in doc["configurations"]:
        assert set(c["runs"]) == {"libra", "verl-static-uniform"}
        for r in c["runs"].values():
            assert r["status"] == "ok" and r["all_completed"] and r["completed"] == r["expected"] == 32
        assert c["comparison"]["outcome"] in ("win", "tie", "loss") and c["comparison"]["best_baseline"] == "verl-static-uniform"
    # every run reports the class of its configuration; in K=0 nothing may run async (each policy
    # picks its own loop within the class, so K=1 may be either)
    for c in doc["configurations"]:
        for r in c["runs"].values():
            assert r["max_staleness"] == c["max_staleness"] and (c["max_staleness"] > 0 or "async" not in r["mode"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and {r["policy"] for r in rows} == {"libra", "verl-static-uniform"}
    # every run names its split; Libra's, which may change per step, as the splits it ran
    assert all(r["split"] for r in rows), [(r["policy"], r["split"]) for r in rows]
    md = (out / "summary.md").read_text()
    assert "SIMULATED" in md and "swe/c8/K1/s0" in md
    assert len(list((out / "cache").glob("*.json"))) == 4 and len(list((out / "traces").glob("swe-*.jsonl.gz"))) == 1
    first = {(c["config"], p): r["throughput_tok_s"] for c in doc["configurations"] for p, r in c["runs"].items()}

    # a rerun computes nothing and reports the same numbers
    assert main(["sweep", path, "--out", str(out), "--jobs", "1"]) == 0
    doc = _results(out)
    assert doc["computed_runs"] == 0 and doc["cached_runs"] == 4
    assert {(c["config"], p): r["throughput_tok_s"] for c in doc["configurations"] for p, r in c["runs"].items()} == first

    # a changed axis (a second seed) computes only the new configurations' runs
    g = _grid()
    g["sweeps"][0]["seeds"] = [0, 1]
    assert main(["sweep", _write(tmp_path, g), "--out", str(out), "--jobs", "2"]) == 0
    doc = _results(out)
    assert doc["computed_runs"] == 4 and doc["cached_runs"] == 4 and len(doc["configurations"]) == 4
    assert len(list((out / "traces").glob("*.jsonl.gz"))) == 1  # the workload did not change: generated once
    capsys.readouterr()
    assert main(["sweep", _write(tmp_path, g), "--out", str(out), "--dry-run"]) == 0
    assert "8 cached, 0 to compute" in capsys.readouterr().err


def test_a_failing_policy_is_reported_not_a_crash(tmp_path: Path) -> None:
    # qwen3-32b with 65k contexts on one 8-GPU node: the static baselines find no plan that fits
    g = _grid(policies=["libra", "verl-static-uniform"])
    g["clusters"]["c8"] = {"gpus": 1, "gpu": "a800", "model": "qwen3-32b"}
    g["sweeps"][0]["max_staleness"] = [0]
    out = tmp_path / "out"
    rc = main(["sweep", _write(tmp_path, g), "--out", str(out), "--jobs", "1", "--quiet"])
    doc = _results(out)
    runs = doc["configurations"][0]["runs"]
    failed = {p: r["error"] for p, r in runs.items() if r["status"] != "ok"}
    assert failed and rc == 1 and all(e for e in failed.values())
    md = (out / "summary.md").read_text()
    assert all(f"{p}: " in md for p in failed)


# ---------------------------------------------------------------- ray
def test_ray_missing_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    out = tmp_path / "out"
    assert main(["sweep", _write(tmp_path, _grid()), "--out", str(out), "--ray", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install the [run] extra" in err[0]
    assert not (out / "traces").exists()


class _Ref:
    """An object reference: hashable by identity, like ray's."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _FakeRay(types.ModuleType):
    """Just enough of ray's API to drive ``execute_ray`` in-process (the real one is the [run] extra)."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.inits: list[str] = []
        self.puts = 0
        self.options: list[dict[str, Any]] = []

    def init(self, address: str, **kw: Any) -> None:
        self.inits.append(address)

    def put(self, obj: Any) -> Any:
        self.puts += 1
        return _Ref(obj)

    def remote(self, **opts: Any) -> Any:
        self.options.append(opts)

        def deco(fn: Any) -> Any:
            return types.SimpleNamespace(remote=lambda task, ref: _Ref(fn(task, ref.value)))
        return deco

    def wait(self, refs: list[Any], num_returns: int = 1) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: Any) -> Any:
        return ref.value


def test_ray_path_runs_each_configuration_as_a_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    out = tmp_path / "out"
    assert main(["sweep", _write(tmp_path, _grid()), "--out", str(out), "--ray", "ray://head:10001", "--quiet"]) == 0
    assert fake.inits == ["ray://head:10001"] and fake.options == [{"num_cpus": 1}] and fake.puts == 1
    doc = _results(out)
    assert doc["executor"] == "ray ray://head:10001" and doc["computed_runs"] == 4
    assert all(r["status"] == "ok" for c in doc["configurations"] for r in c["runs"].values())


# ---------------------------------------------------------------- the CI-size grid
def test_ci_small_grid(tmp_path: Path) -> None:
    """experiments/grids/ci_small.yaml end to end (the reduced never_loses grid): every policy
    runs every configuration of its class and completes every trajectory once."""
    out = tmp_path / "ci"
    rc = main(["sweep", str(ROOT / "experiments" / "grids" / "ci_small.yaml"), "--out", str(out), "--jobs",
               str(min(2, os.cpu_count() or 1)), "--quiet"])
    doc = _results(out)
    fails = [f"{c['config']} {p}: {r['error']}" for c in doc["configurations"] for p, r in c["runs"].items() if r["status"] != "ok"]
    assert rc == 0 and not fails, fails
    assert len(doc["configurations"]) >= 4 and {c["max_staleness"] for c in doc["configurations"]} == {0, 1}
    assert sum(doc["totals"]["outcomes"].values()) == len(doc["configurations"])


def test_never_loses_grid_is_valid_and_big_enough() -> None:
    grid = load_grid(str(ROOT / "experiments" / "grids" / "never_loses.yaml"))
    cs = grid.configurations
    assert len(cs) >= 40
    assert {c.max_staleness for c in cs} == {0, 1}
    assert {c.cluster.gpu for c in cs} >= {"a800", "h100"} and {c.cluster.model for c in cs} >= {"qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-30b-a3b"}
    gpus = [c.cluster.gpus for c in cs]
    assert min(gpus) == 16 and max(gpus) == 128
    from sim.sweep.grid import GeneratedWorkload, TraceWorkload

    kinds = {c.workload.source.kind for c in cs if isinstance(c.workload.source, GeneratedWorkload)}
    traces = {os.path.basename(c.workload.source.path) for c in cs if isinstance(c.workload.source, TraceWorkload)}
    assert kinds == {"swe", "search", "math"} and len(traces) == 3
