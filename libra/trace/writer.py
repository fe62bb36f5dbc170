"""Write traces in the TRACE_FORMAT.md v1 JSON Lines form, plain or gzip.

The writer applies the reader's own rules (``libra.trace.validate``) to every record before it
writes it, so nothing it produces can be rejected later, and it writes through a temporary file
renamed into place at the end, so a failure never leaves a half-written trace behind.

Output is byte-for-byte deterministic: keys in a fixed order, compact separators, and for gzip
an empty file name and ``mtime=0`` in the gzip header. Same trajectories in -> same bytes out,
which lets generated traces be compared by hash and kept in git without noise.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from array import array
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

from libra.errors import TraceError, UserError
from libra.trace.records import FORMAT_NAME, TraceHeader, Trajectory, Turn
from libra.trace.validate import HEADER_KEYS, R_DUPLICATE, RuleViolation, check_trajectory, parse_header

def _i(v: Any) -> Any:
    """NumPy integer scalars (common in generators) as Python ints; anything else unchanged, so
    that validation reports it (a float or bool where an int belongs is an error, not rounded)."""
    return v if type(v) is int else int(v) if isinstance(v, np.integer) else v


def _f(v: Any) -> Any:
    """NumPy float scalars as Python floats; anything else unchanged."""
    return float(v) if isinstance(v, (np.floating, np.integer)) else v


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
#: Compression level for ``.gz`` output: 6 is zlib's default, near 9's ratio at a third of the time.
GZIP_LEVEL = 6


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    """One turn as a JSON-ready dict. A turn without a tool is written as ``gen_tokens`` and
    ``tool: null`` alone: the spec says absent ``tool_tokens`` is 0 and absent
    ``tool_latency_s``/``outcome`` are null, so that is the whole truth, in fewer bytes."""
    if turn.tool is None:
        d: dict[str, Any] = {"gen_tokens": _i(turn.gen_tokens), "tool": None}
        # Keep values the rules forbid, so that validation names them instead of dropping them.
        if turn.tool_latency_s is not None:
            d["tool_latency_s"] = _f(turn.tool_latency_s)
        if turn.tool_tokens != 0 or type(turn.tool_tokens) is not int:
            d["tool_tokens"] = _i(turn.tool_tokens)
        if turn.outcome is not None:
            d["outcome"] = turn.outcome
    else:
        d = {
            "gen_tokens": _i(turn.gen_tokens),
            "tool": turn.tool,
            "tool_latency_s": _f(turn.tool_latency_s),
            "tool_tokens": _i(turn.tool_tokens),
            "outcome": turn.outcome,
        }
    if turn.policy_version is not None:  # optional: written only when the recorder knows it
        d["policy_version"] = _i(turn.policy_version)
    return d


def trajectory_to_dict(t: Trajectory) -> dict[str, Any]:
    """A trajectory as a JSON-ready dict with keys in the fixed order of TRACE_FORMAT.md.

    ``group``, ``reward`` and ``finish`` are always written (null when unknown) so that every
    line shows the same keys to a human reading the file.
    """
    return {
        "type": "trajectory",
        "id": t.id,
        "step": _i(t.step),
        "group": t.group,
        "prompt_tokens": _i(t.prompt_tokens),
        "turns": [turn_to_dict(turn) for turn in t.turns],
        "reward": _f(t.reward),
        "finish": t.finish,
    }


def header_to_dict(header: TraceHeader) -> dict[str, Any]:
    """The header record; metadata keys follow the known keys, in sorted order for determinism."""
    clash = sorted(set(header.metadata) & set(HEADER_KEYS))
    if clash:
        raise UserError(f"trace header metadata may not use the reserved key(s) {', '.join(clash)}")
    d: dict[str, Any] = {
        "type": "header",
        "format": FORMAT_NAME,
        "version": header.version,
        "workload": header.workload,
        "model": header.model,
        "source": header.source,
    }
    for key in sorted(header.metadata):
        d[key] = header.metadata[key]
    return d


def _encode(obj: dict[str, Any], path: str, line: int) -> bytes:
    try:
        return (_ENCODER.encode(obj) + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:  # not JSON-serializable, NaN in metadata, ...
        raise TraceError(path, line, "(line)", f"cannot be written as JSON: {exc}") from None
    except UnicodeEncodeError as exc:  # lone surrogates in a string
        raise TraceError(path, line, "(line)", f"cannot be written as UTF-8: {exc.reason}") from None


def _open_output(tmp: BinaryIO, gz: bool) -> BinaryIO:
    if gz:
        return gzip.GzipFile(filename="", mode="wb", fileobj=tmp, compresslevel=GZIP_LEVEL, mtime=0)  # type: ignore[return-value]
    return tmp


def write_trace(
    path: str | os.PathLike[str], trajectories: Iterable[Trajectory], header: TraceHeader | None = None
) -> int:
    """Writes JSONL (gzip when path ends in .gz, with mtime=0 so same input -> same bytes).

    Returns the number of trajectories written. Every record is checked with the reader's rules
    first, duplicate ids included; a broken rule raises ``TraceError`` naming the line it would
    have had, and the destination is left untouched.
    """
    from libra.trace.reader import duplicate_lines  # the reader owns the file scanning

    dest = os.fspath(path)
    gz = dest.endswith(".gz")
    directory = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write trace {dest}: directory {directory} does not exist")
    fd, tmp_path = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(dest), dir=directory)
    # mkstemp creates 0600; a trace is an ordinary file, so give it the mode open() would
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    count = 0
    hashes = array("q")
    lines = array("q")
    try:
        with os.fdopen(fd, "wb") as raw:
            out = _open_output(raw, gz)
            buf: list[bytes] = []
            line = 0
            if header is not None:
                hd = header_to_dict(header)
                line += 1
                try:
                    parse_header(hd)
                except RuleViolation as v:
                    raise TraceError(dest, line, v.field, v.message) from None
                buf.append(_encode(hd, dest, line))
            for t in trajectories:
                d = trajectory_to_dict(t)
                line += 1
                try:
                    check_trajectory(d)
                except RuleViolation as v:
                    raise TraceError(dest, line, v.field, v.message) from None
                buf.append(_encode(d, dest, line))
                hashes.append(hash(t.id))
                lines.append(line)
                count += 1
                if len(buf) >= 4096:
                    out.write(b"".join(buf))
                    buf.clear()
            out.write(b"".join(buf))
            if out is not raw:
                out.close()
        dups = duplicate_lines(tmp_path, hashes, lines)
        if dups:
            d = dups[0]
            raise TraceError(dest, d.line, "id", f"{R_DUPLICATE} (id {d.id!r} also on line {d.first_line})")
        try:
            os.replace(tmp_path, dest)
        except OSError as exc:
            raise UserError(f"cannot write trace {dest}: {exc.strerror}") from None
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise
    return count
