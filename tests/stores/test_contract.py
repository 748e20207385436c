"""The store contract, alike on memory, Redis and Redis Cluster, sync and async.

Every test runs on each backend in both modes (see ``conftest.Backend``); the
per-algorithm ones on each of ``ALGORITHMS`` too. Time is a FakeClock (the Redis
stores take the client's time), so waits are exact to the microsecond and free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from stormguard import AsyncRateLimiter, ConfigError, RateLimiter, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.testing import FakeClock
from tests.stores.conftest import Backend

ALGOS = sorted(ALGORITHMS)
BUCKETS = [a for a in ALGOS if ALGORITHMS[a].uses_burst]
US = 1e-6  # one microsecond: the resolution of every store


def rule_for(algo: str, **options: Any) -> Rule:
    return Rule(5, 10, algorithm=algo, **options)


def exhaust(backend: Backend, key: str, rule: Rule) -> None:
    """Hit until denied."""
    for _ in range(100):
        if not backend.hit(key, rule).allowed:
            return
    raise AssertionError(f"{rule} never denied")


@pytest.mark.parametrize("algo", ALGOS)
def test_admits_up_to_the_limit_then_denies(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    for left in (4, 3, 2, 1, 0):
        d = backend.hit("user:42", rule)
        assert (d.allowed, d.limit, d.remaining, d.retry_after) == (True, 5, left, 0.0)
        assert d.rule == rule
        assert not d.degraded
    for _ in range(2):
        d = backend.hit("user:42", rule)
        assert not d.allowed
        assert (d.limit, d.remaining) == (5, 0)
        assert d.retry_after > 0
        assert d.reset_after >= d.retry_after
        assert d.rule == rule
        assert not d.degraded


@pytest.mark.parametrize("algo", ALGOS)
def test_a_denial_consumes_nothing(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    exhaust(backend, "k", rule)
    first = backend.hit("k", rule)
    assert not first.allowed
    assert [backend.hit("k", rule) for _ in range(5)] == [first] * 5
    assert backend.peek("k", rule) == first
    backend.clock.advance(first.retry_after)
    assert backend.hit("k", rule).allowed  # the wait did not grow with the denials


@pytest.mark.parametrize("cost", [1, 3])
@pytest.mark.parametrize("algo", ALGOS)
def test_retry_after_is_exact(backend: Backend, algo: str, cost: int) -> None:
    rule = rule_for(algo)
    clock = backend.clock
    clock.advance(2.5)  # mid-window: the wait is not a whole window
    assert backend.hit("k", rule, cost=4).allowed
    clock.advance(0.25)
    d = backend.hit("k", rule, cost=cost)
    if cost == 1:
        assert d.allowed
        d = backend.hit("k", rule, cost=cost)
    assert not d.allowed
    assert d.retry_after > 0
    clock.advance(d.retry_after - US)
    assert not backend.peek("k", rule, cost=cost).allowed
    assert not backend.hit("k", rule, cost=cost).allowed  # a microsecond early
    clock.advance(US)
    assert backend.peek("k", rule, cost=cost).allowed
    assert backend.hit("k", rule, cost=cost).allowed  # the same request, exactly on time


@pytest.mark.parametrize("algo", ALGOS)
def test_reset_after_and_remaining(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    clock = backend.clock
    d = backend.peek("k", rule)
    assert (d.allowed, d.limit, d.remaining, d.reset_after, d.retry_after) == (
        True, 5, 5, 0.0, 0.0)  # a fresh key: full, nothing to wait for
    clock.advance(1.5)
    d = backend.hit("k", rule, cost=2)
    assert d.remaining == 3
    assert d.reset_after > 0
    assert backend.peek("k", rule).remaining == 3
    assert backend.peek("k", rule, cost=3).remaining == 3  # peek reports, for any cost
    clock.advance(d.reset_after - US)
    assert backend.peek("k", rule).remaining < 5  # a microsecond before: not yet full
    clock.advance(US)
    d = backend.peek("k", rule)
    assert (d.remaining, d.reset_after) == (5, 0.0)  # fully restored, exactly then
    assert backend.hit("k", rule, cost=5).allowed


@pytest.mark.parametrize("algo", ALGOS)
def test_cost_above_one_and_above_capacity(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    assert backend.hit("k", rule, cost=2).remaining == 3
    d = backend.hit("k", rule, cost=3)
    assert (d.allowed, d.remaining) == (True, 0)
    assert not backend.hit("k", rule).allowed
    assert backend.hit("fresh", rule, cost=5).allowed  # cost == capacity: admitted at once
    before = backend.peek("other", rule)
    for call in (backend.hit, backend.peek):
        with pytest.raises(ConfigError) as exc:
            call("other", rule, 6)
        assert exc.value.field == "cost"
        assert "capacity 5" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        backend.hit_all("other", [rule, Rule(100, 1, name="big")], 6)
    assert exc.value.field == "cost"
    assert backend.peek("other", rule) == before  # nothing was written


@pytest.mark.parametrize("algo", BUCKETS)
def test_bucket_capacity_is_the_burst(backend: Backend, algo: str) -> None:
    rule = Rule(2, 10, algorithm=algo, burst=7)
    d = backend.hit("k", rule, cost=7)
    assert (d.allowed, d.limit, d.remaining) == (True, 7, 0)
    with pytest.raises(ConfigError, match="capacity 7"):
        backend.hit("k", rule, cost=8)


@pytest.mark.parametrize("algo", ALGOS)
def test_peek_never_consumes(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    for _ in range(10):
        assert backend.peek("k", rule, cost=5).allowed
    assert backend.held() == 0  # a peek stores nothing
    assert backend.hit("k", rule, cost=3).remaining == 2
    assert backend.held() == 1
    assert backend.peek("k", rule).remaining == 2
    assert not backend.hit("k", rule, cost=3).allowed
    denied = backend.peek("k", rule, cost=3)
    assert not denied.allowed
    assert [backend.peek("k", rule, cost=3) for _ in range(5)] == [denied] * 5
    assert backend.hit("k", rule, cost=2).allowed
    backend.reset("k", rule)
    assert backend.hit("k", rule, cost=5).allowed


@pytest.mark.parametrize("algo", ALGOS)
def test_reset_forgets(backend: Backend, algo: str) -> None:
    rule = rule_for(algo)
    named = rule_for(algo, name="named")
    for key in ("k", "other"):
        exhaust(backend, key, rule)
        exhaust(backend, key, named)
    backend.reset("k", rule)
    d = backend.peek("k", rule)
    assert (d.allowed, d.remaining, d.reset_after) == (True, 5, 0.0)
    assert not backend.peek("k", named).allowed  # another rule: kept
    assert not backend.peek("other", rule).allowed  # another key: kept
    assert backend.held() == 3
    backend.reset("other", [rule, named])  # several rules at once
    assert backend.held() == 1  # the counters are gone, not just zeroed
    assert backend.peek("other", rule).remaining == 5
    assert backend.peek("other", named).remaining == 5
    backend.reset("never-seen", rule)  # forgetting an unknown key is fine
    backend.reset("k", [])  # and so is forgetting no rule
    assert not backend.peek("k", named).allowed


def test_hit_all_is_all_or_nothing(backend: Backend) -> None:
    clock = backend.clock
    per_second = Rule(2, 1, algorithm="fixed_window", name="sec")
    per_minute = Rule(3, 60, algorithm="sliding_window_log", name="min")
    assert backend.hit_all("u", [per_second, per_minute]).allowed
    assert backend.hit_all("u", [per_second, per_minute]).allowed
    d = backend.hit_all("u", [per_second, per_minute])
    assert not d.allowed
    assert d.rule == per_second
    # the denial consumed nothing from per_minute
    assert backend.peek("u", per_minute).remaining == 1
    clock.advance(1)
    d = backend.hit_all("u", [per_second, per_minute])
    assert d.allowed
    assert d.rule == per_minute
    assert d.remaining == 0
    d = backend.hit_all("u", [per_second, per_minute])
    assert not d.allowed
    assert d.rule == per_minute
    assert backend.peek("u", per_second).remaining == 1


@pytest.mark.parametrize("algo", ALGOS)
def test_hit_all_reports_the_binding_rule(backend: Backend, algo: str) -> None:
    clock = backend.clock
    tight = rule_for(algo, name="tight")
    roomy = Rule(100, 60, algorithm="fixed_window", name="roomy")
    slow = Rule(4, 3600, algorithm="sliding_window_log", name="slow")
    d = backend.hit_all("k", [roomy, tight], cost=2)
    assert d.allowed
    assert (d.rule, d.remaining) == (tight, 3)  # all admit: the rule with the least left
    fresh = Rule(50, 60, algorithm="token_bucket", name="fresh")
    d = backend.hit_all("k", [tight, roomy, fresh], cost=4)  # tight cannot: none consumes
    assert backend.held() == 2  # not even a counter for the fresh rule
    assert not d.allowed
    assert d.rule == tight
    assert d.retry_after == backend.peek("k", tight, cost=4).retry_after
    assert backend.peek("k", roomy).remaining == 98
    assert backend.peek("k", tight).remaining == 3
    exhaust(backend, "k", slow)
    d = backend.hit_all("k", [tight, slow, roomy], cost=4)
    assert not d.allowed
    assert d.rule == slow  # both deny: the longer wait binds
    assert d.retry_after == backend.peek("k", slow, cost=4).retry_after
    clock.advance(backend.peek("k", tight, cost=4).retry_after)
    d = backend.hit_all("k", [tight, roomy], cost=4)
    assert d.allowed  # tight admits now; roomy had it all along
    assert backend.peek("k", roomy).remaining == 94
    twin = Rule(100, 60, algorithm="fixed_window", name="roomy")  # equal to roomy
    assert backend.hit_all("k", [roomy, twin, roomy]).remaining == 93  # counted once


def test_rules_with_different_names_keep_separate_counters(backend: Backend) -> None:
    for algo in ALGOS:
        plain = Rule(1, 60, algorithm=algo)
        same = Rule(1, 60, algorithm=algo)  # an equal rule: the same counters
        a = Rule(1, 60, algorithm=algo, name="a")
        b = Rule(1, 60, algorithm=algo, name="b")
        assert backend.hit("k", plain).allowed
        assert not backend.hit("k", same).allowed
        assert backend.hit("k", a).allowed
        assert backend.hit("k", b).allowed
        assert not backend.hit("k", a).allowed
        assert not backend.hit_all("k", [a, b]).allowed


def test_keys_are_independent_and_any_string(backend: Backend) -> None:
    rule = Rule(1, 60, algorithm="fixed_window")
    keys = ["a", "b", "{a}", "{", "}", "{}", "a{b}c", "ключ-🔑", "用户:42", "cafe\u0301",
            "caf\u00e9", "x" * 4096, "ж" * 4096, "x" * 4095 + "y", "", "a:b", "a\x00b"]
    assert all(backend.hit(k, rule).allowed for k in keys)
    assert not any(backend.hit(k, rule).allowed for k in keys)
    other = Rule(1, 60, algorithm="fixed_window", name="other")
    assert all(backend.hit(k, other).allowed for k in keys)
    both = [Rule(2, 60, algorithm="gcra", name="g"), Rule(2, 60, algorithm="token_bucket")]
    for k in keys:  # several rules of one key in one call: one slot even with braces
        assert backend.hit_all(k, both).remaining == 1
        backend.reset(k, [rule, *both])
        assert backend.peek(k, rule).allowed
        assert backend.hit_all(k, both).remaining == 1


@pytest.mark.parametrize("key", [42, b"user", None, ("a",), 4.2])
def test_a_non_string_key_is_a_type_error_naming_the_key(backend: Backend, key: Any) -> None:
    # documented (docs/concepts.md): a TypeError, not a ConfigError, on every backend
    rule = Rule(5, 10)
    calls: list[Callable[[], object]] = [
        lambda: backend.hit(key, rule), lambda: backend.peek(key, rule),
        lambda: backend.hit_all(key, [rule, Rule(5, 1)]),
        lambda: backend.hit_all(key, [rule]), lambda: backend.reset(key, rule)]
    for call in calls:
        with pytest.raises(TypeError, match="key: must be a str"):
            call()


@pytest.mark.parametrize("cost", [0, -1, True, False, 1.0, 2.5, "2", None])
def test_bad_cost_is_a_config_error_naming_the_cost(backend: Backend, cost: Any) -> None:
    rule = Rule(5, 10, algorithm="sliding_window_log")
    calls: list[Callable[[], object]] = [
        lambda: backend.hit("k", rule, cost), lambda: backend.peek("k", rule, cost),
        lambda: backend.hit_all("k", [rule, Rule(9, 1)], cost),
        lambda: backend.hit_all("k", [rule], cost)]
    for call in calls:
        with pytest.raises(ConfigError) as exc:
            call()
        assert exc.value.field == "cost"
        assert exc.value.value is cost
        assert str(exc.value).startswith("cost: ")
    assert backend.peek("k", rule).remaining == 5  # nothing was consumed


def test_bad_rules_are_a_config_error_naming_the_rules(backend: Backend) -> None:
    rule = Rule(5, 10)
    empty: list[Sequence[Rule]] = [[], ()]
    for rules in empty:
        with pytest.raises(ConfigError, match="at least one rule") as exc:
            backend.hit_all("k", rules)
        assert exc.value.field == "rules"
    with pytest.raises(ConfigError) as exc:
        backend.hit_all("k", [rule, "10/second"])
    assert (exc.value.field, exc.value.value) == ("rules", "10/second")
    assert backend.peek("k", rule).remaining == 5  # the good rule was not consumed
    assert backend.hit_all("k", rule).remaining == 4  # a lone Rule is a list of one
    assert backend.ping()


def test_stores_on_one_backend(backend: Backend) -> None:
    # Redis: two stores (two clients) on one server share counters; memory: each its own
    rule = Rule(1, 60)
    other = backend.make()
    assert backend.hit("k", rule).allowed
    shared = not other.peek("k", rule).allowed
    assert shared == (backend.kind != "memory")
    prefixed = backend.make(**({} if backend.kind == "memory" else {"prefix": "elsewhere"}))
    assert prefixed.peek("k", rule).allowed  # another prefix: other counters


@pytest.mark.parametrize("algo", ALGOS)
def test_the_limiters_over_each_store(backend: Backend, algo: str) -> None:
    # RateLimiter / AsyncRateLimiter pass the store's decisions through unchanged
    rule = rule_for(algo)
    clock = backend.clock
    if backend.mode == "sync":
        limiter = RateLimiter(backend.store)
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
        limiter.reset("user:42", rule)
        d = limiter.hit_all("user:42", [rule, Rule(1, 1, algorithm="gcra")])
        assert d.allowed
        assert d.remaining == 0
        assert limiter.ping()
        return

    async def scenario() -> None:
        limiter = AsyncRateLimiter(backend.store)
        allowed = [(await limiter.hit("user:42", rule)).allowed for _ in range(6)]
        assert allowed == [True] * 5 + [False]
        d = await limiter.peek("user:42", rule)
        assert not d.allowed
        assert not d.degraded
        clock.advance(d.retry_after)
        assert (await limiter.hit("user:42", rule)).allowed
        await limiter.reset("user:42", rule)
        d = await limiter.hit_all("user:42", [rule, Rule(1, 1, algorithm="gcra")])
        assert d.allowed
        assert d.remaining == 0
        assert await limiter.ping()
        await limiter.aclose()

    backend.run(scenario())


def test_sync_and_async_calls_share_counters(kind: str, url: str, clock: FakeClock) -> None:
    b = Backend(kind, "async", url, clock)
    try:
        rule = Rule(3, 60)
        store = b.store
        assert store.hit("k", rule).allowed
        assert b.run(store.ahit("k", rule)).remaining == 1
        assert store.peek("k", rule).remaining == 1
        assert b.run(store.ahit_all("k", [rule])).remaining == 0
        assert not store.hit("k", rule).allowed
        store.reset("k", rule)
        assert b.run(store.apeek("k", rule)).remaining == 3
        b.run(store.areset("k", rule))
        assert b.run(store.aping())
        assert store.ping()
    finally:
        b.close()
