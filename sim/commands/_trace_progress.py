"""A rich progress bar for passes over a trace, shown only when stderr is a terminal.

Shared by ``libra-sim validate``, ``stats`` and ``convert``: the reader calls
``progress(done, total)``; here that drives one bar per pass. When stderr is not a TTY (CI, pipes,
tests) nothing is drawn, so machine-readable output stays clean.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

ProgressFn = Callable[[int, int], None]


@contextmanager
def trace_progress(label: str) -> Iterator[ProgressFn | None]:
    """Yields a ``progress(done, total)`` callback, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    state: dict[str, object] = {"task": None, "last": -1}

    def update(done: int, total: int) -> None:
        # A new pass starts when progress goes backwards: give it a fresh bar.
        if state["task"] is None or done < int(state["last"]):  # type: ignore[arg-type]
            if state["task"] is not None:
                bar.remove_task(state["task"])  # type: ignore[arg-type]
            state["task"] = bar.add_task(label, total=max(total, 1))
        state["last"] = done
        bar.update(state["task"], completed=done, total=max(total, 1))  # type: ignore[arg-type]

    with bar:
        yield update
