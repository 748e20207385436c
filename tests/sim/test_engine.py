"""The discrete-event engine: order, ties, cancellation, series, ``until``, bad input."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import ConfigError
from stormguard.sim import Engine
from stormguard.testing import FakeClock


def test_default_clock_is_a_fake_clock_and_now_is_its_monotonic_time() -> None:
    eng = Engine()
    assert isinstance(eng.clock, FakeClock)
    assert eng.now == eng.clock.monotonic()
    clock = FakeClock(monotonic_start=5.0)
    assert Engine(clock).clock is clock
    assert Engine(clock=clock).now == 5.0


def test_events_run_in_time_order_and_the_clock_is_at_each_events_time() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    seen: list[tuple[str, float]] = []

    def note(tag: str) -> None:
        seen.append((tag, eng.now))

    eng.call_at(3.0, note, "c")
    eng.call_later(1.0, note, "a")
    eng.call_at(2.0, note, "b")
    assert eng.pending == 3
    eng.run()
    assert seen == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert eng.pending == 0
    assert eng.now == 3.0


def test_ties_run_fifo_including_events_scheduled_now_by_a_running_event() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    seen: list[str] = []

    def first() -> None:
        seen.append("first")
        eng.call_later(0.0, seen.append, "scheduled-by-first")
        eng.call_at(0.5, seen.append, "past")  # in the past: runs now, after the others

    eng.call_at(1.0, first)
    for i in range(5):
        eng.call_at(1.0, seen.append, f"t{i}")
    eng.run()
    assert seen == ["first", "t0", "t1", "t2", "t3", "t4", "scheduled-by-first", "past"]
    assert eng.now == 1.0


def test_cancel_prevents_the_event_and_updates_pending() -> None:
    eng = Engine()
    seen: list[int] = []
    h1 = eng.call_later(1.0, seen.append, 1)
    eng.call_later(2.0, seen.append, 2)
    assert eng.pending == 2
    h1.cancel()
    h1.cancel()  # twice is harmless
    assert h1.cancelled
    assert eng.pending == 1
    eng.run()
    assert seen == [2]
    assert eng.pending == 0
    h1.cancel()
    assert eng.pending == 0


def test_a_handle_that_has_run_cannot_corrupt_pending() -> None:
    eng = Engine()
    h = eng.call_later(1.0, lambda: None)
    eng.run()
    h.cancel()
    assert eng.pending == 0


def test_run_until_stops_there_and_leaves_the_clock_at_until() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0, 4.0):
        eng.call_at(t, lambda: seen.append(eng.now))
    eng.run(until=2.0)  # events due exactly at `until` run
    assert seen == [1.0, 2.0]
    assert eng.now == 2.0
    eng.run(until=3.5)
    assert seen == [1.0, 2.0, 3.0]
    assert eng.now == 3.5
    assert eng.pending == 1
    eng.run(until=10.0)
    assert eng.now == 10.0  # left at until even with nothing more to run
    assert eng.pending == 0


def test_run_until_in_the_past_runs_nothing_and_never_moves_time_back() -> None:
    eng = Engine(FakeClock(monotonic_start=10.0))
    eng.call_at(11.0, lambda: None)
    eng.run(until=5.0)
    assert eng.now == 10.0
    assert eng.pending == 1


def test_every_repeats_without_drift_until_cancelled() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    times: list[float] = []
    h = eng.every(0.1, lambda: times.append(eng.now))
    assert eng.pending == 1
    eng.run(until=100.0)
    assert len(times) == 1000
    # the n-th run is at exactly first + n * interval (computed, not accumulated: summing
    # 0.1 a thousand times would drift)
    assert all(t == 0.1 + i * 0.1 for i, t in enumerate(times))
    assert eng.pending == 1
    h.cancel()
    assert eng.pending == 0
    eng.run(until=200.0)
    assert len(times) == 1000


def test_every_with_start_and_cancelled_from_inside_its_own_callback() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    times: list[float] = []
    holder: list[object] = []

    def tick(tag: str) -> None:
        times.append(eng.now)
        assert tag == "x"
        if len(times) == 3:
            holder[0].cancel()  # type: ignore[attr-defined]

    holder.append(eng.every(2.0, tick, "x", start=5.0))
    eng.run()  # returns: the series stopped itself
    assert times == [5.0, 7.0, 9.0]
    assert eng.pending == 0


def test_an_exception_propagates_and_the_rest_stays_scheduled() -> None:
    eng = Engine(FakeClock(monotonic_start=0.0))
    seen: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    eng.call_at(1.0, boom)
    eng.call_at(2.0, seen.append, 2)
    with pytest.raises(RuntimeError, match="boom"):
        eng.run()
    assert eng.now == 1.0
    assert eng.pending == 1
    eng.run()
    assert seen == [2]


def test_policies_given_the_engine_clock_see_event_time() -> None:
    from stormguard import CircuitBreaker, CircuitOpen

    eng = Engine()
    breaker = CircuitBreaker(window=1, min_calls=1, open_for=5.0, half_open_calls=1,
                             name="dep", clock=eng.clock)
    states: list[str] = []

    def fail() -> None:
        with pytest.raises(ZeroDivisionError):
            breaker.call(lambda: 1 / 0)

    start = eng.now
    eng.call_at(start + 1.0, fail)
    def probe() -> None:
        try:
            breaker.call(lambda: None)
        except CircuitOpen as exc:
            states.append(f"rejected, {exc.remaining:g} s left")
        else:
            states.append(breaker.state)

    eng.call_at(start + 3.0, probe)
    eng.call_at(start + 6.5, probe)  # open_for (5 s) has passed in virtual time
    eng.run()
    assert states == ["rejected, 3 s left", "closed"]


def test_bad_input_is_refused_naming_the_field() -> None:
    eng = Engine()
    with pytest.raises(TypeError, match="clock"):
        Engine(clock=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="delay"):
        eng.call_later(-1.0, lambda: None)
    with pytest.raises(ConfigError, match="when"):
        eng.call_at(float("nan"), lambda: None)
    with pytest.raises(ConfigError, match="interval"):
        eng.every(0.0, lambda: None)
    with pytest.raises(ConfigError, match="start"):
        eng.every(1.0, lambda: None, start="soon")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="until"):
        eng.run(until=float("inf"))
    assert eng.pending == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=1, max_size=60),
       st.integers(0, 60))
def test_matches_a_sorted_reference(events: list[tuple[int, bool]], until: int) -> None:
    """Random schedules with cancellations: the engine runs exactly the uncancelled events
    due by ``until``, sorted by (time, scheduling order)."""
    eng = Engine(FakeClock(monotonic_start=0.0))
    ran: list[int] = []
    handles = []
    for i, (t, _cancel) in enumerate(events):
        handles.append(eng.call_at(float(t), ran.append, i))
    for h, (_t, cancel) in zip(handles, events, strict=True):
        if cancel:
            h.cancel()
    expected = sorted((t, i) for i, (t, c) in enumerate(events) if not c and t <= until)
    eng.run(until=float(until))
    assert ran == [i for _t, i in expected]
    assert eng.pending == sum(1 for t, c in events if not c and t > until)
    assert eng.now == float(until)


def test_many_events_in_heap_order() -> None:
    """O(log n): 50,000 events pending at once run in order."""
    eng = Engine(FakeClock(monotonic_start=0.0))
    rng = random.Random(7)
    last = [-1.0]
    bad = [0]

    def check() -> None:
        if eng.now < last[0]:
            bad[0] += 1
        last[0] = eng.now

    for _ in range(50_000):
        eng.call_at(rng.uniform(0, 1000), check)
    eng.run()
    assert bad[0] == 0
    assert eng.events_run == 50_000
