"""``limiter.limit(...)`` decorators and :class:`stormguard.RateLimited`."""

from __future__ import annotations

import pickle

import pytest

import stormguard
from stormguard import (
    AsyncRateLimiter,
    ConfigError,
    MemoryStore,
    RateLimited,
    RateLimiter,
    Rule,
    StormguardError,
)
from stormguard._core import errors
from stormguard.testing import FakeClock


def test_sync_decorator_limits_per_key(clock: FakeClock) -> None:
    limiter = RateLimiter(MemoryStore(clock=clock))
    calls: list[str] = []

    @limiter.limit("2/minute", key=lambda user, **kw: f"user:{user}")
    def search(user: str, q: str = "") -> str:
        """Search."""
        calls.append(user)
        return f"{user}:{q}"

    assert search("a", q="x") == "a:x"
    assert search("a") == "a:"
    with pytest.raises(RateLimited) as exc:
        search("a", q="y")
    assert calls == ["a", "a"]  # a denied call does not run
    d = exc.value.decision
    assert not d.allowed
    assert 0 < d.retry_after <= 120.0
    assert isinstance(exc.value, StormguardError)
    assert "retry after" in str(exc.value)
    assert search("b") == "b:"  # another key
    assert search.__name__ == "search"
    assert search.__doc__ == "Search."
    clock.advance(120)
    assert search("a") == "a:"


async def test_async_decorator(clock: FakeClock) -> None:
    limiter = AsyncRateLimiter(MemoryStore(clock=clock))

    rules = Rule.parse_many("1/second;2/minute", algorithm="fixed_window")

    @limiter.limit(rules, key=lambda *args, **kwargs: "k")
    async def work(n: int) -> int:
        return n * 2

    assert await work(1) == 2
    with pytest.raises(RateLimited):
        await work(2)  # the per-second limit
    clock.advance(1.0)
    assert await work(3) == 6
    clock.advance(1.0)
    with pytest.raises(RateLimited) as exc:
        await work(4)  # the per-minute limit
    assert exc.value.decision.rule == rules[1]


def test_default_key_is_the_function_and_rules_and_cost(clock: FakeClock) -> None:
    limiter = RateLimiter(MemoryStore(clock=clock))

    @limiter.limit(Rule(4, 60), cost=2)
    def a() -> None: ...

    @limiter.limit([Rule(4, 60)], key="shared")
    def b() -> None: ...

    a()
    a()
    with pytest.raises(RateLimited):
        a()
    for _ in range(4):
        b()  # its own counter


async def test_the_wrong_kind_of_function_is_refused_at_decoration() -> None:
    async def coro() -> None: ...

    def plain() -> None: ...

    with pytest.raises(ConfigError, match="AsyncRateLimiter") as exc:
        RateLimiter().limit("1/second")(coro)
    assert exc.value.field == "function"
    with pytest.raises(ConfigError, match=r"RateLimiter\(") as exc:
        AsyncRateLimiter().limit("1/second")(plain)  # type: ignore[arg-type]
    assert exc.value.field == "function"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"limit": "10/fortnight"}, "rule"), ({"limit": 10}, "limit"), ({"limit": []}, "limit"),
    ({"limit": "10/minute", "cost": 0}, "cost"), ({"limit": "10/minute", "cost": 11}, "cost"),
    ({"limit": "10/minute", "key": 42}, "key"),
])
def test_bad_arguments_are_config_errors_naming_the_field(kwargs: dict[str, object],
                                                          field: str) -> None:
    limit = kwargs.pop("limit")
    with pytest.raises(ConfigError) as exc:
        RateLimiter().limit(limit, **kwargs)(lambda: None)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_a_key_function_must_return_a_string() -> None:
    @RateLimiter().limit("1/second", key=lambda: 42)  # type: ignore[arg-type, return-value]
    def f() -> None: ...

    with pytest.raises(TypeError, match="key"):
        f()


def test_rate_limited_is_public_and_pickles() -> None:
    assert stormguard.RateLimited is RateLimited
    assert "RateLimited" in stormguard.__all__
    assert "RateLimited" in (errors.__doc__ or "")
    d = RateLimiter().hit("k", Rule(1, 60))
    err = pickle.loads(pickle.dumps(RateLimited(d)))
    assert err.decision == d
