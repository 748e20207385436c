"""Public testing helpers: a clock you control."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that only moves when told to.

    ``wall()`` starts at ``start`` (epoch seconds), ``monotonic()`` at
    ``monotonic_start``; both move together. ``sleep`` and ``asleep`` advance
    the clock instead of sleeping (``asleep`` also yields to the event loop
    once), so retry and backoff scenarios run instantly and deterministically.
    It is safe to share between threads.
    """

    def __init__(self, start: float = 1_700_000_040.0, *, monotonic_start: float = 100.0) -> None:
        self._wall0 = float(start)
        self._mono0 = float(monotonic_start)
        self._elapsed = 0.0
        self._lock = threading.Lock()
        self.sleeps: list[float] = []
        """Every duration passed to ``sleep``/``asleep``, in order."""

    def wall(self) -> float:
        return self._wall0 + self._elapsed

    def wall_ns(self) -> int:
        """``wall()`` in integer nanoseconds, rounded to the microsecond."""
        return int(self.wall() * 1_000_000 + 0.5) * 1000

    def monotonic(self) -> float:
        return self._mono0 + self._elapsed

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError(f"seconds: cannot go back in time (got {seconds!r})")
        with self._lock:
            self._elapsed += seconds

    def set_wall(self, when: float) -> None:
        """Jump forward to the epoch time ``when``."""
        self.advance(when - self.wall())

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"FakeClock(wall={self.wall()!r}, monotonic={self.monotonic()!r})"
