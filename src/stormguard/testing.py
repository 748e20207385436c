"""Public testing helpers: a clock you control, and an event loop that runs on it.

:class:`FakeClock` only moves when told to. Threads use :meth:`FakeClock.sleep`
(it advances the clock at once); asyncio code runs on the clock's own event loop,
:meth:`FakeClock.run`, whose time *is* the clock and which jumps the clock to the
next timer whenever every task is waiting (Trio's ``MockClock`` autojump). So
``asyncio.sleep``, ``asyncio.timeout``, ``loop.call_later`` and every stormguard
timer run in virtual time::

    clock = FakeClock()
    clock.run(Timeout(30.0, clock=clock).acall(asyncio.sleep, 60))
    # DeadlineExceeded after exactly 30 virtual seconds, a few real milliseconds
"""

from __future__ import annotations

import asyncio
import heapq
import math
import selectors
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from stormguard._core import validate

__all__ = ["FakeClock", "VirtualEventLoop"]

T = TypeVar("T")


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
        self._lock = threading.Lock()
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


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is ``clock.monotonic()`` and which autojumps.

    Before each iteration with no callback ready, it polls the selector without
    blocking (real I/O and wake-ups from other threads come first); if still nothing
    is ready, it moves the clock to the earliest timer that is not cancelled, so
    that timer is due at once. A ready callback is never skipped: time only moves
    when every task waits. ``autojump_threshold`` (real seconds, default 0) first
    waits that long for real I/O, for loops that also talk to real sockets or
    threads while timers are pending. With no timer at all it waits for I/O as
    any loop does.
    """

    def __init__(self, clock: FakeClock, *, autojump_threshold: float = 0.0) -> None:
        super().__init__(selectors.DefaultSelector())
        self.clock = clock
        try:
            self.autojump_threshold = validate.number("autojump_threshold", autojump_threshold,
                                                      allow_zero=True)
        except BaseException:
            self.close()
            raise

    def time(self) -> float:
        return self.clock.monotonic()

    def _run_once(self) -> None:
        if not self._ready and not self._stopping:  # type: ignore[attr-defined]
            self._autojump()
        super()._run_once()  # type: ignore[misc]

    def _poll(self, timeout: float) -> bool:
        """Process the I/O events of the next ``timeout`` real seconds; True if any."""
        self._process_events(self._selector.select(timeout))  # type: ignore[attr-defined]
        return bool(self._ready)  # type: ignore[attr-defined]

    def _autojump(self) -> None:
        if self._poll(0) or (self.autojump_threshold and self._poll(self.autojump_threshold)):
            return
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        # drop cancelled timers from the head, with CPython's own bookkeeping
        while scheduled and scheduled[0].cancelled():
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False  # type: ignore[attr-defined]
        if scheduled:
            when = scheduled[0].when()
            if when > self.clock.monotonic():
                self.clock._advance_to(when)

    def __repr__(self) -> str:
        return f"VirtualEventLoop({self.clock!r})"


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """What :func:`asyncio.run` does with the tasks left when the main one ends."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if task.cancelled():
            continue
        if task.exception() is not None:
            loop.call_exception_handler({
                "message": "unhandled exception during FakeClock.run() shutdown",
                "exception": task.exception(), "task": task})
