"""Pure ASGI rate-limit middleware (FastAPI, Starlette, ...): see :mod:`stormguard.middleware`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from stormguard._core.errors import ConfigError
from stormguard.integrations.headers import MiddlewareBase, RulesArg, denied_body, log_refused
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rules import RequestAttrs, acheck_plan

__all__ = ["RateLimitMiddleware", "Scope"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware(MiddlewareBase):
    """Pure ASGI middleware. ``user(scope)`` and ``tier(scope)`` return the user id and
    tier (or None); the API key comes from ``api_key_header``."""

    def __init__(self, app: ASGIApp, *, limiter: AsyncRateLimiter | RateLimiter,
                 rules: RulesArg, user: Callable[[Scope], str | None] | None = None,
                 tier: Callable[[Scope], str | None] | None = None,
                 api_key_header: str | None = "x-api-key",
                 trusted_proxies: Iterable[str] = ()) -> None:
        if not isinstance(limiter, AsyncRateLimiter | RateLimiter):
            raise ConfigError("limiter", limiter, "must be an AsyncRateLimiter or RateLimiter")
        super().__init__(limiter, rules, user=user, tier=tier, api_key_header=api_key_header,
                         trusted_proxies=trusted_proxies)
        self.app = app
        self._api_key = self.api_key_header.encode() if self.api_key_header else None

    def attrs(self, scope: Scope) -> RequestAttrs:
        api_key = None
        xff: list[str] = []
        for name, value in scope.get("headers") or ():
            if name == b"x-forwarded-for":
                xff.append(value.decode("latin-1"))
            elif name == self._api_key:
                api_key = value.decode("latin-1")
        client = scope.get("client")
        peer = client[0] if client else None
        return RequestAttrs(
            user=self.user(scope) if self.user is not None else None,
            api_key=api_key or None,
            ip=self.client_ip.resolve(peer, ",".join(xff)),
            method=scope.get("method"),
            path=scope.get("path"),
            tier=self.tier(scope) if self.tier is not None else None,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        plan = self.rules.plan(self.attrs(scope))
        if not plan:
            await self.app(scope, receive, send)
            return
        try:
            result = await acheck_plan(self.limiter, plan)
        except ConfigError as exc:  # a rule the store cannot enforce: never a 500
            log_refused(exc)
            await self.app(scope, receive, send)
            return
        headers = [(k.lower().encode(), v.encode()) for k, v in result.headers().items()]
        if not result.allowed:
            body = denied_body(result)
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), *headers]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)
