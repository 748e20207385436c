"""One contract over memory, Redis and Redis Cluster, sync and async (client time)."""

from __future__ import annotations

import pytest

from stormguard import AsyncRateLimiter, ConfigError, RateLimiter, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.testing import FakeClock
from tests.redis.conftest import StoreFactory

ALGOS = sorted(ALGORITHMS)


def rule_for(algo: str) -> Rule:
    return Rule(5, 10, algorithm=algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_limit_then_retry_after_is_exact(make_store: StoreFactory, clock: FakeClock,
                                         algo: str) -> None:
    limiter = RateLimiter(make_store(clock))
    rule = rule_for(algo)
    allowed = [limiter.hit("user:42", rule).allowed for _ in range(7)]
    assert allowed == [True] * 5 + [False] * 2
    d = limiter.hit("user:42", rule)
    assert not d.allowed
    assert d.remaining == 0
    assert d.limit == 5
    assert d.retry_after > 0
    assert not d.degraded
    clock.advance(d.retry_after - 0.001)
    assert not limiter.peek("user:42", rule).allowed
    clock.advance(0.001)
    assert limiter.hit("user:42", rule).allowed


@pytest.mark.parametrize("algo", ALGOS)
def test_peek_consumes_nothing_and_reset_restores(make_store: StoreFactory, clock: FakeClock,
                                                  algo: str) -> None:
    limiter = RateLimiter(make_store(clock))
    rule = rule_for(algo)
    for _ in range(10):
        assert limiter.peek("k", rule, cost=5).allowed
    assert limiter.hit("k", rule, cost=3).remaining == 2
    assert limiter.peek("k", rule).remaining == 2
    assert not limiter.hit("k", rule, cost=3).allowed
    assert limiter.hit("k", rule, cost=2).allowed
    limiter.reset("k", rule)
    assert limiter.hit("k", rule, cost=5).allowed


def test_hit_all_is_all_or_nothing(make_store: StoreFactory, clock: FakeClock) -> None:
    limiter = RateLimiter(make_store(clock))
    per_second = Rule(2, 1, algorithm="fixed_window", name="sec")
    per_minute = Rule(3, 60, algorithm="sliding_window_log", name="min")
    assert limiter.hit_all("u", [per_second, per_minute]).allowed
    assert limiter.hit_all("u", [per_second, per_minute]).allowed
    d = limiter.hit_all("u", [per_second, per_minute])
    assert not d.allowed
    assert d.rule == per_second
    # the denial consumed nothing from per_minute
    assert limiter.peek("u", per_minute).remaining == 1
    clock.advance(1)
    d = limiter.hit_all("u", [per_second, per_minute])
    assert d.allowed
    assert d.rule == per_minute
    assert d.remaining == 0
    d = limiter.hit_all("u", [per_second, per_minute])
    assert not d.allowed
    assert d.rule == per_minute
    assert limiter.peek("u", per_second).remaining == 1


def test_keys_are_independent_and_any_string(make_store: StoreFactory, clock: FakeClock) -> None:
    limiter = RateLimiter(make_store(clock))
    rule = Rule(1, 60, algorithm="fixed_window")
    keys = ["a", "b", "{a}", "ключ-🔑", "x" * 4096, "", "a:b", "a\x00b"]
    assert all(limiter.hit(k, rule).allowed for k in keys)
    assert not any(limiter.hit(k, rule).allowed for k in keys)
    other = Rule(1, 60, algorithm="fixed_window", name="other")
    assert all(limiter.hit(k, other).allowed for k in keys)


def test_bad_input(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(clock)
    rule = Rule(5, 10)
    with pytest.raises(ConfigError, match="cost"):
        store.hit("k", rule, cost=6)
    with pytest.raises(ConfigError, match="cost"):
        store.hit("k", rule, cost=0)
    with pytest.raises(TypeError, match="key"):
        store.hit(42, rule)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="rules"):
        store.hit_all("k", [])
    assert store.ping()


@pytest.mark.parametrize("algo", ALGOS)
async def test_async_same_contract(make_store: StoreFactory, clock: FakeClock,
                                   algo: str) -> None:
    limiter = AsyncRateLimiter(make_store(clock))
    rule = rule_for(algo)
    allowed = [(await limiter.hit("user:42", rule)).allowed for _ in range(6)]
    assert allowed == [True] * 5 + [False]
    d = await limiter.peek("user:42", rule)
    assert not d.allowed
    clock.advance(d.retry_after)
    assert (await limiter.hit("user:42", rule)).allowed
    await limiter.reset("user:42", rule)
    d = await limiter.hit_all("user:42", [rule, Rule(1, 1, algorithm="gcra")])
    assert d.allowed
    assert d.remaining == 0
    assert await limiter.ping()
    await limiter.aclose()
