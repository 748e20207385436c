"""ASGI and WSGI middleware: 429s, headers, client IP and XFF, store failures, examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stormguard import AsyncRateLimiter, ConfigError, MemoryStore, RateLimiter
from stormguard.middleware import ClientIP, RateLimitMiddleware, WSGIRateLimitMiddleware
from stormguard.testing import FakeClock
from tests.service.helpers import DownStore, RefusingStore

ROOT = Path(__file__).resolve().parents[2]
RULES = [
    {"name": "per-ip", "scope": "ip", "limit": 2, "window": 60, "algorithm": "fixed_window"},
    {"name": "per-user", "scope": "user", "endpoint": "GET /search*", "limit": 1, "window": 60,
     "algorithm": "fixed_window"},
]


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world"}, headers={"X-App": "1"})


def asgi_app(limiter: Any, **kw: Any) -> RateLimitMiddleware:
    inner = Starlette(routes=[Route("/", hello), Route("/search", hello)])
    return RateLimitMiddleware(inner, limiter=limiter, rules=RULES, **kw)


def asgi_client(app: Any, peer: str = "192.0.2.1") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(peer, 5000)),
                             base_url="http://app")


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-App", "1")])
    return [b"hello"]


def wsgi_client(app: Any, peer: str = "192.0.2.1") -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=app, remote_addr=peer),
                        base_url="http://app")


@pytest.mark.parametrize("limiter_cls", [AsyncRateLimiter, RateLimiter])
async def test_asgi_limits_with_headers_and_429(clock: FakeClock,
                                                limiter_cls: type[Any]) -> None:
    app = asgi_app(limiter_cls(MemoryStore(clock=clock)))
    async with asgi_client(app) as c:
        r1, r2, r3 = [await c.get("/") for _ in range(3)]
    assert (r1.status_code, r2.status_code, r3.status_code) == (200, 200, 429)
    assert r1.json() == {"hello": "world"}
    assert r1.headers["x-app"] == "1"
    assert r1.headers["x-ratelimit-limit"] == "2"
    assert r1.headers["x-ratelimit-remaining"] == "1"
    assert r1.headers["ratelimit-policy"] == '"per-ip";q=2;w=60'
    assert "retry-after" not in r1.headers
    assert r3.headers["retry-after"] == "60"
    assert r3.headers["content-type"] == "application/json"
    body = r3.json()
    assert body["error"] == "rate limit exceeded"
    assert body["rule"] == "per-ip"
    assert body["retry_after"] == 60.0


async def test_asgi_user_and_api_key(clock: FakeClock) -> None:
    rules = [{"name": "per-user", "scope": "user", "limit": 1, "window": 60},
             {"name": "per-key", "scope": "api_key", "limit": 1, "window": 60}]
    inner = Starlette(routes=[Route("/", hello)])
    app = RateLimitMiddleware(inner, limiter=AsyncRateLimiter(MemoryStore(clock=clock)),
                              rules=rules, user=lambda s: s["query_string"].decode() or None)
    async with asgi_client(app) as c:
        assert (await c.get("/?u1")).status_code == 200
        assert (await c.get("/?u1")).status_code == 429
        assert (await c.get("/?u2")).status_code == 200
        assert (await c.get("/", headers={"X-API-Key": "k"})).status_code == 200
        assert (await c.get("/", headers={"X-API-Key": "k"})).status_code == 429
        assert (await c.get("/")).status_code == 200  # no user, no key: no rule applies
        r = await c.get("/")
        assert "x-ratelimit-limit" not in r.headers


async def test_spoofed_forwarded_for_from_untrusted_client_changes_nothing(
        clock: FakeClock) -> None:
    app = asgi_app(AsyncRateLimiter(MemoryStore(clock=clock)), trusted_proxies=["10.0.0.0/8"])
    async with asgi_client(app, peer="198.51.100.7") as c:
        codes = [(await c.get("/", headers={"X-Forwarded-For": f"203.0.113.{i}"})).status_code
                 for i in range(4)]
    assert codes == [200, 200, 429, 429]  # every request counted against the socket peer


async def test_forwarded_for_from_trusted_proxy_identifies_clients(clock: FakeClock) -> None:
    app = asgi_app(AsyncRateLimiter(MemoryStore(clock=clock)),
                   trusted_proxies=["10.0.0.0/8", "127.0.0.1"])
    async with asgi_client(app, peer="10.1.2.3") as c:
        a = [(await c.get("/", headers={"X-Forwarded-For": "203.0.113.1, 10.9.9.9"}))
             .status_code for _ in range(3)]
        # the client cannot escape by prepending a fake address: the walk stops at it
        b = [(await c.get("/", headers={"X-Forwarded-For": f"1.1.1.{i}, 203.0.113.1"}))
             .status_code for i in range(2)]
        other = (await c.get("/", headers={"X-Forwarded-For": "203.0.113.2"})).status_code
    assert a == [200, 200, 429]
    assert b == [429, 429]
    assert other == 200


@pytest.mark.parametrize(("peer", "xff", "expected"), [
    ("198.51.100.7", "203.0.113.9", "198.51.100.7"),          # untrusted peer: header ignored
    ("10.0.0.1", None, "10.0.0.1"),                            # trusted, no header
    ("10.0.0.1", "203.0.113.9", "203.0.113.9"),
    ("10.0.0.1", "203.0.113.9, 10.0.0.2, 10.0.0.3", "203.0.113.9"),
    ("10.0.0.1", "6.6.6.6, 203.0.113.9, 10.0.0.2", "203.0.113.9"),
    ("10.0.0.1", "10.0.0.7, 10.0.0.2", "10.0.0.7"),            # all trusted: the leftmost
    ("10.0.0.1", "garbage, 10.0.0.2", "10.0.0.2"),             # garbage stops the walk
    ("10.0.0.1", "203.0.113.9:4711", "203.0.113.9"),
    ("10.0.0.1", "[2001:db8::1]:443", "2001:db8::1"),
    ("10.0.0.1", "2001:db8::2", "2001:db8::2"),
    ("::ffff:10.0.0.1", "203.0.113.9", "203.0.113.9"),         # v4-mapped proxy address
    ("not-an-ip", "203.0.113.9", "not-an-ip"),
    (None, "203.0.113.9", None),
])
def test_client_ip_walk(peer: str | None, xff: str | None, expected: str | None) -> None:
    assert ClientIP(["10.0.0.0/8"]).resolve(peer, xff) == expected


def test_client_ip_config_errors() -> None:
    with pytest.raises(ConfigError, match="trusted_proxies"):
        ClientIP(["10.0.0.0/33"])
    assert ClientIP("127.0.0.1").resolve("127.0.0.1", "5.5.5.5") == "5.5.5.5"


@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 429),
                                                  ("local", 200)])
async def test_asgi_store_down_follows_on_error(on_error: Any, status: int) -> None:
    store = DownStore()
    app = asgi_app(AsyncRateLimiter(store, on_error=on_error))
    async with asgi_client(app) as c:
        r = await c.get("/")
    assert r.status_code == status
    assert store.calls == 1


@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 429)])
def test_wsgi_store_down_follows_on_error(on_error: Any, status: int) -> None:
    store = DownStore()
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(store, on_error=on_error),
                                  rules=RULES)
    with wsgi_client(app) as c:
        assert c.get("/").status_code == status


async def test_asgi_redis_on_a_dead_port_never_500() -> None:
    """A real network failure (nothing listens) through the redis client: the limiter's
    ``allow`` answers, no 500."""
    pytest.importorskip("stormguard.stores.redis")
    from tests.redis_servers import free_port

    limiter = AsyncRateLimiter(f"redis://127.0.0.1:{free_port()}/0", on_error="allow")
    async with asgi_client(asgi_app(limiter)) as c:
        assert [(await c.get("/")).status_code for _ in range(3)] == [200, 200, 200]


def test_wsgi_limits_with_headers_and_429(clock: FakeClock) -> None:
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(MemoryStore(clock=clock)),
                                  rules=RULES, user=lambda env: env.get("HTTP_X_USER"))
    with wsgi_client(app) as c:
        r1, r2, r3 = (c.get("/") for _ in range(3))
        assert (r1.status_code, r2.status_code, r3.status_code) == (200, 200, 429)
        assert r1.text == "hello"
        assert r1.headers["x-app"] == "1"
        assert r1.headers["x-ratelimit-remaining"] == "1"
        assert r3.headers["retry-after"] == "60"
        assert r3.json()["rule"] == "per-ip"
    with wsgi_client(app, peer="192.0.2.2") as c:
        r = c.get("/search", headers={"X-User": "u"})
        assert r.status_code == 200
        r = c.get("/search", headers={"X-User": "u", "X-Forwarded-For": "1.2.3.4"})
        assert r.status_code == 429
        assert r.json()["rule"] == "per-user"


def test_wsgi_trusted_proxy(clock: FakeClock) -> None:
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(MemoryStore(clock=clock)),
                                  rules=RULES, trusted_proxies=["127.0.0.1"])
    with wsgi_client(app, peer="127.0.0.1") as c:
        codes = [c.get("/", headers={"X-Forwarded-For": f"203.0.113.{i % 2}"}).status_code
                 for i in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]


def test_middleware_config_errors() -> None:
    with pytest.raises(ConfigError, match="limiter"):
        WSGIRateLimitMiddleware(wsgi_app, limiter=AsyncRateLimiter(),  # type: ignore[arg-type]
                                rules=RULES)
    with pytest.raises(ConfigError, match="limiter"):
        RateLimitMiddleware(hello, limiter="memory://", rules=RULES)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="scope"):
        RateLimitMiddleware(hello, limiter=AsyncRateLimiter(),  # type: ignore[arg-type]
                            rules=[{"name": "x", "scope": "moon", "limit": 1, "window": 1}])


async def test_non_http_scopes_pass_through(clock: FakeClock) -> None:
    seen = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    app = RateLimitMiddleware(inner, limiter=AsyncRateLimiter(MemoryStore(clock=clock)),
                              rules=RULES)
    await app({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


def _load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_fastapi_example(clock: FakeClock) -> None:
    example = _load_example("fastapi_app")
    assert example.app is not None
    app = example.create_app(AsyncRateLimiter(MemoryStore(clock=clock)))
    async with asgi_client(app, peer="127.0.0.1") as c:
        codes = [(await c.get("/search?q=x", headers={"X-User": "42"})).status_code
                 for _ in range(6)]
        assert codes == [200] * 5 + [429]
        r = await c.get("/items/3", headers={"X-Forwarded-For": "203.0.113.5"})
        assert r.json() == {"id": 3}
        assert r.headers["ratelimit-policy"].startswith(
            '"anonymous-per-ip"')
        for _ in range(20):
            r = await c.get("/items/1", headers={"X-API-Key": "key-free-1"})
        assert r.status_code == 200
        r = await c.get("/items/1", headers={"X-API-Key": "key-free-1"})
        assert r.status_code == 429
        assert r.json()["rule"] == "free-api"


def test_flask_example(clock: FakeClock) -> None:
    example = _load_example("flask_app")
    app = example.create_app(RateLimiter(MemoryStore(clock=clock)))
    with wsgi_client(app) as c:
        codes = [c.get("/search", headers={"X-User": "42"}).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
        r = c.get("/")
        assert r.json() == {"hello": "world"}
        assert "x-ratelimit-limit" in r.headers


async def test_a_rule_the_store_refuses_passes_the_request_never_500() -> None:
    app = asgi_app(AsyncRateLimiter(RefusingStore()))
    async with asgi_client(app) as c:
        r = await c.get("/")
    assert r.status_code == 200
    assert r.json() == {"hello": "world"}
    wsgi = WSGIRateLimitMiddleware(wsgi_app, limiter=RateLimiter(RefusingStore()), rules=RULES)
    with wsgi_client(wsgi) as c:
        assert c.get("/").status_code == 200
