"""Text forms the emitters write: Hydra overrides on a command line, nested YAML from dotted
keys, launch flags. Shared so no emitter imports another."""

from __future__ import annotations

import shlex

import yaml


def value_text(v: object) -> str:
    """A value as Hydra / argparse read it (``True``/``False``, ``null``, numbers as they are)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


def command(head: list[str], args: list[list[str]]) -> str:
    """A shell command, one argument group (a flag and its value) per continued line."""
    parts = [" ".join(shlex.quote(h) for h in g) for g in [head, *args]]
    return " \\\n    ".join(parts) + "\n"


def hydra(head: list[str], keys: dict[str, object]) -> str:
    """``head`` followed by ``key=value`` Hydra overrides of existing keys."""
    return command(head, [[f"{k}={value_text(v)}"] for k, v in keys.items()])


def flags(head: list[str], keys: dict[str, object]) -> str:
    """``head`` followed by ``--flag value`` (``True``: the bare flag)."""
    return command(head, [[k] if v is True else [k, value_text(v)] for k, v in keys.items()])


def nested_yaml(keys: dict[str, object], header: str = "") -> str:
    """Dotted keys as one nested YAML document (keys in the order given)."""
    root: dict[str, object] = {}
    for k, v in keys.items():
        node = root
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})  # type: ignore[assignment]
        node[last] = v
    body = yaml.safe_dump(root, sort_keys=False, default_flow_style=False)
    return (header if header.endswith("\n") or not header else header + "\n") + body
