"""The shedder's standing queue sheds only the arrivals that would wait (issue 15 §1:
"a request that gets no slot waits at most queue_timeout; when waiting requests have
stood in the queue ... new sheddable and degraded arrivals are shed at once"), and its
public two-step acquire (:meth:`Shedder.enqueue` / :meth:`Shedder.settle`) for a caller
that waits by its own means, as the simulator does."""

from __future__ import annotations

import asyncio
import threading

from stormguard import Shed
from stormguard.overload.shedder import CRITICAL, DEGRADED, SHEDDABLE, Shedder, Ticket, Waiting
from stormguard.testing import FakeClock


def test_a_standing_queue_sheds_only_arrivals_that_find_no_slot() -> None:
    """A limit of 10 (caps: sheddable 5, degraded 8, critical 10), 5 slots held and three
    sheddable requests queued for 150 ms: the queue stands. A degraded arrival that finds
    a slot under its cap takes it, standing queue or not; one that finds none (8 of 8) is
    shed at once (``codel``), never queued; a critical arrival still gets its slot."""
    clock = FakeClock()
    s = Shedder(10, queue_timeout=10.0, clock=clock)

    async def main() -> None:
        held = [s.try_acquire(CRITICAL) for _ in range(5)]
        assert all(isinstance(t, Ticket) for t in held)
        waiters = [asyncio.create_task(s.acquire_async(SHEDDABLE)) for _ in range(3)]
        await asyncio.sleep(0.150)  # virtual time (clock.run): they stand 150 ms
        assert s.waiting == 3
        free = [await s.acquire_async(DEGRADED) for _ in range(3)]  # in flight 5, 6, 7 < 8
        assert all(isinstance(t, Ticket) for t in free)
        assert s.overloaded()  # the queue stands: the three were admitted all the same
        before = clock.monotonic()
        shed = await s.acquire_async(DEGRADED)  # 8 of 8: it would wait: shed at once
        assert isinstance(shed, Shed)
        assert shed.reason == "codel"
        assert clock.monotonic() == before  # at once, no wait
        assert s.waiting == 3  # not queued
        crit = await s.acquire_async(CRITICAL)  # 8 of 10
        assert isinstance(crit, Ticket)
        stats = s.stats()
        assert stats["shed_codel"] == 1
        assert stats["admitted"] == {"critical": 6, "degraded": 3, "sheddable": 0}
        for t in [*held, *free, crit]:
            assert isinstance(t, Ticket)
            s.release(t)
        got = await asyncio.gather(*waiters)  # the freed slots went to the waiters
        assert all(isinstance(t, Ticket) for t in got)

    clock.run(main())


def test_enqueue_and_settle_decide_as_acquire_blocking() -> None:
    """A slot at once is a Ticket and a full queue's arrival is shed (``event`` never
    called); a request that must wait gets its place, whose event the shedder sets when
    it hands the place a slot: ``settle`` then gives that ticket. A place never handed a
    slot is shed by ``settle`` (``queue_timeout``) and leaves the queue."""
    clock = FakeClock()
    s = Shedder(1, queue_timeout=0.5, max_queue=1, clock=clock)
    made: list[threading.Event] = []

    def event() -> threading.Event:
        made.append(threading.Event())
        return made[-1]

    first = s.enqueue(CRITICAL, "a", event)
    assert isinstance(first, Ticket)
    assert made == []
    place = s.enqueue(CRITICAL, "b", event)
    assert isinstance(place, Waiting)
    assert place.event is made[0]
    assert not made[0].is_set()
    assert s.waiting == 1
    full = s.enqueue(DEGRADED, "c", event)  # no slot, and the queue holds max_queue
    assert isinstance(full, Shed)
    assert full.reason == "capacity"
    assert len(made) == 1
    clock.advance(0.1)
    s.release(first)  # the slot goes to the place
    assert made[0].is_set()
    granted = s.settle(place)
    assert isinstance(granted, Ticket)
    assert granted.key == "b"
    assert s.in_flight == 1
    assert s.waiting == 0
    late = s.enqueue(CRITICAL, "d", event)
    assert isinstance(late, Waiting)
    clock.advance(0.5)  # nobody releases: the caller's wait ends in vain
    shed = s.settle(late)
    assert isinstance(shed, Shed)
    assert shed.reason == "queue_timeout"
    assert s.waiting == 0
    assert s.stats()["shed_queue_timeout"] == 1
