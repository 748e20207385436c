"""What the per-route integrations (the FastAPI dependency, the Starlette decorator)
share: the limit, the key function, the limiter, the headers and the 429 body."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.integrations.asgi import check_async_limiter
from stormguard.integrations.headers import RESET_HEADERS
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.decorate import LimitArg, rules_of
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.stores.base import check_cost

__all__ = ["RouteLimit"]


class RouteLimit:
    """One route's limit: ``limit`` (``"10/minute"``, ``"10/minute;100/hour"``, a Rule or
    rules) spent ``cost`` at a time per key, the key from ``key(request, ...)``."""

    def __init__(self, limit: LimitArg, *, key: Callable[..., str],
                 limiter: AsyncRateLimiter | RateLimiter, cost: int = 1,
                 reset_header: str = "seconds") -> None:
        self.rules = rules_of(limit)
        if not callable(key):
            raise ConfigError("key", key, "must be a callable taking the request and "
                              "returning the counter key")
        check_async_limiter(limiter)
        self.key = key
        self.limiter = limiter
        self.cost = validate.integer("cost", cost)
        for rule in self.rules:
            if cost != 1:
                check_cost(rule, cost)
        self.reset_header = validate.one_of("reset_header", reset_header, RESET_HEADERS)

    def key_for(self, *args: Any) -> str:
        key = self.key(*args)
        if not isinstance(key, str):
            raise TypeError(f"key: the key function must return a str, got "
                            f"{type(key).__name__} {key!r:.80}")
        return key

    async def check(self, key: str) -> Decision:
        limiter, rules = self.limiter, self.rules
        if isinstance(limiter, AsyncRateLimiter):
            if len(rules) == 1:
                return await limiter.hit(key, rules[0], self.cost)
            return await limiter.hit_all(key, rules, self.cost)
        if len(rules) == 1:  # a RateLimiter over memory:// (never blocks)
            return limiter.hit(key, rules[0], self.cost)
        return limiter.hit_all(key, rules, self.cost)

    def headers(self, d: Decision) -> dict[str, str]:
        if self.reset_header == "seconds":
            return d.headers()
        return d.headers(self.reset_header, self.limiter.store.clock.wall())

    @staticmethod
    def denied(d: Decision) -> dict[str, object]:
        """The 429 body (as the middleware's): ``error``, the decision, ``retry_after``."""
        return {"error": "rate limit exceeded", **d.to_dict(),
                "retry_after": round(d.retry_after, 3)}

    @staticmethod
    def denied_bytes(d: Decision) -> bytes:
        return json.dumps(RouteLimit.denied(d), separators=(",", ":")).encode()
