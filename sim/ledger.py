"""Who owns each GPU, at every moment: the simulator's guard against double-booking.

Every use of a GPU (a rollout instance, a training job, a role change in flight, a failed GPU
out of service) books it here first and frees it after. ``take`` raises ``InvariantViolation``
if any GPU is already booked, so a bug that would let two stages share a GPU stops the replay
instead of producing an optimistic number. ``acquire`` is the waiting form: it books the GPUs as
soon as all are free (FIFO among waiters), which is how the next step's rollout instances wait
for GPUs still training in asynchronous mode.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

from sim.instance import InvariantViolation

if TYPE_CHECKING:  # pragma: no cover
    import simpy


class GpuLedger:
    """Ownership of ``n_gpus`` GPUs (ids 0..n-1, node = id // gpus_per_node)."""

    def __init__(self, env: simpy.Environment, n_gpus: int) -> None:
        self.env = env
        self.n = n_gpus
        self.owner: list[Hashable | None] = [None] * n_gpus
        self._waiters: list[tuple[tuple[int, ...], Hashable, simpy.Event]] = []
        self.bookings = 0

    def _check(self, gpus: Iterable[int]) -> tuple[int, ...]:
        g = tuple(gpus)
        for x in g:
            if not 0 <= x < self.n:
                raise InvariantViolation(f"GPU {x} does not exist (cluster has {self.n})")
        if len(set(g)) != len(g):
            raise InvariantViolation(f"GPU list {g} books a GPU twice")
        return g

    def is_free(self, gpus: Iterable[int]) -> bool:
        return all(self.owner[x] is None for x in gpus)

    def take(self, gpus: Iterable[int], owner: Hashable) -> None:
        """Book ``gpus`` for ``owner`` now; any of them already booked is a simulator bug."""
        g = self._check(gpus)
        for x in g:
            if self.owner[x] is not None:
                raise InvariantViolation(f"GPU {x} double-booked: held by {self.owner[x]!r}, wanted by {owner!r}")
        for x in g:
            self.owner[x] = owner
        self.bookings += 1

    def acquire(self, gpus: Iterable[int], owner: Hashable) -> simpy.Event:
        """An event that fires once ``gpus`` are all free and booked for ``owner``."""
        g = self._check(gpus)
        ev = self.env.event()
        self._waiters.append((g, owner, ev))
        self._serve()
        return ev

    def release(self, gpus: Iterable[int], owner: Hashable) -> None:
        """Free ``gpus``, which ``owner`` must hold; waiting bookings then proceed."""
        g = self._check(gpus)
        for x in g:
            if self.owner[x] != owner:
                raise InvariantViolation(f"GPU {x} released by {owner!r} but held by {self.owner[x]!r}")
        for x in g:
            self.owner[x] = None
        self._serve()

    def transfer(self, gpus: Iterable[int], old: Hashable, new: Hashable) -> None:
        """Hand ``gpus`` from ``old`` to ``new`` with no gap (a role change)."""
        g = self._check(gpus)
        for x in g:
            if self.owner[x] != old:
                raise InvariantViolation(f"GPU {x} handed over by {old!r} but held by {self.owner[x]!r}")
        for x in g:
            self.owner[x] = new

    def owned_by(self, owner: Hashable) -> tuple[int, ...]:
        return tuple(i for i, o in enumerate(self.owner) if o == owner)

    def _serve(self) -> None:
        still = []
        for g, owner, ev in self._waiters:
            if not still and self.is_free(g):  # FIFO: nobody jumps an earlier waiter
                self.take(g, owner)
                ev.succeed()
            elif self.is_free(g) and all(not set(g) & set(h) for h, _, _ in still):
                self.take(g, owner)
                ev.succeed()
            else:
                still.append((g, owner, ev))
        self._waiters = still
