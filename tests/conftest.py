"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def without_sequence_parallelism(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Training memory of a trainer that does not split activations over its TP group
    (``cost_models.memory.SEQUENCE_PARALLEL`` off). The launch rules these tests pin down act
    where no training GPU count, or only an extreme one, holds the length prior's 64K tokens; with
    Megatron's sequence parallelism (session 44) the shapes they were written on hold it, so they
    keep the memory regime they were written in rather than moving to larger models."""
    import cost_models.memory as memory

    monkeypatch.setattr(memory, "SEQUENCE_PARALLEL", False)
    yield
