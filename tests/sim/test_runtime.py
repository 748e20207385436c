"""Simulated threads: sleeping in virtual time, waiting with a deadline, pools, gauges."""

from __future__ import annotations

import greenlet
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import CircuitBreaker, DeadlineExceeded, Retry, Timeout
from stormguard._core import deadline
from stormguard.sim.runtime import Gauge, Pool, PoolFull, Series, Waiter, new_engine, spawn


def test_tasks_sleep_in_virtual_time_and_interleave_by_time() -> None:
    eng, clock = new_engine()
    seen: list[tuple[str, float]] = []

    def task(name: str, naps: list[float]) -> None:
        for nap in naps:
            clock.sleep(nap)
            seen.append((name, eng.now))

    spawn(eng, clock, task, "a", [1.0, 1.0, 1.0])
    spawn(eng, clock, task, "b", [0.5, 2.0])
    eng.run()
    assert seen == [("b", 0.5), ("a", 1.0), ("a", 2.0), ("b", 2.5), ("a", 3.0)]
    assert eng.pending == 0


def test_sleep_outside_a_task_is_refused() -> None:
    _eng, clock = new_engine()
    with pytest.raises(RuntimeError, match="only a simulated task"):
        clock.sleep(1.0)


def test_a_task_error_propagates_out_of_run() -> None:
    eng, clock = new_engine()

    def bad() -> None:
        clock.sleep(1.0)
        raise ValueError("model bug")

    spawn(eng, clock, bad)
    with pytest.raises(ValueError, match="model bug"):
        eng.run()


def test_each_task_has_its_own_deadline_context() -> None:
    """A Timeout in one simulated request is invisible to the others (as per thread)."""
    eng, clock = new_engine()
    seen: dict[str, float | None] = {}

    def with_deadline() -> None:
        def inner() -> None:
            clock.sleep(0.2)
            seen["inner"] = deadline.remaining()
        Timeout(1.0, clock=clock).call(inner)

    def without() -> None:
        clock.sleep(0.1)
        seen["other"] = deadline.remaining()

    spawn(eng, clock, with_deadline)
    spawn(eng, clock, without)
    eng.run()
    assert seen["other"] is None
    assert seen["inner"] == pytest.approx(0.8)


def test_real_retry_sleeps_its_backoff_in_virtual_time() -> None:
    eng, clock = new_engine()
    attempts: list[float] = []

    def flaky() -> str:
        attempts.append(eng.now)
        if len(attempts) < 3:
            raise ConnectionError("down")
        return "ok"

    out: list[str] = []
    retry = Retry(attempts=3, base=1.0, multiplier=2.0, jitter="none", clock=clock)
    spawn(eng, clock, lambda: out.append(retry.call(flaky)))
    eng.run()
    assert out == ["ok"]
    assert attempts == [0.0, 1.0, 3.0]  # backoff 1 s then 2 s, virtual


def test_waiter_completion_and_expiry_whichever_first() -> None:
    eng, clock = new_engine()
    got: list[tuple[str, bool, float]] = []
    early, late = Waiter(eng, clock), Waiter(eng, clock)

    def waits(name: str, w: Waiter, timeout: float) -> None:
        got.append((name, w.wait(timeout), eng.now))

    spawn(eng, clock, waits, "early", early, 5.0)
    spawn(eng, clock, waits, "late", late, 1.0)
    eng.call_at(2.0, early.complete, "x")
    eng.call_at(3.0, late.complete, "y")  # after the give-up: ignored
    eng.run()
    assert got == [("late", False, 1.0), ("early", True, 2.0)]
    assert early.value == "x"
    assert late.value is None


def test_pool_never_exceeds_its_size_and_serves_fifo() -> None:
    eng, clock = new_engine()
    gauge, qgauge = Gauge(clock, 100, 1.0), Gauge(clock, 100, 1.0)
    pool = Pool(eng, clock, 3, None, gauge, qgauge)
    order: list[int] = []
    worst = [0]

    def request(i: int) -> None:
        pool.acquire()
        worst[0] = max(worst[0], pool.busy)
        order.append(i)
        clock.sleep(1.0)
        pool.release()

    for i in range(10):
        spawn(eng, clock, request, i)
    eng.run()
    assert order == list(range(10))
    assert worst[0] == 3
    assert pool.busy == 0
    assert pool.first_full_at == 0.0
    # 10 one-second requests on 3 threads: busy 3, 3, 3, then 1
    gauge.close(eng.now)
    assert gauge.area[:4] == [3.0, 3.0, 3.0, 1.0]
    assert qgauge.area[:3] == [7.0, 4.0, 1.0]


def test_pool_with_a_full_queue_refuses_at_once() -> None:
    eng, clock = new_engine()
    pool = Pool(eng, clock, 1, 1, Gauge(clock, 10, 1.0), Gauge(clock, 10, 1.0))
    outcome: list[str] = []

    def request() -> None:
        try:
            pool.acquire()
        except PoolFull:
            outcome.append(f"refused at {eng.now}")
            return
        clock.sleep(1.0)
        pool.release()
        outcome.append(f"served until {eng.now}")

    for _ in range(3):
        spawn(eng, clock, request)
    eng.run()
    assert sorted(outcome) == ["refused at 0.0", "served until 1.0", "served until 2.0"]


def test_gauge_integrates_across_buckets_exactly() -> None:
    eng, clock = new_engine()
    g = Gauge(clock, 10, 0.5)
    eng.call_at(0.25, g.add, 4)
    eng.call_at(1.75, g.add, -2)
    eng.run(until=2.5)
    g.close(eng.now)
    assert g.area[:5] == [1.0, 2.0, 2.0, 1.5, 1.0]
    assert g.mean(0.5, 1.5) == 4.0
    assert max(g.peak) == 4


