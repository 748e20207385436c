"""The state behind one service app (limiter, rules source, metrics, admin token) and its
lifecycle; the endpoint groups (:mod:`.check`, :mod:`.admin`, :mod:`.ops`) extend it."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.applications import Starlette

from stormguard._core import validate
from stormguard.observability.topk import SpaceSaving
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rules import CheckResult, Plan
from stormguard.service.metrics import Metrics
from stormguard.service.sources import RulesSource

__all__ = ["Companion", "ServiceBase"]


class Companion(Protocol):
    """A server that lives as long as the app, on its event loop (the gRPC rate-limit
    service): started after the app's start-up, stopped before its shutdown."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

log = logging.getLogger("stormguard.service")


class ServiceBase:
    """The state behind one app: limiter, rules source, metrics, admin token."""

    def __init__(self, limiter: AsyncRateLimiter | RateLimiter, source: RulesSource,
                 admin_token: str | None, metrics: Metrics, top_keys: int = 1000) -> None:
        self.limiter = limiter
        self.source = source
        # the token's bytes: UTF-8 (an environment variable's undecodable bytes as they were)
        self.admin_token = admin_token.encode("utf-8", "surrogateescape") if admin_token \
            else None
        self.metrics = metrics
        self.top = SpaceSaving(validate.integer("top_keys", top_keys, maximum=1_000_000))
        """The most-denied keys (``GET /v1/top``): a bounded space-saving sketch."""
        self._started = False
        self.companions: list[Companion] = []
        self._degraded_since: float | None = None
        self._degraded_n = 0

    def observe(self, plan: Plan, result: CheckResult) -> None:
        """After each check: the denied keys into the top-K sketch, and one log line when
        checks start being answered degraded (the store failing) and one when they stop."""
        if not result.allowed or result.shadow_denied:
            d = result.decision
            for key, spec in plan:
                if (not result.allowed and d is not None and spec.rule is d.rule) \
                        or spec.name in result.shadow_denied:
                    self.top.add(key, spec.name or "(inline)")
        self.observe_degraded(result)

    def observe_degraded(self, result: CheckResult) -> None:
        """After each check, whatever its protocol (``POST /v1/check``, Envoy's gRPC
        ``ShouldRateLimit``): one log line (``event`` ``degraded_start``) when checks start
        being answered degraded (the store failing) and one (``degraded_stop``, with the
        number of degraded decisions and the seconds) when a check is decided by the
        store again; a check that reached no rule (no decision) changes nothing."""
        if result.degraded:
            self._degraded_n += 1
            if self._degraded_since is None:
                self._degraded_since = time.monotonic()
                log.warning("stormguard: checks are answered degraded: the store fails, "
                            "on_error=%s answers", self.limiter.on_error,
                            extra={"event": "degraded_start",
                                   "on_error": self.limiter.on_error})
        elif self._degraded_since is not None and result.decision is not None:
            seconds = time.monotonic() - self._degraded_since
            n, self._degraded_since, self._degraded_n = self._degraded_n, None, 0
            log.warning("stormguard: checks are answered by the store again, after %d "
                        "degraded decisions in %.3f s", n, seconds,
                        extra={"event": "degraded_stop", "degraded_decisions": n,
                               "seconds": round(seconds, 3)})

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.source.start()

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self.source.stop()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        started: list[Companion] = []
        try:
            for companion in self.companions:
                await companion.start()
                started.append(companion)
            yield
        finally:
            for companion in reversed(started):
                await companion.stop()
            await self.stop()
