"""Resilient httpx transports: run every request through a stormguard pipeline.

::

    pipeline = Pipeline(Timeout(total=3.0), Retry(attempts=3), CircuitBreaker(), Timeout(1.0))
    client = httpx.Client(transport=ResilientTransport(pipeline))

What the transport translates (the pipeline decides what to do about it):

* a response whose status is in ``failure_statuses`` (default: 429 and 5xx) is a
  failure inside the pipeline (the breaker counts it, a Fallback can answer);
  it is *retryable* when its status is in ``retry_statuses`` (429, 502, 503,
  504). Its ``Retry-After`` (seconds or an HTTP date) becomes the exception's
  ``retry_after``, which :class:`stormguard.Retry` honours (capped).
* connect errors and connect/pool timeouts are retryable for every method
  (nothing was sent); read/write timeouts and read errors are retryable for
  idempotent requests only.
* POST and PATCH (and any method not in ``IDEMPOTENT_METHODS``) are only
  retried when the request has an ``Idempotency-Key`` header or the transport
  was built with ``retry_non_idempotent=True``; a request whose body is a
  one-shot stream is never retried.
* each attempt's httpx timeouts (connect, read, write, pool) are clipped to
  what is left of the deadline in force (``Timeout`` in the pipeline); an
  attempt with no time left is not sent (``DeadlineExceeded``).

When the pipeline gives up, the caller gets what httpx would have given: the
last failing response (a 503 is returned, not raised) or the original httpx
exception, also when the retry budget was spent. ``DeadlineExceeded``,
``CircuitOpen`` and ``BulkheadFull`` are raised as themselves; a ``Fallback``
in the pipeline must return an ``httpx.Response``.
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC

import httpx

from stormguard._core import deadline
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import (
    ConfigError,
    DeadlineExceeded,
    RetryBudgetExhausted,
    TransientError,
)
from stormguard.resilience._base import Policy
from stormguard.resilience.retry import restrict

__all__ = [
    "FAILURE_STATUSES",
    "IDEMPOTENT_METHODS",
    "RETRY_STATUSES",
    "AsyncResilientTransport",
    "HTTPStatusFailure",
    "ResilientTransport",
    "RetryableHTTPStatus",
    "RetryableTransportFailure",
    "TransportFailure",
    "parse_retry_after",
]

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
RETRY_STATUSES = frozenset({429, 502, 503, 504})
FAILURE_STATUSES = frozenset({429, *range(500, 600)})
_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
# Nothing reached the server: safe to retry whatever the method.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_SENT_MAYBE = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError,
               httpx.RemoteProtocolError)


class HTTPStatusFailure(Exception):
    """A response with a failure status, carried through the pipeline as an exception."""

    def __init__(self, response: httpx.Response, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after = retry_after


class RetryableHTTPStatus(HTTPStatusFailure, TransientError):
    """A failure status that may be retried (429, 502, 503, 504 by default)."""


class TransportFailure(Exception):
    """An httpx transport error carried through the pipeline (``original``)."""

    def __init__(self, original: httpx.TransportError) -> None:
        super().__init__(repr(original))
        self.original = original


class RetryableTransportFailure(TransportFailure, TransientError):
    """A transport error that may be retried."""


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta seconds or HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - now)
    return seconds if seconds >= 0 and math.isfinite(seconds) else None


class _Translator:
    """What both transports share: per-request retry rights, timeouts, outcome mapping."""

    def __init__(self, pipeline: Policy, retry_statuses: frozenset[int],
                 failure_statuses: frozenset[int], retry_non_idempotent: bool,
                 clock: Clock | None) -> None:
        if not isinstance(pipeline, Policy):
            raise ConfigError("pipeline", pipeline, "must be a stormguard Pipeline or policy")
        self.pipeline = pipeline
        self.retry_statuses = frozenset(retry_statuses)
        self.failure_statuses = frozenset(failure_statuses) | self.retry_statuses
        self.retry_non_idempotent = retry_non_idempotent
        self.clock: Clock = system_clock if clock is None else clock

    def may_resend(self, request: httpx.Request) -> bool:
        if not isinstance(request.stream, httpx.ByteStream):
            return False  # a one-shot body cannot be sent twice
        return (request.method in IDEMPOTENT_METHODS or self.retry_non_idempotent
                or "idempotency-key" in request.headers)

    @staticmethod
    def clip_timeouts(request: httpx.Request, base: dict[str, float | None]) -> None:
        left = deadline.remaining()
        if left is None:
            return
        if left <= 0:
            raise DeadlineExceeded("no time left for another HTTP attempt")
        request.extensions["timeout"] = {
            key: left if base.get(key) is None else min(left, base[key])  # type: ignore[type-var]
            for key in _TIMEOUT_KEYS}

    @staticmethod
    def nothing_sent(exc: BaseException) -> bool:
        """True when ``exc`` (or what caused it) proves the request never left."""
        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, TransportFailure):
                return isinstance(seen.original, _NOT_SENT)
            seen = seen.__cause__
        return False

    @staticmethod
    def transport_error(exc: httpx.TransportError, resend: bool) -> TransportFailure:
        if isinstance(exc, _NOT_SENT) or (resend and isinstance(exc, _SENT_MAYBE)):
            return RetryableTransportFailure(exc)
        return TransportFailure(exc)

    def status_failure(self, request: httpx.Request, response: httpx.Response, raw: bytes,
                       resend: bool) -> HTTPStatusFailure:
        kept = httpx.Response(response.status_code, headers=response.headers,
                              stream=httpx.ByteStream(raw), extensions=response.extensions,
                              request=request)
        if resend and response.status_code in self.retry_statuses:
            after = parse_retry_after(response.headers.get("retry-after"), self.clock.wall())
            return RetryableHTTPStatus(kept, after)
        return HTTPStatusFailure(kept)

    @staticmethod
    def unwrap(exc: Exception) -> httpx.Response:
        """Turn the pipeline's final error back into what httpx would have given."""
        inner: BaseException | None = exc
        if isinstance(exc, RetryBudgetExhausted):
            inner = exc.__cause__
        if isinstance(inner, HTTPStatusFailure):
            return inner.response
        if isinstance(inner, TransportFailure):
            raise inner.original from None
        raise exc

    @staticmethod
    def check(result: object) -> httpx.Response:
        if not isinstance(result, httpx.Response):
            raise TypeError(f"the pipeline must produce an httpx.Response (a Fallback "
                            f"returned {result!r})")
        return result


