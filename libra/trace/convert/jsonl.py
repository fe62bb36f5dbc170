"""Reading JSON Lines logs for the converters (``openai_chat``, ``verl``): which files, and each
line with its ``FILE:LINE`` so that a line that cannot be converted is reported where it is."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra.errors import UserError

#: File names read from a folder.
JSONL_SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz")


@dataclass
class Line:
    """One parsed line: where it is, and the JSON value (None when it did not parse; then
    ``error`` says why)."""

    path: Path
    lineno: int
    value: Any
    error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def find_jsonl_files(root: Path, what: str) -> list[Path]:
    """``root`` itself when it is a file, else every ``*.jsonl``/``*.jsonl.gz`` under it
    (recursively), sorted by path (so the trace bytes do not depend on the file system)."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise UserError(f"{root} does not exist; give a {what} file or a folder of them")
    found = [Path(d) / n for d, _dirs, files in os.walk(root) for n in files if n.endswith(JSONL_SUFFIXES)]
    if not found:
        raise UserError(f"no *.jsonl or *.jsonl.gz files under {root}")
    return sorted(found)


def read_lines(path: Path) -> Iterator[Line]:
    """Every non-blank line of ``path`` (gzip told by its first bytes), parsed; a line that is not
    JSON comes back with ``error`` set rather than stopping the file."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as f:  # type: ignore[operator]
            for i, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    yield Line(path, i, json.loads(raw.decode("utf-8")))
                except UnicodeDecodeError as exc:
                    yield Line(path, i, None, f"invalid UTF-8 at byte {exc.start}")
                except json.JSONDecodeError as exc:
                    yield Line(path, i, None, f"invalid JSON: {exc.msg} at column {exc.colno}")
    except (OSError, EOFError) as exc:  # unreadable, or a truncated gzip stream
        yield Line(path, 0, None, f"unreadable: {exc}")
