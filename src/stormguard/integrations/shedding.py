"""Priority load-shedding middleware, ASGI and WSGI: see :mod:`stormguard.middleware`.

Both resolve a request's tier (a callable, a trusted proxy's header, the first matching
``priorities`` pattern, else ``default``), ask one :class:`~stormguard.overload.Shedder`
for a slot and answer a shed request with ``503``, ``Retry-After`` and a JSON body naming
the tier, before the app is called and before the request body is read.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.errors import ConfigError, Shed
from stormguard.integrations.clientip import ClientIP, _parse_ip
from stormguard.integrations.headers import exempt_matcher
from stormguard.observability.events import Listener
from stormguard.overload.limit import AdaptiveLimit
from stormguard.overload.shedder import TIERS, Shedder, Ticket, tier_index

__all__ = ["LoadSheddingMiddleware", "Priorities", "WSGILoadSheddingMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_METHOD = re.compile(r"^([A-Z]+)\s+(\S.*)$")
_CACHE = 4096  # (method, path) -> tier memo entries per middleware
_REASONS = ("capacity", "queue_timeout", "codel")


class Priorities:
    """Request -> tier index: ``priority(request)``, a trusted proxy's header, the first
    matching ``"[METHOD ]/glob"`` pattern, else ``default``."""

    def __init__(self, priorities: Mapping[str, str] | None, default: str,
                 priority: Callable[[Any], str | None] | None, priority_header: str | None,
                 trusted_proxies: Iterable[str]) -> None:
        self.default = tier_index("default", default)
        self.rules: list[tuple[str | None, re.Pattern[str], int]] = []
        if priorities is not None:
            if not isinstance(priorities, Mapping):
                raise ConfigError("priorities", priorities,
                                  "must map '[METHOD ]/path-glob' patterns to tiers")
            for pattern, tier in priorities.items():
                validate.text("priorities", pattern)
                m = _METHOD.match(pattern)
                method, glob = (m[1], m[2]) if m else (None, pattern)
                if not glob.startswith(("/", "*")):
                    raise ConfigError("priorities", pattern, "patterns must be path globs "
                                      "such as '/cart*' or 'POST /checkout*'")
                self.rules.append((method, re.compile(fnmatch.translate(glob)),
                                   tier_index(f"priorities[{pattern!r}]", tier)))
        if priority is not None and not callable(priority):
            raise ConfigError("priority", priority, "must be a callable taking the request "
                              "(the ASGI scope, the WSGI environ) and returning a tier or None")
        self.priority = priority
        self.header = (validate.text("priority_header", priority_header).lower()
                       if priority_header is not None else None)
        self.proxies = ClientIP(trusted_proxies)
        if self.header is not None and not self.proxies.networks:
            raise ConfigError("priority_header", priority_header, "is honoured only from "
                              "trusted proxies: list them in trusted_proxies")
        self._patterns = list(priorities or {})
        self._memo: dict[tuple[str, str], tuple[int, str]] = {}

    def route(self, method: str, path: str) -> tuple[int, str]:
        """The tier of the first matching pattern (else the default) and the latency key
        of the request: that pattern (so /products/1/gallery and /products/2/gallery share
        a baseline), else the path."""
        memo = self._memo
        got = memo.get((method, path))
        if got is not None:
            return got
        found = (self.default, path)
        for i, (m, rx, t) in enumerate(self.rules):
            if (m is None or m == method) and rx.match(path) is not None:
                found = (t, self._patterns[i])
                break
        if len(memo) >= _CACHE:
            memo.clear()
        memo[(method, path)] = found
        return found

    def of_path(self, method: str, path: str) -> int:
        return self.route(method, path)[0]

    def from_callable(self, request: Any) -> int | None:
        assert self.priority is not None
        tier = self.priority(request)
        if tier is None:
            return None
        try:
            return TIERS.index(tier)
        except ValueError:
            raise ValueError(f"priority: the callable must return 'critical', 'degraded', "
                             f"'sheddable' or None, got {tier!r:.80}") from None

    def from_header(self, peer: str | None, value: str | None) -> int | None:
        if value is None or peer is None:
            return None
        ip = _parse_ip(peer)
        if ip is None or not self.proxies.is_trusted(ip):
            return None
        value = value.strip().lower()
        return TIERS.index(value) if value in TIERS else None


class _Base:
    def __init__(self, *, priorities: Mapping[str, str] | None, default: str,
                 priority: Callable[[Any], str | None] | None, priority_header: str | None,
                 trusted_proxies: Iterable[str], limit: AdaptiveLimit | int | None,
                 queue_timeout: float | Mapping[str, float], shares: Mapping[str, float] | None,
                 exempt: Iterable[str], retry_after: float, codel_target: float,
                 codel_interval: float, max_queue: int, name: str, clock: Clock | None,
                 listeners: Iterable[Listener], shedder: Shedder | None,
                 switch_interval: float | None) -> None:
        self.switch_interval = (None if switch_interval is None
                                else validate.duration("switch_interval", switch_interval))
        if self.switch_interval is not None:  # opt-in: the whole interpreter's setting
            sys.setswitchinterval(self.switch_interval)
        self.priorities = Priorities(priorities, default, priority, priority_header,
                                     trusted_proxies)
        if shedder is not None:
            if not isinstance(shedder, Shedder):
                raise ConfigError("shedder", shedder, "must be a stormguard.overload.Shedder")
            self.shedder = shedder
        else:
            self.shedder = Shedder(limit, queue_timeout=queue_timeout, shares=shares,
                                   codel_target=codel_target, codel_interval=codel_interval,
                                   max_queue=max_queue, retry_after=retry_after, name=name,
                                   clock=clock, listeners=listeners)
        self.is_exempt = exempt_matcher(exempt)
        retry = str(math.ceil(self.shedder.retry_after))
        self._retry_after = retry
        self._bodies = {
            (t, r): json.dumps({"error": "overloaded", "tier": TIERS[t], "reason": r,
                                "retry_after": self.shedder.retry_after},
                               separators=(",", ":")).encode()
            for t in range(len(TIERS)) for r in _REASONS}

    def stats(self) -> dict[str, Any]:
        """The shedder's gauges and counters (limit, in flight and shed per tier...)."""
        return self.shedder.stats()

    def body(self, shed: Shed) -> bytes:
        return self._bodies[(TIERS.index(shed.tier), shed.reason)]


