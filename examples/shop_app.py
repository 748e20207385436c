"""A shop under overload: priority load shedding in front of CPU-bound endpoints.

Run it:   SHOP_PROTECTION=adaptive uvicorn examples.shop_app:app --no-access-log
          (SHOP_PROTECTION: "adaptive" (LoadSheddingMiddleware + AdaptiveLimit, the default),
          "fixed" (the middleware with a fixed limit of SHOP_FIXED_LIMIT, one tier), "none";
          "shed-all" (a calibration: every request is shed);
          SHOP_TOLERANCE, SHOP_LIMIT_MIN: another AdaptiveLimit tolerance, floor;
          SHOP_LIMIT: the same tiers under a fixed limit; SHOP_CRITICAL_WAIT: the critical
          tier's queue_timeout (0.25 s); SHOP_DEGRADED_WAIT, SHOP_SHEDDABLE_WAIT: the
          others' (0.05 s); SHOP_SWITCH_INTERVAL: the GIL's (0.0001 s);
          SHOP_TRACE=1: record every request's timings, GET /trace; SHOP_BURNERS=k:
          k threads burning CPU)
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
import threading
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
#: a critical request may wait longer for a slot than the others: at 4x the critical work
#: alone takes 60-70 % of the core, and even an ideal scheduler then starts about 1 % of
#: the critical requests later than 50 ms after their arrival (bench/overload.py prints
#: that ceiling)
QUEUE_TIMEOUT: dict[str, float] = {"critical": 0.25, "degraded": 0.05, "sheddable": 0.05}
for _tier in QUEUE_TIMEOUT:
    if os.environ.get(f"SHOP_{_tier.upper()}_WAIT"):
        QUEUE_TIMEOUT[_tier] = float(os.environ[f"SHOP_{_tier.upper()}_WAIT"])


def _spin() -> int:
    x = 0
    for i in range(200):
        x += i * i
    return x


def _rate() -> float:
    """Rounds of :func:`_spin` per second of one thread's CPU on this machine, alone (the
    best of three 20 ms measurements)."""
    best = 0.0
    for _ in range(3):
        t0 = time.thread_time()
        n = 0
        while time.thread_time() - t0 < 0.02:
            for _ in range(100):  # (the clock read is a system call: not once a round)
                _spin()
            n += 100
        best = max(best, n / (time.thread_time() - t0))
    return best


SPINS_PER_SECOND = _rate()


def burn(seconds: float) -> None:
    """Do ``seconds`` of one thread's CPU work: a fixed amount of work, measured once at
    start (:data:`SPINS_PER_SECOND`), not a CPU-time budget. Under contention the request
    takes longer, as real work does, and it costs the same work: a budget of the thread's
    CPU time would count the kernel's GIL hand-offs (futex calls, on the other core too)
    as the request's work and end it early, so concurrent requests looked cheaper than
    one alone (the closed-loop capacity, 4 threads at a 0.1 ms switch interval, took 1.2
    cores for 1.08 cores of nominal work)."""
    for _ in range(round(seconds * SPINS_PER_SECOND)):
        _spin()


def _sync_routes() -> list[Route]:
    def endpoint(cost: float) -> Callable[[Request], JSONResponse]:
        def handle(request: Request) -> JSONResponse:
            scope = request.scope
            scope["trace.run"] = time.monotonic()  # in the worker thread (SHOP_TRACE)
            burn(cost)
            scope["trace.ran"] = time.monotonic()
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


class Trace:
    """``SHOP_TRACE=1``: the server's side of every request, for bench/overload.py. Per
    request (``?i=<id>``), on the clock every process shares (CLOCK_MONOTONIC): when the
    server's event loop handed it to the ASGI app (``arrive``), when it got its slot
    (the shedding middleware called the shop: ``granted``), when its handler started and
    finished in the worker thread (``run``, ``ran``), when the shop returned (``done``)
    and when the last byte of the answer was written (``sent``). ``GET /trace`` answers
    the rows so far and forgets them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.rows: list[list[Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/stats":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/trace":
            rows, self.rows = self.rows, []
            await JSONResponse(rows)(scope, receive, send)
            return
        arrive = time.monotonic()
        status = [0, 0.0]

        async def traced(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                status[1] = time.monotonic()

        await self.app(scope, receive, traced)
        self.rows.append([scope["query_string"].decode()[2:], status[0], arrive,
                          scope.get("trace.granted"), scope.get("trace.run"),
                          scope.get("trace.ran"), scope.get("trace.done"), status[1]])


def _granted(app: Any) -> Any:
    async def granted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["trace.granted"] = time.monotonic()
        await app(scope, receive, send)
        scope["trace.done"] = time.monotonic()

    return granted


def build_app(protection: str = "adaptive", *, work: Callable[[float], Awaitable[None]] | None
              = None, fixed_limit: int = FIXED_LIMIT, trace: bool = False,
              **options: Any) -> Any:
    """The shop with ``protection`` "adaptive", "fixed" or "none"; ``options`` go to the
    middleware (``clock=``, ``listeners=``, ``queue_timeout=``...)."""
    routes = _sync_routes() if work is None else _async_routes(work)
    shop: Any = Starlette(routes=[*routes, Route("/healthz", healthz), Route("/stats", stats)])
    if trace:
        shop = _granted(shop)
    if protection == "none":
        return Trace(shop) if trace else shop
    if protection == "shed-all":  # a calibration: every request is shed (what a 503 costs)
        mw = LoadSheddingMiddleware(shop, limit=1, queue_timeout=0, priorities=PRIORITIES,
                                    exempt=["/healthz", "/stats"], **options)
        mw.shedder.try_acquire()  # the one slot, taken for good
    elif protection == "fixed":  # a plain concurrency limit: no tiers
        mw = LoadSheddingMiddleware(shop, limit=fixed_limit, default="critical",
                                    exempt=["/healthz", "/stats"], **options)
    elif protection == "adaptive":
        tolerance = os.environ.get("SHOP_TOLERANCE")  # to try other tolerances and floors
        floor = int(os.environ.get("SHOP_LIMIT_MIN", "1"))
        fixed = os.environ.get("SHOP_LIMIT")  # the same tiers under a fixed limit
        limit = options.pop("limit", None) or (
            int(fixed) if fixed else AdaptiveLimit(min=floor) if not tolerance
            else AdaptiveLimit(min=floor, tolerance=float(tolerance)))
        options.setdefault("queue_timeout", QUEUE_TIMEOUT)
        mw = LoadSheddingMiddleware(shop, priorities=PRIORITIES, default="degraded",
                                    limit=limit,
                                    exempt=["/healthz", "/stats"], **options)
    else:
        raise ValueError(f"protection: must be 'adaptive', 'fixed' or 'none', "
                         f"got {protection!r}")
    _protected[:] = [mw]
    return Trace(mw) if trace else mw


def _burner() -> None:
    while True:
        burn(1.0)


# SHOP_BURNERS=<k>: k threads that burn CPU for ever, as k CPU-bound requests in flight do
# (bench/overload.py measures what they cost a 503: the GIL hand-offs)
for _ in range(int(os.environ.get("SHOP_BURNERS", "0"))):
    threading.Thread(target=_burner, daemon=True).start()

# The event loop (which parses every request and answers every 503) waits for the GIL
# while the CPU-bound worker threads hold it, up to one switch interval (CPython: 5 ms) per
# busy thread, two or more times per request: the middleware's switch_interval=0.0001
# shortens that (docs/overload.md, deployment; run under uvicorn's default loop and parser,
# uvloop and httptools). It is the interpreter's setting: the unprotected shop gets it too,
# so the configurations are compared under the same interpreter.
SWITCH_INTERVAL = float(os.environ.get("SHOP_SWITCH_INTERVAL", "0.0001"))
_protection = os.environ.get("SHOP_PROTECTION", "adaptive")
if _protection == "none":
    sys.setswitchinterval(SWITCH_INTERVAL)
app = build_app(_protection, fixed_limit=int(os.environ.get("SHOP_FIXED_LIMIT", FIXED_LIMIT)),
                trace=os.environ.get("SHOP_TRACE") == "1",
                **({} if _protection == "none" else {"switch_interval": SWITCH_INTERVAL}))
