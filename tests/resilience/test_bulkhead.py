"""Bulkhead: never more than max_concurrent in flight, for threads and asyncio tasks.

Time is a FakeClock's: tasks wait on its loop (``clock.run``), threads until the clock
is advanced. No test sleeps on the wall clock; threads meet through events and barriers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from stormguard import Bulkhead, BulkheadFull, ConfigError, DeadlineExceeded, Timeout
from stormguard.observability.events import BulkheadRejected, Event
from stormguard.testing import FakeClock
from tests.resilience.conftest import eventually, run_threads


class Gauge:
    """Counts calls in flight and remembers the maximum (thread-safe).

    The first ``fill`` calls wait inside until ``fill`` of them are in flight together,
    so the peak is reached for sure, with no timing involved.
    """

    def __init__(self, fill: int = 0) -> None:
        self.now = 0
        self.peak = 0
        self.done = 0
        self.lock = threading.Lock()
        self.full = threading.Event()
        self.fill = fill

    def enter(self) -> bool:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            if self.now >= self.fill:
                self.full.set()
            return self.full.is_set()

    def leave(self) -> None:
        with self.lock:
            self.now -= 1
            self.done += 1

    def work(self) -> None:
        if not self.enter():
            assert self.full.wait(30)
        self.leave()

    async def awork(self, seconds: float = 0.002) -> None:
        self.enter()
        try:
            await asyncio.sleep(seconds)  # virtual time on the clock's loop
        finally:
            self.leave()


@contextmanager
def held(bh: Bulkhead) -> Iterator[threading.Event]:
    """A thread holds one slot of ``bh`` until the block ends (or the event is set)."""
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        inside.set()
        assert release.wait(30)

    t = threading.Thread(target=bh.call, args=(hold,))
    t.start()
    assert inside.wait(30)
    try:
        yield release
    finally:
        release.set()
        t.join()


def test_threads_never_exceed_max_concurrent() -> None:
    bh = Bulkhead(max_concurrent=3, max_wait=30.0)
    gauge = Gauge(fill=3)

    def worker() -> None:
        for _ in range(5):
            bh.call(gauge.work)

    run_threads(worker, 12)
    assert gauge.peak == 3
    assert gauge.done == 60
    assert (bh.in_flight, bh.waiting) == (0, 0)


def test_tasks_never_exceed_max_concurrent_and_a_freed_slot_is_used_at_once(
        clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=3, max_wait=5.0, clock=clock)
    gauge = Gauge()

    async def main() -> float:
        t0 = clock.monotonic()
        await asyncio.gather(*(bh.acall(gauge.awork, 0.25) for _ in range(40)))
        return clock.monotonic() - t0

    assert clock.run(main()) == 14 * 0.25  # 40 calls, 3 at a time: 14 rounds, no gap
    assert gauge.peak == 3
    assert gauge.done == 40
    assert (bh.in_flight, bh.waiting) == (0, 0)


async def test_threads_and_tasks_share_one_bulkhead() -> None:
    bh = Bulkhead(max_concurrent=2, max_wait=30.0)
    gauge = Gauge()

    def worker() -> None:
        for _ in range(5):
            bh.call(gauge.work)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    await asyncio.gather(*(bh.acall(gauge.awork, 0) for _ in range(15)))
    for t in threads:
        t.join()
    assert gauge.peak <= 2
    assert gauge.done == 30
    assert (bh.in_flight, bh.waiting) == (0, 0)


def test_max_wait_zero_rejects_at_once(clock: FakeClock) -> None:
    events: list[Event] = []
    bh = Bulkhead(max_concurrent=1, clock=clock, listeners=(events.append,))
    with held(bh):  # the holder keeps its slot until the block ends: any wait would hang
        with pytest.raises(BulkheadFull):
            bh.call(int)
        assert clock.monotonic() == 100.0
    assert bh.call(int) == 0
    assert [(type(e), e.max_concurrent, e.waited) for e in events] == [
        (BulkheadRejected, 1, 0.0)]


def test_async_max_wait_zero_rejects_at_once(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, clock=clock)

    async def main() -> None:
        release = asyncio.Event()
        holder = asyncio.ensure_future(bh.acall(release.wait))
        await asyncio.sleep(0)
        with pytest.raises(BulkheadFull):
            await bh.acall(asyncio.sleep, 0)
        assert clock.monotonic() == 100.0
        release.set()
        await holder

    clock.run(main())


def test_waiter_gets_the_slot_when_one_frees_in_time(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=2.0, clock=clock)
    got: list[str] = []
    with held(bh) as release:
        waiter = threading.Thread(target=lambda: got.append(bh.call(lambda: "got it")))
        waiter.start()
        eventually(lambda: bh.waiting == 1)
        clock.advance(1.999)  # still within max_wait
        release.set()
        waiter.join()
    assert got == ["got it"]


def test_waiter_times_out_after_max_wait_on_the_clock(clock: FakeClock) -> None:
    events: list[Event] = []
    bh = Bulkhead(max_concurrent=1, max_wait=2.0, clock=clock, listeners=(events.append,))
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            bh.call(int)
        except BulkheadFull as exc:
            errors.append(exc)

    with held(bh):
        waiter = threading.Thread(target=wait)
        waiter.start()
        eventually(lambda: bh.waiting == 1)  # it waits, on the clock: nothing moves it
        clock.advance(2.0)
        waiter.join()
        assert bh.waiting == 0
    assert [type(e) for e in errors] == [BulkheadFull]
    assert [e.waited for e in events if isinstance(e, BulkheadRejected)] == [2.0]
    assert bh.in_flight == 0


def test_async_waiter_times_out_after_exactly_max_wait(clock: FakeClock) -> None:
    events: list[Event] = []
    bh = Bulkhead(max_concurrent=1, max_wait=0.75, clock=clock, listeners=(events.append,))

    async def main() -> float:
        release = asyncio.Event()
        holder = asyncio.ensure_future(bh.acall(release.wait))
        await asyncio.sleep(0)
        t0 = clock.monotonic()
        with pytest.raises(BulkheadFull):
            await bh.acall(asyncio.sleep, 0)
        waited = clock.monotonic() - t0
        release.set()
        await holder
        return waited

    assert clock.run(main()) == 0.75
    assert [e.waited for e in events if isinstance(e, BulkheadRejected)] == [0.75]
    assert (bh.in_flight, bh.waiting) == (0, 0)


def test_cancelled_async_waiter_leaves_the_queue(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=5.0, clock=clock)

    async def main() -> None:
        release = asyncio.Event()
        holder = asyncio.ensure_future(bh.acall(release.wait))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(bh.acall(asyncio.sleep, 0))
        await asyncio.sleep(0)
        assert bh.waiting == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert bh.waiting == 0
        release.set()
        await holder

    clock.run(main())
    assert bh.in_flight == 0


def test_waiters_are_served_first_come_first_served(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=5.0, clock=clock)
    order: list[int] = []

    async def record(i: int) -> None:
        order.append(i)

    async def main() -> None:
        release = asyncio.Event()
        holder = asyncio.ensure_future(bh.acall(release.wait))
        await asyncio.sleep(0)
        waiters = []
        for i in range(5):
            waiters.append(asyncio.ensure_future(bh.acall(record, i)))
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(holder, *waiters)

    clock.run(main())
    assert order == [0, 1, 2, 3, 4]


def test_wait_is_clipped_to_the_deadline(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=10.0, clock=clock)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            Timeout(total=3.0, clock=clock).call(bh.call, int)
        except DeadlineExceeded as exc:
            errors.append(exc)

    with held(bh):
        waiter = threading.Thread(target=wait)
        waiter.start()
        eventually(lambda: bh.waiting == 1)
        clock.advance(3.0)  # the deadline, not max_wait: it gives up now
        waiter.join()
    assert [type(e) for e in errors] == [DeadlineExceeded]
    assert isinstance(errors[0].__cause__, BulkheadFull)


def test_async_wait_is_clipped_to_the_deadline(clock: FakeClock) -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=10.0, clock=clock)

    async def main() -> float:
        release = asyncio.Event()
        holder = asyncio.ensure_future(bh.acall(release.wait))
        await asyncio.sleep(0)
        t0 = clock.monotonic()
        with pytest.raises(DeadlineExceeded) as info:
            await Timeout(total=3.0, clock=clock).acall(bh.acall, asyncio.sleep, 0)
        assert isinstance(info.value.__cause__, BulkheadFull | asyncio.CancelledError)
        waited = clock.monotonic() - t0
        release.set()
        await holder
        return waited

    assert clock.run(main()) == 3.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_concurrent": 0}, "max_concurrent"), ({"max_wait": -1}, "max_wait"),
    ({"max_concurrent": 1.5}, "max_concurrent")])
def test_config_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bulkhead(**kwargs)
    assert info.value.field == field


def test_no_slot_leaks_under_timeouts_cancellations_and_threads(clock: FakeClock) -> None:
    """A storm of waiting, timing-out and cancelled callers: the limit holds, every slot returns.

    Tasks wait in virtual time; threads wait on the same clock, which the loop moves.
    """
    bh = Bulkhead(max_concurrent=3, max_wait=0.01, clock=clock)
    gauge = Gauge()

    def thread_worker() -> None:
        for _ in range(20):
            with suppress(BulkheadFull):
                bh.call(gauge.work)

    async def main() -> list[Any]:
        threads = [threading.Thread(target=thread_worker) for _ in range(3)]
        for t in threads:
            t.start()
        tasks = [asyncio.ensure_future(bh.acall(gauge.awork)) for _ in range(60)]
        await asyncio.sleep(0.003)
        for task in tasks[::4]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for t in threads:
            t.join()
        assert [await bh.acall(gauge.awork) for _ in range(3)] == [None] * 3
        return results

    results = clock.run(main())
    assert "CancelledError" in {type(r).__name__ for r in results}
    assert "BulkheadFull" in {type(r).__name__ for r in results}
    assert gauge.peak <= 3
    assert gauge.done > 0
    assert all(r is None or isinstance(r, BulkheadFull | asyncio.CancelledError)
               for r in results)
    assert (bh.in_flight, bh.waiting) == (0, 0)
