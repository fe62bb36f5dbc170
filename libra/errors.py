"""User-facing errors.

A ``UserError`` is a mistake in what the user gave us (a file, a flag, a config). The CLIs catch
it and print its message on one line, with no traceback, and exit with status 2.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user; the message says what is wrong and what would work."""


class TraceError(UserError):
    """A trace line breaks a rule of TRACE_FORMAT.md.

    The message always names the file, the line number, the field and the rule broken, in the
    form ``FILE:LINE: field 'F': RULE``.
    """

    def __init__(self, path: str, line: int, field: str, rule: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.rule = rule
        super().__init__(f"{path}:{line}: field '{field}': {rule}")
