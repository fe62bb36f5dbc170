"""Real tools for the RL environments: a sandboxed Python runner and BM25 retrieval.

Every tool returns a ``ToolResult`` with an outcome of ``ok``, ``error`` or ``timeout`` (the
trace format's values) and never raises or hangs on bad input: a rollout step must not stall on
a tool.
"""

from libra.runtime.tools.base import ToolResult
from libra.runtime.tools.registry import ToolBox

__all__ = ["ToolBox", "ToolResult"]
