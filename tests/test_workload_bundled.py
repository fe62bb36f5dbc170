"""The bundled traces: valid, small, made by the documented commands, and described truthfully.

traces/README.md holds generated blocks (file table with regeneration commands, parameter table,
per-trace statistics, error-effect sweep); these tests fail when a trace or a default changes and
the README was not regenerated (``python -m libra.trace.workload.report traces/README.md``).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from sim.cli import main

from libra.trace.reader import open_trace
from libra.trace.workload import GENERATOR_VERSION, WORKLOAD_TARGETS, make_params
from libra.trace.workload.report import (markdown_table, readme_blocks, regen_command, render_block,
                                         table_from_stats, targets_for, trace_stats)

TRACES = Path(__file__).resolve().parent.parent / "traces"
BUNDLED = {"swe-qwen3-14b": "swe", "search-r1": "search", "math-tool": "math"}


@pytest.fixture(scope="module")
def readme() -> dict[tuple[str, str], str]:
    return readme_blocks((TRACES / "README.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def opened() -> dict[str, tuple]:
    """Each bundled trace read once: its reader, validation summary and statistics table."""
    out = {}
    for name in BUNDLED:
        reader = open_trace(TRACES / f"{name}.jsonl.gz")
        summary = reader.validate()
        df = table_from_stats(trace_stats(reader.steps()), targets_for(reader.header.workload))
        out[name] = (reader, summary, df)
    return out


@pytest.mark.parametrize(("name", "workload"), sorted(BUNDLED.items()))
def test_bundled_trace_is_valid_small_and_at_defaults(opened, name, workload):
    path = TRACES / f"{name}.jsonl.gz"
    assert path.stat().st_size < 5_000_000
    reader, summary, _ = opened[name]
    assert not summary.skipped and summary.sorted
    h = reader.header
    assert h.workload == workload and h.model
    assert h.metadata["generator_version"] == GENERATOR_VERSION
    # the README's tables describe the defaults, so the bundled traces must use them
    assert h.metadata["params"] == make_params(workload).as_dict()
    counts = reader.step_counts()
    assert set(counts.values()) == {h.metadata["batch"]} and len(counts) == h.metadata["steps"]
    if workload == "swe":
        assert len(counts) >= 20 and h.metadata["batch"] >= 512 and h.model == "Qwen3-14B"


@pytest.mark.parametrize(("name", "workload"), sorted(BUNDLED.items()))
def test_bundled_trace_statistics_match_readme_and_bands(readme, opened, name, workload):
    df = opened[name][2]
    bad = df[df["in_band"] == False]  # noqa: E712 - None means no band
    assert bad.empty, bad[["key", "generated", "band"]].to_string()
    assert len(df[df["in_band"] == True]) == len(WORKLOAD_TARGETS[workload])  # noqa: E712
    assert readme[("stats", name)] == markdown_table(df), \
        "traces/README.md is stale: run python -m libra.trace.workload.report traces/README.md"


def test_readme_file_table_parameter_table_and_effect_sweep_are_current(readme):
    assert set(readme) == {("files", "all"), ("params", "all"), ("effect", "all")} | {("stats", n) for n in BUNDLED}
    for kind in ("files", "params", "effect"):
        assert readme[(kind, "all")] == render_block(kind, "all", str(TRACES)), f"stale {kind} block"


def test_documented_command_regenerates_the_swe_trace_byte_for_byte(tmp_path):
    bundled = TRACES / "swe-qwen3-14b.jsonl.gz"
    argv = shlex.split(regen_command(bundled))
    assert argv[:2] == ["libra-sim", "gen"] and argv[-2] == "-o"
    out = tmp_path / "swe.jsonl.gz"
    assert main(argv[1:-1] + [str(out)]) == 0
    assert out.read_bytes() == bundled.read_bytes()
    assert os.path.getsize(out) == os.path.getsize(bundled)
