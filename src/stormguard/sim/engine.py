"""The discrete-event engine: one priority queue of timed callbacks over a FakeClock.

Every simulation in stormguard runs on this engine (the capacity simulator of
``stormguard simulate``, the fleet and region simulations), so that they share one
notion of time: the engine's clock is a :class:`stormguard.testing.FakeClock`, and the
real policies given that clock (``CircuitBreaker(clock=eng.clock)``, ``RetryBudget``,
``Bulkhead``...) read the very time at which the engine runs each event.

::

    eng = Engine()
    seen = []
    eng.call_later(2.0, seen.append, "b")
    eng.call_later(1.0, seen.append, "a")
    tick = eng.every(0.5, seen.append, ".")
    eng.run(until=eng.now + 1.2)   # ".", "a", "." ; the clock is left at now + 1.2
    tick.cancel()

Events run in time order; events due at the same time run in the order they were
scheduled (FIFO), including events scheduled at the current time by a running event.
A time in the past is run at the current time (the clock never goes back). Each
event costs one ``heapq`` push and pop: O(log n) in the number pending. Nothing here
reads the wall clock.

The simulator's waits of one length again and again (a work step's, a dependency's
constant latency) go through FIFO lanes (``Engine._lane``, ``SimClock._sleep_in``):
only the first entry of each lane is in the heap, which then holds a few entries
instead of one per waiting request; the run order is exactly the heap's alone.

A clock that only the engine moves (``clock._engine_owned``, the simulator's
``SimClock``) and whose monotonic time is its elapsed time (``monotonic_start=0``) is
moved by one attribute write per event instead of a call.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard.testing import FakeClock

__all__ = ["Engine", "Handle"]

class _Event:
    """A heap entry, ordered by (time, sequence): ``fn`` is the :class:`Handle` and
    ``args`` None for the public calls; for the simulator's own events (never cancelled:
    no handle to allocate) ``fn(*args)`` runs. ``lane`` is None or the FIFO lane holding
    the entry (see :meth:`Engine._lane`).

    Compared by ``__lt__`` alone (what ``heapq`` uses): compiled, two typed fields,
    instead of a tuple's item-by-item equality and order tests through the object
    protocol (a tenth of a simulated request's instructions, callgrind)."""

    __slots__ = ("args", "fn", "lane", "seq", "when")

    def __init__(self, when: float, seq: int, fn: Any, args: tuple[Any, ...] | None,
                 lane: deque[_Event] | None) -> None:
        self.when = when
        self.seq = seq
        self.fn = fn
        self.args = args
        self.lane = lane

    def __lt__(self, other: _Event) -> bool:
        # sequence numbers are unique: no two entries are ever equal
        return self.when < other.when or (self.when == other.when and self.seq < other.seq)

    def __repr__(self) -> str:
        return f"<_Event at {self.when!r} #{self.seq}>"



class Handle:
    """A scheduled event (or, for :meth:`Engine.every`, a repeating series of them).

    :meth:`cancel` stops it: a cancelled event never runs, a cancelled series runs no
    more. ``when`` is the time the event is (next) due.
    """

    __slots__ = ("_args", "_engine", "_fn", "_interval", "_n", "_start", "cancelled", "when")

    def __init__(self, engine: Engine, when: float, fn: Callable[..., object],
                 args: tuple[Any, ...], interval: float | None = None) -> None:
        self._engine = engine
        self._fn = fn
        self._args = args
        self._interval = interval
        self._start = when
        self._n = 0
        self.when = when
        self.cancelled = False

    def cancel(self) -> None:
        """Cancel the event (or the rest of the series); cancelling twice is harmless."""
        if not self.cancelled:
            self.cancelled = True
            self._engine._dead += 1  # still in the heap: skipped when popped

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else f"at {self.when!r}"
        kind = f"every {self._interval!r}" if self._interval is not None else "once"
        return f"<Handle {getattr(self._fn, '__qualname__', self._fn)!s} {kind} {state}>"


class Engine:
    """A discrete-event engine in virtual time (see the module docstring).

    ``clock`` is the :class:`FakeClock` it advances (a new one when omitted); ``now`` is
    its monotonic time.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        if clock is None:
            clock = FakeClock()
        elif not isinstance(clock, FakeClock):
            raise TypeError(f"clock: must be a stormguard.testing.FakeClock "
                            f"(got {type(clock).__name__})")
        self.clock = clock
        # The sequence number of an entry (_Event) is unique: no two entries compare
        # equal. Every entry takes a new sequence number, so the counts below need no
        # update per event.
        self._heap: list[_Event] = []
        # FIFO lanes: entries appended in (time, sequence) order, only each lane's first
        # entry in the heap (a smaller heap: fewer comparisons per event, the same order)
        self._lanes: list[deque[_Event]] = []
        self._seq = 0  # entries ever made
        self._dead = 0  # cancelled handles still in the heap
        self._gone = 0  # entries removed without running (cancelled, or cleared)

    @property
    def now(self) -> float:
        """The current virtual time: ``clock.monotonic()``."""
        return self.clock.monotonic()

    def _queued(self) -> int:
        """Entries not yet run or dropped: the heap's, and the lanes' behind their first."""
        return len(self._heap) + sum(len(lane) - 1 for lane in self._lanes if lane)

    @property
    def pending(self) -> int:
        """How many events are scheduled and not cancelled (a series counts as one)."""
        return self._queued() - self._dead

    @property
    def events_run(self) -> int:
        """How many events have run (a series counts once per run)."""
        return self._seq - self._queued() - self._gone

    def _clear(self) -> None:
        """Drop every scheduled event (the run is over): none of them will run."""
        self._gone += self._queued()
        self._heap.clear()
        for lane in self._lanes:
            lane.clear()
        self._dead = 0

    def _lane(self) -> deque[_Event]:
        """A new FIFO lane, for events scheduled in time order (the same delay from now,
        again and again; ``SimClock._sleep_in``). Its user makes ``(when, seq, fn, args,
        lane)`` with a new ``seq`` and appends it when ``when`` is not before the lane's
        last entry's (pushing it on the heap too if the lane was empty), else pushes it
        with lane None on the heap: the run order is the one the heap alone would give."""
        lane: deque[_Event] = deque()
        self._lanes.append(lane)
        return lane

    def _push(self, handle: Handle) -> None:
        self._seq += 1
        heapq.heappush(self._heap, _Event(handle.when, self._seq, handle, None, None))

    def call_at(self, when: object, fn: Callable[..., object], *args: Any) -> Handle:
        """Run ``fn(*args)`` at virtual time ``when`` (at once if that is past)."""
        at = validate.number("when", when, minimum=None)
        now = self.clock.monotonic()
        handle = Handle(self, at if at > now else now, fn, args)
        self._push(handle)
        return handle

    def call_later(self, delay: object, fn: Callable[..., object], *args: Any) -> Handle:
        """Run ``fn(*args)`` ``delay`` virtual seconds from now (``delay >= 0``)."""
        seconds = validate.number("delay", delay, allow_zero=True)
        handle = Handle(self, self.clock.monotonic() + seconds, fn, args)
        self._push(handle)
        return handle

    def _later(self, delay: float, fn: Callable[..., object], *args: Any) -> Handle:
        """:meth:`call_later` without the argument checks, for the simulator's own hot
        path (``delay`` already a float >= 0)."""
        handle = Handle(self, self.clock.monotonic() + delay, fn, args)
        self._seq += 1
        heapq.heappush(self._heap, _Event(handle.when, self._seq, handle, None, None))
        return handle

    def _fire_later(self, delay: float, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` ``delay`` (a float >= 0) from now; no handle, no cancel."""
        self._seq += 1
        heapq.heappush(self._heap, _Event(self.clock.monotonic() + delay, self._seq, fn, args,
                                          None))

    def _fire_now(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` now, after the events already due now; no handle."""
        self._seq += 1
        heapq.heappush(self._heap, _Event(self.clock.monotonic(), self._seq, fn, args, None))

    def every(self, interval: object, fn: Callable[..., object], *args: Any,
              start: object = None) -> Handle:
        """Run ``fn(*args)`` every ``interval`` seconds, first at ``start`` (default: one
        interval from now), until the returned handle is cancelled.

        The n-th run is due at ``start + n * interval`` exactly (no drift).
        """
        period = validate.number("interval", interval)
        now = self.clock.monotonic()
        if start is None:
            first = now + period
        else:
            first = validate.number("start", start, minimum=None)
            first = max(first, now)
        handle = Handle(self, first, fn, args, period)
        self._push(handle)
        return handle

    def run(self, until: object = None) -> None:
        """Run events in time order until none are left, or up to virtual time ``until``
        (events due at ``until`` run; the clock is then left at ``until``).

        An exception raised by an event propagates; that event is consumed, the others
        stay scheduled, and ``run`` may be called again.
        """
        limit = math.inf if until is None else validate.number("until", until, minimum=None)
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        clock = self.clock
        monotonic, advance_to = clock.monotonic, clock._advance_to
        # a clock only this loop moves, monotonic() == _elapsed: moved by one write
        direct = getattr(clock, "_engine_owned", False) and clock._mono0 == 0.0
        while heap:
            entry: _Event = pop(heap)
            when = entry.when
            if when > limit:
                push(heap, entry)  # the same (time, sequence): its place is unchanged
                break
            lane = entry.lane
            if lane is not None:  # the first of its lane: the next one takes its place
                lane.popleft()
                if lane:
                    push(heap, lane[0])
            args = entry.args
            if args is not None:  # the simulator's own event: nothing to cancel or repeat
                if direct:
                    if when > clock._elapsed:  # noqa: PLR1730 -- max() is a call per event
                        clock._elapsed = when
                elif when > monotonic():
                    advance_to(when)
                fn = entry.fn  # a local: `entry.fn(...)` would be looked up by name
                fn(*args)
                continue
            handle: Handle = entry.fn
            if handle.cancelled:
                self._dead -= 1
                self._gone += 1
                continue
            if when > monotonic():
                advance_to(when)  # exactly `when`: no float drift from advance()
            interval = handle._interval
            if interval is None:
                handle.cancelled = True  # it has run: cancel() is now a no-op
            else:
                handle._n += 1
                handle.when = handle._start + handle._n * interval
                self._push(handle)
            fn = handle._fn
            fn(*handle._args)
        if limit != math.inf and limit > clock.monotonic():
            clock._advance_to(limit)

    def __repr__(self) -> str:
        return f"<Engine now={self.now!r} pending={self.pending}>"
