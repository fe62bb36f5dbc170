"""The tools a trajectory may call, by name, behind one ``call(name, args)``."""

from __future__ import annotations

import time

from libra.runtime.tools.base import ToolResult


class ToolBox:
    """``python`` (sandboxed) and ``search`` (BM25 over the corpus); unknown names are errors."""

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_bytes: int = 1024,
                 search_k: int = 1, corpus_path: str | None = None) -> None:
        from libra.runtime.tasks import CORPUS_PATH, load_corpus
        from libra.runtime.tools.retrieval import SearchTool
        from libra.runtime.tools.sandbox import Sandbox

        self.sandbox = Sandbox(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
        self.search = SearchTool(load_corpus(corpus_path or CORPUS_PATH), k=search_k)
        self.names = ("python", "search")

    def call(self, name: str, args: str) -> ToolResult:
        """Run one call; never raises (a tool failure is an ``error`` result)."""
        t0 = time.perf_counter()
        try:
            if name == "python":
                return self.sandbox.run(args)
            if name == "search":
                return self.search.run(args)
            return ToolResult(f"error: unknown tool {name!r}; available: {', '.join(self.names)}", "error", time.perf_counter() - t0)
        except Exception as exc:  # a tool bug must not stall the step
            return ToolResult(f"error: {type(exc).__name__}: {exc}", "error", time.perf_counter() - t0)
