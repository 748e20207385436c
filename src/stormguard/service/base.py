"""The state behind one service app (limiter, rules source, metrics, admin token) and its
lifecycle; the endpoint groups (:mod:`.check`, :mod:`.admin`, :mod:`.ops`) extend it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.applications import Starlette

from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.service.metrics import Metrics
from stormguard.service.sources import RulesSource

__all__ = ["Companion", "ServiceBase"]


class Companion(Protocol):
    """A server that lives as long as the app, on its event loop (the gRPC rate-limit
    service): started after the app's start-up, stopped before its shutdown."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ServiceBase:
    """The state behind one app: limiter, rules source, metrics, admin token."""

    def __init__(self, limiter: AsyncRateLimiter | RateLimiter, source: RulesSource,
                 admin_token: str | None, metrics: Metrics) -> None:
        self.limiter = limiter
        self.source = source
        # the token's bytes: UTF-8 (an environment variable's undecodable bytes as they were)
        self.admin_token = admin_token.encode("utf-8", "surrogateescape") if admin_token \
            else None
        self.metrics = metrics
        self._started = False
        self.companions: list[Companion] = []

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
