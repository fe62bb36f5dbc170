"""Validate an emitted configuration against its framework's key lists (``schemas/*.keys``).

Why key lists and not the frameworks' config classes: verl, AReaL, slime and NeMo RL do not
install without a GPU stack, so CI cannot import them; their example configs and argument
parsers are the documented schema. ``scripts/build_export_schemas.py`` derives the lists and
records the repository and commit of each (the first lines of every file).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from libra.export.target import Emitted

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


@lru_cache(maxsize=None)
def load_keys(name: str) -> frozenset[str]:
    """The keys of schema ``name`` (``schemas/NAME.keys``; ``#`` lines are provenance)."""
    path = SCHEMA_DIR / f"{name}.keys"
    lines = path.read_text().splitlines()
    return frozenset(s for s in (x.strip() for x in lines) if s and not s.startswith("#"))


def provenance(name: str) -> str:
    """The first comment line of a schema: the repository and commit it was derived from."""
    first = (SCHEMA_DIR / f"{name}.keys").read_text().splitlines()[0]
    return first.lstrip("# ").strip()


def validate(emitted: Emitted) -> list[str]:
    """Every key of ``emitted`` that is in none of its schemas, one message each (empty: valid)."""
    known: frozenset[str] = frozenset().union(*(load_keys(s) for s in emitted.schemas))
    return [f"{emitted.framework}: key {k!r} is not in {' + '.join(emitted.schemas)} ({provenance(emitted.schemas[0])})"
            for k in emitted.keys if k not in known]