def test_series_counts_per_bucket_and_rates() -> None:
    eng, clock = new_engine()
    s = Series(clock, 5, 1.0)
    for t in (0.1, 0.2, 1.5, 3.9, 99.0):
        eng.call_at(t, s.add, "x")
    eng.run()
    assert s.counts["x"] == [2, 1, 0, 1, 1]  # beyond the end: the last bucket
    assert s.rate("x", 0, 2) == 1.5
    assert s.total("x") == 5
    assert s.total("missing") == 0


def test_a_breaker_and_timeout_run_unchanged_inside_tasks() -> None:
    """The real blocking flow of the policies: a slow call times out (virtual), the
    breaker counts it, opens, and rejects the next calls at once."""
    eng, clock = new_engine()
    breaker = CircuitBreaker(window=2, min_calls=2, open_for=10.0, clock=clock, name="sms")
    timeout = Timeout(1.0, clock=clock)
    log: list[tuple[float, str]] = []

    def slow() -> None:
        d = deadline.current()
        assert d is not None
        clock.sleep(min(30.0, d.remaining()))  # a client that honours the deadline
        raise TimeoutError("no answer")

    def request() -> None:
        try:
            breaker.call(timeout.call, slow)
        except DeadlineExceeded:
            log.append((eng.now, "timed out"))
        except Exception as exc:
            log.append((eng.now, type(exc).__name__))

    spawn(eng, clock, request)
    spawn(eng, clock, request)
    eng.call_at(1.5, spawn, eng, clock, request)
    eng.run()
    assert log == [(1.0, "timed out"), (1.0, "timed out"), (1.5, "CircuitOpen")]
    assert breaker.state == "open"
    assert isinstance(greenlet.getcurrent(), greenlet.greenlet)


def test_reused_workers_start_each_task_in_a_fresh_context() -> None:
    """Worker greenlets are reused; a context variable left set by one task (a bug in
    the code it runs) is not seen by the next one."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    eng, clock = new_engine()
    seen: list[str] = []

    def leaky(i: int) -> None:
        seen.append(var.get())
        var.set(f"left by {i}")  # never reset
        clock.sleep(0.1)
        seen.append(var.get())  # its own value survives its own sleep

    for i in range(3):
        eng.call_at(float(i), spawn, eng, clock, leaky, i)
    eng.run()
    assert seen == ["unset", "left by 0", "unset", "left by 1", "unset", "left by 2"]
    assert len(clock._idle) == 1  # one worker served all three, one after the other


def test_gauge_matches_a_brute_force_integral() -> None:
    """Random changes at random times: each bucket's area equals the integral computed
    point by point (the fast same-bucket path and the bucket-crossing one agree)."""
    import random

    rng = random.Random(5)
    eng, clock = new_engine()
    g = Gauge(clock, 20, 0.5)
    changes = sorted((rng.uniform(0, 12), rng.choice([-1, 1, 2])) for _ in range(300))
    for t, d in changes:
        eng.call_at(t, g.add, d)
    eng.run(until=12.0)
    g.close(eng.now)
    level, expected = 0, [0.0] * 20
    points = [*changes, (12.0, 0)]
    last = 0.0
    for t, d in points:
        span_start = last
        while span_start < t:  # split [last, t] over the buckets, the last one open-ended
            i = min(int(span_start / 0.5), 19)
            end = t if i == 19 else min(t, (i + 1) * 0.5)
            expected[i] += level * (end - span_start)
            span_start = end
        level += d
        last = t
    assert g.area == pytest.approx(expected, abs=1e-9)


def test_gauge_past_its_last_bucket_accumulates_there() -> None:
    eng, clock = new_engine()
    g = Gauge(clock, 3, 1.0)
    eng.call_at(0.5, g.add, 2)
    eng.call_at(3.5, g.add, 1)  # past the last bucket (2)
    eng.call_at(4.5, g.add, -3)  # further past it
    eng.run(until=5.0)
    g.close(eng.now)
    assert g.area == [1.0, 2.0, 2.0 * 1.5 + 3.0 * 1.0]
    assert g.peak[2] == 3


_NAPS = st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 1.0, 0.3, 0.7]),
                           st.sampled_from(["heap", "a", "b"])), max_size=6)


@settings(max_examples=80, deadline=None)
@given(st.lists(_NAPS, min_size=1, max_size=6), st.lists(st.floats(0.0, 3.0), max_size=4))
def test_waits_through_lanes_run_in_exactly_the_heaps_order(
        programs: list[list[tuple[float, str]]], marks: list[float]) -> None:
    """A wait through a FIFO lane of the engine (the simulator's work steps and dependency
    answers) wakes at the time and in the order a plain ``sleep`` would, out-of-order
    waits on a lane, ties and public events included; pending and events_run agree."""

    def trace(lanes: bool) -> tuple[list[tuple[object, ...]], int, list[int]]:
        eng, clock = new_engine()
        lane = {"a": eng._lane(), "b": eng._lane()}
        seen: list[tuple[object, ...]] = []
        pending: list[int] = []

        def task(i: int, naps: list[tuple[float, str]]) -> None:
            for k, (nap, via) in enumerate(naps):
                if lanes and via != "heap":
                    clock._sleep_in(lane[via], nap)
                else:
                    clock.sleep(nap)
                seen.append((i, k, eng.now))
                pending.append(eng.pending)

        for i, naps in enumerate(programs):
            spawn(eng, clock, task, i, naps)
        for t in marks:
            eng.call_at(t, lambda t=t: seen.append(("mark", t, eng.now)))
        eng.run(until=2.0)
        pending.append(eng.pending)
        eng.run()
        assert eng.pending == 0
        return seen, eng.events_run, pending

    assert trace(True) == trace(False)
