"""Per-route limits for Starlette endpoints: a decorator.

::

    from starlette.routing import Route
    from stormguard import AsyncRateLimiter
    from stormguard.integrations.starlette import rate_limit

    limiter = AsyncRateLimiter("redis://localhost:6379/0")

    @rate_limit("10/minute", key=lambda request: f"user:{request.user.display_name}",
                limiter=limiter)
    async def search(request):
        ...

    app = Starlette(routes=[Route("/search", search)])

The key function gets the request, after the app's middleware ran (an
``AuthenticationMiddleware``'s ``request.user``, a session). Denied: ``429`` with a
JSON body (as the middleware's) and the rate-limit headers, the endpoint not called;
allowed: the endpoint's response gets the rate-limit headers.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from stormguard._core.errors import ConfigError
from stormguard.integrations.route import RouteLimit
from stormguard.ratelimit.decorate import LimitArg
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter

__all__ = ["Endpoint", "rate_limit"]

Endpoint = Callable[[Request], Awaitable[Response]]


def rate_limit(limit: LimitArg, *, key: Callable[[Request], str],
               limiter: AsyncRateLimiter | RateLimiter, cost: int = 1,
               reset_header: str = "seconds") -> Callable[[Endpoint], Endpoint]:
    """Decorate an ``async def endpoint(request)``: see the module docstring; the
    arguments are those of :class:`stormguard.integrations.fastapi.RateLimit`."""
    route = RouteLimit(limit, key=key, limiter=limiter, cost=cost, reset_header=reset_header)

    def decorate(endpoint: Endpoint) -> Endpoint:
        if not inspect.iscoroutinefunction(endpoint):
            raise ConfigError("endpoint", endpoint,
                              "rate_limit() decorates an async def endpoint(request)")

        @functools.wraps(endpoint)
        async def limited(request: Request) -> Response:
            d = await route.check(route.key_for(request))
            headers = route.headers(d)
            if not d.allowed:
                return Response(route.denied_bytes(d), 429, headers=headers,
                                media_type="application/json")
            response = await endpoint(request)
            response.headers.update(headers)
            return response

        return limited

    return decorate
