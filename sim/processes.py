"""Process pools that a Ctrl-C stops within a second, with no worker traceback.

Why: ``libra-sim replay --compare`` and ``libra-sim sweep`` replay in forked worker processes.
With a plain ``ProcessPoolExecutor`` an interrupt went wrong in three ways: a terminal Ctrl-C
(SIGINT to the whole process group) printed a ``KeyboardInterrupt`` traceback from every worker;
a SIGINT to the driver alone (``timeout -s INT``) left the workers computing while the
executor's shutdown waited for them (27-38 s, once over 10 minutes); and what had finished was
lost. Here the workers ignore SIGINT (the driver alone decides what an interrupt means) and,
when the driver is interrupted (or fails), it terminates its workers instead of waiting for
them; the caller keeps the results that came back and writes them, marked incomplete.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.context import BaseContext
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Seconds a terminated worker gets to exit before it is killed.
TERM_GRACE_S = 0.5


def ignore_sigint() -> None:
    """Worker initializer: a terminal Ctrl-C reaches every process of the foreground group; the
    workers leave it to the driver, which terminates them (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a SIGINT that arrives while workers are being forked, and raise it afterwards: a
    worker forked in that moment would otherwise inherit Python's handler before its
    initializer runs and print a traceback. Outside the main thread (no signals there) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt


def stop_now(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and terminate the workers (SIGTERM, then SIGKILL after
    ``TERM_GRACE_S``), without waiting for their replays. ``ProcessPoolExecutor`` has no public
    way to end running work before Python 3.14 (``terminate_workers``), hence its process map."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(TERM_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(TERM_GRACE_S)


class InterruptiblePool:
    """A ``ProcessPoolExecutor`` whose workers ignore SIGINT and which, left by an exception
    (a ``KeyboardInterrupt`` above all), terminates its workers instead of waiting for them.

    Use ``submit_all`` to start the work: it forks the workers with SIGINT held."""

    def __init__(self, jobs: int, mp_context: BaseContext) -> None:
        self.pool = ProcessPoolExecutor(jobs, mp_context=mp_context, initializer=ignore_sigint)

    def submit_all(self, fn: Callable[[T], R], items: Iterable[T]) -> list[Future[R]]:
        """``[pool.submit(fn, x) for x in items]`` with a SIGINT during the forks held back."""
        with _sigint_deferred():
            return [self.pool.submit(fn, x) for x in items]

    def __enter__(self) -> InterruptiblePool:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.pool.shutdown(wait=True)
        else:
            stop_now(self.pool)
