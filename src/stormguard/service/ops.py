"""Operations endpoints: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from stormguard.ratelimit.limiter import AsyncRateLimiter
from stormguard.service.base import ServiceBase
from stormguard.service.http import json_response
from stormguard.service.metrics import CONTENT_TYPE_LATEST
from stormguard.service.openapi import openapi_document

__all__ = ["OpsEndpoints"]


class OpsEndpoints(ServiceBase):
    """Liveness, readiness, Prometheus metrics and the OpenAPI document."""

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        try:
            if isinstance(self.limiter, AsyncRateLimiter):
                ok = await self.limiter.ping()
            else:
                ok = self.limiter.ping()
        except Exception as exc:  # any failure of the store means "not ready", never a 500
            return json_response({"status": "unavailable", "error": f"store: {exc}"[:300]},
                                 503)
        if not ok:
            return json_response({"status": "unavailable", "error": "store does not answer"},
                                 503)
        return json_response({"status": "ready", "rules": len(self.source.current),
                              "version": self.source.current.version})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), 200, media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_document())
