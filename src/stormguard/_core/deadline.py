"""The overall deadline of the current call, readable by any code under it.

``Timeout(total=...)`` (and ``Timeout(seconds)``) sets it for everything it wraps;
code that does its own I/O (the httpx transport, the Redis store, your own
client) reads :func:`remaining` to clip its own timeouts, which is how a
deadline reaches blocking code that Python cannot interrupt safely.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from stormguard._core.clock import Clock, system_clock

__all__ = ["Deadline", "current", "remaining", "scope"]


class Deadline:
    """An absolute point on one clock's monotonic time."""

    __slots__ = ("at", "clock")

    def __init__(self, at: float, clock: Clock = system_clock) -> None:
        self.at = at
        self.clock = clock

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.clock.monotonic()

    def expired(self) -> bool:
        return self.clock.monotonic() >= self.at

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.6f})"


_current: ContextVar[Deadline | None] = ContextVar("stormguard_deadline", default=None)


def current() -> Deadline | None:
    """The innermost deadline in force, or None."""
    return _current.get()


def remaining() -> float | None:
    """Seconds left before the deadline in force (None when there is none)."""
    d = _current.get()
    return None if d is None else d.remaining()


@contextmanager
def scope(seconds: float, clock: Clock = system_clock) -> Iterator[Deadline]:
    """Set a deadline ``seconds`` from now for the block, never later than an outer one."""
    at = clock.monotonic() + seconds
    outer = _current.get()
    if outer is not None and outer.clock is clock and outer.at < at:
        at = outer.at
    d = Deadline(at, clock)
    token = _current.set(d)
    try:
        yield d
    finally:
        _current.reset(token)
