"""Envoy's gRPC path reports as ``POST /v1/check`` does: the same ``/metrics`` families
(checks by rule and result, shadow denials, degraded decisions, the limiter's decisions by
rule and result: allowed, denied, shadow_denied, degraded) and the same degraded start /
stop log lines. A real grpcio server on a free loopback port, in the test's event loop,
beside the same service app asked over HTTP (httpx's ASGITransport)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from stormguard import AsyncRateLimiter
from stormguard.gateways.envoy import load_envoy_config
from stormguard.gateways.grpc import RateLimitServer
from stormguard.gateways.rls import EnvoyChecker
from stormguard.service import create_app
from stormguard.service.app import ServiceApp
from stormguard.stores.memory import MemoryStore
from stormguard.testing import FakeClock
from tests.gateways.conftest import CONFIGS
from tests.redis_servers import free_port, start_redis

D = ratelimit_pb2.RateLimitDescriptor
OK, OVER = rls_pb2.RateLimitResponse.Code.OK, rls_pb2.RateLimitResponse.Code.OVER_LIMIT
RULES = [
    {"name": "login", "scope": "user", "limit": 2, "window": 60},
    {"name": "dry", "scope": "ip", "limit": 1, "window": 60, "shadow": True},
]
# what the families count: every sample of them, parsed back from /metrics
FAMILIES = ("stormguard_checks", "stormguard_shadow_denials",
            "stormguard_degraded_decisions", "stormguard_limiter_decisions")
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        if family.name in FAMILIES:
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(got: Series, metric: str, /, **labels: str) -> float:
    return got.get((metric, frozenset(labels.items())), 0.0)


def descriptor(*entries: tuple[str, str]) -> Any:
    return D(entries=[D.Entry(key=k, value=v) for k, v in entries])


class Grpc:
    """A real grpcio server of one service app on a free loopback port, and a stub."""

    def __init__(self, app: ServiceApp, envoy_config: Any = None) -> None:
        svc = app.service
        checker = EnvoyChecker(svc.limiter, envoy_config, svc.source)
        self.server = RateLimitServer(checker, free_port(), metrics=svc.metrics, top=svc.top,
                                      observe=svc.observe_degraded)
        self.channel: Any = None
        self.stub: Any = None

    async def __aenter__(self) -> Grpc:
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.bound_port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop()

    async def ask(self, domain: str, *descs: Any) -> int:
        r = await self.stub.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain=domain, descriptors=descs), timeout=10)
        code: int = r.overall_code
        return code


def client(app: ServiceApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                             base_url="http://sg")


def memory_app(clock: FakeClock) -> ServiceApp:
    return create_app(AsyncRateLimiter(MemoryStore(clock=clock), name="edge"), RULES)


CHECKS = [("mallory", "10.0.0.1")] * 5 + [("bob", "10.0.0.1")] * 2


async def test_grpc_counts_every_family_as_http_does() -> None:
    """The same seven requests (a user limit of 2 and a shadow per-ip limit of 1) over
    HTTP to one app and over gRPC to another: the same samples in every family, and the
    ones the semantics say (the shadow rule is charged only by requests the enforced rule
    passes: 4, of which 3 would have been denied)."""
    clock = FakeClock()  # virtual time: the fixed windows never roll over mid-test
    over_http, over_grpc = memory_app(clock), memory_app(clock)
    async with client(over_http) as c:
        answers = [(await c.post("/v1/check", json={"user": u, "ip": ip})).json()["allowed"]
                   for u, ip in CHECKS]
        http = series((await c.get("/metrics")).text)
    async with Grpc(over_grpc) as g, client(over_grpc) as c:
        codes = [await g.ask("stormguard", descriptor(("user", u), ("ip", ip)))
                 for u, ip in CHECKS]
        grpc_ = series((await c.get("/metrics")).text)
    assert answers == [True, True, False, False, False, True, True]
    assert codes == [OK, OK, OVER, OVER, OVER, OK, OK]
    assert grpc_ == http
    assert value(grpc_, "stormguard_checks_total", rule="login", result="allowed") == 4
    assert value(grpc_, "stormguard_checks_total", rule="login", result="denied") == 3
    assert value(grpc_, "stormguard_shadow_denials_total", rule="dry") == 3
    assert value(grpc_, "stormguard_degraded_decisions_total") == 0
    decisions = {(dict(labels)["rule"], dict(labels)["result"]): v
                 for (name, labels), v in grpc_.items()
                 if name == "stormguard_limiter_decisions_total" and v}
    assert decisions == {("login", "allowed"): 4, ("login", "denied"): 3,
                         ("dry", "allowed"): 1, ("dry", "shadow_denied"): 3}
    assert all(dict(labels)["name"] == "edge" for (name, labels) in grpc_
               if name == "stormguard_limiter_decisions_total")


async def test_an_envoy_shadow_limit_is_counted_shadow_denied() -> None:
    """envoyproxy/ratelimit's shadow-mode example (5 a day, shadow): 7 requests are OK;
    the two over the limit are shadow denials in the service's family and the limiter's
    ``shadow_denied``, never ``denied``."""
    app = memory_app(FakeClock())
    rule = "shadow_messaging.message_type_marketing.to_number"
    marketing = descriptor(("message_type", "marketing"), ("to_number", "1"))
    async with Grpc(app, load_envoy_config(CONFIGS)) as g, client(app) as c:
        assert [await g.ask("shadow_messaging", marketing) for _ in range(7)] == [OK] * 7
        got = series((await c.get("/metrics")).text)
    assert value(got, "stormguard_shadow_denials_total", rule=rule) == 2
    assert value(got, "stormguard_limiter_decisions_total", name="edge", rule=rule,
                 result="allowed") == 5
    assert value(got, "stormguard_limiter_decisions_total", name="edge", rule=rule,
                 result="shadow_denied") == 2
    assert value(got, "stormguard_limiter_decisions_total", name="edge", rule=rule,
                 result="denied") == 0


@pytest.mark.slow
async def test_grpc_writes_the_degraded_start_and_stop_lines(
        caplog: pytest.LogCaptureFixture) -> None:
    """A real Redis SIGKILLed then restarted on its port, checks over gRPC and HTTP on one
    service: one ``degraded_start`` line when the first gRPC check is answered by
    on_error, none while checks of either protocol stay degraded, one ``degraded_stop``
    when a gRPC check is decided by the store again, counting the degraded decisions of
    both protocols; the degraded decisions are counted in /metrics."""
    server = start_redis()
    try:
        limiter = AsyncRateLimiter(server.url, breaker_cooldown=0.05, timeout=0.2)
        app = create_app(limiter, RULES)
        caplog.set_level(logging.WARNING, logger="stormguard.service")

        def lines(event: str) -> list[logging.LogRecord]:
            return [r for r in caplog.records if getattr(r, "event", "") == event]

        u1 = descriptor(("user", "u1"))
        async with Grpc(app) as g, client(app) as c:
            assert await g.ask("stormguard", u1) == OK
            assert lines("degraded_start") == []
            server.stop()
            assert await g.ask("stormguard", u1) == OK  # on_error allow
            assert len(lines("degraded_start")) == 1
            assert "on_error=allow" in lines("degraded_start")[0].getMessage()
            for _ in range(2):
                assert await g.ask("stormguard", u1) == OK
                r = await c.post("/v1/check", json={"user": "u1"})
                assert r.status_code == 200  # an outage is never a 500
                assert r.json()["degraded"] is True
            assert len(lines("degraded_start")) == 1
            assert lines("degraded_stop") == []
            assert (await c.get("/v1/stats")).json()["degraded_now"] is True
            got = series((await c.get("/metrics")).text)
            assert value(got, "stormguard_degraded_decisions_total") == 5
            assert value(got, "stormguard_limiter_decisions_total", name="limiter",
                         rule="login", result="degraded") == 5
            server.restart()
            deadline = time.monotonic() + 10
            while lines("degraded_stop") == []:
                assert time.monotonic() < deadline, "the store never answered again"
                await asyncio.sleep(0.05)  # real time: the store's breaker cool-down
                await g.ask("stormguard", u1)
            assert len(lines("degraded_stop")) == 1
            assert getattr(lines("degraded_stop")[0], "degraded_decisions", 0) >= 5
            assert len(lines("degraded_start")) == 1
            assert (await c.get("/v1/stats")).json()["degraded_now"] is False
        await limiter.aclose()
    finally:
        server.stop()
