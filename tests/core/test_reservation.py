"""Reservations: the earliest time ``cost`` is admitted, optionally booked (the bucket
algorithms), in the pure form and on the memory store."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import ConfigError, MemoryStore, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS, Algorithm
from stormguard.ratelimit.reservation import Reservation
from stormguard.testing import FakeClock
from tests.core.util import BUCKETS, NOON

EXAMPLES = settings(max_examples=150, deadline=None)
T0 = int(NOON * 1_000_000)
WINDOWS = ("fixed_window", "sliding_window_counter", "sliding_window_log")

Trace = list[tuple[int, int, str, int, bool]]


@st.composite
def setups(draw: st.DrawFn, algorithms: tuple[str, ...] = BUCKETS, back: bool = True,
           slow: bool = False) -> tuple[str, int, int, int, Trace]:
    """(algorithm, limit, window_us, burst, trace of (dt_us, cost, op, max_wait_us, book)).
    ``slow``: at most one unit per µs (``W >= N``, every real rate)."""
    name = draw(st.sampled_from(algorithms))
    limit = draw(st.integers(1, 6))
    window = draw(st.integers(limit if slow else 1, 3000)) * draw(st.sampled_from([1, 1000]))
    burst = draw(st.integers(1, 8))
    step = st.integers(-window if back else 0, 2 * window)
    op = st.sampled_from(["reserve", "reserve", "hit", "peek"])
    wait = st.one_of(st.just(0), st.integers(0, 3 * window), st.just(2**62))
    trace = draw(st.lists(st.tuples(step, st.integers(1, burst), op, wait, st.booleans()),
                          min_size=1, max_size=60))
    return name, limit, window, burst, trace


def at_us(now: int) -> FakeClock:
    clock = FakeClock()
    clock.set_wall(now / 1e6)
    return clock


def make(name: str, limit: int, window: int, burst: int) -> Algorithm:
    return ALGORITHMS[name](limit, window, burst)


@EXAMPLES
@given(setups())
def test_reservation_is_the_earliest_admitted_time(
        setup: tuple[str, int, int, int, Trace]) -> None:
    algo = make(*setup[:4])
    state: Any = None
    now = T0
    for dt, cost, op, max_wait, book in setup[4]:
        now += dt
        ok, at, new = algo.reserve(state, now, cost, max_wait, book)
        assert at >= now
        assert ok == (at - now <= max_wait)
        assert algo.decide(state, at, cost, True)[0]  # exact: a hit at the slot passes
        if at > now:  # ... and nothing earlier does
            assert not algo.decide(state, at - 1, cost, True)[0]
            assert not algo.decide(state, now, cost, True)[0]
        if ok and book:
            assert new == algo.decide(state, at, cost, True)[1]  # booking = the hit at `at`
        else:
            assert new is state  # nothing booked
        # reserving with max_wait=0 is a hit
        hit = algo.decide(state, now, cost, True)
        ok0, at0, new0 = algo.reserve(state, now, cost, 0, True)
        assert ok0 == hit[0]
        if ok0:
            assert (at0, new0) == (now, hit[1])
        else:
            assert at0 == now + hit[4] or algo.name != "gcra"  # gcra: retry_after is the wait
            assert new0 is state
        if op == "reserve":
            state = new
        elif op == "hit":
            state = hit[1]


@EXAMPLES
@given(setups(back=False, slow=True))
def test_bookings_and_hits_never_exceed_the_bucket(
        setup: tuple[str, int, int, int, Trace]) -> None:
    """Whatever mix of hits and bookings: in any interval [a, b] of real time, at most
    ``B + (b - a) * N / W`` units go (a hit at its time, a booking at its slot)."""
    algo = make(*setup[:4])
    state: Any = None
    now = T0
    went: list[tuple[int, int]] = []
    for dt, cost, op, max_wait, book in setup[4]:
        now += dt
        if op == "reserve":
            ok, at, state = algo.reserve(state, now, cost, max_wait, book)
            if ok and book:
                went.append((at, cost))
        elif op == "hit":
            allowed, state, *_ = algo.decide(state, now, cost, True)
            if allowed:
                went.append((now, cost))
    went.sort()
    for i, (a, _) in enumerate(went):
        total = 0
        for b, c in went[i:]:
            total += c
            assert total * algo.W <= algo.C + (b - a) * algo.N, (a, b, total)


@EXAMPLES
@given(setups(back=False, slow=True))
def test_slots_are_handed_out_in_order(setup: tuple[str, int, int, int, Trace]) -> None:
    """A later reservation never gets an earlier slot than a booked one (FIFO)."""
    algo = make(*setup[:4])
    state: Any = None
    now = T0
    last = 0
    for dt, cost, _, _, _ in setup[4]:
        now += dt
        ok, at, state = algo.reserve(state, now, cost, 2**62, True)
        assert ok
        assert at >= last
        last = at


@EXAMPLES
@given(setups(back=False, slow=True))
def test_gcra_token_and_leaky_buckets_reserve_alike(
        setup: tuple[str, int, int, int, Trace]) -> None:
    _, limit, window, burst, trace = setup
    answers = []
    for name in BUCKETS:
        algo = make(name, limit, window, burst)
        state: Any = None
        now = T0
        out: list[tuple[bool, ...]] = []
        for dt, cost, op, max_wait, book in trace:
            now += dt
            if op == "reserve":
                ok, at, state = algo.reserve(state, now, cost, max_wait, book)
                out.append((ok, at))
            else:
                allowed, new, *_ = algo.decide(state, now, cost, op == "hit")
                state = new
                out.append((allowed,))
        answers.append(out)
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_callers_leave_on_their_slots(algorithm: str) -> None:
    """10 per second with a burst of 3: ten callers at once get 0, 0, 0, 100 ms, 200 ms,
    ...; with max_wait=0.45 the eighth to the tenth are refused and book nothing."""
    clock = at_us(T0)
    store = MemoryStore(clock=clock)
    rule = Rule(limit=10, window=1, burst=3, algorithm=algorithm)
    got = [store.reserve("shaper", rule, max_wait=0.45) for _ in range(10)]
    assert [r.ok for r in got] == [True] * 7 + [False] * 3
    assert [r.wait for r in got] == [0.0, 0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5]
    assert [r.at - got[0].at for r in got[:8]] == pytest.approx(
        [0.0, 0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert not got[-1]
    assert not store.hit("shaper", rule).allowed  # the hits come after the bookings
    clock.set_wall((T0 + 400_000) / 1e6)  # the last booked caller leaves: nothing for a hit
    assert not store.peek("shaper", rule).allowed
    clock.set_wall((T0 + 500_000) / 1e6)
    assert store.hit("shaper", rule).allowed
    # peek-like: book=False says when, books nothing
    first = store.reserve("shaper", rule, book=False)
    assert first == store.reserve("shaper", rule, book=False)
    assert first.wait == pytest.approx(0.1)


ops = st.lists(st.tuples(st.sampled_from(["hit", "peek", "reserve", "reserve"]),
                         st.sampled_from(["a", "b"]), st.integers(1, 3),
                         st.integers(-200_000, 2_000_000),
                         st.sampled_from([None, 0.0, 0.05, 0.3, 2.0]), st.booleans()),
               min_size=1, max_size=50)


@EXAMPLES
@given(algorithm=st.sampled_from(BUCKETS), limit=st.integers(1, 5),
       window=st.sampled_from([0.001, 0.25, 1, 60]), burst=st.integers(1, 4), trace=ops)
def test_memory_store_reserves_like_the_reference(
        algorithm: str, limit: int, window: float, burst: int,
        trace: list[tuple[str, str, int, int, float | None, bool]]) -> None:
    clock = at_us(T0)
    store = MemoryStore(clock=clock)
    rule = Rule(limit, window, algorithm=algorithm, burst=burst)
    algo = rule._algo
    states: dict[str, Any] = {}
    now = T0
    for op, key, cost, dt, max_wait, book in trace:
        now += dt
        clock.set_wall(now / 1e6)  # integer microseconds survive the float exactly
        c = min(cost, rule.capacity)
        state = states.get(key)
        if op == "reserve":
            wait_us = 2**62 if max_wait is None else round(max_wait * 1e6)
            ok, at, states[key] = algo.reserve(state, now, c, wait_us, book)
            got = store.reserve(key, rule, c, max_wait=max_wait, book=book)
            assert got == Reservation(ok, (at - now) / 1e6, at / 1e6)
            assert bool(got) is ok
        else:
            allowed, new, remaining, reset, retry, _ = algo.decide(state, now, c, op == "hit")
            states[key] = new
            d = getattr(store, op)(key, rule, c)
            assert d[:5] == (allowed, rule.capacity, remaining, reset / 1e6, retry / 1e6)
            assert d.rule is rule


def test_areserve() -> None:
    store = MemoryStore(clock=FakeClock())
    rule = Rule(limit=1, window=1, algorithm="gcra")
    first = asyncio.run(store.areserve("k", rule))
    second = asyncio.run(store.areserve("k", rule, max_wait=0.5))
    assert (first.ok, first.wait, second.ok, second.wait) == (True, 0.0, False, 1.0)


@pytest.mark.parametrize("algorithm", WINDOWS)
def test_window_algorithms_have_no_reservation(algorithm: str) -> None:
    rule = Rule(limit=5, window=1, algorithm=algorithm)
    with pytest.raises(ConfigError) as exc:
        MemoryStore().reserve("k", rule)
    assert exc.value.field == "algorithm"
    assert "token_bucket" in str(exc.value)
    with pytest.raises(ConfigError):
        rule._algo.reserve(None, T0, 1, 0, True)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_wait": -1}, "max_wait"), ({"max_wait": math.nan}, "max_wait"),
    ({"max_wait": "1s"}, "max_wait"), ({"max_wait": True}, "max_wait"),
    ({"book": 1}, "book"), ({"book": None}, "book"), ({"cost": 3}, "cost"),
    ({"cost": 0}, "cost"), ({"cost": 1.0}, "cost"),
])
def test_bad_reservation_arguments(kwargs: dict[str, Any], field: str) -> None:
    store = MemoryStore()
    rule = Rule(limit=2, window=1, algorithm="leaky_bucket")
    with pytest.raises(ConfigError) as exc:
        store.reserve("k", rule, **kwargs)
    assert exc.value.field == field
    with pytest.raises(TypeError, match="key: must be a str"):
        store.reserve(b"k", rule)  # type: ignore[arg-type]
    assert len(store) == 0
