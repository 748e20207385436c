"""Middleware options of issue 17: exempt paths, ``reset_header="epoch"``, the blocking
limiter refused on the event loop, and degraded answers naming the healthy rule."""

from __future__ import annotations

import math
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from stormguard import AsyncRateLimiter, ConfigError, Decision, MemoryStore, RateLimiter, Rule
from stormguard.middleware import RateLimitMiddleware, WSGIRateLimitMiddleware
from stormguard.testing import FakeClock
from tests.service.helpers import DownStore
from tests.service.test_middleware import asgi_client, hello, wsgi_app, wsgi_client

RULES = [{"name": "per-ip", "scope": "ip", "limit": 1, "window": 60,
          "algorithm": "fixed_window"}]
EXEMPT = ["/healthz", "/metrics", "/docs*"]


def asgi(limiter: Any, rules: Any = RULES, **kw: Any) -> RateLimitMiddleware:
    inner = Starlette(routes=[Route(p, hello) for p in ("/", "/healthz", "/metrics",
                                                        "/docs", "/docs/x", "/docsy")])
    return RateLimitMiddleware(inner, limiter=limiter, rules=rules, **kw)


async def test_asgi_exempt_paths_are_neither_checked_nor_given_headers(
        clock: FakeClock) -> None:
    async with asgi_client(asgi(AsyncRateLimiter(MemoryStore(clock=clock)),
                                exempt=EXEMPT)) as c:
        for path in ("/healthz", "/metrics", "/docs", "/docs/x", "/docsy") * 3:
            r = await c.get(path)
            assert r.status_code == 200
            assert "x-ratelimit-limit" not in r.headers
        assert (await c.get("/")).status_code == 200  # the exempt requests spent nothing
        assert (await c.get("/")).status_code == 429
        assert (await c.get("/healthz")).status_code == 200  # even when the key is limited
        assert (await c.get("/healthz/")).status_code == 429  # a glob, not a prefix


def test_wsgi_exempt_paths(clock: FakeClock) -> None:
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(MemoryStore(clock=clock)),
                                  rules=RULES, exempt="/healthz")
    with wsgi_client(app) as c:
        for _ in range(3):
            r = c.get("/healthz")
            assert r.status_code == 200
            assert "x-ratelimit-limit" not in r.headers
        assert c.get("/").status_code == 200
        assert c.get("/").status_code == 429


@pytest.mark.parametrize("exempt", [["healthz"], [""], [42]])
def test_bad_exempt_is_a_config_error(exempt: list[Any]) -> None:
    with pytest.raises(ConfigError) as exc:
        asgi(AsyncRateLimiter(), exempt=exempt)
    assert exc.value.field == "exempt"


async def test_reset_header_epoch_asgi_and_wsgi(clock: FakeClock) -> None:
    clock.advance(0.25)
    store = MemoryStore(clock=clock)
    async with asgi_client(asgi(AsyncRateLimiter(store), reset_header="epoch")) as c:
        r = await c.get("/")
        denied = await c.get("/")
    end_of_window = math.ceil(clock.wall() / 60) * 60
    assert r.headers["x-ratelimit-reset"] == str(end_of_window)
    assert denied.headers["x-ratelimit-reset"] == str(end_of_window)
    assert denied.headers["retry-after"] == "60"  # always seconds
    async with asgi_client(asgi(AsyncRateLimiter(MemoryStore(clock=clock)))) as c:
        assert (await c.get("/")).headers["x-ratelimit-reset"] == "60"  # the default
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(MemoryStore(clock=clock)),
                                  rules=RULES, reset_header="epoch")
    with wsgi_client(app) as c:
        assert c.get("/").headers["x-ratelimit-reset"] == str(end_of_window)
    with pytest.raises(ConfigError, match="reset_header"):
        asgi(AsyncRateLimiter(), reset_header="unix")


