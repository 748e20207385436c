"""The rate-limit service: a Starlette app answering "may this request pass?".

Only translation lives here (HTTP <-> :mod:`stormguard.ratelimit.rules`); the decisions are
the limiter's. This module wires the pieces: :mod:`.http` (bodies, JSON, errors),
:mod:`.check` (the check API), :mod:`.admin` (the control plane), :mod:`.ops`
(health, readiness, metrics) and :mod:`.sources` (where the rules live).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from stormguard.integrations.asgi import check_async_limiter
from stormguard.integrations.clientip import ClientIP
from stormguard.observability.prometheus import enable_prometheus
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rules import RuleSet, RuleSpec
from stormguard.service.admin import AdminEndpoints
from stormguard.service.auth import AUTH_METHODS, AuthEndpoints
from stormguard.service.check import MAX_BATCH, CheckEndpoints
from stormguard.service.http import (
    MAX_BODY,
    MAX_HEADERS,
    ApiError,
    RawEndpoint,
    by_method,
    handle,
    http_error,
)
from stormguard.service.metrics import Metrics
from stormguard.service.observe import ObserveEndpoints
from stormguard.service.ops import OpsEndpoints
from stormguard.service.sources import FileRules, MemoryRules, RedisRules, RulesSource

__all__ = ["MAX_BATCH", "MAX_BODY", "ApiError", "Service", "ServiceApp", "create_app"]

_FROM_ENV: Any = object()


class Service(AuthEndpoints, CheckEndpoints, AdminEndpoints, OpsEndpoints, ObserveEndpoints):
    """The state behind one app (limiter, rules source, metrics, admin token) and its
    endpoints: the check API, nginx's auth_request, the control plane, the operations
    endpoints, the top limited keys and the dashboard."""


def create_app(limiter: AsyncRateLimiter | RateLimiter | None = None,
               rules: RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str
               | os.PathLike[str] | None = None, *,
               admin_token: str | None = _FROM_ENV,
               rules_path: str | os.PathLike[str] | None = None,
               rules_url: str | None = None,
               rules_prefix: str = "stormguard",
               poll_interval: float | None = None,
               metrics: Metrics | None = None,
               trusted_proxies: Iterable[str] = (),
               top_keys: int = 1000) -> ServiceApp:
    """Build the service app.

    * ``limiter``: an :class:`AsyncRateLimiter` (or a blocking :class:`RateLimiter` over a
      store that never blocks); default ``AsyncRateLimiter("memory://")``.
    * ``rules``: the initial rules (RuleSet, list, or rules-file path).
    * ``admin_token``: the control plane's bearer token; default the
      ``STORMGUARD_ADMIN_TOKEN`` environment variable; None or empty disables it.
    * ``rules_path``: a rules file that control-plane edits rewrite atomically (the
      initial rules come from it when ``rules`` is not given).
    * ``rules_url``: a Redis URL: the rules live in Redis and every instance picks up
      changes within ``poll_interval`` (0.25 s) seconds; ``rules``/``rules_path`` only
      seed an empty Redis.
    * ``trusted_proxies``: addresses or networks (``127.0.0.1``, ``10.0.0.0/8``) whose
      ``X-Original-*`` / ``X-Real-IP`` headers ``/v1/auth`` believes (nginx).
    """
    if limiter is None:
        limiter = AsyncRateLimiter("memory://")
    check_async_limiter(limiter)  # a blocking limiter over Redis would block the loop
    if admin_token is _FROM_ENV:
        admin_token = os.environ.get("STORMGUARD_ADMIN_TOKEN") or None
    initial = RuleSet.coerce(rules) if rules is not None else None
    source: RulesSource
    if rules_url is not None:
        seed = initial
        if seed is None and rules_path is not None:
            seed = RuleSet.load(rules_path)
        source = RedisRules(rules_url, prefix=rules_prefix, seed=seed,
                            poll_interval=0.25 if poll_interval is None else poll_interval)
    elif rules_path is not None:
        if initial is not None and not os.path.exists(rules_path):
            with open(rules_path, "w", encoding="utf-8") as f:
                f.write(initial.dumps())
        source = FileRules(rules_path, poll_interval=1.0 if poll_interval is None
                           else poll_interval)
    else:
        source = MemoryRules(initial)
    service = Service(limiter, source, admin_token, metrics or Metrics(), top_keys)
    service.auth_proxies = ClientIP(trusted_proxies)
    own = service.limiter  # another app's limiter reports on that app's /metrics, not here
    enable_prometheus(service.metrics.registry,
                      select=lambda kind, obj: kind != "limiter" or obj is own)
    s = service
    routes = [
        Route("/v1/check", RawEndpoint(s.check), methods=["POST"]),  # 405 for other methods
        Route("/v1/check/batch", handle(s.check_batch), methods=["POST"]),
        Route("/v1/auth", handle(s.auth), methods=AUTH_METHODS),  # nginx auth_request
        Route("/v1/reset", handle(s.reset_counters), methods=["POST"]),
        # one route per path, dispatching on the method, so a 405 lists every method
        Route("/v1/rules", by_method(GET=s.get_rules, PUT=s.put_rules),
              methods=["GET", "PUT"]),
        Route("/v1/rules/{name}", by_method(GET=s.get_rule, PUT=s.put_rule,
                                            DELETE=s.delete_rule),
              methods=["GET", "PUT", "DELETE"]),
        Route("/healthz", s.healthz, methods=["GET"]),
        Route("/readyz", s.readyz, methods=["GET"]),
        Route("/metrics", s.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", s.openapi, methods=["GET"]),
        Route("/v1/top", handle(s.top_keys), methods=["GET"]),
        Route("/v1/stats", s.stats_endpoint, methods=["GET"]),
        Route("/dashboard", s.dashboard, methods=["GET"]),
        Route("/dashboard/assets/{name}", handle(s.dashboard_asset), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=service.lifespan,
                    exception_handlers={HTTPException: http_error, Exception: http_error})
    app.state.service = service
    return ServiceApp(app, service)


class ServiceApp:
    """The service's ASGI app: ``POST /v1/check`` straight to its handler, everything else
    through the Starlette app (``.starlette``); ``.state.service`` is the :class:`Service`."""

    def __init__(self, starlette: Starlette, service: Service) -> None:
        self.starlette = starlette
        self.service = service
        self.state = starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if len(scope["headers"]) > MAX_HEADERS:
                await _too_many_headers(send)
                return
            if scope["path"] == "/v1/check" and scope["method"] == "POST":
                await self.service.check(scope, receive, send)
                return
        await self.starlette(scope, receive, send)


async def _too_many_headers(send: Send) -> None:
    body = ApiError(431, f"more than {MAX_HEADERS} header fields").body()
    await send({"type": "http.response.start", "status": 431, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