class LoadSheddingMiddleware(_Base):
    """Pure ASGI priority load shedding (FastAPI, Starlette, ...), zero-config by default.

    ``priorities`` maps ``"[METHOD ]/path-glob"`` to ``"critical"``, ``"degraded"`` or
    ``"sheddable"`` (first match wins, else ``default``); ``priority(scope)`` may decide
    first (None: fall through); ``priority_header`` is read only from ``trusted_proxies``.
    ``limit`` is an :class:`~stormguard.AdaptiveLimit` (the default) or an int.
    ``queue_timeout`` is one wait for every tier or a mapping per tier. ``switch_interval``
    (seconds; ``0.0001`` for CPU-bound endpoints in the thread pool; default: leave it
    alone) sets the interpreter's :func:`sys.setswitchinterval`: the event loop, which
    answers every 503, waits up to one interval for the GIL per busy thread, two or more
    times per request (docs/overload.md, deployment).
    """

    def __init__(self, app: ASGIApp, *, priorities: Mapping[str, str] | None = None,
                 default: str = "degraded", priority: Callable[[Scope], str | None] | None = None,
                 priority_header: str | None = None, trusted_proxies: Iterable[str] = (),
                 limit: AdaptiveLimit | int | None = None,
                 queue_timeout: float | Mapping[str, float] = 0.05,
                 shares: Mapping[str, float] | None = None, exempt: Iterable[str] = (),
                 retry_after: float = 1.0, codel_target: float = 0.005,
                 codel_interval: float = 0.1, max_queue: int = 1000,
                 name: str = "load-shedding", clock: Clock | None = None,
                 listeners: Iterable[Listener] = (), shedder: Shedder | None = None,
                 switch_interval: float | None = None) -> None:
        super().__init__(priorities=priorities, default=default, priority=priority,
                         priority_header=priority_header, trusted_proxies=trusted_proxies,
                         limit=limit, queue_timeout=queue_timeout, shares=shares, exempt=exempt,
                         retry_after=retry_after, codel_target=codel_target,
                         codel_interval=codel_interval, max_queue=max_queue, name=name,
                         clock=clock, listeners=listeners, shedder=shedder,
                         switch_interval=switch_interval)
        self.app = app
        self._header = self.priorities.header.encode() if self.priorities.header else None

    def tier(self, scope: Scope) -> int:
        return self.classify(scope)[0]

    def classify(self, scope: Scope) -> tuple[int, str]:
        """The request's tier and latency key."""
        p = self.priorities
        tier, key = p.route(scope.get("method", "GET"), scope.get("path", "/"))
        if p.priority is not None:
            got = p.from_callable(scope)
            if got is not None:
                return got, key
        if self._header is not None:
            value = None
            for name, v in scope.get("headers") or ():
                if name == self._header:
                    value = v.decode("latin-1")
                    break
            client = scope.get("client")
            got = p.from_header(client[0] if client else None, value)
            if got is not None:
                return got, key
        return tier, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.is_exempt is not None
                                       and self.is_exempt(scope.get("path", "/"))):
            await self.app(scope, receive, send)
            return
        tier, key = self.classify(scope)
        shedder = self.shedder
        got = await shedder.acquire_async(tier, key)
        if not isinstance(got, Ticket):
            await self._shed(got, send)
            return
        ok = False
        try:
            await self.app(scope, receive, send)
            ok = True
        finally:
            shedder.release(got, ok)

    async def _shed(self, shed: Shed, send: Send) -> None:
        body = self.body(shed)
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", self._retry_after.encode()),
        ]})
        await send({"type": "http.response.body", "body": body})


