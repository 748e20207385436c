"""Per-route limits: the FastAPI dependency ``RateLimit`` (after the app's auth
dependencies) and the Starlette decorator ``rate_limit``, in process over httpx's ASGI
transport."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from stormguard import AsyncRateLimiter, ConfigError, Decision, MemoryStore, RateLimiter, Rule
from stormguard.integrations.fastapi import RateLimit
from stormguard.integrations.starlette import rate_limit
from stormguard.testing import FakeClock
from tests.service.helpers import DownStore

TOKENS = {"t-alice": "alice", "t-bob": "bob"}
calls: list[str] = []


async def current_user(authorization: Annotated[str | None, Header()] = None) -> str:
    """The app's auth dependency: 401 without a valid token."""
    calls.append("auth")
    user = TOKENS.get((authorization or "").removeprefix("Bearer "))
    if user is None:
        raise HTTPException(401, "who are you?")
    return user


def fastapi_app(limiter: AsyncRateLimiter, **kw: Any) -> FastAPI:
    app = FastAPI()
    per_user = RateLimit(Rule(2, 60, "fixed_window"), limiter=limiter,
                         key=lambda request, user: f"user:{user}", auth=current_user, **kw)
    per_ip = RateLimit("100/minute", limiter=limiter,
                       key=lambda request: f"ip:{request.client.host}")

    @app.get("/search", dependencies=[Depends(per_ip)])
    async def search(user: Annotated[str, Depends(current_user)],
                     decision: Decision = Depends(per_user)  # noqa: B008 (a local)
                     ) -> dict[str, Any]:
        calls.append("search")
        return {"user": user, "remaining": decision.remaining}

    return app


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("192.0.2.9", 1)),
                             base_url="http://app")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_fastapi_dependency_keys_by_the_authenticated_user(clock: FakeClock) -> None:
    calls.clear()
    async with client(fastapi_app(AsyncRateLimiter(MemoryStore(clock=clock)))) as c:
        r1 = await c.get("/search", headers=bearer("t-alice"))
        r2 = await c.get("/search", headers=bearer("t-alice"))
        r3 = await c.get("/search", headers=bearer("t-alice"))
        other = await c.get("/search", headers=bearer("t-bob"))
        anonymous = await c.get("/search")
    assert (r1.status_code, r2.status_code, r3.status_code) == (200, 200, 429)
    assert r1.json() == {"user": "alice", "remaining": 1}
    assert r1.headers["x-ratelimit-limit"] == "2"  # the binding (per-user) rule's headers
    assert r1.headers["x-ratelimit-remaining"] == "1"
    assert r1.headers["x-ratelimit-reset"] == "60"
    assert "retry-after" not in r1.headers
    assert r3.headers["retry-after"] == "60"
    assert r3.headers["x-ratelimit-remaining"] == "0"
    assert r3.json()["detail"]["error"] == "rate limit exceeded"
    assert r3.json()["detail"]["retry_after"] == 60.0
    assert other.status_code == 200  # per user, not per client address
    assert anonymous.status_code == 401  # auth answered before the per-user limit counted
    # auth ran once per request (shared by the endpoint and the limit), before the limit
    assert calls == ["auth", "search", "auth", "search", "auth", "auth", "search", "auth"]


async def test_fastapi_dependency_epoch_reset_and_degraded(clock: FakeClock) -> None:
    limiter = AsyncRateLimiter(MemoryStore(clock=clock))
    async with client(fastapi_app(limiter, reset_header="epoch")) as c:
        r = await c.get("/search", headers=bearer("t-bob"))
    assert r.headers["x-ratelimit-reset"] == str(int(clock.wall()) + 60)
    async with client(fastapi_app(AsyncRateLimiter(DownStore(), on_error="deny"))) as c:
        r = await c.get("/search", headers=bearer("t-bob"))
    assert r.status_code == 429


def test_fastapi_dependency_config_errors() -> None:
    with pytest.raises(ConfigError, match="limiter"):
        RateLimit("1/second", key=lambda request: "k",
                  limiter=RateLimiter(DownStore()))  # would block the event loop
    with pytest.raises(ConfigError) as exc:
        RateLimit("1/fortnight", key=lambda request: "k", limiter=AsyncRateLimiter())
    assert exc.value.field == "rule"
    with pytest.raises(ConfigError) as exc:
        RateLimit("1/second", key="k", limiter=AsyncRateLimiter())  # type: ignore[arg-type]
    assert exc.value.field == "key"
    with pytest.raises(ConfigError) as exc:
        RateLimit("1/second", key=lambda r: "k", limiter=AsyncRateLimiter(), cost=2)
    assert exc.value.field == "cost"
    assert "1/1s" in repr(RateLimit("1/second", key=lambda r: "k", limiter=AsyncRateLimiter()))


def starlette_app(limiter: AsyncRateLimiter | RateLimiter, **kw: Any) -> Starlette:
    @rate_limit("2/minute;3/hour", key=lambda request: request.headers.get("x-user", "anon"),
                limiter=limiter, **kw)
    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"}, headers={"X-App": "1"})

    return Starlette(routes=[Route("/", hello)])


@pytest.mark.parametrize("kind", [AsyncRateLimiter, RateLimiter])
async def test_starlette_decorator(clock: FakeClock, kind: type[Any]) -> None:
    async with client(starlette_app(kind(MemoryStore(clock=clock)))) as c:
        answers = [await c.get("/", headers={"X-User": "u1"}) for _ in range(3)]
        other = await c.get("/", headers={"X-User": "u2"})
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert answers[0].json() == {"hello": "world"}
    assert answers[0].headers["x-app"] == "1"
    assert answers[0].headers["x-ratelimit-remaining"] == "1"
    assert answers[2].headers["retry-after"]
    body = answers[2].json()
    assert (body["error"], body["allowed"]) == ("rate limit exceeded", False)
    assert answers[2].headers["content-type"] == "application/json"
    assert other.status_code == 200


async def test_starlette_decorator_epoch_and_errors(clock: FakeClock) -> None:
    async with client(starlette_app(AsyncRateLimiter(MemoryStore(clock=clock)),
                                    reset_header="epoch")) as c:
        r = await c.get("/")
    assert int(r.headers["x-ratelimit-reset"]) > clock.wall()

    def sync_endpoint(request: Request) -> JSONResponse:
        return JSONResponse({})

    with pytest.raises(ConfigError) as exc:
        rate_limit("1/second", key=lambda r: "k",
                   limiter=AsyncRateLimiter())(sync_endpoint)  # type: ignore[arg-type]
    assert exc.value.field == "endpoint"
    with pytest.raises(ConfigError, match="reset_header"):
        rate_limit("1/second", key=lambda r: "k", limiter=AsyncRateLimiter(),
                   reset_header="iso")
