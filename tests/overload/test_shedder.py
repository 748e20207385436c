"""The admission core: tiers as caps, hand-off to waiters by tier, the bounded wait,
CoDel's standing queue and newest-first service, threads and asyncio, events, stats."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import AdaptiveLimit, ConfigError, Shed
from stormguard.observability.events import Event, LimitChanged, RequestShed
from stormguard.overload import Shedder, Ticket
from stormguard.overload.shedder import CRITICAL, DEGRADED, SHEDDABLE
from stormguard.testing import FakeClock


def fill(s: Shedder, tier: int) -> list[Ticket]:
    out = []
    while isinstance(t := s.try_acquire(tier), Ticket):
        out.append(t)
    return out


@pytest.mark.parametrize(("limit", "caps"), [(10, (10, 8, 5)), (3, (3, 2, 1)), (2, (2, 1, 1)),
                                             (1, (1, 1, 1)), (7, (7, 5, 3))])
def test_tiers_are_caps_on_the_total_in_flight(limit: int, caps: tuple[int, int, int]) -> None:
    """A tier's request is admitted while fewer than floor(limit x share) slots are taken
    (at least 1), whatever tier holds them."""
    for tier in (SHEDDABLE, DEGRADED, CRITICAL):
        s = Shedder(limit, queue_timeout=0)
        assert len(fill(s, tier)) == caps[tier]
    s = Shedder(limit, queue_timeout=0)
    assert len(fill(s, SHEDDABLE)) == caps[SHEDDABLE]
    assert len(fill(s, DEGRADED)) == caps[DEGRADED] - caps[SHEDDABLE]
    assert len(fill(s, CRITICAL)) == caps[CRITICAL] - caps[DEGRADED]
    shed = s.try_acquire(SHEDDABLE)
    assert isinstance(shed, Shed)
    assert (shed.tier, shed.reason, shed.retry_after) == ("sheddable", "capacity", 1.0)
    st_ = s.stats()
    assert st_["in_flight"] == limit
    # each fill() ended on one shed request of its tier, then the one above
    assert st_["shed"] == {"critical": 1, "degraded": 1, "sheddable": 2}


def test_configured_shares() -> None:
    s = Shedder(10, shares={"sheddable": 0.2, "degraded": 0.6}, queue_timeout=0)
    assert [s.cap(t) for t in (CRITICAL, DEGRADED, SHEDDABLE)] == [10, 6, 2]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"shares": {"sheddable": 0.9}}, "shares"),      # more than degraded
    ({"shares": {"bulk": 0.1}}, "shares"),
    ({"shares": {"degraded": 1.5}}, "degraded"),
    ({"shares": [0.5]}, "shares"),
    ({"queue_timeout": -1}, "queue_timeout"),
    ({"queue_timeout": {"urgent": 0.5}}, "queue_timeout"),
    ({"queue_timeout": {"critical": -0.5}}, r"queue_timeout\['critical'\]"),
    ({"limit": 0}, "limit"),
    ({"limit": "20"}, "limit"),
    ({"max_queue": -1}, "max_queue"),
    ({"codel_target": 0}, "codel_target"),
])
def test_bad_configuration_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Shedder(**kwargs)  # type: ignore[arg-type]


def test_an_adaptive_limit_has_one_owner() -> None:
    limit = AdaptiveLimit()
    Shedder(limit)
    with pytest.raises(ConfigError, match="limit"):
        Shedder(limit)


def test_a_waiter_gets_the_freed_slot_within_its_wait_else_it_is_shed() -> None:
    clock = FakeClock()
    s = Shedder(1, queue_timeout=0.05, clock=clock)

    async def main() -> tuple[object, float, object, float]:
        held = s.try_acquire(CRITICAL)
        assert isinstance(held, Ticket)
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, s.release, held)
        t0 = clock.monotonic()
        got = await s.acquire_async(DEGRADED)
        waited = clock.monotonic() - t0
        t1 = clock.monotonic()
        late = await s.acquire_async(CRITICAL)  # nobody releases: shed at queue_timeout
        return got, waited, late, clock.monotonic() - t1

    got, waited, late, waited_late = clock.run(main())
    assert isinstance(got, Ticket)
    assert waited == pytest.approx(0.02)
    assert isinstance(late, Shed)
    assert late.reason == "queue_timeout"
    assert waited_late == pytest.approx(0.05)
    assert s.stats()["waiting"] == 0



def test_a_slot_freed_on_the_waiters_loop_resumes_it_in_the_next_round() -> None:
    """Released on the waiter's own event loop (a request finishing in the middleware),
    the slot's waiter runs in the loop's next round: not a round later through
    call_soon_threadsafe, whose wake-up of the loop is a system call (and, while a CPU-bound
    handler thread holds the GIL, a wait for it)."""
    clock = FakeClock()
    s = Shedder(1, queue_timeout=0.05, clock=clock)
    woken: list[object] = []

    async def main() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        held = s.try_acquire(CRITICAL)
        assert isinstance(held, Ticket)
        waiter = asyncio.create_task(s.acquire_async(CRITICAL))
        await asyncio.sleep(0)  # one loop iteration (no time passes): it waits for the slot
        assert s.waiting == 1
        threadsafe = loop.call_soon_threadsafe

        def counting(*args: object, **kwargs: object) -> asyncio.Handle:
            woken.append(args)
            return threadsafe(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        try:
            s.release(held)
            await asyncio.sleep(0)  # one loop iteration (no time passes)
        finally:
            del loop.call_soon_threadsafe
        done = waiter.done()
        got = await waiter
        assert isinstance(got, Ticket)
        s.release(got)
        return done, s.in_flight

    done, in_flight = clock.run(main())
    assert done  # resumed in the round after the release
    assert woken == []  # no wake-up of the loop through its self-pipe
    assert in_flight == 0


def test_each_tier_waits_its_own_queue_timeout() -> None:
    clock = FakeClock()
    s = Shedder(1, queue_timeout={"critical": 0.25, "sheddable": "10ms"}, clock=clock)
    assert s.queue_timeouts == {"critical": 0.25, "degraded": 0.05, "sheddable": 0.01}
    assert s.queue_timeout == 0.25  # the longest any request may wait

    async def waited(tier: int) -> tuple[float, object]:
        t0 = clock.monotonic()
        got = await s.acquire_async(tier)
        return clock.monotonic() - t0, got

    async def main() -> list[tuple[float, object]]:
        held = s.try_acquire(CRITICAL)
        assert isinstance(held, Ticket)
        return await asyncio.gather(waited(CRITICAL), waited(DEGRADED), waited(SHEDDABLE))

    outcomes = clock.run(main())
    # the sheddable one may be shed at once (it would wait in vain), never after 10 ms
    for (took, got), most in zip(outcomes, (0.25, 0.05, 0.01), strict=True):
        assert isinstance(got, Shed)
        assert took <= most + 1e-9
    assert outcomes[0][0] == pytest.approx(0.25)
    assert outcomes[1][0] == pytest.approx(0.05)

    clock2 = FakeClock()
    s2 = Shedder(1, queue_timeout={"degraded": 0.0}, clock=clock2)
    s2.try_acquire(CRITICAL)
    t0 = clock2.monotonic()
    shed = s2.acquire_blocking(DEGRADED)
    assert isinstance(shed, Shed)
    assert shed.reason == "capacity"  # a zero wait: shed at once, never queued
    assert clock2.monotonic() == t0


def test_freed_slots_go_to_the_most_important_waiter_its_cap_allowing() -> None:
    clock = FakeClock()
    s = Shedder(2, queue_timeout=1.0, clock=clock)
    order: list[str] = []

    async def wait(tier: int, name: str) -> None:
        got = await s.acquire_async(tier)
        if isinstance(got, Ticket):
            order.append(name)

    async def main() -> None:
        a, b = fill(s, CRITICAL)
        tasks = [asyncio.create_task(wait(SHEDDABLE, "sheddable")),
                 asyncio.create_task(wait(DEGRADED, "degraded")),
                 asyncio.create_task(wait(CRITICAL, "critical"))]
        await asyncio.sleep(0.01)  # virtual time (clock.run)
        s.release(a)
        await asyncio.sleep(0.01)  # virtual time (clock.run)
        assert order == ["critical"]  # first in line by tier, though it came last
        s.release(b)
        await asyncio.sleep(0.01)  # virtual time (clock.run)
        # one slot free of two: the degraded cap (1) is full, the sheddable cap (1) too
        assert order == ["critical"]
        assert s.stats()["waiting_by_tier"] == {"critical": 0, "degraded": 1, "sheddable": 1}
        await asyncio.gather(*tasks)

    clock.run(main())
    # fill() ended on one shed critical request; the two capped waiters timed out
    assert s.stats()["shed"] == {"critical": 1, "degraded": 1, "sheddable": 1}


def test_at_a_limit_of_one_the_freed_slot_goes_to_critical_before_earlier_waiters() -> None:
    """At limit 1 every tier's cap is 1: the tiers no longer keep a slot free, so what
    keeps critical traffic first is the hand-off: each freed slot goes to the most
    important waiter, however long the others have waited."""
    clock = FakeClock()
    s = Shedder(1, queue_timeout=1.0, clock=clock)
    order: list[str] = []

    async def wait(tier: int, name: str, hold: float) -> None:
        got = await s.acquire_async(tier)
        assert isinstance(got, Ticket)
        order.append(name)
        await asyncio.sleep(hold)  # virtual time (clock.run): the request runs
        s.release(got)

    async def main() -> None:
        busy = s.try_acquire(SHEDDABLE)
        assert isinstance(busy, Ticket)
        tasks = [asyncio.create_task(wait(SHEDDABLE, "sheddable", 0.01))]
        await asyncio.sleep(0.001)  # virtual time (clock.run)
        tasks.append(asyncio.create_task(wait(DEGRADED, "degraded", 0.01)))
        await asyncio.sleep(0.001)  # virtual time (clock.run)
        tasks += [asyncio.create_task(wait(CRITICAL, "critical-1", 0.01)),
                  asyncio.create_task(wait(CRITICAL, "critical-2", 0.01))]
        await asyncio.sleep(0.001)  # virtual time (clock.run)
        assert s.stats()["caps"] == {"critical": 1, "degraded": 1, "sheddable": 1}
        s.release(busy)
        await asyncio.gather(*tasks)

    clock.run(main())
    assert order == ["critical-1", "critical-2", "degraded", "sheddable"]
    assert s.stats()["shed"] == {"critical": 0, "degraded": 0, "sheddable": 0}


class _Recording(AdaptiveLimit):
    """An adaptive limit that keeps the in-flight count of every sample it is fed."""

    def __init__(self) -> None:
        super().__init__(initial=10)
        self.seen: list[float] = []

    def sample(self, rtt: float, now: float, in_flight: float, key: str = "") -> float | None:
        self.seen.append(in_flight)
        return super().sample(rtt, now, in_flight, key)


def test_a_request_is_sampled_at_the_mean_concurrency_of_its_life() -> None:
    """The limit learns from requests that ran alone (no-load baselines, "the machine is
    slow" holds) and from how much the others slowed the ones that did not: each sample
    carries the in-flight count averaged over the request's life, itself included. One
    that started alone but was joined did not run alone; one joined for a third of its
    life ran at 1 1/3."""
    clock = FakeClock()
    limit = _Recording()
    s = Shedder(limit, clock=clock)
    a = s.try_acquire(CRITICAL)  # alone when it starts
    assert isinstance(a, Ticket)
    assert a.in_flight == 1
    clock.advance(0.01)
    b = s.try_acquire(CRITICAL)  # joins it
    assert isinstance(b, Ticket)
    clock.advance(0.01)
    s.release(b)
    clock.advance(0.01)
    s.release(a)  # b ran beside a for 10 of a's 30 ms
    c = s.try_acquire(CRITICAL)
    assert isinstance(c, Ticket)
    clock.advance(0.01)
    s.release(c)  # nobody else started meanwhile: alone
    assert limit.seen == [pytest.approx(2.0), pytest.approx(4 / 3), pytest.approx(1.0)]


def test_a_standing_queue_sheds_arrivals_at_once_and_serves_newest_first() -> None:
    """CoDel: waiters stood more than 5 ms for a whole 100 ms: degraded and sheddable
    arrivals are shed on arrival (critical ones still wait), degraded and sheddable
    waiters are served newest first, critical ones first and in order; once the queue
    has stayed short for 100 ms, normal service resumes."""
    clock = FakeClock()
    events: list[Event] = []
    s = Shedder(1, queue_timeout=10.0, clock=clock, listeners=[events.append])
    served: list[int] = []

    async def waiter(i: int, tier: int) -> None:
        got = await s.acquire_async(tier)
        if isinstance(got, Ticket):
            served.append(i)
            await asyncio.sleep(0.010)  # each holds the one slot 10 ms: sojourns grow (virtual)
            s.release(got)

    async def main() -> None:
        held = s.try_acquire(CRITICAL)
        assert isinstance(held, Ticket)
        tasks = [asyncio.create_task(waiter(i, DEGRADED)) for i in range(30)]
        await asyncio.sleep(0.001)  # virtual time (clock.run)
        s.release(held)
        await asyncio.sleep(0.150)  # the queue has stood > 5 ms for more than 100 ms (virtual)
        assert s.overloaded()
        shed = await s.acquire_async(SHEDDABLE)
        assert isinstance(shed, Shed)
        assert shed.reason == "codel"
        late = [asyncio.create_task(waiter(100 + i, CRITICAL)) for i in range(3)]
        await asyncio.gather(*tasks, *late)
        # first in, first out until the queue had stood for 100 ms, then newest first for
        # degraded waiters; the late critical ones go before all of them, in order
        old = [i for i in served if i < 100]
        k = next(i for i in range(len(old) - 1) if old[i + 1] < old[i]) + 1
        assert 10 <= k <= 13, old
        assert old == sorted(old[:k]) + sorted(old[k:], reverse=True)
        at = served.index(100)
        assert served[at:at + 3] == [100, 101, 102]
        assert all(i < 100 for i in served[:at])
        assert s.overloaded()  # the queue just emptied: short for less than 100 ms
        await asyncio.sleep(0.101)  # virtual time (clock.run)
        assert not s.overloaded()
        got = await s.acquire_async(SHEDDABLE)
        assert isinstance(got, Ticket)

    clock.run(main())
    shed_events = [e for e in events if isinstance(e, RequestShed)]
    assert [(e.tier, e.reason) for e in shed_events] == [("sheddable", "codel")]
    assert s.stats()["shed_codel"] == 1


def test_a_cancelled_waiter_never_leaks_a_slot() -> None:
    clock = FakeClock()
    s = Shedder(1, queue_timeout=1.0, clock=clock)

    async def main() -> None:
        held = s.try_acquire(CRITICAL)
        assert isinstance(held, Ticket)
        task = asyncio.create_task(s.acquire_async(CRITICAL))
        await asyncio.sleep(0.01)  # virtual time (clock.run)
        s.release(held)  # the slot is handed to the task...
        task.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.in_flight == 0
        assert isinstance(s.try_acquire(CRITICAL), Ticket)

    clock.run(main())


def test_events_name_the_tier_and_limit_changes() -> None:
    events: list[Event] = []
    limit = AdaptiveLimit(initial=4, min=1, max=8, min_samples=1, window=0.0)
    clock = FakeClock()
    s = Shedder(limit, queue_timeout=0, clock=clock, listeners=[events.append])
    tickets = fill(s, SHEDDABLE)
    assert len(tickets) == 2
    assert isinstance(s.try_acquire(SHEDDABLE), Shed)
    for t in tickets:
        clock.advance(0.01)
        s.release(t)
    t = s.try_acquire(CRITICAL)
    assert isinstance(t, Ticket)
    clock.advance(0.1)  # 10x the no-load latency: the limit halves
    s.release(t)
    shed = [e for e in events if isinstance(e, RequestShed)]
    assert [(e.tier, e.reason, e.in_flight, e.limit) for e in shed] == [
        ("sheddable", "capacity", 2, 4)] * 2  # the one ending fill(), and ours
    changed = [e for e in events if isinstance(e, LimitChanged)]
    assert changed
    assert changed[-1].new < changed[-1].old
    assert changed[-1].ratio > 1.5


def test_threads_never_exceed_the_limit_and_never_crowd_out_critical_traffic() -> None:
    """16 real threads hammer the shedder with degraded and sheddable work (waiting for
    slots); they never hold more than 80 % of the limit, so critical requests from two
    more threads always find a slot at once, and the total never exceeds the limit."""
    s = Shedder(10, queue_timeout=0.01)
    stop = threading.Event()
    lock = threading.Lock()
    peak = {"low": 0, "all": 0}
    held = {"low": 0, "all": 0}
    critical_shed = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            got = s.acquire_blocking(rng.choice((DEGRADED, SHEDDABLE)))
            if not isinstance(got, Ticket):
                continue
            with lock:
                held["low"] += 1
                held["all"] += 1
                peak["low"] = max(peak["low"], held["low"])
                peak["all"] = max(peak["all"], held["all"])
            for _ in range(rng.randrange(50)):
                pass
            with lock:
                held["low"] -= 1
                held["all"] -= 1
            s.release(got)

    def critical() -> None:
        for _ in range(2000):
            got = s.try_acquire(CRITICAL)
            if not isinstance(got, Ticket):
                critical_shed.append(got)
                continue
            with lock:
                held["all"] += 1
                peak["all"] = max(peak["all"], held["all"])
            with lock:
                held["all"] -= 1
            s.release(got)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    crit = [threading.Thread(target=critical) for _ in range(2)]
    for t in crit:
        t.start()
    for t in crit:
        t.join()  # real threads: waiting for them to finish
    stop.set()
    for t in threads:
        t.join()  # real threads: waiting for them to finish
    assert critical_shed == []
    assert peak["low"] <= 8
    assert peak["all"] <= 10
    stats = s.stats()
    assert stats["in_flight"] == 0
    assert stats["waiting"] == 0
    assert stats["admitted"]["critical"] == 4000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "release"]), st.integers(0, 2),
                          st.integers(0, 50)), max_size=200),
       st.integers(1, 20))
def test_in_flight_accounting_matches_the_tickets(ops: list[tuple[str, int, int]],
                                                  limit: int) -> None:
    s = Shedder(limit, queue_timeout=0)
    held: list[Ticket] = []
    for op, tier, pick in ops:
        if op == "acquire":
            before = s.in_flight
            got = s.try_acquire(tier)
            if isinstance(got, Ticket):
                assert before < s.cap(tier)
                held.append(got)
            else:
                assert before >= s.cap(tier)
        elif held:
            s.release(held.pop(pick % len(held)))
        assert s.in_flight == len(held) <= limit
        by_tier = s.stats()["in_flight_by_tier"]
        assert [by_tier[t] for t in ("critical", "degraded", "sheddable")] == [
            sum(1 for h in held if h.tier == i) for i in range(3)]


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(1, 12),
       timeout=st.sampled_from([0.0, 0.005, 0.05, 0.2]),
       arrivals=st.lists(st.tuples(st.floats(0, 0.02), st.integers(0, 2), st.floats(0.001, 0.1)),
                         min_size=1, max_size=120))
def test_every_request_gets_an_outcome_within_its_wait_and_caps_hold(
        limit: int, timeout: float, arrivals: list[tuple[float, int, float]]) -> None:
    """Random arrivals in virtual time (gap, tier, how long it holds its slot): every
    request is admitted or shed, never both, never lost; none waits longer than
    queue_timeout; at every admission the slots taken were below the tier's cap; the
    total never exceeds the limit; everything is released in the end."""
    clock = FakeClock()
    s = Shedder(limit, queue_timeout=timeout, clock=clock)
    outcomes: list[str] = []
    over: list[int] = []

    async def one(tier: int, hold: float) -> None:
        t0 = clock.monotonic()
        got = await s.acquire_async(tier)
        waited = clock.monotonic() - t0
        assert waited <= timeout + 1e-9
        if isinstance(got, Ticket):
            outcomes.append("admitted")
            if got.in_flight > s.cap(tier):  # the slots taken at its admission, itself included
                over.append(got.in_flight)
            await asyncio.sleep(hold)  # virtual time (clock.run)
            s.release(got)
        else:
            outcomes.append("shed")

    async def main() -> None:
        tasks = []
        for gap, tier, hold in arrivals:
            await asyncio.sleep(gap)  # virtual time (clock.run)
            tasks.append(asyncio.create_task(one(tier, hold)))
        await asyncio.gather(*tasks)

    clock.run(main())
    assert len(outcomes) == len(arrivals)
    assert over == []
    stats = s.stats()
    assert stats["in_flight"] == 0
    assert stats["waiting"] == 0
    assert sum(stats["admitted"].values()) == outcomes.count("admitted")
    assert sum(stats["shed"].values()) == outcomes.count("shed")


def test_threads_and_tasks_share_one_shedder() -> None:
    """A WSGI thread pool and an event loop on one shedder (real threads, the system
    clock): slots handed between them, never more than the limit, nobody waits in vain
    while slots come free."""
    s = Shedder(2, queue_timeout=5.0)
    lock = threading.Lock()
    held = [0]
    peak = [0]
    shed: list[object] = []

    def work() -> None:
        with lock:
            held[0] += 1
            peak[0] = max(peak[0], held[0])
        for _ in range(3000):
            pass
        with lock:
            held[0] -= 1

    def thread_worker() -> None:
        for _ in range(100):
            got = s.acquire_blocking(CRITICAL)
            if not isinstance(got, Ticket):
                shed.append(got)
                continue
            work()
            s.release(got)

    async def task_worker() -> None:
        for _ in range(100):
            got = await s.acquire_async(CRITICAL)
            if not isinstance(got, Ticket):
                shed.append(got)
                continue
            work()
            await asyncio.sleep(0)  # one loop iteration
            s.release(got)

    async def main() -> None:
        await asyncio.gather(*(task_worker() for _ in range(4)))

    threads = [threading.Thread(target=thread_worker) for _ in range(4)]
    for t in threads:
        t.start()
    asyncio.run(main())
    for t in threads:
        t.join()  # real threads: waiting for them to finish
    assert shed == []
    assert peak[0] <= 2
    assert s.stats()["admitted"]["critical"] == 800
    assert s.in_flight == 0


def test_a_request_that_more_important_arrivals_would_overtake_is_shed_at_once() -> None:
    """A degraded request that finds the one slot taken waits only if it can expect a
    slot within its queue_timeout: critical requests arriving while it waits go first.
    With critical work arriving at 110 per second, 8 ms each (88 % of the slot), nobody
    ahead of it is enough to shed it at once; after a second of silence it waits."""
    clock = FakeClock()
    s = Shedder(1, clock=clock)
    for _ in range(60):
        t = s.try_acquire(CRITICAL)
        assert isinstance(t, Ticket)
        clock.advance(0.008)
        s.release(t)
        clock.advance(0.001)
    held = s.try_acquire(CRITICAL)
    assert isinstance(held, Ticket)
    got = s.enqueue(DEGRADED, "", threading.Event)
    assert isinstance(got, Shed)
    assert got.reason == "capacity"
    assert s.waiting == 0
    s.release(held)
    clock.advance(1.0)  # no critical request for a second: its rate has decayed
    held = s.try_acquire(CRITICAL)
    assert isinstance(held, Ticket)
    place = s.enqueue(DEGRADED, "", threading.Event)
    assert not isinstance(place, Shed | Ticket)
    assert s.waiting == 1
    s.release(held)
    assert isinstance(s.settle(place), Ticket)  # the freed slot went to it


def _one_slot_shedder(rtt: float) -> tuple[FakeClock, Shedder]:
    """A limit of one whose requests have taken ``rtt`` (critical ones, a second apart:
    their arrival rate is too low to matter)."""
    clock = FakeClock()
    s = Shedder(1, clock=clock)
    for _ in range(40):
        t = s.try_acquire(CRITICAL)
        assert isinstance(t, Ticket)
        clock.advance(rtt)
        s.release(t)
        clock.advance(1.0)
    return clock, s


def _wait_in_vain(clock: FakeClock, s: Shedder, tier: int) -> None:
    place = s.enqueue(tier, "", threading.Event)
    assert not isinstance(place, Shed | Ticket)
    clock.advance(0.05)  # its whole queue_timeout, the slot still taken
    shed = s.settle(place)
    assert isinstance(shed, Shed)
    assert shed.reason == "queue_timeout"


def test_a_wait_in_vain_makes_the_estimate_of_its_tier_more_careful_for_a_while() -> None:
    """Slots free every 30 ms: a degraded request expects to start within its 50 ms and
    waits. It waits in vain: the next one may count on half its wait (25 ms), so it is
    shed at once, while a sheddable one (its own tier's estimate unharmed) still waits.
    Without another miss the share grows back, doubling in 3 s, and degraded requests
    wait again."""
    clock, s = _one_slot_shedder(0.030)
    held = s.try_acquire(CRITICAL)
    assert isinstance(held, Ticket)
    _wait_in_vain(clock, s, DEGRADED)
    got = s.enqueue(DEGRADED, "", threading.Event)
    assert isinstance(got, Shed)
    assert got.reason == "capacity"
    place = s.enqueue(SHEDDABLE, "", threading.Event)
    assert not isinstance(place, Shed | Ticket)
    s.release(held)
    ticket = s.settle(place)
    assert isinstance(ticket, Ticket)  # the freed slot went to it
    clock.advance(0.030)
    s.release(ticket)
    clock.advance(0.4)  # the share has grown back to 0.55 only (0.5 x 2 ** (0.43 / 3))
    held = s.try_acquire(CRITICAL)
    assert isinstance(held, Ticket)
    assert isinstance(s.enqueue(DEGRADED, "", threading.Event), Shed)
    clock.advance(2.57)  # 3 s after the miss: the whole wait again
    place = s.enqueue(DEGRADED, "", threading.Event)
    assert not isinstance(place, Shed | Ticket)
    s.release(held)
    assert isinstance(s.settle(place), Ticket)


def test_misses_in_a_row_never_stop_a_request_that_would_start_soon_from_waiting() -> None:
    """Ten waits in vain in a row halve the share of the wait ten times, but never below
    an eighth (6.25 ms of 50): a request expecting its slot within 5 ms still waits."""
    clock, s = _one_slot_shedder(0.005)
    held = s.try_acquire(CRITICAL)
    assert isinstance(held, Ticket)
    for _ in range(10):
        _wait_in_vain(clock, s, DEGRADED)
    place = s.enqueue(DEGRADED, "", threading.Event)
    assert not isinstance(place, Shed | Ticket)
    s.release(held)
    assert isinstance(s.settle(place), Ticket)