# The transports' flow, once: asyncio source, blocking twin generated (tools/unasync.py).
# unasync: source transport
class AsyncResilientTransport(httpx.AsyncBaseTransport):
    # sync: """An httpx transport that sends each request through ``pipeline``."""
    """The asyncio twin of :class:`ResilientTransport` (real cancellation on timeouts)."""

    def __init__(
        self, pipeline: Policy, transport: httpx.AsyncBaseTransport | None = None, *,
        retry_statuses: frozenset[int] = RETRY_STATUSES,
        failure_statuses: frozenset[int] = FAILURE_STATUSES,
        retry_non_idempotent: bool = False, clock: Clock | None = None,
    ) -> None:
        self._t = _Translator(pipeline, retry_statuses, failure_statuses,
                              retry_non_idempotent, clock)
        self._transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t, inner = self._t, self._transport
        resend = t.may_resend(request)
        base = dict(request.extensions.get("timeout", {}))

        async def attempt() -> httpx.Response:
            t.clip_timeouts(request, base)
            try:
                response = await inner.handle_async_request(request)
            except httpx.TransportError as exc:
                raise t.transport_error(exc, resend) from exc
            if response.status_code in t.failure_statuses:
                try:
                    # sync: raw = b"".join(response.iter_raw())
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                finally:
                    await response.aclose()
                raise t.status_failure(request, response, raw, resend)
            return response

        try:
            if resend:
                return t.check(await t.pipeline.acall(attempt))
            with restrict(t.nothing_sent):
                return t.check(await t.pipeline.acall(attempt))
        except (HTTPStatusFailure, TransportFailure, RetryBudgetExhausted) as exc:
            return t.unwrap(exc)

    async def aclose(self) -> None:
        await self._transport.aclose()
# unasync: end


# unasync: generated transport (python tools/unasync.py; do not edit)
class ResilientTransport(httpx.BaseTransport):
    """An httpx transport that sends each request through ``pipeline``."""

    def __init__(
        self, pipeline: Policy, transport: httpx.BaseTransport | None = None, *,
        retry_statuses: frozenset[int] = RETRY_STATUSES,
        failure_statuses: frozenset[int] = FAILURE_STATUSES,
        retry_non_idempotent: bool = False, clock: Clock | None = None,
    ) -> None:
        self._t = _Translator(pipeline, retry_statuses, failure_statuses,
                              retry_non_idempotent, clock)
        self._transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        t, inner = self._t, self._transport
        resend = t.may_resend(request)
        base = dict(request.extensions.get("timeout", {}))

        def attempt() -> httpx.Response:
            t.clip_timeouts(request, base)
            try:
                response = inner.handle_request(request)
            except httpx.TransportError as exc:
                raise t.transport_error(exc, resend) from exc
            if response.status_code in t.failure_statuses:
                try:
                    raw = b"".join(response.iter_raw())
                finally:
                    response.close()
                raise t.status_failure(request, response, raw, resend)
            return response

        try:
            if resend:
                return t.check(t.pipeline.call(attempt))
            with restrict(t.nothing_sent):
                return t.check(t.pipeline.call(attempt))
        except (HTTPStatusFailure, TransportFailure, RetryBudgetExhausted) as exc:
            return t.unwrap(exc)

    def close(self) -> None:
        self._transport.close()
# unasync: end