def test_decision_headers_reset_forms() -> None:
    d = Decision(True, 10, 9, 59.2, 0.0)
    assert d.headers()["X-RateLimit-Reset"] == "60"
    assert d.headers("seconds")["X-RateLimit-Reset"] == "60"
    assert d.headers("epoch", now=1_000.5)["X-RateLimit-Reset"] == "1060"  # rounded up
    assert d.headers("epoch", now=1_000.9)["X-RateLimit-Reset"] == "1061"
    assert d.headers("epoch", now=1_000.9)["RateLimit"] == '"default";r=9;t=60'
    assert d.reset_epoch(now=1_000.0) == 1060
    with pytest.raises(ConfigError, match="reset_header"):
        d.headers("iso")


def test_asgi_refuses_a_blocking_limiter_over_a_store_that_blocks() -> None:
    with pytest.raises(ConfigError, match="AsyncRateLimiter") as exc:
        asgi(RateLimiter(DownStore()))
    assert exc.value.field == "limiter"
    assert "event loop" in str(exc.value)
    asgi(RateLimiter("memory://"))  # never blocks: accepted
    asgi(AsyncRateLimiter(DownStore()))


def test_asgi_refuses_a_blocking_redis_limiter() -> None:
    pytest.importorskip("stormguard.stores.redis")
    from tests.redis_servers import free_port

    limiter = RateLimiter(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(ConfigError, match="RedisStore would block the event loop"):
        asgi(limiter)
    limiter.close()


@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
async def test_degraded_answer_names_the_rule_and_limit_of_the_healthy_one(
        clock: FakeClock, on_error: Any) -> None:
    """Issue 17 (8), through the middleware with a store that fails."""
    rules = [{"name": "per-minute", "scope": "ip", "limit": 100, "window": 60},
             {"name": "per-second", "scope": "ip", "limit": 10, "window": 1}]
    async with asgi_client(asgi(AsyncRateLimiter(MemoryStore(clock=clock)), rules)) as c:
        healthy = await c.get("/")
    async with asgi_client(asgi(AsyncRateLimiter(DownStore(), on_error=on_error),
                                rules)) as c:
        degraded = await c.get("/")
    for r in (healthy, degraded):
        assert r.headers["ratelimit-policy"] == '"per-second";q=10;w=1'
        assert r.headers["x-ratelimit-limit"] == "10"
    if on_error == "deny":
        assert degraded.json()["rule"] == "per-second"



async def test_rules_from_parse_many_apply_per_client_ip(clock: FakeClock) -> None:
    rules = Rule.parse_many("2/minute;3/hour", algorithm="fixed_window")
    app = asgi(AsyncRateLimiter(MemoryStore(clock=clock)), rules, exempt=["/healthz"])
    async with asgi_client(app) as c:
        codes = [(await c.get("/")).status_code for _ in range(3)]
        r = await c.get("/")
    async with asgi_client(app, peer="192.0.2.200") as c:
        assert (await c.get("/")).status_code == 200
    assert codes == [200, 200, 429]
    assert r.json()["rule"] == "ip-2-per-60s"
    wsgi = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(MemoryStore(clock=clock)),
                                   rules=Rule(1, 60, name="one"))
    with wsgi_client(wsgi) as c:
        assert [c.get("/").status_code for _ in range(2)] == [200, 429]
        assert c.get("/").headers["ratelimit-policy"] == '"one";q=1;w=60'


def test_service_app_refuses_a_blocking_redis_limiter(redis_url: str) -> None:
    """The service is an ASGI app too: a blocking limiter over Redis would block its loop."""
    from stormguard import RateLimiter
    from stormguard.service import create_app

    limiter = RateLimiter(redis_url)
    try:
        with pytest.raises(ConfigError, match="would block the event loop") as exc:
            create_app(limiter, [])
        assert exc.value.field == "limiter"
        create_app(RateLimiter("memory://"), [])  # never blocks: accepted
    finally:
        limiter.store.close()
