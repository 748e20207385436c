"""The worked examples of the design sessions, to the request."""

from __future__ import annotations

import pytest

from stormguard import Rule
from tests.core.util import NOON, admitted_exactly_after, at, limiter_at


def test_sliding_window_counter_at_12_01_15_estimates_90_and_admits() -> None:
    limiter, clock = limiter_at(at(0, 10))
    rule = Rule.parse("100/minute")
    assert rule.algorithm == "sliding_window_counter"
    assert all(limiter.hit("u", rule).allowed for _ in range(80))  # previous window: 80
    clock.set_wall(at(1, 14))  # 80 * 46/60 + 30 = 91.3: the 30 fit
    assert all(limiter.hit("u", rule).allowed for _ in range(30))  # current window: 30
    clock.set_wall(at(1, 15))
    # estimate = 80 * 45/60 + 30 = 90 -> 10 more fit, the 11th does not
    peek = limiter.peek("u", rule)
    assert peek.allowed
    assert peek.remaining == 10
    d = limiter.hit("u", rule)
    assert d.allowed
    assert d.remaining == 9
    assert all(limiter.hit("u", rule).allowed for _ in range(9))
    denied = limiter.hit("u", rule)
    assert not denied.allowed
    assert denied.remaining == 0


def test_boundary_bot_passes_fixed_window_but_not_sliding_window_counter() -> None:
    fixed = Rule(limit=100, window=60, algorithm="fixed_window")
    swc = Rule(limit=100, window=60, algorithm="sliding_window_counter")
    limiter, clock = limiter_at(at(0, 59))
    assert all(limiter.hit("bot", fixed).allowed for _ in range(100))
    assert all(limiter.hit("bot", swc).allowed for _ in range(100))
    clock.set_wall(at(1, 0))
    # fixed window: a new window, 100 more in the same two seconds
    assert all(limiter.hit("bot", fixed).allowed for _ in range(100))
    assert not limiter.hit("bot", fixed).allowed
    # sliding window counter: the whole previous window still weighs 100
    first = limiter.hit("bot", swc)
    assert not first.allowed
    # 100 * (60 - t)/60 + 1 <= 100 first holds at t = 0.6 s
    assert first.retry_after == pytest.approx(0.6, abs=1e-6)
    assert admitted_exactly_after(limiter, clock, "bot", swc, 0.6)


def test_token_bucket_burst_of_10_then_2_per_second_for_a_bot_at_500_per_second() -> None:
    limiter, clock = limiter_at(NOON)
    bucket = Rule(limit=2, window=1, burst=10, algorithm="token_bucket")
    assert bucket.capacity == 10
    assert [limiter.hit("bot", bucket).allowed for _ in range(11)] == [True] * 10 + [False]
    per_second = [0] * 5
    for i in range(1, 5 * 500 + 1):  # 500 requests per second for 5 seconds
        clock.set_wall(NOON + i * 0.002)
        if limiter.hit("bot", bucket).allowed:
            per_second[min((i - 1) // 500, 4)] += 1
    assert per_second == [2, 2, 2, 2, 2]
