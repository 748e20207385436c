"""Time: one small protocol with monotonic time, wall time and sleeping.

Everything in stormguard that needs time takes a ``clock=`` argument; the real
clock is used when it is omitted and :class:`stormguard.testing.FakeClock` in
tests, so no test ever sleeps on the wall clock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "system_clock", "wall_us"]


@runtime_checkable
class Clock(Protocol):
    """The time source every policy and store is built on."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines, breaker windows)."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch (window alignment, reset headers)."""
        ...

    def wall_ns(self) -> int:
        """``wall()`` in integer nanoseconds (see :func:`wall_us`)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds``."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, real sleeps."""

    __slots__ = ()

    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)
    wall_ns = staticmethod(time.time_ns)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))

    def __repr__(self) -> str:
        return "SystemClock()"


system_clock = SystemClock()


def wall_us(clock: Clock) -> int:
    """Epoch microseconds on ``clock``: the one integer time of the rate-limit stores.

    ``clock.wall_ns() // 1000``: exact on the system clock (no float on the way) and
    ``round(wall() * 1e6)`` on :class:`stormguard.testing.FakeClock` (its ``wall_ns`` is
    rounded to the microsecond), which is what a Redis store sends in client-time mode.
    """
    return clock.wall_ns() // 1000
