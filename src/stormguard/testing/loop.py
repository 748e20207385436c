"""VirtualEventLoop: an asyncio loop whose time is a FakeClock (re-exported by
:mod:`stormguard.testing`)."""

from __future__ import annotations

import asyncio
import heapq
import selectors
from typing import TYPE_CHECKING

from stormguard._core import validate

if TYPE_CHECKING:
    from stormguard.testing.clock import FakeClock

__all__ = ["VirtualEventLoop"]


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
