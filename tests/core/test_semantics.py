"""Exact semantics of each algorithm through RateLimiter + MemoryStore + FakeClock."""

from __future__ import annotations

import pytest

from stormguard import Decision, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS as ALGO_CLASSES
from tests.core.util import ALGORITHMS, BUCKETS, NOON, admitted_exactly_after, at, limiter_at

US = 1e-6


def approx(x: float) -> object:
    return pytest.approx(x, abs=US)


# -- fixed window -------------------------------------------------------------------


def test_fixed_window_is_epoch_aligned_to_the_millisecond() -> None:
    limiter, clock = limiter_at(at(0, 59.999))
    rule = Rule(limit=100, window=60, algorithm="fixed_window")
    for i in range(100):
        d = limiter.hit("k", rule)
        assert d.allowed
        assert d.remaining == 99 - i
        assert d.reset_after == approx(0.001)
    d = limiter.hit("k", rule)
    assert not d.allowed
    assert d.retry_after == approx(0.001)
    assert d.reset_after == approx(0.001)
    clock.set_wall(at(1, 0.0))
    d = limiter.hit("k", rule)
    assert d.allowed
    assert d.remaining == 99
    assert d.reset_after == approx(60.0)


def test_fixed_window_window_starts_at_the_epoch_multiple_not_the_first_hit() -> None:
    limiter, clock = limiter_at(at(0, 30))
    rule = Rule(limit=1, window=60, algorithm="fixed_window")
    d = limiter.hit("k", rule)
    assert d.reset_after == approx(30.0)
    d = limiter.hit("k", rule)
    assert not d.allowed
    assert d.retry_after == approx(30.0)
    assert admitted_exactly_after(limiter, clock, "k", rule, 30.0)


# -- sliding window log -------------------------------------------------------------


def test_sliding_window_log_is_exact_with_half_open_intervals() -> None:
    limiter, clock = limiter_at(NOON)
    rule = Rule(limit=3, window=10, algorithm="sliding_window_log")
    for t in (0.0, 1.0, 2.0):
        clock.set_wall(NOON + t)
        assert limiter.hit("k", rule).allowed
    d = limiter.hit("k", rule)
    assert not d.allowed
    assert d.remaining == 0
    assert d.retry_after == approx(8.0)  # the entry of t=0 leaves at t=10
    assert d.reset_after == approx(10.0)  # the entry of t=2 leaves at t=12
    clock.set_wall(NOON + 9.999)
    assert not limiter.hit("k", rule).allowed
    clock.set_wall(NOON + 10.0)
    d = limiter.hit("k", rule)
    assert d.allowed
    assert d.remaining == 0
    assert not limiter.hit("k", rule).allowed


def test_sliding_window_log_retry_after_with_cost_waits_for_enough_entries() -> None:
    limiter, clock = limiter_at(NOON)
    rule = Rule(limit=4, window=10, algorithm="sliding_window_log")
    for t in (0.0, 1.0, 2.0, 3.0):
        clock.set_wall(NOON + t)
        limiter.hit("k", rule)
    d = limiter.hit("k", rule, cost=3)  # needs the entries of t=0,1,2 to expire
    assert not d.allowed
    assert d.retry_after == approx(9.0)
    assert admitted_exactly_after(limiter, clock, "k", rule, 9.0, cost=3)
    assert limiter.peek("k", rule).remaining == 0


# -- sliding window counter ---------------------------------------------------------


def test_sliding_window_counter_formula_weights_the_previous_window() -> None:
    limiter, clock = limiter_at(at(0, 1))
    rule = Rule(limit=10, window=60, algorithm="sliding_window_counter")
    for _ in range(10):
        limiter.hit("k", rule)
    # 12:01:30: estimate = 10 * 30/60 + 0 = 5 -> remaining 5
    clock.set_wall(at(1, 30))
    d = limiter.peek("k", rule)
    assert d.allowed
    assert d.remaining == 5
    assert d.reset_after == approx(30.0)  # the previous window stops counting at 12:02
    for _ in range(5):
        assert limiter.hit("k", rule).allowed
    d = limiter.hit("k", rule)
    assert not d.allowed
    # cur=5, prev=10: 10*(60-e)/60 + 6 <= 10  <=>  e >= 36 -> 6 s from 12:01:30
    assert d.retry_after == approx(6.0)
    assert d.reset_after == approx(90.0)  # cur stops counting at 12:03
    assert admitted_exactly_after(limiter, clock, "k", rule, 6.0)


def test_sliding_window_counter_retry_after_into_the_next_window() -> None:
    limiter, clock = limiter_at(at(0, 50))
    rule = Rule(limit=10, window=60, algorithm="sliding_window_counter")
    for _ in range(10):
        limiter.hit("k", rule)
    d = limiter.hit("k", rule, cost=2)
    assert not d.allowed
    # next window: prev=10: 10*(60-e)/60 + 2 <= 10  <=>  e >= 12 -> 12:01:12, 22 s away
    assert d.retry_after == approx(22.0)
    assert admitted_exactly_after(limiter, clock, "k", rule, 22.0, cost=2)


