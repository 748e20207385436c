"""BreakerMachine (stormguard._core.breaker): the one state machine, driven directly."""

from __future__ import annotations

import threading

import pytest

from stormguard import CircuitBreaker, CircuitOpen
from stormguard._core.breaker import BreakerMachine
from stormguard.testing import FakeClock
from tests.resilience.conftest import Boom


def machine(clock: FakeClock, **kwargs: object) -> tuple[BreakerMachine, list[tuple[str, str]],
                                                         list[str]]:
    changes: list[tuple[str, str]] = []
    rejects: list[str] = []
    m = BreakerMachine(clock=clock, on_change=lambda old, new, now: changes.append((old, new)),
                       on_reject=lambda reason, remaining, now: rejects.append(reason),
                       **kwargs)  # type: ignore[arg-type]
    return m, changes, rejects


def trip(m: BreakerMachine) -> None:
    """Fail calls through the permission protocol until the machine opens."""
    while m.state_code == 0:
        m.on_failure(m.acquire())


# -- the probe lease ----------------------------------------------------------------------

def test_a_trial_whose_outcome_never_comes_gives_its_slot_back_after_the_lease(
        clock: FakeClock) -> None:
    m, changes, rejects = machine(clock, window=2, min_calls=2, open_for=5, half_open_calls=1,
                                  probe_lease=10.0)
    trip(m)
    clock.advance(5)
    lost = m.acquire()  # the trial's caller vanishes: no outcome, no release
    assert m.state == "half_open"
    with pytest.raises(CircuitOpen) as info:
        m.acquire()
    assert info.value.remaining == 0.0
    clock.advance(9.999)
    with pytest.raises(CircuitOpen):
        m.acquire()
    clock.advance(0.001)  # the lease is over: the slot is back
    trial = m.acquire()
    assert trial == lost  # same half-open epoch
    with pytest.raises(CircuitOpen):
        m.acquire()  # one slot, leased again
    m.on_success(trial)
    assert m.state == "closed"
    m.on_failure(lost)  # the lost outcome turns up after all: from an old epoch, ignored
    assert m.snapshot() == (0, 0, 0)
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert rejects == ["half_open_full"] * 3


def test_a_late_release_after_the_lease_does_not_give_the_slot_back_twice(
        clock: FakeClock) -> None:
    """Regression: the lease handed the slot of a slow trial on, then that trial's
    release() gave it back again: two trials in flight with half_open_calls=1."""
    m, _, _ = machine(clock, window=2, min_calls=2, open_for=5, half_open_calls=1,
                      probe_lease=10.0)
    trip(m)
    clock.advance(5)
    slow = m.acquire()
    clock.advance(10)
    m.acquire()  # the lease handed the slow trial's slot on
    m.release(slow)  # the slow trial ends after all, without a verdict
    with pytest.raises(CircuitOpen):
        m.acquire()  # still exactly one trial in flight
    clock.advance(10)
    m.on_success(m.acquire())  # and the lease still heals a lost one
    assert m.state == "closed"


def test_without_a_lease_a_lost_trial_keeps_its_slot(clock: FakeClock) -> None:
    m, _, _ = machine(clock, window=2, min_calls=2, open_for=5, half_open_calls=1)
    trip(m)
    clock.advance(5)
    epoch = m.acquire()
    clock.advance(10**6)
    with pytest.raises(CircuitOpen):
        m.acquire()
    m.release(epoch)  # ended without a verdict: the slot goes back
    m.on_success(m.acquire())
    assert m.state == "closed"


def test_the_lease_gives_back_one_slot_per_lease_period(clock: FakeClock) -> None:
    m, _, _ = machine(clock, window=2, min_calls=2, open_for=5, half_open_calls=2,
                      probe_lease=3.0)
    trip(m)
    clock.advance(5)
    m.acquire()
    m.acquire()
    clock.advance(3.0)
    ok = m.acquire()  # one slot back...
    with pytest.raises(CircuitOpen):
        m.acquire()  # ...not both at once
    m.on_success(ok)
    assert m.state == "half_open"  # one success of two
    clock.advance(3.0)
    m.on_success(m.acquire())
    assert m.state == "closed"


# -- outcome-only reporting ---------------------------------------------------------------

