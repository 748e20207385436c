"""Pure ASGI rate-limit middleware (FastAPI, Starlette, ...): see :mod:`stormguard.middleware`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from stormguard._core.errors import ConfigError
from stormguard.integrations.headers import MiddlewareBase, RulesArg, denied_body, log_refused
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rules import RequestAttrs, acheck_plan
from stormguard.stores.memory import MemoryStore

__all__ = ["RateLimitMiddleware", "Scope", "check_async_limiter"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def check_async_limiter(limiter: object) -> None:
    """Refuse a limiter that would block the event loop: an :class:`AsyncRateLimiter`,
    or a blocking :class:`RateLimiter` over the in-process memory store (which never
    blocks); anything else is a :class:`ConfigError` naming ``limiter``."""
    if isinstance(limiter, AsyncRateLimiter):
        return
    if not isinstance(limiter, RateLimiter):
        raise ConfigError("limiter", limiter, "must be an AsyncRateLimiter or RateLimiter")
    if not isinstance(limiter.store, MemoryStore):
        raise ConfigError("limiter", limiter,
                          f"a blocking RateLimiter over {type(limiter.store).__name__} would "
                          "block the event loop on every check (up to the store's timeout); "
                          "use AsyncRateLimiter with the same store (a blocking RateLimiter "
                          "is accepted only over memory://, which never blocks)")


class RateLimitMiddleware(MiddlewareBase):
    """Pure ASGI middleware. ``user(scope)`` and ``tier(scope)`` return the user id and
    tier (or None); the API key comes from ``api_key_header``.

    ``limiter`` is an :class:`AsyncRateLimiter` (a blocking :class:`RateLimiter` only over
    ``memory://``: over Redis it would block the event loop, and is refused). Requests
    whose path matches an ``exempt`` glob (``["/healthz", "/metrics", "/docs*"]``) are
    neither checked nor given headers. ``reset_header="epoch"`` sends
    ``X-RateLimit-Reset`` as an epoch timestamp instead of seconds from now.
    """

    def __init__(self, app: ASGIApp, *, limiter: AsyncRateLimiter | RateLimiter,
                 rules: RulesArg, user: Callable[[Scope], str | None] | None = None,
                 tier: Callable[[Scope], str | None] | None = None,
                 api_key_header: str | None = "x-api-key",
                 trusted_proxies: Iterable[str] = (), exempt: Iterable[str] = (),
                 reset_header: str = "seconds") -> None:
        check_async_limiter(limiter)
        super().__init__(limiter, rules, user=user, tier=tier, api_key_header=api_key_header,
                         trusted_proxies=trusted_proxies, exempt=exempt,
                         reset_header=reset_header)
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
        if scope["type"] != "http" or (
                self.is_exempt is not None and self.is_exempt(scope.get("path") or "")):
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
        headers = [(k.lower().encode(), v.encode()) for k, v in self.headers(result).items()]
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
