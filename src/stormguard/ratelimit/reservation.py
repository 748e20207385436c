"""`Reservation`: when a call may go, for a shaper that delays instead of rejecting."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Reservation"]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to one reservation (``store.reserve(key, rule, cost, max_wait=...)``).

    * ``ok``: the slot is within ``max_wait`` (and, with ``book=True``, it is booked: the
      caller must go at ``at`` and no earlier; later callers get later slots);
    * ``wait``: seconds from now until the slot (0.0: go now);
    * ``at``: the slot, in epoch seconds of the store's clock.

    When ``ok`` is false nothing was booked; ``wait`` and ``at`` still say when the
    earliest slot would be. ``bool(reservation)`` is ``ok``.
    """

    ok: bool
    wait: float
    at: float

    def __bool__(self) -> bool:
        return self.ok