# -- buckets ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_token_bucket_refills_continuously_up_to_capacity(algorithm: str) -> None:
    limiter, clock = limiter_at(NOON)
    rule = Rule(limit=2, window=1, burst=10, algorithm=algorithm)
    d = limiter.peek("k", rule)
    assert (d.allowed, d.limit, d.remaining, d.reset_after) == (True, 10, 10, 0.0)
    for i in range(10):
        d = limiter.hit("k", rule)
        assert d.remaining == 9 - i
    assert d.reset_after == approx(5.0)  # 10 tokens at 2 per second
    clock.advance(0.25)  # half a token
    d = limiter.hit("k", rule)
    assert not d.allowed
    assert d.retry_after == approx(0.25)
    assert d.reset_after == approx(4.75)
    clock.advance(0.25)
    d = limiter.hit("k", rule)
    assert d.allowed
    assert d.remaining == 0
    clock.advance(3600)
    d = limiter.peek("k", rule)
    assert d.remaining == 10  # capped at the capacity, not 7200
    assert d.reset_after == 0.0


def test_leaky_bucket_meter_fills_and_drains() -> None:
    limiter, clock = limiter_at(NOON)
    rule = Rule(limit=2, window=1, burst=10, algorithm="leaky_bucket")
    assert all(limiter.hit("k", rule).allowed for _ in range(10))
    d = limiter.hit("k", rule)
    assert not d.allowed
    assert d.retry_after == approx(0.5)  # drains one unit per 0.5 s
    assert d.reset_after == approx(5.0)  # empty after 5 s
    clock.advance(1.0)  # level 8: two more fit
    assert [limiter.hit("k", rule).allowed for _ in range(3)] == [True, True, False]
    d = limiter.hit("k", rule, cost=4)
    assert d.retry_after == approx(2.0)


def test_bucket_default_capacity_is_the_limit_and_burst_selects_token_bucket() -> None:
    assert Rule(limit=5, window=1, algorithm="gcra").capacity == 5
    r = Rule(limit=5, window=1, burst=9)
    assert r.algorithm == "token_bucket"
    assert r.capacity == 9
    assert Rule(limit=5, window=1, algorithm="fixed_window").capacity == 5


# -- across algorithms --------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_denied_request_never_consumes(algorithm: str) -> None:
    limiter, clock = limiter_at(at(0, 10))
    rule = Rule(limit=5, window=60, algorithm=algorithm)
    for _ in range(5):
        assert limiter.hit("k", rule).allowed
    clock.advance(0.5)
    first = limiter.hit("k", rule)
    assert not first.allowed
    for _ in range(100):
        assert limiter.hit("k", rule) == first  # identical: nothing moved
    clock.advance(first.retry_after)
    assert limiter.hit("k", rule).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_peek_consumes_nothing_and_agrees_with_hit(algorithm: str) -> None:
    limiter, _ = limiter_at(at(0, 10))
    rule = Rule(limit=3, window=60, algorithm=algorithm)
    for _ in range(4):
        p1 = limiter.peek("k", rule)
        p2 = limiter.peek("k", rule)
        assert p1 == p2
        h = limiter.hit("k", rule)
        assert p1.allowed == h.allowed
        assert p1.retry_after == h.retry_after
        # peek reports the quota now; hit the quota left after this request
        assert p1.remaining == h.remaining + (1 if h.allowed else 0)
    assert not h.allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reset_restores_the_full_quota_of_that_rule_only(algorithm: str) -> None:
    limiter, _ = limiter_at(at(0, 10))
    rule = Rule(limit=2, window=60, algorithm=algorithm)
    other = Rule(limit=2, window=60, algorithm=algorithm, name="other")
    for r in (rule, other):
        limiter.hit("k", r)
        limiter.hit("k", r)
        assert not limiter.hit("k", r).allowed
    limiter.reset("k", rule)
    assert limiter.peek("k", rule).remaining == 2
    assert not limiter.peek("k", other).allowed
    limiter.reset("k", [rule, other])
    assert limiter.peek("k", other).allowed
    limiter.reset("never-seen", rule)  # no error


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_keys_are_independent(algorithm: str) -> None:
    limiter, _ = limiter_at(at(0, 10))
    rule = Rule(limit=1, window=60, algorithm=algorithm)
    assert limiter.hit("a", rule).allowed
    assert not limiter.hit("a", rule).allowed
    assert limiter.hit("b", rule).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_greater_than_one(algorithm: str) -> None:
    limiter, _ = limiter_at(at(0, 10))
    rule = Rule(limit=10, window=60, algorithm=algorithm)
    assert limiter.hit("k", rule, cost=4).remaining == 6
    assert limiter.hit("k", rule, cost=4).remaining == 2
    d = limiter.hit("k", rule, cost=4)
    assert not d.allowed
    assert d.remaining == 2
    assert limiter.hit("k", rule, cost=2).allowed
    assert limiter.hit("k", rule, cost=10).retry_after > 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_decision_fields(algorithm: str) -> None:
    limiter, _ = limiter_at(at(0, 10))
    rule = Rule(limit=2, window=60, algorithm=algorithm, name="api")
    d = limiter.hit("k", rule)
    assert isinstance(d, Decision)
    assert d
    assert (d.allowed, d.limit, d.remaining, d.retry_after, d.rule, d.degraded) == (
        True, 2, 1, 0.0, rule, False)
    assert d.reset_after > 0
    limiter.hit("k", rule)
    d = limiter.hit("k", rule)
    assert not d
    assert d.retry_after > 0
    assert d.reset_after >= d.retry_after
    assert d.to_dict() == {"allowed": False, "limit": 2, "remaining": 0,
                           "reset_after": d.reset_after, "retry_after": d.retry_after,
                           "rule": "api", "degraded": False}


