"""Envoy's rate-limit service over gRPC: ``envoy.service.ratelimit.v3.RateLimitService``
``/ShouldRateLimit`` (grpcio's asyncio server, the messages of the ``xds-protos`` package),
on the service's event loop, limiter and rules. The semantics are :mod:`.rls`'s."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from stormguard._core.errors import ConfigError
from stormguard.observability.topk import SpaceSaving
from stormguard.ratelimit.rules.check import CheckResult
from stormguard.service.metrics import Metrics

from .rls import EnvoyChecker, EnvoyResult

__all__ = ["EnvoyCollector", "RateLimitServer", "to_response"]

log = logging.getLogger("stormguard.service")
_Response = rls_pb2.RateLimitResponse
SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
_MAX_MESSAGE = 1024 * 1024
_UINT32 = 2**32 - 1


def _current_limit(st: Any) -> Any:
    lim = st.limit
    if lim is not None and not lim.unlimited:
        return _Response.RateLimit(name=lim.name, requests_per_unit=lim.requests_per_unit,
                                   unit=lim.unit_code)
    d = st.decision
    if d is not None and d.rule is not None:  # a stormguard rule (the stormguard domain)
        rule = d.rule
        unit = {1: 1, 60: 2, 3600: 3, 86400: 4, 604800: 7, 2592000: 5, 31536000: 6}.get(
            int(rule.window) if float(rule.window).is_integer() else -1, 0)
        return _Response.RateLimit(name=rule.name or "",
                                   requests_per_unit=min(rule.limit, _UINT32), unit=unit)
    return None


def to_response(result: EnvoyResult, headers: bool) -> Any:
    """The ``RateLimitResponse`` of a result; ``headers``: add the RateLimit headers
    (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)."""
    statuses = []
    for st in result.statuses:
        s = _Response.DescriptorStatus(code=st.code,
                                       limit_remaining=min(st.remaining, _UINT32))
        cur = _current_limit(st)
        if cur is not None:
            s.current_limit.CopyFrom(cur)
        if st.reset_after > 0:
            s.duration_until_reset.FromNanoseconds(round(st.reset_after * 1e9))
        statuses.append(s)
    resp = _Response(overall_code=result.code, statuses=statuses)
    if headers:
        for k, v in result.headers().items():
            resp.response_headers_to_add.append(base_pb2.HeaderValue(key=k, value=v))
    return resp


class _Servicer(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    def __init__(self, server: RateLimitServer) -> None:
        self.server = server

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        s = self.server
        t0 = time.perf_counter()
        if not request.domain:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "rate limit domain must not be empty")
        if not request.descriptors:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "rate limit descriptor list must not be empty")
        descriptors = []
        overrides: list[tuple[int, int] | None] | None = None
        for i, d in enumerate(request.descriptors):
            descriptors.append(([(e.key, e.value) for e in d.entries],
                                d.hits_addend.value if d.HasField("hits_addend") else 0))
            if d.HasField("limit"):
                if overrides is None:
                    overrides = [None] * len(request.descriptors)
                overrides[i] = (d.limit.requests_per_unit, d.limit.unit)
        try:
            result = await s.checker.check(request.domain, descriptors, request.hits_addend,
                                           overrides)
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:500])
        if s.metrics is not None or s.observe is not None:
            checked = s.checker.check_result(result)
            if s.metrics is not None:
                s.metrics.record(checked, time.perf_counter() - t0)
            if s.observe is not None:
                s.observe(checked)
        if s.top is not None:
            for key, rule in result.denials:
                s.top.add(key, rule)
        return to_response(result, s.headers)


class RateLimitServer:
    """The gRPC server, started and stopped with the app (a service companion).

    ``metrics``: the service's metrics (the checks counted as ``POST /v1/check`` counts
    them); ``top``: the service's most-denied keys (``GET /v1/top``), fed each request's
    denials (:attr:`EnvoyResult.denials`); ``observe``: called with each request's answer
    as a :class:`CheckResult` after it is counted (the service's
    :meth:`~stormguard.service.base.ServiceBase.observe_degraded`: the degraded start / stop
    log lines, as ``POST /v1/check`` writes them)."""

    def __init__(self, checker: EnvoyChecker, port: int, host: str = "127.0.0.1", *,
                 headers: bool = False, metrics: Metrics | None = None,
                 top: SpaceSaving | None = None,
                 observe: Callable[[CheckResult], None] | None = None) -> None:
        self.checker = checker
        self.host = host
        self.port = port
        self.headers = headers
        self.metrics = metrics
        self.top = top
        self.observe = observe
        self.bound_port: int | None = None
        self._server: Any = None
        self.health: Any = None
        if metrics is not None:
            metrics.registry.register(EnvoyCollector(checker))

    async def start(self) -> None:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.so_reuseport", 0),  # a second instance on the port must fail, not share
        ])
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(_Servicer(self), server)
        # the standard gRPC health service, for Envoy's grpc_health_check on the cluster
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            self.bound_port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as exc:
            log.error("stormguard: cannot serve gRPC on %s:%s: %s (is the port in use?)",
                      self.host, self.port, exc)
            raise
        await server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        log.info("stormguard: Envoy rate-limit service (gRPC) on %s:%s", self.host,
                 self.bound_port)

    async def stop(self) -> None:
        if self._server is not None:
            # NOT_SERVING first: health-checking clients move away during the grace
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace=5)
            self._server = None


class EnvoyCollector(Collector):
    """``stormguard_envoy_descriptors_total{domain,result}`` (result: ok, over_limit,
    shadow_over_limit, unlimited, unknown, replaced, rules) and
    ``stormguard_envoy_requests_total{domain,code}``."""

    def __init__(self, checker: EnvoyChecker) -> None:
        self.checker = checker

    def collect(self) -> Iterator[Metric]:
        m = self.checker.metrics
        d = CounterMetricFamily("stormguard_envoy_descriptors", "Envoy rate-limit descriptors "
                                "by domain and result", labels=["domain", "result"])
        for (domain, result), n in sorted(m.descriptors.items()):
            d.add_metric([domain, result], n)
        yield d
        r = CounterMetricFamily("stormguard_envoy_requests", "ShouldRateLimit calls by "
                                "domain and overall code", labels=["domain", "code"])
        for (domain, code), n in sorted(m.requests.items()):
            r.add_metric([domain, code], n)
        yield r
        c = CounterMetricFamily("stormguard_envoy_config_reloads", "Envoy configuration "
                                "reloads by result (error: refused, the previous one stays)",
                                labels=["result"])
        for result, n in sorted(m.reloads.items()):
            c.add_metric([result], n)
        yield c