def test_success_and_failure_attribute_outcomes_to_the_current_state(clock: FakeClock) -> None:
    m, changes, _ = machine(clock, window=3, failure_rate=1.0, min_calls=3, open_for=5,
                            half_open_calls=2)
    for _ in range(2):
        m.failure()
    m.success()
    m.failure()
    m.failure()
    assert m.state == "closed"  # never 3 failures in a row
    m.failure()
    assert m.state == "open"
    m.success()
    m.failure()  # outcomes while open count for nothing
    clock.advance(5)
    m.acquire()
    m.success()
    assert m.state == "half_open"
    m.acquire()
    m.success()
    assert m.state == "closed"
    m.failure()
    assert m.snapshot() == (1, 1, 0)  # a fresh window
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_half_open_failure_reopens(clock: FakeClock) -> None:
    m, _, _ = machine(clock, window=1, min_calls=1, open_for=5, half_open_calls=3)
    m.failure()
    clock.advance(5)
    m.acquire()
    m.failure()
    assert m.state == "open"
    assert m.remaining() == 5.0


def test_outcome_only_successes_are_never_slow(clock: FakeClock) -> None:
    """Regression: success() recorded its call as started at monotonic 0, so with
    slow_call_duration every outcome-only success counted as slow (and opened)."""
    m, _, _ = machine(clock, window=4, min_calls=4, slow_call_duration=1.0, slow_call_rate=0.5)
    for _ in range(10):
        m.success()
    assert m.state == "closed"
    assert m.snapshot() == (4, 0, 0)
    t = FakeClock()
    timed, _, _ = machine(t, window=10.0, window_type="time", min_calls=3,
                          slow_call_duration=1.0, slow_call_rate=0.5)
    for _ in range(5):
        timed.success()
    assert timed.snapshot() == (5, 0, 0)


# -- "N consecutive failures" -------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_consecutive_failures_configuration(clock: FakeClock, n: int) -> None:
    m, _, _ = machine(clock, window=n, failure_rate=1.0, min_calls=n, open_for=5)
    for _ in range(3):
        for _ in range(n - 1):
            m.on_failure(m.acquire())
        m.on_success(m.acquire())  # breaks the run
        assert m.state == "closed"
    for _ in range(n):
        m.on_failure(m.acquire())
    assert m.state == "open"


def test_n_consecutive_failures_through_the_policy(clock: FakeClock) -> None:
    b = CircuitBreaker(window=3, failure_rate=1.0, min_calls=3, clock=clock)
    outcomes = [False, False, True, False, False, True, False, False]  # True: succeeds
    for good in outcomes:
        if good:
            b.call(int)
        else:
            with pytest.raises(Boom):
                b.call(_boom)
    assert b.state == "closed"
    with pytest.raises(Boom):
        b.call(_boom)
    assert b.state == "open"


def _boom() -> None:
    raise Boom


# -- real threads -------------------------------------------------------------------------

@pytest.mark.parametrize("half_open_calls", [1, 3, 7])
def test_half_open_admits_exactly_half_open_calls_of_many_threads(
        clock: FakeClock, half_open_calls: int) -> None:
    m = BreakerMachine(window=2, min_calls=2, open_for=5, half_open_calls=half_open_calls,
                       clock=clock)
    threads_n = 48
    for _ in range(10):  # rounds: open -> half-open -> a crowd at once -> closed
        trip(m)
        clock.advance(5)
        admitted, rejected = _crowd(m, threads_n)
        assert len(admitted) == half_open_calls
        assert rejected == threads_n - half_open_calls
        assert m.state == "half_open"
        for epoch in admitted:
            m.on_success(epoch)
        assert m.state == "closed"


def _crowd(m: BreakerMachine, n: int) -> tuple[list[int], int]:
    """``n`` real threads call ``m.acquire()`` at once: (epochs admitted, rejections)."""
    start = threading.Barrier(n)
    admitted: list[int] = []
    rejected: list[int] = []
    lock = threading.Lock()

    def caller() -> None:
        start.wait()
        try:
            epoch = m.acquire()
        except CircuitOpen:
            with lock:
                rejected.append(1)
            return
        with lock:
            admitted.append(epoch)

    threads = [threading.Thread(target=caller) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return admitted, len(rejected)
