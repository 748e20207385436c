"""Rate-limit middleware: pure ASGI (FastAPI, Starlette, ...) and WSGI (Flask, Django, ...).

Both take a limiter and rules (a list, a :class:`~stormguard.ruleset.RuleSet` or a rules
file path), build the request attributes (user id from a callable, API key from a header,
the client IP, method, path, tier), check every matching rule in one go and answer a
denied request with ``429``, a JSON body, ``Retry-After`` and the rate-limit headers.
Allowed responses carry the rate-limit headers too.

**Client IP.** The socket peer address, unless the peer is a configured trusted proxy
(``trusted_proxies=["10.0.0.0/8", "127.0.0.1"]``): then ``X-Forwarded-For`` is walked
from the right, skipping trusted hops, and the first untrusted address is the client.
A client that is not a trusted proxy cannot change its address by sending the header.

**Store failures** follow the limiter's ``on_error`` (allow / deny / local); the limiter
turns every :class:`~stormguard.StorageError` into a degraded decision, so a storage
outage never becomes a 500.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from stormguard.errors import ConfigError
from stormguard.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ruleset import CheckResult, RequestAttrs, RuleSet, RuleSpec, acheck_plan

__all__ = ["ClientIP", "RateLimitMiddleware", "Scope", "WSGIRateLimitMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RulesArg = RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str | os.PathLike[str]
log = logging.getLogger("stormguard.middleware")
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse_ip(text: str) -> _Address | None:
    text = text.strip()
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text.startswith("["):  # "[2001:db8::1]:443"
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # "203.0.113.7:5678"
        host = text.partition(":")[0]
    else:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class ClientIP:
    """Resolve the client address from the socket peer and ``X-Forwarded-For``."""

    def __init__(self, trusted_proxies: Iterable[str] = ()) -> None:
        if isinstance(trusted_proxies, str):
            trusted_proxies = [trusted_proxies]
        nets: list[_Network] = []
        for p in trusted_proxies:
            try:
                nets.append(ipaddress.ip_network(p, strict=False))
            except (ValueError, TypeError):
                raise ConfigError("trusted_proxies", p,
                                  "must be IP addresses or networks such as '10.0.0.0/8'") \
                    from None
        self.networks = tuple(nets)

    def is_trusted(self, ip: _Address) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in n for n in self.networks)

    def resolve(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The client address: ``peer`` unless it is a trusted proxy, else the rightmost
        untrusted ``X-Forwarded-For`` hop."""
        if not self.networks or peer is None or not forwarded_for:
            return peer
        current = _parse_ip(peer)
        if current is None or not self.is_trusted(current):
            return peer
        for hop in reversed(forwarded_for.split(",")):
            ip = _parse_ip(hop)
            if ip is None:  # garbage from beyond the last trusted hop: stop at that hop
                break
            current = ip
            if not self.is_trusted(ip):
                break
        return str(current)


def _log_refused(exc: ConfigError) -> None:
    log.error("stormguard: the store refused a rule, request passed unlimited: %s", exc)


def _body(result: CheckResult) -> bytes:
    d = result.decision
    body = {"error": "rate limit exceeded", **result.to_dict()}
    if d is not None:
        body["retry_after"] = round(d.retry_after, 3)
    return json.dumps(body, separators=(",", ":")).encode()


class _Base:
    def __init__(self, limiter: Any, rules: RulesArg, *,
                 user: Callable[[Any], str | None] | None, tier: Callable[[Any], str | None]
                 | None, api_key_header: str | None, trusted_proxies: Iterable[str]) -> None:
        self.limiter = limiter
        self.rules = RuleSet.coerce(rules)
        self.user = user
        self.tier = tier
        self.api_key_header = api_key_header.lower() if api_key_header else None
        self.client_ip = ClientIP(trusted_proxies)


class RateLimitMiddleware(_Base):
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
            _log_refused(exc)
            await self.app(scope, receive, send)
            return
        headers = [(k.lower().encode(), v.encode()) for k, v in result.headers().items()]
        if not result.allowed:
            body = _body(result)
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


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WSGIRateLimitMiddleware(_Base):
    """WSGI middleware with a blocking :class:`RateLimiter`. ``user(environ)`` and
    ``tier(environ)`` return the user id and tier (or None)."""

    def __init__(self, app: WSGIApp, *, limiter: RateLimiter, rules: RulesArg,
                 user: Callable[[dict[str, Any]], str | None] | None = None,
                 tier: Callable[[dict[str, Any]], str | None] | None = None,
                 api_key_header: str | None = "x-api-key",
                 trusted_proxies: Iterable[str] = ()) -> None:
        if not isinstance(limiter, RateLimiter):
            raise ConfigError("limiter", limiter,
                              "must be a RateLimiter (WSGI is blocking; use "
                              "RateLimitMiddleware for an AsyncRateLimiter)")
        super().__init__(limiter, rules, user=user, tier=tier, api_key_header=api_key_header,
                         trusted_proxies=trusted_proxies)
        self.app = app
        self._api_key_env = ("HTTP_" + self.api_key_header.upper().replace("-", "_")
                             if self.api_key_header else None)

    def attrs(self, environ: dict[str, Any]) -> RequestAttrs:
        api_key = environ.get(self._api_key_env) if self._api_key_env else None
        return RequestAttrs(
            user=self.user(environ) if self.user is not None else None,
            api_key=api_key or None,
            ip=self.client_ip.resolve(environ.get("REMOTE_ADDR"),
                                      environ.get("HTTP_X_FORWARDED_FOR")),
            method=environ.get("REQUEST_METHOD"),
            path=environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""),
            tier=self.tier(environ) if self.tier is not None else None,
        )

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        attrs = self.attrs(environ)
        if not self.rules.match(attrs):
            return self.app(environ, start_response)
        try:
            result = self.rules.check(self.limiter, attrs)
        except ConfigError as exc:  # a rule the store cannot enforce: never a 500
            _log_refused(exc)
            return self.app(environ, start_response)
        headers = list(result.headers().items())
        if not result.allowed:
            body = _body(result)
            start_response("429 Too Many Requests", [
                ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                *headers])
            return [body]

        def start_with_headers(status: str, response_headers: list[tuple[str, str]],
                               exc_info: Any = None) -> Any:
            return start_response(status, [*response_headers, *headers], exc_info)

        return self.app(environ, start_with_headers)
