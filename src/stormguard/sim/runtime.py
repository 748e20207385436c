"""Simulated threads on the engine: blocking code (the real policies) in virtual time.

A simulated request is a greenlet running ordinary blocking code: the real
``Pipeline(...).call(...)`` of the policies, unchanged. When that code waits (a
``Retry`` backoff through ``clock.sleep``, a thread-pool queue, a dependency's
answer) the greenlet schedules its own wake-up on the :class:`~stormguard.sim.Engine`
and switches back to the engine's loop; the engine switches into it again at the
virtual time it asked for. So thousands of "threads" block at once at the cost of a
heap entry each, and the policies read the engine's clock (:class:`SimClock`), the
very time at which the engine runs them. Every switch goes through the engine's loop
(the main greenlet): a task never switches into another directly.

Each greenlet has its own ``contextvars`` context, so deadlines (``Timeout``) and
retry restrictions stay per request, as they are per thread in production.
"""

from __future__ import annotations

import contextvars
import math
from collections import deque
from collections.abc import Callable
from heapq import heappush
from typing import Any

import greenlet
from greenlet import getcurrent

from stormguard.sim.engine import Engine, _Event
from stormguard.testing import FakeClock

__all__ = ["Gauge", "Pool", "PoolFull", "Series", "SimClock", "Waiter", "new_engine", "spawn",
           "start"]


class SimClock(FakeClock):
    """A FakeClock whose ``sleep`` suspends the calling simulated task, not the world.

    Called from a task (a greenlet started by :func:`spawn`) it schedules the task's
    wake-up ``seconds`` later and yields to the engine. Called from the engine's own
    loop it is an error: time there moves only from event to event.
    """

    #: only the engine's loop moves this clock (Engine.run may set its time directly)
    _engine_owned = True

    def __init__(self, start: float = 1_700_000_040.0, *, monotonic_start: float = 0.0) -> None:
        super().__init__(start, monotonic_start=monotonic_start)
        self.engine: Engine | None = None
        self.main: greenlet.greenlet | None = None
        #: ``main.switch`` (set by :func:`new_engine`): a task's way back to the engine,
        #: the bound method made once instead of looked up at every wait
        self._to_main: Callable[..., Any] | None = None
        #: every worker made, with its ``switch`` made once: the wake-up a waiting task
        #: schedules
        self._wakes: dict[greenlet.greenlet, Callable[..., Any]] = {}
        self._idle: list[greenlet.greenlet] = []  # worker greenlets waiting for a task

    def stop_tasks(self) -> None:
        """End every task still waiting (the run is over): each gets ``GreenletExit`` at
        its wait, so its ``finally`` blocks run, at the current time; then the workers
        are dropped. Without this, the tasks of a run live as long as its clock."""
        if self.engine is not None:
            self.engine._clear()
        for worker in list(self._wakes):
            if worker and not worker.dead:  # started and suspended
                worker.throw(greenlet.GreenletExit)
        if self.engine is not None:  # what the finally blocks scheduled will never run
            self.engine._clear()
        self._wakes.clear()
        self._idle.clear()

    def _advance_to(self, when: float) -> None:
        # the engine's loop is the only writer (one thread): no lock needed
        elapsed = when - self._mono0
        if elapsed > self._elapsed:
            self._elapsed = elapsed
            while self._mono0 + self._elapsed < when:
                self._elapsed = math.nextafter(self._elapsed, math.inf)

    def _wake_of(self, me: greenlet.greenlet) -> Callable[..., Any]:
        """``me.switch``, the bound method made once per worker (a task started by
        :func:`start`); made anew for any other greenlet."""
        wake = self._wakes.get(me)
        return me.switch if wake is None else wake

    def sleep(self, seconds: float) -> None:
        to_main = self._to_main
        me = getcurrent()
        eng = self.engine
        if to_main is None or me is self.main or eng is None:
            raise RuntimeError("SimClock.sleep: only a simulated task may sleep "
                               "(time moves from event to event)")
        # Engine._fire_later, inlined: this is the simulator's most frequent call
        eng._seq += 1
        heappush(eng._heap, _Event(self._mono0 + self._elapsed
                                   + (seconds if seconds > 0.0 else 0.0),
                                   eng._seq, self._wake_of(me), (), None))
        to_main()

    def _sleep_in(self, lane: deque[_Event], seconds: float) -> None:
        """:meth:`sleep`, the wake-up scheduled through the engine's FIFO ``lane``
        (``Engine._lane``): for waits of the same length again and again (a work step, a
        dependency's latency), which then never enter the engine's heap behind the lane's
        first. The same wake-up time and order as :meth:`sleep`."""
        to_main = self._to_main
        me = getcurrent()
        eng = self.engine
        if to_main is None or me is self.main or eng is None:
            raise RuntimeError("SimClock.sleep: only a simulated task may sleep "
                               "(time moves from event to event)")
        when = self._mono0 + self._elapsed + (seconds if seconds > 0.0 else 0.0)
        wake = self._wake_of(me)
        # Engine._fire_in, inlined
        eng._seq += 1
        if not lane:
            entry = _Event(when, eng._seq, wake, (), lane)
            lane.append(entry)
            heappush(eng._heap, entry)
        elif lane[-1].when <= when:
            lane.append(_Event(when, eng._seq, wake, (), lane))
        else:  # out of order for the lane: on the heap alone
            heappush(eng._heap, _Event(when, eng._seq, wake, (), None))
        to_main()


