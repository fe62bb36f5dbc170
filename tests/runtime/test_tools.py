"""The real tools: sandboxed python (limits, timeouts, floods, no network) and BM25 search."""

from __future__ import annotations

import time

import pytest

from libra.runtime.tasks import Doc, load_corpus
from libra.runtime.tools import ToolBox
from libra.runtime.tools.retrieval import BM25
from libra.runtime.tools.sandbox import Sandbox


@pytest.fixture(scope="module")
def box() -> ToolBox:
    """Generous wall-clock limit: tests that expect ok/error must not turn into timeouts when
    CI's two cores are busy (a Python start-up alone can take over a second then)."""
    return ToolBox(timeout_s=15.0, memory_mb=256, max_output_bytes=256)


@pytest.fixture(scope="module")
def fast_box() -> ToolBox:
    """Short wall-clock limit, for the tests that expect the timeout itself."""
    return ToolBox(timeout_s=1.0, memory_mb=256, max_output_bytes=256)


def test_python_prints_result(box: ToolBox) -> None:
    r = box.call("python", "print(37*41+5)")
    assert (r.output, r.outcome) == ("1522", "ok")
    assert r.latency_s > 0


def test_hanging_code_times_out_without_stalling(fast_box: ToolBox) -> None:
    t0 = time.perf_counter()
    r = fast_box.call("python", "while True:\n    pass")
    assert r.outcome == "timeout"
    assert "timed out" in r.output
    assert time.perf_counter() - t0 < 5


def test_sleeping_child_process_is_killed_too(fast_box: ToolBox) -> None:
    r = fast_box.call("python", "import subprocess\nsubprocess.Popen(['sleep', '30'])\nimport time\ntime.sleep(30)")
    assert r.outcome == "timeout"


def test_output_flood_is_cut(box: ToolBox) -> None:
    r = box.call("python", "while True:\n    print('x' * 1000)")
    assert r.outcome == "error"
    assert "truncated" in r.output
    assert len(r.output) < 400


def test_crash_and_exit_code_are_errors(box: ToolBox) -> None:
    assert box.call("python", "raise ValueError('boom')").outcome == "error"
    assert box.call("python", "import os\nos.abort()").outcome == "error"
    assert box.call("python", "def (").outcome == "error"


def test_memory_limit(box: ToolBox) -> None:
    r = box.call("python", "x = bytearray(1 << 30)\nprint(len(x))")
    assert r.outcome == "error"
    assert "MemoryError" in r.output


def test_no_network(box: ToolBox) -> None:
    r = box.call("python", "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))\nprint('connected')")
    assert r.outcome == "error"
    assert "connected" not in r.output


def test_scratch_dir_is_fresh_and_removed() -> None:
    sb = Sandbox(timeout_s=10)
    a = sb.run("import os\nopen('f.txt','w').write('hi')\nprint(os.getcwd())")
    b = sb.run("import os\nprint(os.path.exists('f.txt'))")
    assert a.outcome == "ok" and b.output == "False"
    import os

    assert not os.path.exists(a.output)


def test_prelude_blocks_sockets_without_namespace() -> None:
    sb = Sandbox(timeout_s=10, use_namespace=False)
    assert sb.network_isolation == "prelude"
    r = sb.run("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert r.outcome == "error" and "network access is disabled" in r.output


def test_search_finds_the_fact(box: ToolBox) -> None:
    doc = load_corpus()[0]
    country, fact = doc.text.split()[:2]
    r = box.call("search", f"{country} {fact}")
    assert (r.output, r.outcome) == (doc.text, "ok")
    assert box.call("search", "").outcome == "error"
    assert box.call("search", "qqqq zzzz").output == "no results"


def test_unknown_tool_is_an_error_not_an_exception(box: ToolBox) -> None:
    r = box.call("bash", "ls")
    assert r.outcome == "error" and "python, search" in r.output


def test_bm25_ranks_by_term_rarity() -> None:
    docs = [Doc("a", "apple banana"), Doc("b", "apple cherry cherry"), Doc("c", "banana banana date")]
    idx = BM25(docs)
    assert [d.id for d in idx.search("cherry", 3)] == ["b"]
    assert idx.search("date banana", 1)[0].id == "c"
    assert idx.search("nothing") == []