class _Released:
    """The app's response iterable; the slot is released when the server closes it."""

    def __init__(self, body: Iterable[bytes], release: Callable[[bool], None]) -> None:
        self._body = body
        self._release: Callable[[bool], None] | None = release
        self._ok = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._body
        except BaseException:
            self.close()
            raise
        self._ok = True
        release, self._release = self._release, None
        if release is not None:  # the body is out: free the slot now (close() may be late)
            release(True)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release(self._ok)


class WSGILoadSheddingMiddleware(_Base):
    """WSGI priority load shedding for thread-pool servers (gunicorn ``--threads``,
    waitress): the same tiers and limit as :class:`LoadSheddingMiddleware`, per process.
    A request that waits for a slot blocks its server thread, at most ``queue_timeout``;
    ``switch_interval`` as for :class:`LoadSheddingMiddleware`."""

    def __init__(self, app: WSGIApp, *, priorities: Mapping[str, str] | None = None,
                 default: str = "degraded",
                 priority: Callable[[dict[str, Any]], str | None] | None = None,
                 priority_header: str | None = None, trusted_proxies: Iterable[str] = (),
                 limit: AdaptiveLimit | int | None = None,
                 queue_timeout: float | Mapping[str, float] = 0.05,
                 shares: Mapping[str, float] | None = None, exempt: Iterable[str] = (),
                 retry_after: float = 1.0, codel_target: float = 0.005,
                 codel_interval: float = 0.1, max_queue: int = 1000,
                 name: str = "load-shedding", clock: Clock | None = None,
                 listeners: Iterable[Listener] = (), shedder: Shedder | None = None,
                 switch_interval: float | None = None) -> None:
        super().__init__(priorities=priorities, default=default, priority=priority,
                         priority_header=priority_header, trusted_proxies=trusted_proxies,
                         limit=limit, queue_timeout=queue_timeout, shares=shares, exempt=exempt,
                         retry_after=retry_after, codel_target=codel_target,
                         codel_interval=codel_interval, max_queue=max_queue, name=name,
                         clock=clock, listeners=listeners, shedder=shedder,
                         switch_interval=switch_interval)
        self.app = app
        self._environ_key = ("HTTP_" + self.priorities.header.upper().replace("-", "_")
                             if self.priorities.header else None)

    def tier(self, environ: dict[str, Any]) -> int:
        return self.classify(environ)[0]

    def classify(self, environ: dict[str, Any]) -> tuple[int, str]:
        """The request's tier and latency key."""
        p = self.priorities
        tier, key = p.route(environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/"))
        if p.priority is not None:
            got = p.from_callable(environ)
            if got is not None:
                return got, key
        if self._environ_key is not None:
            got = p.from_header(environ.get("REMOTE_ADDR"), environ.get(self._environ_key))
            if got is not None:
                return got, key
        return tier, key

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if self.is_exempt is not None and self.is_exempt(path):
            return self.app(environ, start_response)
        tier, key = self.classify(environ)
        shedder = self.shedder
        got = shedder.acquire_blocking(tier, key)
        if not isinstance(got, Ticket):
            body = self.body(got)
            start_response("503 Service Unavailable", [
                ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                ("Retry-After", self._retry_after)])
            return [body]
        ticket = got
        try:
            body_iter = self.app(environ, start_response)
        except BaseException:
            shedder.release(ticket, False)
            raise
        return _Released(body_iter, lambda ok: shedder.release(ticket, ok))