def new_engine() -> tuple[Engine, SimClock]:
    """An engine on a fresh :class:`SimClock` (virtual time starts at 0)."""
    clock = SimClock()
    eng = Engine(clock)
    clock.engine = eng
    clock.main = main = greenlet.getcurrent()
    clock._to_main = main.switch
    return eng, clock


def _worker(clock: SimClock, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
    """A worker greenlet: runs one task after another, each in a fresh context.

    Creating and finishing a greenlet costs about 8 µs, a switch well under one: a
    finished worker waits in its clock's idle list for the next task.
    """
    me = greenlet.getcurrent()
    clock._wakes[me] = me.switch
    idle, to_main = clock._idle, clock._to_main
    assert to_main is not None
    while True:
        contextvars.Context().run(fn, *args)
        idle.append(me)
        fn, args = to_main()


def start(clock: SimClock, fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` as a simulated task right now, until it first waits (call it
    from the engine's loop, that is from an event)."""
    idle = clock._idle
    if idle:
        idle.pop().switch(fn, args)
        return
    worker = greenlet.greenlet(_worker, parent=clock.main)
    worker.switch(clock, fn, args)  # _worker enters itself in clock._wakes first


def spawn(eng: Engine, clock: SimClock, fn: Callable[..., object], *args: Any) -> None:
    """Start ``fn(*args)`` as a simulated task now (after the events already due now)."""
    eng._fire_now(start, clock, fn, *args)


class Waiter:
    """One answer a task waits for, with an optional give-up time.

    ``wait(timeout)`` (in the task) returns True once :meth:`complete` is called, or
    False when ``timeout`` virtual seconds pass first; whichever comes first wins,
    the other is ignored.
    """

    __slots__ = ("_clock", "_eng", "_task", "_timer", "done", "value")

    def __init__(self, eng: Engine, clock: SimClock) -> None:
        self._eng = eng
        self._clock = clock
        self._task: greenlet.greenlet | None = None
        self._timer: Any = None
        self.done = False
        self.value: object = None

    def complete(self, value: object = None) -> None:
        if self.done:
            return
        self.done = True
        self.value = value
        if self._task is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._eng._fire_now(self._task.switch, True)

    def _expire(self) -> None:
        if self.done:
            return
        self.done = True
        task = self._task
        assert task is not None
        task.switch(False)

    def wait(self, timeout: float | None = None) -> bool:
        if self.done:
            return True
        self._task = greenlet.getcurrent()
        if timeout is not None:
            self._timer = self._eng._later(timeout if timeout > 0.0 else 0.0, self._expire)
        main = self._clock.main
        assert main is not None
        return bool(main.switch())


class PoolFull(Exception):
    """A thread pool's queue is full: the request is refused at once (HTTP 503)."""


class Gauge:
    """A level over virtual time (busy threads, queue length), integrated per bucket.

    ``area[i]`` is the integral of the level over bucket ``i`` (``resolution``
    seconds); ``peak[i]`` its highest value there. The time average over a span is
    the sum of areas divided by its length (Little's law measured, not assumed).
    """

    __slots__ = ("_clock", "_last", "_li", "_res", "_top", "area", "peak", "value")

    def __init__(self, clock: FakeClock, buckets: int, resolution: float) -> None:
        self._clock = clock
        self._res = resolution
        self._last = 0.0
        self._li = 0  # int(_last / _res), kept with _last
        self.value = 0
        self.area = [0.0] * buckets
        self.peak = [0] * buckets
        self._top = buckets - 1

    def _flush(self, now: float) -> None:
        last, res, value = self._last, self._res, self.value
        if now > last and value:
            area = self.area
            i = int(last / res)
            top = len(area) - 1
            while True:
                end = (i + 1) * res
                if now <= end or i >= top:
                    area[min(i, top)] += value * (now - last)
                    break
                area[i] += value * (end - last)
                last = end
                i += 1
        self._last = now
        self._li = int(now / res)

    def add(self, delta: int) -> None:
        clock = self._clock
        now = clock._mono0 + clock._elapsed  # clock.monotonic(), inlined (twice a request)
        li = self._li
        i = int(now / self._res)
        if i == li:  # the common case: the same bucket as the last change
            top = self._top
            i = i if i <= top else top  # past the last bucket: it holds the rest of the run
            self.area[i] += self.value * (now - self._last)
            self._last = now
        else:
            self._flush(now)  # (the same sum as above when both are past the last bucket)
            top = self._top
            i = i if i <= top else top
        value = self.value = self.value + delta
        peak = self.peak
        if value > peak[i]:  # noqa: PLR1730 -- max() is a call, twice per request
            peak[i] = value

    def close(self, now: float) -> None:
        """Account the level up to ``now`` (the end of the run)."""
        self._flush(now)
        # a level held through buckets with no change still peaks there
        for i in range(len(self.peak)):
            if self.area[i] > 0 and self.peak[i] == 0:
                self.peak[i] = self.value

    def mean(self, start: float, end: float) -> float:
        """Time-average level over ``[start, end)`` (bucket-aligned)."""
        res = self._res
        lo, hi = int(start / res), int(end / res)
        if hi <= lo:
            return 0.0
        return sum(self.area[lo:hi]) / ((hi - lo) * res)


class Series:
    """Counts per bucket of virtual time, by name (``calls:sms``, ``orders:success``...)."""

    __slots__ = ("_clock", "_res", "buckets", "counts")

    def __init__(self, clock: FakeClock, buckets: int, resolution: float) -> None:
        self._clock = clock
        self._res = resolution
        self.buckets = buckets
        self.counts: dict[str, list[int]] = {}

    @property
    def resolution(self) -> float:
        return self._res

    def row(self, name: str) -> list[int]:
        """The counts of ``name`` (created empty), for callers that count often."""
        row = self.counts.get(name)
        if row is None:
            row = self.counts[name] = [0] * self.buckets
        return row

    def add(self, name: str, n: int = 1) -> None:
        row = self.counts.get(name)
        if row is None:
            row = self.counts[name] = [0] * self.buckets
        i = int(self._clock.monotonic() / self._res)
        row[i if i < self.buckets else self.buckets - 1] += n

    def rate(self, name: str, start: float, end: float) -> float:
        """Mean count per second over ``[start, end)`` (bucket-aligned)."""
        row = self.counts.get(name)
        res = self._res
        lo, hi = int(start / res), int(end / res)
        if row is None or hi <= lo:
            return 0.0
        return sum(row[lo:hi]) / ((hi - lo) * res)

    def total(self, name: str, start: float = 0.0, end: float | None = None) -> int:
        row = self.counts.get(name)
        if row is None:
            return 0
        lo = int(start / self._res)
        hi = len(row) if end is None else int(end / self._res)
        return sum(row[lo:hi])


class Pool:
    """A fixed pool of threads (``size``; None: as many as asked) with a FIFO queue.

    :meth:`acquire` (in a task) returns holding a thread, after waiting in the queue
    if every thread is busy; with ``queue_limit`` a full queue raises
    :class:`PoolFull` at once. :meth:`release` hands the thread to the oldest waiter.
    """

    __slots__ = ("_clock", "_eng", "busy", "first_full_at", "gauge", "queue", "queue_gauge",
                 "queue_limit", "size")

    def __init__(self, eng: Engine, clock: SimClock, size: int | None, queue_limit: int | None,
                 gauge: Gauge, queue_gauge: Gauge) -> None:
        self._eng = eng
        self._clock = clock
        self.size = size
        self.queue_limit = queue_limit
        self.busy = 0
        self.queue: deque[greenlet.greenlet] = deque()
        self.gauge = gauge
        self.queue_gauge = queue_gauge
        self.first_full_at: float | None = None

    def acquire(self) -> None:
        size = self.size
        if size is None or self.busy < size:
            self.busy += 1
            self.gauge.add(1)
            if self.busy == size and self.first_full_at is None:
                self.first_full_at = self._eng.now
            return
        if self.queue_limit is not None and len(self.queue) >= self.queue_limit:
            raise PoolFull("every thread busy and the queue full")
        self.queue.append(greenlet.getcurrent())
        self.queue_gauge.add(1)
        main = self._clock.main
        assert main is not None
        main.switch()  # woken by release(), holding the thread it handed over

    def release(self) -> None:
        if self.queue:
            task = self.queue.popleft()
            self.queue_gauge.add(-1)
            self._eng._fire_now(task.switch)
            return
        self.busy -= 1
        self.gauge.add(-1)
