"""Bulkhead: never more than max_concurrent in flight, for threads and asyncio tasks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from stormguard import Bulkhead, BulkheadFull, ConfigError, DeadlineExceeded, Timeout
from stormguard.observability.events import BulkheadRejected, Event
from stormguard.testing import FakeClock
from tests.resilience.conftest import run_threads


class Gauge:
    """Counts calls in flight and remembers the maximum (thread-safe)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.done = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1
            self.done += 1

    def work(self, seconds: float = 0.002) -> None:
        self.enter()
        try:
            time.sleep(seconds)
        finally:
            self.leave()

    async def awork(self, seconds: float = 0.002) -> None:
        self.enter()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.leave()


@contextmanager
def held(bh: Bulkhead, for_seconds: float = 5.0) -> Iterator[threading.Event]:
    """A thread holds one slot of ``bh`` until the block ends (or ``for_seconds``)."""
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(for_seconds)

    t = threading.Thread(target=bh.call, args=(hold,))
    t.start()
    inside.wait(5)
    try:
        yield release
    finally:
        release.set()
        t.join()


def test_threads_never_exceed_max_concurrent() -> None:
    bh = Bulkhead(max_concurrent=3, max_wait=5.0)
    gauge = Gauge()


    def worker() -> None:
        for _ in range(5):
            bh.call(gauge.work)

    run_threads(worker, 12)
    assert gauge.peak == 3
    assert gauge.done == 60
    assert (bh.in_flight, bh.waiting) == (0, 0)


async def test_tasks_never_exceed_max_concurrent() -> None:
    bh = Bulkhead(max_concurrent=3, max_wait=5.0)
    gauge = Gauge()


    await asyncio.gather(*(bh.acall(gauge.awork, 0.001) for _ in range(40)))
    assert gauge.peak == 3
    assert gauge.done == 40
    assert (bh.in_flight, bh.waiting) == (0, 0)


async def test_threads_and_tasks_share_one_bulkhead() -> None:
    bh = Bulkhead(max_concurrent=2, max_wait=5.0)
    gauge = Gauge()



    def worker() -> None:
        for _ in range(5):
            bh.call(gauge.work, 0.001)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    await asyncio.gather(*(bh.acall(gauge.awork) for _ in range(15)))
    for t in threads:
        t.join()
    assert gauge.peak <= 2
    assert gauge.done == 30


def test_max_wait_zero_rejects_at_once(clock: FakeClock) -> None:
    events: list[Event] = []
    bh = Bulkhead(max_concurrent=1, clock=clock, listeners=(events.append,))
    with held(bh):
        began = time.monotonic()
        with pytest.raises(BulkheadFull):
            bh.call(int)
        assert time.monotonic() - began < 0.25  # no waiting (the holder keeps it 5 s)
    assert bh.call(int) == 0
    assert [(type(e), e.max_concurrent, e.waited) for e in events] == [
        (BulkheadRejected, 1, 0.0)]


async def test_async_max_wait_zero_rejects_at_once() -> None:
    bh = Bulkhead(max_concurrent=1)
    release = asyncio.Event()
    holder = asyncio.ensure_future(bh.acall(release.wait))
    await asyncio.sleep(0)
    with pytest.raises(BulkheadFull):
        await bh.acall(asyncio.sleep, 0)
    release.set()
    await holder


def test_waiter_gets_the_slot_when_one_frees_in_time() -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=2.0)
    with held(bh, for_seconds=0.02):
        assert bh.call(lambda: "got it") == "got it"


def test_waiter_times_out_after_max_wait() -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=0.02)
    with held(bh):
        began = time.monotonic()
        with pytest.raises(BulkheadFull):
            bh.call(int)
        assert 0.015 < time.monotonic() - began < 1.0
        assert bh.waiting == 0
    assert bh.in_flight == 0


async def test_async_waiter_times_out_and_cancelled_waiter_leaves_the_queue() -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=0.02)
    release = asyncio.Event()
    holder = asyncio.ensure_future(bh.acall(release.wait))
    await asyncio.sleep(0)
    with pytest.raises(BulkheadFull):
        await bh.acall(asyncio.sleep, 0)
    bh2 = Bulkhead(max_concurrent=1, max_wait=5.0)
    holder2 = asyncio.ensure_future(bh2.acall(release.wait))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(bh2.acall(asyncio.sleep, 0))
    await asyncio.sleep(0)
    assert bh2.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bh2.waiting == 0
    release.set()
    await asyncio.gather(holder, holder2)
    assert (bh.in_flight, bh2.in_flight) == (0, 0)


async def test_waiters_are_served_first_come_first_served() -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=5.0)
    order: list[int] = []
    release = asyncio.Event()
    holder = asyncio.ensure_future(bh.acall(release.wait))
    await asyncio.sleep(0)

    async def record(i: int) -> None:
        order.append(i)

    waiters = []
    for i in range(5):
        waiters.append(asyncio.ensure_future(bh.acall(record, i)))
        await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == [0, 1, 2, 3, 4]


def test_wait_is_clipped_to_the_deadline() -> None:
    bh = Bulkhead(max_concurrent=1, max_wait=10.0)
    with held(bh):
        began = time.monotonic()
        with pytest.raises(DeadlineExceeded) as info:  # it waited until the deadline, no longer
            Timeout(total=0.03).call(bh.call, int)
        assert isinstance(info.value.__cause__, BulkheadFull)
        assert time.monotonic() - began < 1.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_concurrent": 0}, "max_concurrent"), ({"max_wait": -1}, "max_wait"),
    ({"max_concurrent": 1.5}, "max_concurrent")])
def test_config_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bulkhead(**kwargs)
    assert info.value.field == field


async def test_no_slot_leaks_under_timeouts_cancellations_and_threads() -> None:
    """A storm of waiting, timing-out and cancelled callers: the limit holds, every slot returns."""
    bh = Bulkhead(max_concurrent=3, max_wait=0.01)
    gauge = Gauge()



    def thread_worker() -> None:
        for _ in range(20):
            with suppress(BulkheadFull):
                bh.call(gauge.work, 0.001)

    threads = [threading.Thread(target=thread_worker) for _ in range(3)]
    for t in threads:
        t.start()
    tasks = [asyncio.ensure_future(bh.acall(gauge.awork)) for _ in range(60)]
    await asyncio.sleep(0.003)
    for task in tasks[::4]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert "CancelledError" in {type(r).__name__ for r in results}
    for t in threads:
        t.join()
    assert gauge.peak <= 3
    assert gauge.done > 0
    assert all(r is None or isinstance(r, BulkheadFull | asyncio.CancelledError)
               for r in results)
    assert (bh.in_flight, bh.waiting) == (0, 0)
    assert [await bh.acall(gauge.awork) for _ in range(3)] == [None] * 3
