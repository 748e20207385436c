"""CircuitBreaker scenarios, run through call and acall; real threads for the concurrency claims."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from stormguard import BulkheadFull, CircuitBreaker, CircuitOpen, ConfigError, Shed, Throttled
from stormguard._core.errors import ShaperFull
from stormguard.observability.events import CallRejected, Event, StateChanged
from stormguard.testing import FakeClock
from tests.resilience.conftest import Boom, Mode, failing, ok, run_threads


async def fail_n(mode: Mode, breaker: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        with pytest.raises(Boom):
            await mode.call(breaker, failing())


async def succeed_n(mode: Mode, breaker: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        assert await mode.call(breaker, ok()) == "ok"


async def test_opens_at_failure_rate_once_min_calls_recorded(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=10, failure_rate=0.5, min_calls=10, open_for=30, clock=clock)
    await fail_n(mode, b, 5)
    await succeed_n(mode, b, 4)
    assert b.state == "closed"  # 9 calls < min_calls even though 5/9 failed
    await succeed_n(mode, b, 1)
    assert b.state == "open"  # 10th call: 5/10 >= 0.5


async def test_below_failure_rate_stays_closed(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=10, failure_rate=0.5, min_calls=10, clock=clock)
    for _ in range(5):  # alternating, but the last 10 always hold 4 failures at most
        await succeed_n(mode, b, 2)
        await fail_n(mode, b, 1)
    assert b.state == "closed"
    assert b.snapshot() == (10, 4, 0)


async def test_count_window_forgets_old_outcomes(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, failure_rate=0.75, min_calls=4, clock=clock)
    await fail_n(mode, b, 2)
    await succeed_n(mode, b, 6)  # the two failures slid out
    await fail_n(mode, b, 2)
    assert b.snapshot() == (4, 2, 0)
    assert b.state == "closed"
    await fail_n(mode, b, 1)
    assert b.state == "open"


async def test_open_rejects_without_calling_and_reports_remaining(mode: Mode,
                                                                  clock: FakeClock) -> None:
    b = CircuitBreaker(window=2, min_calls=2, open_for=30, clock=clock)
    await fail_n(mode, b, 2)
    calls = []
    clock.advance(10)
    err = await mode.outcome(b, lambda: calls.append(1))
    assert isinstance(err, CircuitOpen)
    assert err.remaining == pytest.approx(20.0)
    assert err.name == "breaker"
    assert calls == []


async def test_half_open_success_closes_with_fresh_window(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, min_calls=4, open_for=30, half_open_calls=3, clock=clock)
    await fail_n(mode, b, 4)
    clock.advance(30)
    assert b.state == "open"  # the move to half-open happens on the next call
    await succeed_n(mode, b, 2)
    assert b.state == "half_open"
    await succeed_n(mode, b, 1)
    assert b.state == "closed"
    assert b.snapshot() == (0, 0, 0)


async def test_half_open_failure_reopens_for_open_for(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, min_calls=4, open_for=30, half_open_calls=3, clock=clock)
    await fail_n(mode, b, 4)
    clock.advance(31)
    await succeed_n(mode, b, 2)
    await fail_n(mode, b, 1)
    assert b.state == "open"
    clock.advance(29.9)
    err = await mode.outcome(b, ok())
    assert isinstance(err, CircuitOpen)
    assert err.remaining == pytest.approx(0.1)


async def test_half_open_admits_exactly_n_sequentially_in_flight(clock: FakeClock) -> None:
    """While the trials are running, any further caller is rejected with remaining=0."""
    b = CircuitBreaker(window=2, min_calls=2, open_for=5, half_open_calls=2, clock=clock)
    _open_then_half_open(b, clock)
    gate = asyncio.Event()

    async def trial() -> str:
        await gate.wait()
        return "ok"

    t1 = asyncio.ensure_future(b.acall(trial))
    t2 = asyncio.ensure_future(b.acall(trial))
    await asyncio.sleep(0)
    with pytest.raises(CircuitOpen) as info:
        await b.acall(trial)
    assert info.value.remaining == 0.0
    gate.set()
    assert await asyncio.gather(t1, t2) == ["ok", "ok"]
    assert b.state == "closed"


async def _araise() -> None:
    raise Boom


async def test_exceptions_marked_not_failures_are_not_counted(mode: Mode,
                                                              clock: FakeClock) -> None:
    class BadRequest(Exception):
        pass

    b = CircuitBreaker(window=2, min_calls=2, clock=clock,
                       failure_on=lambda e: not isinstance(e, BadRequest))
    for _ in range(5):
        with pytest.raises(BadRequest):
            await mode.call(b, failing(BadRequest()))
    assert b.snapshot() == (0, 0, 0)
    assert b.state == "closed"
    b2 = CircuitBreaker(window=2, min_calls=2, clock=clock, failure_on=(Boom,))
    with pytest.raises(ValueError, match="x"):
        await mode.call(b2, failing(ValueError("x")))
    assert b2.snapshot() == (0, 0, 0)


async def test_inner_rejections_are_not_failures(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=2, min_calls=2, clock=clock)
    for exc in (CircuitOpen(), BulkheadFull(), ShaperFull(), Shed(), Throttled(),
                CircuitOpen()):
        assert isinstance(await mode.outcome(b, failing(exc)), type(exc))
    assert b.snapshot() == (0, 0, 0)


async def test_cancellation_is_not_a_failure_and_frees_a_trial_slot(clock: FakeClock) -> None:
    b = CircuitBreaker(window=2, min_calls=2, open_for=5, half_open_calls=1, clock=clock)
    _open_then_half_open(b, clock)
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.sleep(60)  # never waited: cancelled at once

    task = asyncio.ensure_future(b.acall(hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.state == "half_open"
    assert await b.acall(_aok) == "ok"  # the slot came back
    assert b.state == "closed"


async def _aok() -> str:
    return "ok"


def test_keyboard_interrupt_is_not_a_failure(clock: FakeClock) -> None:
    b = CircuitBreaker(window=1, min_calls=1, clock=clock)
    with pytest.raises(KeyboardInterrupt):
        b.call(failing(KeyboardInterrupt()))
    assert b.state == "closed"
    assert b.snapshot() == (0, 0, 0)


async def test_slow_calls_open_it(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, min_calls=4, slow_call_duration=1.0, slow_call_rate=0.5,
                       clock=clock)

    def slow() -> str:
        clock.advance(1.0)  # at the threshold counts as slow
        return "ok"

    def quick() -> str:
        clock.advance(0.999)
        return "ok"

    for fn in (quick, slow, quick):
        await mode.call(b, fn)
    assert b.snapshot() == (3, 0, 1)
    await mode.call(b, slow)
    assert b.state == "open"  # 2 slow of 4, no failure at all


async def test_slow_trial_reopens(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=1, min_calls=1, slow_call_duration=1.0, open_for=5,
                       half_open_calls=2, clock=clock)
    await fail_n(mode, b, 1)
    clock.advance(5)

    def slow() -> str:
        clock.advance(2)
        return "ok"

    assert await mode.call(b, slow) == "ok"
    assert b.state == "open"


async def test_time_window_expires_old_calls(mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=10.0, window_type="time", min_calls=4, failure_rate=0.5,
                       clock=clock)
    await fail_n(mode, b, 3)
    clock.advance(10.5)  # those failures are out of the window now
    await succeed_n(mode, b, 3)
    await fail_n(mode, b, 1)
    assert b.snapshot() == (4, 1, 0)
    assert b.state == "closed"
    clock.advance(5)
    await fail_n(mode, b, 2)
    assert b.state == "open"  # 3 of 6 in the last 10 s


async def test_time_window_opens_on_success_when_min_calls_reached_late(
        mode: Mode, clock: FakeClock) -> None:
    b = CircuitBreaker(window=60.0, window_type="time", min_calls=3, failure_rate=0.5,
                       clock=clock)
    await fail_n(mode, b, 2)
    await succeed_n(mode, b, 1)
    assert b.state == "open"  # 2/3 >= 0.5 as soon as min_calls is reached


async def test_force_open_force_closed_reset_and_events(mode: Mode, clock: FakeClock) -> None:
    events: list[Event] = []
    b = CircuitBreaker(window=1, min_calls=1, clock=clock, listeners=(events.append,))
    b.force_open()
    assert b.state == "open"
    assert b.forced == "open"
    clock.advance(10_000)
    err = await mode.outcome(b, ok())
    assert isinstance(err, CircuitOpen)
    assert err.remaining == float("inf")
    b.force_closed()
    await fail_n(mode, b, 3)
    assert b.state == "closed"  # forced closed records nothing
    b.reset()
    assert b.forced is None
    await fail_n(mode, b, 1)
    assert b.state == "open"
    changes = [(e.old, e.new) for e in events if isinstance(e, StateChanged)]
    assert changes == [("closed", "open"), ("open", "closed"), ("closed", "open")]
    rejected = [e for e in events if isinstance(e, CallRejected)]
    assert [r.reason for r in rejected] == ["forced_open"]


async def test_state_change_events_full_cycle(mode: Mode, clock: FakeClock) -> None:
    events: list[Any] = []
    b = CircuitBreaker(window=2, min_calls=2, open_for=5, half_open_calls=1, clock=clock)
    b.add_listener(events.append)
    await fail_n(mode, b, 2)
    await mode.outcome(b, ok())
    clock.advance(5)
    await succeed_n(mode, b, 1)
    assert [(e.old, e.new) for e in events if isinstance(e, StateChanged)] == [
        ("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert [e.reason for e in events if isinstance(e, CallRejected)] == ["open"]


async def test_outcome_of_a_call_from_before_a_transition_is_ignored(clock: FakeClock) -> None:
    b = CircuitBreaker(window=2, min_calls=2, open_for=5, half_open_calls=1, clock=clock)
    gate = asyncio.Event()

    async def slow_fail() -> None:
        await gate.wait()
        raise Boom

    straggler = asyncio.ensure_future(b.acall(slow_fail))
    await asyncio.sleep(0)
    _open_then_half_open(b, clock)
    assert await b.acall(_aok) == "ok"
    assert b.state == "closed"
    gate.set()
    with pytest.raises(Boom):
        await straggler
    assert b.snapshot() == (0, 0, 0)  # admitted in the old closed epoch: not recorded


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"window": 0}, "window"),
    ({"window": 2.5}, "window"),
    ({"window": 5, "min_calls": 6}, "min_calls"),
    ({"failure_rate": 0}, "failure_rate"),
    ({"failure_rate": 1.5}, "failure_rate"),
    ({"open_for": -1}, "open_for"),
    ({"half_open_calls": 0}, "half_open_calls"),
    ({"slow_call_duration": 0}, "slow_call_duration"),
    ({"window_type": "sliding"}, "window_type"),
    ({"failure_on": (1,)}, "failure_on"),
])
def test_config_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        CircuitBreaker(**kwargs)
    assert info.value.field == field


# -- real threads and tasks ----------------------------------------------------------------------

def _open_then_half_open(b: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(int(b.window)):
        with pytest.raises(Boom):
            b.call(failing())
    clock.advance(b.open_for)


def test_half_open_admits_exactly_n_of_64_threads(clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, min_calls=4, open_for=5, half_open_calls=3, clock=clock)
    _open_then_half_open(b, clock)
    start = threading.Barrier(64)
    release = threading.Event()
    admitted: list[int] = []
    rejected: list[int] = []
    changed = threading.Condition()

    def trial(i: int) -> None:
        with changed:
            admitted.append(i)
        assert release.wait(30)  # the trials stay in flight until every other caller is in

    def worker(i: int) -> None:
        start.wait()
        try:
            b.call(trial, i)
        except CircuitOpen:
            with changed:
                rejected.append(i)
                changed.notify_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    with changed:  # an event wait, not a sleep: every caller but the trials comes back
        assert changed.wait_for(lambda: len(rejected) == 61, timeout=30)
        assert len(admitted) == 3
    release.set()
    for t in threads:
        t.join()
    assert len(admitted) == 3
    assert len(rejected) == 61
    assert b.state == "closed"


async def test_half_open_admits_exactly_n_of_64_tasks(clock: FakeClock) -> None:
    b = CircuitBreaker(window=4, min_calls=4, open_for=5, half_open_calls=3, clock=clock)
    _open_then_half_open(b, clock)
    release = asyncio.Event()
    admitted = 0

    async def trial() -> None:
        nonlocal admitted
        admitted += 1
        await release.wait()

    tasks = [asyncio.ensure_future(b.acall(trial)) for _ in range(64)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert admitted == 3
    assert sum(isinstance(r, CircuitOpen) for r in results) == 61
    assert b.state == "closed"


def test_no_lock_held_during_the_call(clock: FakeClock) -> None:
    """4 threads are inside one breaker's call at the same time (they meet at a barrier
    there: with a lock held during the call, the barrier would break)."""
    b = CircuitBreaker(window=10, min_calls=10, slow_call_duration=5.0, clock=clock)
    inside = threading.Barrier(4, timeout=30)
    run_threads(lambda: b.call(inside.wait), 4)
    assert not inside.broken
    assert b.snapshot() == (4, 0, 0)


def test_concurrent_records_are_not_lost() -> None:
    b = CircuitBreaker(window=10_000, min_calls=10_000, failure_rate=1.0)

    def worker() -> None:
        for _ in range(1000):
            b.call(int)

    run_threads(worker, 4)
    assert b.snapshot() == (4000, 0, 0)
