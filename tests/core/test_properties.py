"""Hypothesis properties of the six pure algorithms (and of the store's float seconds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import MemoryStore, RateLimiter, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS as CLASSES
from stormguard.ratelimit.algorithms import Algorithm, Gcra, LeakyBucket, TokenBucket
from stormguard.testing import FakeClock
from tests.core.util import ALGORITHMS, NOON, snapshot

EXAMPLES = settings(max_examples=80, deadline=None)

# epoch microseconds near 2026 (the magnitude real clocks give)
T0 = int(NOON * 1_000_000)


@st.composite
def setups(draw: st.DrawFn, algorithms: tuple[str, ...] = ALGORITHMS,
           ms: bool | None = None) -> tuple[str, int, int, int, list[tuple[int, int]]]:
    """(algorithm, limit, window_us, burst, trace of (dt_us, cost))."""
    name = draw(st.sampled_from(algorithms))
    limit = draw(st.integers(1, 6))
    granular = draw(st.booleans()) if ms is None else ms
    unit = 1000 if granular else 1
    window = draw(st.integers(1, 3000)) * unit
    burst = draw(st.integers(1, 8)) if CLASSES[name].uses_burst else limit
    cap = burst
    step = st.integers(0, 2 * window // unit).map(lambda d: d * unit)
    trace = draw(st.lists(st.tuples(step, st.integers(1, cap)), min_size=1, max_size=60))
    return name, limit, window, burst, trace


def replay(algo: Algorithm, trace: list[tuple[int, int]], start: int = T0
           ) -> Iterator[tuple[int, int, Any, tuple[Any, ...]]]:
    """Yield (now, cost, state_before, verdict) for every request of the trace."""
    state: Any = None
    now = start
    for dt, cost in trace:
        now += dt
        verdict = algo.decide(state, now, cost, True)
        yield now, cost, state, verdict
        if verdict[0]:
            state = verdict[1]


def make(name: str, limit: int, window: int, burst: int) -> Algorithm:
    return CLASSES[name](limit, window, burst)


@EXAMPLES
@given(setups())
def test_verdict_invariants(setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    cap = algo.B
    for now, cost, before, (allowed, after, remaining, reset, retry, exp) in replay(
            algo, setup[4]):
        assert 0 <= remaining <= cap
        assert reset >= 0
        assert exp >= now
        if allowed:
            assert retry == 0
        else:
            assert retry > 0
            assert after is before  # a denied request never consumes
        peek = algo.decide(before, now, cost, False)
        assert peek[0] == allowed
        assert peek[4] == retry
        assert peek[1] is before  # peek writes nothing
        assert peek[2] == remaining + (cost if allowed else 0)


@EXAMPLES
@given(setups())
def test_retry_after_is_exact(setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    for now, cost, before, verdict in replay(algo, setup[4]):
        if verdict[0]:
            continue
        retry = verdict[4]
        assert algo.decide(before, now + retry, cost, True)[0]
        assert not algo.decide(before, now + retry - 1, cost, True)[0]


@EXAMPLES
@given(setups())
def test_reset_after_is_exact_and_expiry_forgets(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    for now, _, _, verdict in replay(algo, setup[4]):
        allowed, after, _, reset, _, exp = verdict
        if not allowed:
            continue
        assert algo.decide(after, now + reset, 1, False)[2] == algo.B
        if reset:
            assert algo.decide(after, now + reset - 1, 1, False)[2] < algo.B
        for t in (exp, exp + 1, exp + 7 * algo.W):
            for cost in (1, algo.B):
                assert algo.decide(after, t, cost, False)[2:5] == \
                    algo.decide(None, t, cost, False)[2:5]


@EXAMPLES
@given(setups(algorithms=("sliding_window_log",)))
def test_log_never_admits_more_than_limit_in_any_window(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    admitted = [(now, cost) for now, cost, _, v in replay(algo, setup[4]) if v[0]]
    for t, _ in admitted:
        in_window = sum(c for u, c in admitted if t <= u < t + algo.W)
        assert in_window <= algo.N


@EXAMPLES
@given(setups(algorithms=("sliding_window_log",)))
def test_log_admits_whenever_the_window_has_room(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    admitted: list[tuple[int, int]] = []
    for now, cost, _, verdict in replay(algo, setup[4]):
        live = sum(c for u, c in admitted if now - algo.W < u <= now)
        assert verdict[0] == (live + cost <= algo.N)
        if verdict[0]:
            admitted.append((now, cost))


@EXAMPLES
@given(setups(algorithms=("fixed_window", "sliding_window_counter")))
def test_window_counters_follow_the_formula(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    n, w = algo.N, algo.W
    per_window: Counter[int] = Counter()
    for now, cost, _, verdict in replay(algo, setup[4]):
        k, elapsed = divmod(now, w)
        cur, prev = per_window[k], per_window[k - 1]
        if algo.name == "fixed_window":
            expected = cur + cost <= n
        else:  # prev * (W - elapsed) / W + cur + cost <= N, in exact integers
            expected = prev * (w - elapsed) + (cur + cost) * w <= n * w
        assert verdict[0] == expected
        if verdict[0]:
            per_window[k] += cost


@EXAMPLES
@given(setups(algorithms=("token_bucket",)))
def test_gcra_and_leaky_bucket_decide_like_token_bucket(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    _, limit, window, burst, trace = setup
    tb = TokenBucket(limit, window, burst)
    others = [Gcra(limit, window, burst), LeakyBucket(limit, window, burst)]
    expected = [v[:1] + v[2:] for *_, v in replay(tb, trace)]  # all but the state
    for other in others:
        assert [v[:1] + v[2:] for *_, v in replay(other, trace)] == expected


@settings(max_examples=60, deadline=None)
@given(setups(ms=True))
def test_store_retry_after_in_float_seconds_is_exact_to_the_millisecond(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    name, limit, window_us, burst, trace = setup
    rule = Rule(limit=limit, window=window_us / 1e6, algorithm=name,
                burst=burst if CLASSES[name].uses_burst else None)
    clock = FakeClock(start=NOON)
    store = MemoryStore(clock=clock)
    limiter = RateLimiter(store)
    for dt, cost in trace:
        clock.advance(dt / 1e6)
        d = limiter.hit("k", rule, cost)
        assert d.remaining >= 0
        if d.allowed:
            continue
        assert d.retry_after > 0
        saved = snapshot(store)
        if d.retry_after >= 0.001:
            clock.advance(d.retry_after - 0.001)
            assert not limiter.peek("k", rule, cost).allowed
            clock.advance(0.001)
        else:
            clock.advance(d.retry_after)
        assert limiter.peek("k", rule, cost).allowed
        assert snapshot(store) == saved  # peeks wrote nothing


@EXAMPLES
@given(setups())
def test_remaining_is_exactly_what_can_still_be_admitted_now(
        setup: tuple[str, int, int, int, list[tuple[int, int]]]) -> None:
    algo = make(*setup[:4])
    for now, _, before, verdict in replay(algo, setup[4]):
        state = verdict[1] if verdict[0] else before
        for _ in range(verdict[2]):
            ok, state, *_ = algo.decide(state, now, 1, True)
            assert ok
        assert not algo.decide(state, now, 1, True)[0]
