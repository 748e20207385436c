"""FakeClock: a clock that only moves when told to (re-exported by :mod:`stormguard.testing`).

Compiled with mypyc with the hot path's group (``hatch_build.py``): the simulator's
engine and simulated threads read and move this clock on every event, and a compiled
class's attributes are read without a dictionary lookup. Open to subclasses written in
Python (``allow_interpreted_subclasses``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from stormguard.testing.loop import VirtualEventLoop, _cancel_all_tasks

_C = TypeVar("_C")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # not a runtime dependency: only the compiler reads the decorator

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_C], _C]:
        return lambda cls: cls

__all__ = ["FakeClock"]

T = TypeVar("T")


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, it stays open to subclasses
class FakeClock:
    """A clock that only moves when told to.

    ``wall()`` starts at ``start`` (epoch seconds), ``monotonic()`` at
    ``monotonic_start``; :meth:`advance` moves both. :meth:`set_wall` sets the
    wall time alone (backwards too: an NTP step, a skewed server). ``sleep``
    advances the clock instead of sleeping; ``asleep`` sleeps on the loop when
    running on this clock's own loop (:meth:`run`), else advances the clock and
    yields to the event loop once. It is safe to share between threads.
    """

    def __init__(self, start: float = 1_700_000_040.0, *, monotonic_start: float = 100.0) -> None:
        self._mono0 = float(monotonic_start)
        self._elapsed = 0.0
        # wall() = base + (_elapsed - since): exact right after set_wall(); one tuple, so a
        # reader in another thread never sees half of a set_wall()
        self._wall_at = (float(start), 0.0)
        self._lock: threading.Lock = threading.Lock()
        self.sleeps: list[float] = []
        """Every duration passed to ``sleep``/``asleep``, in order."""

    def wall(self) -> float:
        base, since = self._wall_at
        return base + (self._elapsed - since)

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

    def _advance_to(self, when: float) -> None:
        """Move monotonic time forward to exactly ``when`` (at least)."""
        with self._lock:
            self._elapsed = max(self._elapsed, when - self._mono0)
            while self._mono0 + self._elapsed < when:
                self._elapsed = math.nextafter(self._elapsed, math.inf)

    def set_wall(self, when: float) -> None:
        """Set the wall time to the epoch time ``when``.

        Forward, it is :meth:`advance` (monotonic time moves too); backward, only
        the wall time steps back, as on an NTP correction: monotonic time never does.
        """
        with self._lock:
            ahead = when - self.wall()
            if ahead > 0:
                self._elapsed += ahead
            self._wall_at = (float(when), self._elapsed)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualEventLoop) and loop.clock is self:
            await asyncio.sleep(max(seconds, 0.0))  # a timer on this clock, virtual
            return
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)

    # -- asyncio in virtual time ---------------------------------------------------------
    def new_event_loop(self, *, autojump_threshold: float = 0.0) -> VirtualEventLoop:
        """A new event loop whose time is this clock (see :class:`VirtualEventLoop`).

        Also a loop factory: ``asyncio.Runner(loop_factory=clock.new_event_loop)``.
        """
        return VirtualEventLoop(self, autojump_threshold=autojump_threshold)

    def run(self, coro: Coroutine[Any, Any, T], *, autojump_threshold: float = 0.0) -> T:
        """Run ``coro`` to completion on a new :class:`VirtualEventLoop` of this clock.

        Like :func:`asyncio.run`: the tasks left over are cancelled, async generators
        and the default executor shut down, and the loop closed.
        """
        loop = self.new_event_loop(autojump_threshold=autojump_threshold)
        try:
            return loop.run_until_complete(coro)
        finally:
            try:
                _cancel_all_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def __repr__(self) -> str:
        return f"FakeClock(wall={self.wall()!r}, monotonic={self.monotonic()!r})"
