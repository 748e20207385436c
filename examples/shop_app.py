"""A shop under overload: priority load shedding in front of CPU-bound endpoints.

Run it:   SHOP_PROTECTION=adaptive uvicorn examples.shop_app:app --no-access-log
          (SHOP_PROTECTION: "adaptive" (LoadSheddingMiddleware + AdaptiveLimit, the default),
          "fixed" (the middleware with a fixed limit of SHOP_FIXED_LIMIT, one tier), "none";
          SHOP_TOLERANCE, SHOP_LIMIT_MIN: another AdaptiveLimit tolerance, floor;
          SHOP_SWITCH_INTERVAL: the GIL's)
Load it:  python bench/overload.py

The endpoints are plain ``def`` functions: Starlette runs them in its thread pool, so the
work in flight is visible to the middleware (an ``async def`` endpoint that burns CPU
blocks the event loop, and the queue then forms in the socket, where no middleware can
see it). Each burns about the CPU time of the issue's shop: checkout 20 ms, cart 5 ms,
reviews 10 ms, recommendations 15 ms, analytics 5 ms.

``build_app(protection, work=...)`` is the same shop with another ``work(seconds)``
(an awaitable one): the in-process tests run it on a virtual clock.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stormguard import AdaptiveLimit
from stormguard.middleware import LoadSheddingMiddleware

#: CPU seconds per endpoint
COST = {"/checkout": 0.020, "/cart": 0.005, "/reviews": 0.010, "/recommendations": 0.015,
        "/analytics": 0.005}

PRIORITIES = {
    "POST /checkout*": "critical", "/cart*": "critical", "/payment*": "critical",
    "/reviews*": "degraded", "/products/*/gallery": "degraded",
    "/recommendations*": "sheddable", "/analytics*": "sheddable",
}
FIXED_LIMIT = 8


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (not wall time: under contention the
    request takes longer, as real work does)."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i


def _sync_routes() -> list[Route]:
    def endpoint(cost: float) -> Callable[[Request], JSONResponse]:
        def handle(request: Request) -> JSONResponse:
            burn(cost)
            return JSONResponse({"ok": True, "path": request.url.path})

        return handle

    return [Route(path, endpoint(cost), methods=["GET", "POST"]) for path, cost in COST.items()]


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


_protected: list[Any] = []  # the middleware, for /stats


async def stats(request: Request) -> JSONResponse:
    """The shedder's gauges (exempt from shedding): what the load test samples."""
    return JSONResponse(_protected[0].stats() if _protected else {})


def _async_routes(work: Callable[[float], Awaitable[None]]) -> list[Route]:
    def endpoint(cost: float) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def handle(request: Request) -> JSONResponse:
            await work(cost)
            return JSONResponse({"ok": True, "path": request.url.path})

        return handle

    return [Route(path, endpoint(cost), methods=["GET", "POST"]) for path, cost in COST.items()]


def build_app(protection: str = "adaptive", *, work: Callable[[float], Awaitable[None]] | None
              = None, fixed_limit: int = FIXED_LIMIT, **options: Any) -> Any:
    """The shop with ``protection`` "adaptive", "fixed" or "none"; ``options`` go to the
    middleware (``clock=``, ``listeners=``, ``queue_timeout=``...)."""
    routes = _sync_routes() if work is None else _async_routes(work)
    shop = Starlette(routes=[*routes, Route("/healthz", healthz), Route("/stats", stats)])
    if protection == "none":
        return shop
    if protection == "fixed":  # a plain concurrency limit: no tiers
        mw = LoadSheddingMiddleware(shop, limit=fixed_limit, default="critical",
                                    exempt=["/healthz", "/stats"], **options)
    elif protection == "adaptive":
        tolerance = os.environ.get("SHOP_TOLERANCE")  # to try other tolerances and floors
        floor = int(os.environ.get("SHOP_LIMIT_MIN", "1"))
        limit = options.pop("limit", None) or (
            AdaptiveLimit(min=floor) if not tolerance
            else AdaptiveLimit(min=floor, tolerance=float(tolerance)))
        mw = LoadSheddingMiddleware(shop, priorities=PRIORITIES, default="degraded",
                                    limit=limit, queue_timeout=0.05,
                                    exempt=["/healthz", "/stats"], **options)
    else:
        raise ValueError(f"protection: must be 'adaptive', 'fixed' or 'none', "
                         f"got {protection!r}")
    _protected[:] = [mw]
    return mw


# The event loop (which parses every request and answers every 503) takes the GIL from the
# CPU-bound worker threads at each switch interval, 5 ms by default: SHOP_SWITCH_INTERVAL=
# 0.001 (what bench/overload.py sets) keeps a shed request from waiting behind the work it
# protects (docs/overload.md, deployment).
if os.environ.get("SHOP_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["SHOP_SWITCH_INTERVAL"]))

app = build_app(os.environ.get("SHOP_PROTECTION", "adaptive"),
                fixed_limit=int(os.environ.get("SHOP_FIXED_LIMIT", FIXED_LIMIT)))
