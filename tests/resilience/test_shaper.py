"""Shaper in one process: departures exactly ``per / rate`` apart, in arrival order; the
rejections (max_wait, max_queue, the deadline) book nothing; pause and retry_after.

Time is a FakeClock's: blocking calls sleep on it (it advances at once), asyncio calls
run on its loop (``clock.run``), so every departure time is exact. Departures are compared
in integer microseconds (the shaper's own resolution).
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import (
    ConfigError,
    DeadlineExceeded,
    MemoryStore,
    Pipeline,
    Shaper,
    ShaperFull,
    StormguardError,
    Timeout,
    TransientError,
)
from stormguard.deadline import scope
from stormguard.observability.events import (
    Event,
    ShaperPaused,
    ShaperRejected,
    ShaperWaited,
)
from stormguard.testing import FakeClock


def us(t: float) -> int:
    return round(t * 1_000_000)


def gaps(times: list[float]) -> set[int]:
    return {us(b) - us(a) for a, b in itertools.pairwise(times)}


def gather(clock: FakeClock, shaper: Shaper, n: int, *, at_once: bool = True,
           fn: Any = None) -> tuple[list[float], list[Any]]:
    """``n`` asyncio calls arriving together (in index order); departure times and outcomes."""
    departed: list[float] = []
    order: list[int] = []

    async def call(i: int) -> int:
        departed.append(clock.monotonic())
        order.append(i)
        if fn is not None:
            fn(i)
        return i

    async def main() -> list[Any]:
        return await asyncio.gather(*(shaper.acall(call, i) for i in range(n)),
                                    return_exceptions=True)

    results = clock.run(main())
    assert order == sorted(order), "departures must be in arrival order"
    return departed, results


# -- pacing --------------------------------------------------------------------------------
def test_100_blocking_calls_at_10_per_second_leave_exactly_100ms_apart(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, per=1.0, clock=clock)
    departed: list[float] = []
    start = clock.monotonic()
    for _ in range(100):
        shaper.call(lambda: departed.append(clock.monotonic()))
    assert gaps(departed) == {100_000}
    assert us(departed[0]) == us(start)
    assert shaper.stats()["departed"] == 100
    assert shaper.stats()["waited"] == 99


def test_100_asyncio_calls_at_10_per_second_leave_exactly_100ms_apart_in_order(
        clock: FakeClock) -> None:
    shaper = Shaper(rate=10, per=1.0, max_wait=None, clock=clock)
    start = clock.monotonic()
    departed, results = gather(clock, shaper, 100)
    assert results == list(range(100))
    assert gaps(departed) == {100_000}
    assert us(departed[-1]) - us(start) == 9_900_000


def test_per_and_rate_give_the_interval(clock: FakeClock) -> None:
    shaper = Shaper(rate=3, per=2.0, max_wait=None, clock=clock)
    departed, _ = gather(clock, shaper, 7)
    # 2/3 s apart, rounded up to the microsecond of the schedule: never early
    assert gaps(departed) == {666_667}
    assert shaper.interval == pytest.approx(2 / 3)


def test_burst_lets_n_leave_back_to_back_then_the_pace(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, burst=5, max_wait=None, clock=clock)
    departed, _ = gather(clock, shaper, 12)
    t0 = us(departed[0])
    assert [us(t) - t0 for t in departed] == [0] * 5 + [k * 100_000 for k in range(1, 8)]


def test_an_idle_shaper_lets_the_next_call_go_at_once(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, clock=clock)
    shaper.call(lambda: None)
    clock.advance(5.0)
    before = clock.monotonic()
    shaper.call(lambda: None)
    assert clock.monotonic() == before  # no wait: the slot was free


@settings(max_examples=40, deadline=None)
@given(rate=st.integers(1, 50), burst=st.integers(1, 4),
       arrivals=st.lists(st.floats(0, 0.5), min_size=1, max_size=30))
def test_no_window_ever_holds_more_than_the_rate_allows(rate: int, burst: int,
                                                        arrivals: list[float]) -> None:
    """Property: whatever the arrivals, departures k apart are at least (k - burst + 1)
    intervals apart, and nobody waits longer than the queue ahead of it requires."""
    clock = FakeClock()
    shaper = Shaper(rate=rate, burst=burst, max_wait=None, clock=clock)
    interval = 1_000_000 / rate
    departed: list[int] = []

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        await shaper.acall(_record, departed, clock)

    async def main() -> None:
        await asyncio.gather(*(one(d) for d in arrivals))

    clock.run(main())
    departed.sort()
    for i in range(len(departed)):
        for j in range(i + burst, len(departed)):
            assert departed[j] - departed[i] >= (j - i - burst + 1) * interval - 1


async def _record(out: list[int], clock: FakeClock) -> None:
    out.append(us(clock.monotonic()))


# -- rejections book nothing ---------------------------------------------------------------
def test_max_wait_rejects_at_once_and_books_nothing(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=2.0, clock=clock)
    start = clock.monotonic()
    departed, results = gather(clock, shaper, 100)
    accepted = [r for r in results if not isinstance(r, BaseException)]
    rejected = [r for r in results if isinstance(r, ShaperFull)]
    assert accepted == list(range(21))  # waits 0, 0.1, ..., 2.0
    assert len(rejected) == 79
    assert all(r.reason == "max_wait" for r in rejected)
    assert rejected[0].retry_after == pytest.approx(0.1)  # its slot was 2.1 s away
    assert us(departed[-1]) - us(start) == 2_000_000
    # the 79 rejections booked nothing: the next slot is right after the 21st
    after: list[float] = []
    shaper.call(lambda: after.append(clock.monotonic()))
    assert us(after[0]) - us(start) == 2_100_000
    assert shaper.stats()["rejected_max_wait"] == 79


def test_blocking_max_wait_rejection_books_nothing(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=0.05, clock=clock)
    start = clock.monotonic()
    shaper.call(lambda: None)
    with pytest.raises(ShaperFull) as info:
        shaper.call(lambda: None)  # slot 0.1 s away: beyond 0.05
    assert info.value.retry_after == pytest.approx(0.05)
    assert clock.monotonic() == start  # rejected at once, no wait
    clock.advance(0.06)
    times: list[float] = []
    shaper.call(lambda: times.append(clock.monotonic()))  # slot 0.1 after the first
    assert us(times[0]) - us(start) == 100_000


def test_max_queue_rejects_when_that_many_wait_and_books_nothing(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=None, max_queue=3, clock=clock)
    start = clock.monotonic()
    departed, results = gather(clock, shaper, 6)
    assert results[:4] == [0, 1, 2, 3]  # one leaves now, three wait
    assert [r.reason for r in results[4:]] == ["max_queue", "max_queue"]
    assert results[4].retry_after == pytest.approx(0.1)
    assert [us(t) - us(start) for t in departed] == [0, 100_000, 200_000, 300_000]
    assert shaper.stats()["rejected_max_queue"] == 2
    assert shaper.waiting == 0


def test_max_queue_zero_means_never_wait(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=None, max_queue=0, clock=clock)
    _, results = gather(clock, shaper, 3)
    assert results[0] == 0
    assert all(isinstance(r, ShaperFull) for r in results[1:])


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_deadline_in_force_rejects_and_books_nothing(clock: FakeClock,
                                                         use_async: bool) -> None:
    shaper = Shaper(rate=10, max_wait=5.0, clock=clock)
    start = clock.monotonic()
    shaper.call(lambda: None)  # the next slot is 0.1 s away
    if use_async:
        async def main() -> None:
            async def nothing() -> None:
                return None
            await Timeout(0.05, clock=clock).acall(shaper.acall, nothing)
        with pytest.raises(ShaperFull) as info:
            clock.run(main())
    else:
        with scope(0.05, clock), pytest.raises(ShaperFull) as info:
            shaper.call(lambda: None)
    assert info.value.reason == "deadline"
    assert clock.monotonic() == start
    times: list[float] = []
    shaper.call(lambda: times.append(clock.monotonic()))
    assert us(times[0]) - us(start) == 100_000  # the rejected call took no slot
    assert shaper.stats()["rejected_deadline"] == 1


def test_a_deadline_already_passed_is_rejected_without_booking(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, clock=clock)
    with scope(1.0, clock):
        clock.advance(2.0)
        with pytest.raises(ShaperFull) as info:
            shaper.call(lambda: None)
    assert info.value.reason == "deadline"
    shaper.call(lambda: None)  # the schedule is untouched: goes at once
    assert shaper.stats()["departed"] == 1


def test_a_wait_within_the_deadline_is_taken(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=5.0, clock=clock)
    shaper.call(lambda: None)
    with scope(0.5, clock):
        shaper.call(lambda: None)
    assert shaper.stats()["waited"] == 1


# -- pause ---------------------------------------------------------------------------------
def test_pause_nobody_departs_before_it_ends(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, clock=clock)
    start = clock.monotonic()
    shaper.call(lambda: None)
    shaper.pause(5.0)
    assert shaper.stats()["paused_for"] == pytest.approx(5.0)
    with pytest.raises(ShaperFull) as info:  # 5 s away is beyond max_wait=1.0
        shaper.call(lambda: None)
    assert info.value.reason == "paused"
    assert info.value.retry_after == pytest.approx(4.0)
    clock.advance(4.5)
    times: list[float] = []
    for _ in range(3):
        shaper.call(lambda: times.append(clock.monotonic()))
    assert [us(t) - us(start) for t in times] == [5_000_000, 5_100_000, 5_200_000]


def test_waiters_booked_before_a_pause_book_again_after_it(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=10.0, clock=clock)
    start = clock.monotonic()
    departed: list[float] = []

    async def record() -> None:
        departed.append(clock.monotonic())

    async def main() -> None:
        tasks = [asyncio.ensure_future(shaper.acall(record)) for _ in range(5)]
        await asyncio.sleep(0.15)  # two have left (0.0, 0.1); three wait for 0.2..0.4
        await shaper.apause(1.0)
        await asyncio.gather(*tasks)

    clock.run(main())
    rel = [us(t) - us(start) for t in departed]
    assert rel[:2] == [0, 100_000]
    assert all(t >= 1_150_000 for t in rel[2:])  # none inside the pause
    assert gaps(departed[2:]) == {100_000}  # and the pace again after it
    assert shaper.stats()["departed"] == 5


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_error_with_retry_after_pauses_the_shaper(clock: FakeClock, use_async: bool) -> None:
    shaper = Shaper(rate=10, max_wait=10.0, clock=clock)
    seen: list[Event] = []
    shaper.add_listener(seen.append)
    start = clock.monotonic()

    def provider_429() -> None:
        raise TransientError("429 Too Many Requests", retry_after=3.0)

    if use_async:
        async def a429() -> None:
            provider_429()
        with pytest.raises(TransientError):
            clock.run(shaper.acall(a429))
    else:
        with pytest.raises(TransientError):
            shaper.call(provider_429)
    times: list[float] = []
    shaper.call(lambda: times.append(clock.monotonic()))
    assert us(times[0]) - us(start) == 3_000_000
    paused = [e for e in seen if isinstance(e, ShaperPaused)]
    assert len(paused) == 1
    assert paused[0].seconds == 3.0
    assert isinstance(paused[0].cause, TransientError)


def test_retry_after_is_capped_and_stormguard_errors_do_not_pause(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=None, max_pause=2.0, clock=clock)
    start = clock.monotonic()

    class Http429(Exception):
        retry_after = 3600

    with pytest.raises(Http429):
        shaper.call(_raise, Http429())
    shaper.call(lambda: None)
    assert us(clock.monotonic()) - us(start) == 2_000_000  # capped at max_pause
    for exc in (ShaperFull("inner", retry_after=9.0), TransientError("x"),
                ValueError("no retry_after")):
        with pytest.raises(type(exc)):
            shaper.call(_raise, exc)
    assert shaper.stats()["pauses"] == 1
    off = Shaper(rate=10, pause_on_retry_after=False, clock=clock)
    with pytest.raises(Http429):
        off.call(_raise, Http429())
    assert off.stats()["pauses"] == 0


def _raise(exc: BaseException) -> None:
    raise exc


# -- composition ---------------------------------------------------------------------------
def test_decorator_sync_and_async(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, clock=clock)

    @shaper
    def send(to: str) -> str:
        return f"sent {to}"

    @shaper
    async def asend(to: str) -> str:
        return f"sent {to}"

    start = clock.monotonic()
    assert send("a") == "sent a"
    assert clock.run(asend("b")) == "sent b"
    assert us(clock.monotonic()) - us(start) == 100_000
    assert send.__name__ == "send"


def test_in_a_pipeline_inside_a_timeout(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=5.0, clock=clock)
    pipe = Pipeline(Timeout(0.25, clock=clock), shaper)
    results = []
    for _ in range(3):
        try:
            results.append(pipe.call(lambda: "ok"))
        except ShaperFull as exc:
            results.append(exc.reason)
    assert results == ["ok", "ok", "ok"]  # sequential: each waits 0.1 s, within 0.25
    shaper = Shaper(rate=10, max_wait=5.0, clock=clock)

    async def burst() -> list[Any]:
        async def ok() -> str:
            return "ok"
        return await asyncio.gather(*(Pipeline(Timeout(0.25, clock=clock), shaper).acall(ok)
                                      for _ in range(5)), return_exceptions=True)

    got = clock.run(burst())
    assert got[:3] == ["ok", "ok", "ok"]  # waits 0, 0.1, 0.2 fit in 0.25
    assert [g.reason for g in got[3:]] == ["deadline", "deadline"]


def test_a_timeout_inside_still_bounds_the_call(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, clock=clock)

    async def slow() -> None:
        await asyncio.sleep(10)

    with pytest.raises(DeadlineExceeded):
        clock.run(Pipeline(shaper, Timeout(1.0, clock=clock)).acall(slow))


def test_a_cancelled_waiter_leaves_the_queue(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=None, clock=clock)

    async def nothing() -> None:
        return None

    async def main() -> None:
        await shaper.acall(nothing)
        task = asyncio.ensure_future(shaper.acall(nothing))
        await asyncio.sleep(0.05)
        assert shaper.waiting == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert shaper.waiting == 0

    clock.run(main())


# -- events, stats, errors -----------------------------------------------------------------
def test_events_for_waits_and_rejections(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=0.15, clock=clock)
    seen: list[Event] = []
    shaper.add_listener(seen.append)
    gather(clock, shaper, 3)
    waited = [e for e in seen if isinstance(e, ShaperWaited)]
    rejected = [e for e in seen if isinstance(e, ShaperRejected)]
    assert [round(e.wait, 6) for e in waited] == [0.1]
    assert len(rejected) == 1
    assert rejected[0].reason == "max_wait"
    assert rejected[0].wait == pytest.approx(0.2)
    assert rejected[0].policy == "shaper"
    s = shaper.stats()
    assert (s["departed"], s["waited"], s["rejected"], s["waiting"]) == (2, 1, 1, 0)


def test_shaper_full_is_a_stormguard_error_that_pickles() -> None:
    exc = ShaperFull("full", retry_after=1.5, reason="max_queue", name="sms")
    assert isinstance(exc, StormguardError)
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.retry_after, back.reason, back.name) == ("full", 1.5,
                                                                     "max_queue", "sms")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"rate": 0}, "rate"), ({"rate": -1}, "rate"), ({"rate": "500"}, "rate"),
    ({"rate": 10, "per": 0}, "per"), ({"rate": 10, "burst": 0}, "burst"),
    ({"rate": 10, "burst": 1.5}, "burst"), ({"rate": 10, "max_wait": -1}, "max_wait"),
    ({"rate": 10, "max_queue": -1}, "max_queue"), ({"rate": 10, "on_error": "x"}, "on_error"),
    ({"rate": 10, "key": "k"}, "key"), ({"rate": 10, "store": 42}, "store"),
    ({"rate": 10, "store": "nope://x"}, "store"),
    ({"rate": 10, "expected_instances": 0}, "expected_instances"),
    ({"rate": 10, "max_pause": -1}, "max_pause"),
    ({"rate": 1e-9}, "rate"),
])
def test_bad_options_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Shaper(**kwargs)
    assert info.value.field == field


def test_pause_validates_its_argument(clock: FakeClock) -> None:
    with pytest.raises(ConfigError) as info:
        Shaper(rate=10, clock=clock).pause(-1)
    assert info.value.field == "seconds"


def test_repr_and_interval() -> None:
    shaper = Shaper(rate=500, per=1.0, max_wait=2.0)
    assert shaper.interval == 0.002
    assert "rate=500" in repr(shaper)
    assert "max_wait=2.0" in repr(shaper)


def test_a_memory_store_shared_by_two_shapers_is_one_pace(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    a = Shaper(rate=10, max_wait=None, store=store, key="sms", clock=clock)
    b = Shaper(rate=10, max_wait=None, store=store, key="sms", clock=clock)
    start = clock.monotonic()
    times: list[float] = []
    for s in (a, b, a, b):
        s.call(lambda: times.append(clock.monotonic()))
    assert [us(t) - us(start) for t in times] == [0, 100_000, 200_000, 300_000]


def test_a_store_without_a_shared_pause_waits_the_local_one_out(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, max_wait=3.0, store=MemoryStore(clock=clock), key="k",
                    clock=clock)
    start = clock.monotonic()
    shaper.pause(2.0)
    times: list[float] = []
    for _ in range(2):
        shaper.call(lambda: times.append(clock.monotonic()))
    assert [us(t) - us(start) for t in times] == [2_000_000, 2_100_000]
    shaper.pause(5.0)
    with pytest.raises(ShaperFull) as info:
        shaper.call(lambda: None)
    assert info.value.reason == "paused"


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 10**6), window=st.sampled_from([1.0, 2.0, 7.0, 60.0]),
       burst=st.integers(1, 20),
       trace=st.lists(st.tuples(st.integers(0, 3_000_000),
                                st.one_of(st.none(), st.integers(0, 2_000_000))),
                      min_size=1, max_size=40))
def test_the_schedule_is_gcra_reserve(limit: int, window: float, burst: int,
                                      trace: list[tuple[int, int | None]]) -> None:
    """The in-process schedule books exactly what ``Algorithm.reserve`` of gcra books."""
    from stormguard import Rule
    from stormguard.resilience.shaper import _Schedule

    rule = Rule(limit, window, "gcra", burst)
    clock = FakeClock(monotonic_start=100.0)
    schedule = _Schedule(rule, clock)
    state: Any = None
    for step_us, budget_us in trace:
        clock.advance(step_us / 1_000_000)
        now = round(clock.monotonic() * 1_000_000)
        max_wait = 2**62 if budget_us is None else budget_us
        ok, at, new = rule._algo.reserve(state, now, 1, max_wait, True)
        got_ok, got_wait = schedule.book(None if budget_us is None else budget_us / 1e6,
                                         float("-inf"))
        assert (got_ok, round(got_wait * 1_000_000)) == (ok, at - now)
        if ok:
            state = new
            assert schedule.tat == state[0]


def test_a_full_shaper_inside_a_breaker_is_not_a_dependency_failure(clock: FakeClock) -> None:
    from stormguard import CircuitBreaker

    breaker = CircuitBreaker(window=4, failure_rate=0.5, min_calls=4, clock=clock)
    shaper = Shaper(rate=1, max_wait=0.0, clock=clock)
    pipe = Pipeline(breaker, shaper)
    pipe.call(lambda: None)
    for _ in range(10):  # the provider was never asked: the breaker must not open
        with pytest.raises(ShaperFull):
            pipe.call(lambda: None)
    assert breaker.state == "closed"


def test_real_threads_never_leave_faster_than_the_pace() -> None:
    """8 real threads x 25 calls through one 2,000/s shaper on the real clock (real time:
    what is checked is that the lock makes concurrent bookings distinct slots). Lateness
    only delays a departure, so the k-th departure is at least k intervals after the
    first, however the OS schedules the threads."""
    import threading
    import time

    shaper = Shaper(rate=2000, max_wait=None)
    out: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        for _ in range(25):
            shaper.call(lambda: None)
            t = time.monotonic()
            with lock:
                out.append(t)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.sort()
    assert len(out) == 200
    assert all(out[k] - out[0] >= k * 0.0005 - 0.001 for k in range(200))
    assert shaper.stats()["departed"] == 200
    assert shaper.waiting == 0


def test_repr_never_shows_the_store_url(clock: FakeClock) -> None:
    shaper = Shaper(rate=10, store=MemoryStore(clock=clock), key="sms", clock=clock)
    assert repr(shaper) == ("Shaper(rate=10, per=1, max_wait=1.0, burst=1, store=MemoryStore, "
                            "key='sms')")
