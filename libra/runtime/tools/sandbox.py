"""Run untrusted Python in a subprocess with a timeout, resource limits and no network.

What is enforced (documented in docs/runtime.md):

- wall-clock ``timeout_s``: the whole process group is killed (SIGKILL) when it runs over;
- ``RLIMIT_CPU`` (timeout + 1 s), ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE`` (files it
  writes), ``RLIMIT_NOFILE`` (64), ``RLIMIT_CORE`` 0, set in the child before exec;
- network: when ``unshare -rn`` works on this host (unprivileged user + network namespace) the
  child runs in an empty network namespace (no interface but a down loopback); otherwise, and in
  any case, a prelude replaces ``socket.socket``/``socket.create_connection`` and friends with a
  function that raises, before the user's code runs. The prelude alone is not a security
  boundary (ctypes can bypass it); the namespace is. ``Sandbox.network_isolation`` says which;
- a fresh scratch directory as cwd and ``HOME``, deleted afterwards; ``python -I`` (no user site,
  no PYTHON* variables) with an empty environment but ``PATH``;
- output: at most ``max_output_bytes`` of stdout+stderr is read; a flood beyond it kills the
  process and the call ends in ``error`` with the truncated output.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import lru_cache

from libra.runtime.tools.base import ToolResult

_PRELUDE = r"""
import socket as _s, sys as _sys
def _blocked(*a, **k):
    raise OSError("network access is disabled in the sandbox")
for _n in ("socket", "create_connection", "create_server", "socketpair", "getaddrinfo", "fromfd"):
    setattr(_s, _n, _blocked)
del _s, _n
_code = _sys.stdin.read()
_sys.argv = ["<sandbox>"]
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
"""


@lru_cache(maxsize=1)
def namespace_available() -> bool:
    """True when ``unshare -rn`` can start a process in a fresh network namespace here."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


class Sandbox:
    """A Python runner; one instance is reused for many calls (each call is its own process)."""

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_bytes: int = 4096,
                 max_file_bytes: int = 1 << 20, use_namespace: bool = True) -> None:
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_file_bytes = int(max_file_bytes)
        self.use_ns = bool(use_namespace) and namespace_available()

    @property
    def network_isolation(self) -> str:
        """``"namespace"`` (an empty network namespace) or ``"prelude"`` (socket API blocked)."""
        return "namespace" if self.use_ns else "prelude"

    def _limits(self) -> None:  # runs in the child between fork and exec
        os.setsid()
        cpu = int(self.timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        mem = self.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.max_file_bytes, self.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def run(self, code: str) -> ToolResult:
        """Run ``code``; stdout (then stderr) is the output. Never raises for bad code."""
        t0 = time.perf_counter()
        scratch = tempfile.mkdtemp(prefix="libra-sandbox-")
        cmd = [sys.executable, "-I", "-c", _PRELUDE]
        if self.use_ns:
            cmd = ["unshare", "-rn", *cmd]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "TMPDIR": scratch, "OMP_NUM_THREADS": "1"}
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd=scratch, env=env, preexec_fn=self._limits)
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            return ToolResult(f"sandbox failed to start: {exc}", "error", time.perf_counter() - t0)
        outcome = "ok"
        chunks: list[bytes] = []
        got = 0
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(code.encode("utf-8", "replace"))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            os.set_blocking(proc.stdout.fileno(), False)
            deadline = t0 + self.timeout_s
            while True:
                try:
                    data = proc.stdout.read(65536)
                except BlockingIOError:
                    data = None
                if data:
                    chunks.append(data)
                    got += len(data)
                    if got > self.max_output_bytes:
                        outcome = "error"
                        break
                    continue
                if data == b"" or proc.poll() is not None:
                    # drain what is left after exit
                    try:
                        rest = proc.stdout.read() or b""
                    except BlockingIOError:
                        rest = b""
                    chunks.append(rest)
                    got += len(rest)
                    if proc.poll() is None:
                        proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
                    break
                if time.perf_counter() > deadline:
                    outcome = "timeout"
                    break
                time.sleep(0.002)
        except subprocess.TimeoutExpired:
            outcome = "timeout"
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            shutil.rmtree(scratch, ignore_errors=True)
        text = b"".join(chunks)[: self.max_output_bytes].decode("utf-8", "replace")
        if outcome == "ok" and proc.returncode != 0:
            outcome = "error"
            if proc.returncode < 0:
                text += f"\n[killed by signal {-proc.returncode}]"
        if outcome == "timeout":
            text = (text + f"\n[timed out after {self.timeout_s:g} s]").strip()
        elif got > self.max_output_bytes:
            text += f"\n[output truncated at {self.max_output_bytes} bytes]"
        return ToolResult(text.strip(), outcome, time.perf_counter() - t0)
