"""The one registry of policies (issue 11, "the shape that makes this stay fixed").

Every policy (Libra, its ablations, every baseline) is registered once in the core and built
from one options type; the runtime resolves names through the core only and refuses up front
the policies a real run cannot execute.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sim_support import make_step

from libra.cluster import ClusterSpec
from libra.errors import UserError
from libra.policies import (BASELINES, FUTURE, HINDSIGHT, OPTIONS, POLICIES, POLICY_NAMES, REGISTRY, PolicyOptions, check_backend,
                            min_staleness, resolve)
from sim.costs import load_costs
from sim.hindsight import SimReplayer

ROOT = Path(__file__).resolve().parents[1]
EVERY = ("verl-colocated", "verl-static-uniform", "areal-static-optimal", "libra", "libra-homogeneous", "libra-full", "libra-hetero",
         "libra-cmlfq", "no-migration", "reactive-mlfq", "length-predictor", "hindsight-routing")
CLUSTER = ClusterSpec(16, "a800", "qwen3-8b")


@pytest.fixture(scope="module")
def costs():  # type: ignore[no-untyped-def]
    return load_costs("a800", "qwen3-8b")


def test_one_registry_lists_every_policy_baselines_first() -> None:
    assert POLICY_NAMES == EVERY  # the order --compare lists them in
    assert tuple(POLICIES) == tuple(REGISTRY) == EVERY
    assert BASELINES == ("verl-colocated", "verl-static-uniform", "areal-static-optimal")
    assert {n for n, e in REGISTRY.items() if e.family == "libra"} == set(EVERY) - set(BASELINES)
    assert min_staleness("areal-static-optimal") == 1 and all(min_staleness(n) == 0 for n in EVERY if n != "areal-static-optimal")
    assert REGISTRY["hindsight-routing"].needs == {FUTURE} and REGISTRY["areal-static-optimal"].needs == {HINDSIGHT}
    assert all(not REGISTRY[n].needs for n in EVERY if n not in ("hindsight-routing", "areal-static-optimal"))
    with pytest.raises(UserError, match=r"unknown policy 'nope'; known: verl-colocated, .*hindsight-routing"):
        resolve("nope", CLUSTER)


def test_every_factory_takes_the_one_options_type_and_plans(costs) -> None:  # type: ignore[no-untyped-def]
    step = make_step(0, 32, seed=1)
    # a declared kind: one prior to plan from, not the hedge over every kind's (CI time, session 34)
    cluster = dataclasses.replace(CLUSTER, workload="math")
    opts = PolicyOptions(ev=costs.ev, max_staleness=1, hindsight=SimReplayer([step], cluster, costs))
    for name in EVERY:
        pol = resolve(name, cluster, opts)
        assert pol.name == name and pol.sees_future is (name == "hindsight-routing")
        plan = pol.plan(cluster, (), step.prompt_tokens)
        assert plan.n_train_gpus >= 1 and plan.instances
        # keywords are the same type's fields, applied on top
        assert POLICIES[name](cluster, opts, seed=3).name == name


@pytest.mark.parametrize("name", EVERY)
def test_unknown_options_are_refused_naming_the_known_ones(costs, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError, match=rf"policy {name}: unknown option\(s\) costs, trace_steps; known: ev, seed, .*hindsight"):
        resolve(name, CLUSTER, ev=costs.ev, costs=costs, trace_steps=[])  # the simulator's old vocabulary
    with pytest.raises(UserError, match="mode must be 'sync' or 'async'"):
        resolve(name, CLUSTER, ev=costs.ev, mode="bulk", max_staleness=1)


def test_options_are_one_frozen_type() -> None:
    o = PolicyOptions()
    assert OPTIONS == tuple(f.name for f in dataclasses.fields(PolicyOptions))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 1  # type: ignore[misc]
    # the class K: the simulator's SimConfig.staleness_class rule
    assert (o.staleness_class, PolicyOptions(mode="async").staleness_class, PolicyOptions(mode="async", staleness=2).staleness_class,
            PolicyOptions(max_staleness=3, mode="async").staleness_class) == (0, 1, 2, 3)


def test_a_backend_without_a_capability_refuses_before_any_work() -> None:
    check_backend("libra", (), "libra-run")
    check_backend("hindsight-routing", (FUTURE, HINDSIGHT), "libra-sim")
    with pytest.raises(UserError, match="libra-run cannot run policy 'hindsight-routing': hindsight-routing needs the step's true future"):
        check_backend("hindsight-routing", (), "libra-run")
    with pytest.raises(UserError, match="areal-static-optimal needs hindsight replay: .*run it in libra-sim"):
        check_backend("areal-static-optimal", (FUTURE,), "libra-run")
    with pytest.raises(UserError, match="needs hindsight replay"):  # the factory itself, without a replayer
        resolve("areal-static-optimal", CLUSTER, max_staleness=1)


def test_libra_run_refuses_oracle_and_hindsight_when_reading_its_config() -> None:
    """libra-run's config check (no Ray, no model): the refusal comes before the run starts."""
    from libra.runtime.config import load_config

    assert load_config(None, {"policy": "verl-static-uniform"}).policy == "verl-static-uniform"
    with pytest.raises(UserError, match="--policy: libra-run cannot run policy 'hindsight-routing'.*true future"):
        load_config(None, {"policy": "hindsight-routing"})
    with pytest.raises(UserError, match="--policy: libra-run cannot run policy 'areal-static-optimal'.*hindsight replay"):
        load_config(None, {"policy": "areal-static-optimal"})
    with pytest.raises(UserError, match="unknown policy 'nope'"):
        load_config(None, {"policy": "nope"})


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_runtime_and_the_core_import_no_simulator_module() -> None:
    """The backends never import each other: no module of libra/ (the runtime included) names
    ``sim``, even lazily, and importing the policy glue loads no ``sim`` module."""
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m == "sim" or m.startswith("sim."))
                 for p in (ROOT / "libra").rglob("*.py")}
    assert {p: m for p, m in offenders.items() if m} == {}
    code = ("import sys, libra.runtime.policyglue, libra.runtime.config, libra.policies; "
            "print(sorted(m for m in sys.modules if m == 'sim' or m.startswith('sim.') or m in ('simpy', 'torch', 'ray')))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert got == "[]"


def test_policyglue_builds_what_the_registry_builds(costs) -> None:  # type: ignore[no-untyped-def]
    from libra.runtime.policyglue import known_policies, make_policy

    assert known_policies() == list(EVERY)
    prompts = np.full(32, 700)
    for name in ("libra", "verl-static-uniform", "verl-colocated"):
        via_glue = make_policy(name, CLUSTER, costs.ev, 0, False).plan(CLUSTER, (), prompts)
        direct = resolve(name, CLUSTER, ev=costs.ev).plan(CLUSTER, (), prompts)
        assert repr(via_glue) == repr(direct)  # (a split plan's notes hold NaN, which no NaN equals)
    with pytest.raises(UserError, match="true future"):
        make_policy("hindsight-routing", CLUSTER, costs.ev, 0, False)
