"""``limiter.limit(...)``: per-function rate limits, as decorators.

A :class:`~stormguard.RateLimiter` decorates blocking functions, an
:class:`~stormguard.AsyncRateLimiter` coroutine functions; a denied call raises
:class:`~stormguard.RateLimited` (its ``decision`` says when to retry) and the function
is not called.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar

from stormguard._core import validate
from stormguard._core.errors import ConfigError, RateLimited
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.rule import Rule

__all__ = ["AsyncHits", "BlockingHits", "KeyFunc", "LimitArg", "async_decorator", "rules_of",
           "sync_decorator"]

P = ParamSpec("P")
T = TypeVar("T")
LimitArg = str | Rule | Sequence[Rule]
"""``"10/minute"``, ``"10/minute;100/hour"`` (:meth:`Rule.parse_many`), a Rule or rules."""
KeyFunc = Callable[..., str]


def rules_of(limit: LimitArg, field: str = "limit") -> tuple[Rule, ...]:
    """The rules of a decorator's or a dependency's ``limit`` argument."""
    if isinstance(limit, str):
        return tuple(Rule.parse_many(limit))
    if isinstance(limit, Rule):
        return (limit,)
    rules = tuple(r for r in limit if isinstance(r, Rule)) if isinstance(limit, Sequence) else ()
    if rules and len(rules) == len(limit):
        return rules
    raise ConfigError(field, limit, "must be a limit string such as '10/minute' or "
                      "'10/minute;100/hour', a stormguard.Rule, or a list of rules")


class BlockingHits(Protocol):
    """What the blocking decorator needs of a limiter (a :class:`RateLimiter`)."""

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision: ...

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision: ...


class AsyncHits(Protocol):
    """What the asyncio decorator needs of a limiter (an :class:`AsyncRateLimiter`)."""

    async def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision: ...

    async def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision: ...


class _Limit:
    """What both decorators check before the call: the rules, the key and the cost."""

    __slots__ = ("cost", "key", "rules")

    def __init__(self, limit: LimitArg, key: KeyFunc | str | None, cost: int,
                 func: Callable[..., Any]) -> None:
        self.rules = rules_of(limit)
        self.cost = validate.integer("cost", cost)
        for rule in self.rules:
            if cost > rule.capacity:
                raise ConfigError("cost", cost, f"exceeds the capacity {rule.capacity} of "
                                  f"rule {rule}; no call could ever be admitted")
        if key is None:
            key = f"{func.__module__}.{func.__qualname__}"
        if not isinstance(key, str) and not callable(key):
            raise ConfigError("key", key, "must be a string or a callable taking the "
                              "function's arguments and returning the counter key")
        self.key = key

    def key_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if isinstance(self.key, str):
            return self.key
        key = self.key(*args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(f"key: the key function must return a str, got "
                            f"{type(key).__name__} {key!r:.80}")
        return key


def _callable(func: object) -> Callable[..., Any]:
    if not callable(func):
        raise ConfigError("function", func, "limit() decorates a function")
    return func


def sync_decorator(limiter: BlockingHits, limit: LimitArg, key: KeyFunc | str | None,
                   cost: int) -> Callable[[Callable[P, T]], Callable[P, T]]:
    def decorate(func: Callable[P, T]) -> Callable[P, T]:
        if inspect.iscoroutinefunction(_callable(func)):
            raise ConfigError("function", func, "is a coroutine function: a blocking "
                              "RateLimiter decorates blocking functions; use "
                              "AsyncRateLimiter(...).limit(...) for async ones")
        spec = _Limit(limit, key, cost, func)
        rules, one = spec.rules, len(spec.rules) == 1

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k = spec.key_for(args, kwargs)
            d = (limiter.hit(k, rules[0], spec.cost) if one
                 else limiter.hit_all(k, rules, spec.cost))
            if not d.allowed:
                raise RateLimited(d)
            return func(*args, **kwargs)

        return wrapper

    return decorate


def async_decorator(limiter: AsyncHits, limit: LimitArg, key: KeyFunc | str | None,
                    cost: int) -> Callable[[Callable[P, Awaitable[T]]],
                                           Callable[P, Awaitable[T]]]:
    def decorate(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        if not inspect.iscoroutinefunction(_callable(func)):
            raise ConfigError("function", func, "is not a coroutine function: an "
                              "AsyncRateLimiter decorates async functions; use "
                              "RateLimiter(...).limit(...) for blocking ones")
        spec = _Limit(limit, key, cost, func)
        rules, one = spec.rules, len(spec.rules) == 1

        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k = spec.key_for(args, kwargs)
            d = await (limiter.hit(k, rules[0], spec.cost) if one
                       else limiter.hit_all(k, rules, spec.cost))
            if not d.allowed:
                raise RateLimited(d)
            return await func(*args, **kwargs)

        return wrapper

    return decorate
