"""Output paths, checked before any work starts.

A command that writes results (``libra-run --out``, ``libra-sim replay --out/--json``,
``libra-sim convert -o``, ...) must find out that it cannot write them *before* it spends minutes
on a run or a simulation, and say so on one line (``UserError``, exit 2) instead of ending in a
``FileNotFoundError`` traceback at the end. A command never writes over its input, and replaces
an existing output file only when asked (``--force``). These helpers create what is missing and probe that
the destination is really writable (a probe file, since ``os.access`` answers yes for some paths
that refuse writes, e.g. under ``/proc``).
"""

from __future__ import annotations

import os
import tempfile

from libra.errors import UserError


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _probe(folder: str, label: str, path: str) -> None:
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".libra-probe-"):
            pass
    except OSError as exc:
        raise UserError(f"{label} {path}: cannot write in {folder} ({_why(exc)})") from None


def check_output_dir(path: str, label: str = "--out") -> str:
    """Create the output folder ``path`` if needed and check it can be written; returns its
    absolute path. ``label`` is the flag or key the user gave it with (it starts the message)."""
    if not path:
        raise UserError(f"{label}: needs a folder name")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and not os.path.isdir(full):
        raise UserError(f"{label} {path}: exists and is not a folder; give a folder (it is created when missing)")
    try:
        os.makedirs(full, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{label} {path}: cannot create the folder ({_why(exc)})") from None
    _probe(full, label, path)
    return full


def check_output_file(path: str, label: str = "--json") -> str:
    """Check that the file ``path`` can be written (its folder is created when missing; the file
    itself is not created); returns its absolute path."""
    if not path:
        raise UserError(f"{label}: needs a file name")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        raise UserError(f"{label} {path}: is a folder; give a file name")
    parent = os.path.dirname(full)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise UserError(f"{label} {path}: {parent} is not a folder")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{label} {path}: cannot create the folder {parent} ({_why(exc)})") from None
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise UserError(f"{label} {path}: the file is not writable")
    _probe(parent, label, path)
    return full


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_new_output_file(path: str, label: str, force: bool, inputs: tuple[str, ...] = ()) -> str:
    """``check_output_file``, and never write over what the user has: an output that is one of
    ``inputs`` (a file, or a file inside an input folder) is refused even with ``force`` (the
    command would destroy what it reads); any other existing file is refused unless ``force``
    (``libra-sim gen`` silently replaced traces, ``convert -o LOG`` the user's log)."""
    full = check_output_file(path, label)
    for src in inputs:
        if not src or not os.path.exists(src):
            continue
        src_full = os.path.abspath(os.path.expanduser(src))
        inside = os.path.isdir(src_full) and os.path.exists(full) and \
            os.path.commonpath([os.path.realpath(src_full), os.path.realpath(full)]) == os.path.realpath(src_full)
        if (os.path.isfile(src_full) and os.path.exists(full) and _same_file(src_full, full)) or inside:
            raise UserError(f"{label} {path}: is {'inside ' if inside else ''}the input {src}; write the output to "
                            "another file (an input is never overwritten)")
    if os.path.exists(full) and not force:
        raise UserError(f"{label} {path}: exists; pass --force to replace it, or choose another file")
    return full
