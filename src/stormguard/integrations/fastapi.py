"""A FastAPI dependency: per-route limits keyed by anything the app knows, including the
authenticated user.

::

    from fastapi import Depends, FastAPI
    from stormguard import AsyncRateLimiter
    from stormguard.integrations.fastapi import RateLimit

    limiter = AsyncRateLimiter("redis://localhost:6379/0")
    search_limit = RateLimit("10/minute;100/hour", limiter=limiter,
                             key=lambda request, user: f"user:{user.id}", auth=current_user)

    @app.get("/search", dependencies=[Depends(search_limit)])
    async def search(q: str) -> dict: ...

``auth`` is the app's own dependency (``current_user`` above): FastAPI resolves it first
(once per request, shared with the endpoint's own ``Depends(current_user)``; its
``HTTPException`` answers before anything is counted) and the key function gets its
value after the request. Without ``auth`` the key function gets the request alone
(``key=lambda request: request.client.host``).

Denied: ``HTTPException(429)`` with the rate-limit headers and ``Retry-After`` (FastAPI
answers ``{"detail": {"error": "rate limit exceeded", "rule": ..., "retry_after": ...}}``).
Allowed: the rate-limit headers are set on the response (FastAPI copies a dependency's
response headers onto what the endpoint returns, unless the endpoint returns a
``Response`` object itself). The dependency's value is the :class:`~stormguard.Decision`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fastapi import Depends, HTTPException, Request, Response

from stormguard.integrations.route import RouteLimit
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.decorate import LimitArg
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter

__all__ = ["RateLimit"]

_P = inspect.Parameter


class RateLimit:
    """``Depends(RateLimit("10/minute", key=lambda request: ..., limiter=limiter))``.

    ``limit``: ``"10/minute"``, ``"10/minute;100/hour"`` (:meth:`stormguard.Rule.parse_many`),
    a Rule or rules; ``cost`` per request; ``auth``: a dependency whose value the key
    function gets too; ``reset_header="epoch"``: ``X-RateLimit-Reset`` as an epoch
    timestamp. ``limiter`` is an :class:`~stormguard.AsyncRateLimiter` (a blocking one only
    over ``memory://``).
    """

    def __init__(self, limit: LimitArg, *, key: Callable[..., str],
                 limiter: AsyncRateLimiter | RateLimiter, auth: Callable[..., Any] | None = None,
                 cost: int = 1, reset_header: str = "seconds") -> None:
        self.route = RouteLimit(limit, key=key, limiter=limiter, cost=cost,
                                reset_header=reset_header)
        self.auth = auth
        params = [_P("request", _P.POSITIONAL_OR_KEYWORD, annotation=Request),
                  _P("response", _P.POSITIONAL_OR_KEYWORD, annotation=Response)]
        if auth is not None:
            params.append(_P("auth", _P.POSITIONAL_OR_KEYWORD, annotation=Any,
                             default=Depends(auth)))
        # FastAPI reads the dependency's parameters from its signature: the auth
        # dependency becomes a sub-dependency, resolved before this one
        self.__signature__ = inspect.Signature(params, return_annotation=Decision)

    async def __call__(self, request: Request, response: Response,
                       auth: Any = None) -> Decision:
        route = self.route
        key = route.key_for(request) if self.auth is None else route.key_for(request, auth)
        d = await route.check(key)
        headers = route.headers(d)
        if not d.allowed:
            raise HTTPException(429, detail=route.denied(d), headers=headers)
        response.headers.update(headers)
        return d

    def __repr__(self) -> str:
        return f"RateLimit({list(map(str, self.route.rules))}, limiter={self.route.limiter!r})"