def test_clock_stepping_back_never_admits_more_than_the_limit() -> None:
    # Regression: fixed_window / sliding_window_counter wrote the older window over the
    # newer one, and token/leaky bucket re-counted refill, when the wall clock stepped back.
    for algorithm in ALGORITHMS:
        limiter, clock = limiter_at(at(1, 0))
        rule = Rule(limit=3, window=60, algorithm=algorithm)
        admitted = 0
        for step_back in (False, True, False, True, False):
            if step_back:
                clock.set_wall(clock.wall() - 30)  # an NTP step back
            ds = [limiter.hit("k", rule) for _ in range(3)]
            admitted += sum(d.allowed for d in ds)
            assert all(d.remaining >= 0 for d in ds), algorithm
            if step_back:
                clock.set_wall(clock.wall() + 30)
        assert admitted == 3, algorithm


def test_algorithm_registry_names() -> None:
    assert set(ALGO_CLASSES) == set(ALGORITHMS)
    assert set(BUCKETS) == {n for n, c in ALGO_CLASSES.items() if c.uses_burst}


# -- hit_all ------------------------------------------------------------------------


def test_hit_all_is_all_or_nothing_and_reports_the_binding_rule() -> None:
    limiter, clock = limiter_at(at(0, 10))
    per_second = Rule(limit=2, window=1, algorithm="fixed_window", name="second")
    per_minute = Rule(limit=5, window=60, algorithm="fixed_window", name="minute")
    d = limiter.hit_all("k", [per_second, per_minute])
    assert d.allowed
    assert d.rule is per_second  # the least remaining: 1 of 2
    assert d.remaining == 1
    limiter.hit_all("k", [per_second, per_minute])
    d = limiter.hit_all("k", [per_second, per_minute])
    assert not d.allowed
    assert d.rule is per_second
    assert d.retry_after == approx(1.0)
    assert limiter.peek("k", per_minute).remaining == 3  # the denied call consumed nothing
    clock.advance(1.0)  # 12:00:11: second 2 left, minute 3 left
    d = limiter.hit_all("k", [per_second, per_minute])
    assert (d.allowed, d.rule, d.remaining) == (True, per_second, 1)
    d = limiter.hit_all("k", [per_second, per_minute])
    assert (d.allowed, d.rule, d.remaining) == (True, per_second, 0)
    clock.advance(1.0)  # 12:00:12: second 2 left, minute 1 left
    d = limiter.hit_all("k", [per_second, per_minute])
    assert (d.allowed, d.rule, d.remaining) == (True, per_minute, 0)
    d = limiter.hit_all("k", [per_second, per_minute])
    assert not d.allowed
    assert d.rule is per_minute  # only the minute denies
    assert d.retry_after == approx(48.0)
    assert limiter.peek("k", per_second).remaining == 1  # nothing consumed


def test_hit_all_when_both_deny_picks_the_longest_wait() -> None:
    limiter, _ = limiter_at(at(0, 10))
    short = Rule(limit=1, window=1, algorithm="fixed_window", name="short")
    long = Rule(limit=1, window=3600, algorithm="fixed_window", name="long")
    limiter.hit_all("k", [short, long])
    d = limiter.hit_all("k", [short, long])
    assert not d.allowed
    assert d.rule is long
    assert d.retry_after == approx(3600 - 10)


def test_hit_all_with_a_new_key_evicting_another_rule_of_the_same_key() -> None:
    # Regression: making room for rule a's new entry evicted rule b's entry of the same
    # key, then hit_all crashed with KeyError on move_to_end.
    from stormguard import MemoryStore, RateLimiter
    from stormguard.testing import FakeClock

    clock = FakeClock(start=NOON)
    store = MemoryStore(clock=clock, max_keys=2)
    limiter = RateLimiter(store)
    a = Rule(limit=10, window=60, name="a")
    b = Rule(limit=10, window=60, name="b")
    limiter.hit("k", b)
    limiter.hit("other", a)
    d = limiter.hit_all("k", [a, b])
    assert d.allowed
    assert d.rule is b
    assert d.remaining == 8  # b's earlier hit was kept
    assert len(store) == 2
    assert limiter.peek("k", b).remaining == 8


def test_hit_all_single_rule_and_duplicates() -> None:
    limiter, _ = limiter_at(NOON)
    rule = Rule(limit=3, window=60)
    assert limiter.hit_all("k", [rule]).remaining == 2
    assert limiter.hit_all("k", [rule, Rule(limit=3, window=60)]).remaining == 1
