"""The overall deadline of the current call, readable by any code under it.

``Timeout(total=...)`` (and ``Timeout(seconds)``) sets it for everything it wraps;
code that does its own I/O (the httpx transport, the Redis store, your own
client) reads :func:`remaining` to clip its own timeouts, which is how a
deadline reaches blocking code that Python cannot interrupt safely.

One mechanism: :func:`clip` makes the deadline of a block (never later than the
one in force, whichever clock that one is on); :func:`scope` and
:class:`stormguard.Timeout` both use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from stormguard._core.clock import Clock, system_clock

__all__ = ["Deadline", "clip", "current", "remaining", "scope"]


class Deadline:
    """An absolute point on one clock's monotonic time."""

    __slots__ = ("at", "clock", "cut_by", "seconds")

    def __init__(self, at: float, clock: Clock = system_clock, *,
                 seconds: float | None = None, cut_by: Deadline | None = None) -> None:
        self.at = at
        self.clock = clock
        self.seconds = seconds
        """The length it was asked for (None: not known)."""
        self.cut_by = cut_by
        """The outer deadline that made it earlier than asked (:func:`clip`), or None."""

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


def clip(seconds: float, clock: Clock = system_clock) -> tuple[Deadline, float]:
    """The deadline ``seconds`` from now on ``clock``, never later than the one in force
    (on another clock, by what is left of it), and ``now`` on ``clock``."""
    now = clock.monotonic()
    at = now + seconds
    outer = _current.get()
    cut_by = None
    if outer is not None:
        if outer.clock is clock:
            if outer.at < at:
                at, cut_by = outer.at, outer
        else:
            left = outer.remaining()
            if left < seconds:
                at, cut_by = now + left, outer
    if cut_by is not None and cut_by.cut_by is not None:
        cut_by = cut_by.cut_by  # the deadline that decided, however deep the nesting
    return Deadline(at, clock, seconds=seconds, cut_by=cut_by), now


@contextmanager
def scope(seconds: float, clock: Clock = system_clock) -> Iterator[Deadline]:
    """Set a deadline ``seconds`` from now for the block, never later than an outer one."""
    d = clip(seconds, clock)[0]
    token = _current.set(d)
    try:
        yield d
    finally:
        _current.reset(token)
