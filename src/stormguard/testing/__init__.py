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

from stormguard.testing.clock import FakeClock
from stormguard.testing.loop import VirtualEventLoop

__all__ = ["FakeClock", "VirtualEventLoop"]
