"""``/v1/auth`` (nginx ``auth_request``) on the ASGI app: which headers are believed from
whom, the answers, and a store outage."""

from __future__ import annotations

import logging

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.cli import _parser, main
from stormguard.service import create_app
from stormguard.testing import FakeClock
from tests.service.helpers import DownStore

RULES = [
    {"name": "search-per-ip", "scope": "ip", "endpoint": "GET /search*", "limit": 2,
     "window": 60, "algorithm": "fixed_window"},
    {"name": "per-key", "scope": "api_key", "limit": 1, "window": 60,
     "algorithm": "fixed_window"},
]


def client(peer: str, *, trusted: tuple[str, ...] = ("127.0.0.1", "10.0.0.0/8"),
           store: object = None, on_error: str = "allow") -> httpx.AsyncClient:
    limiter = AsyncRateLimiter(store if store is not None else MemoryStore(clock=FakeClock()),
                               on_error=on_error)
    app = create_app(limiter, RULES, trusted_proxies=trusted)
    transport = httpx.ASGITransport(app=app, client=(peer, 4321))
    return httpx.AsyncClient(transport=transport, base_url="http://sg")


def nginx_headers(uri: str, ip: str, method: str = "GET", **extra: str) -> dict[str, str]:
    return {"X-Original-Method": method, "X-Original-URI": uri, "X-Real-IP": ip, **extra}


async def test_trusted_proxy_headers_select_the_rule_and_key() -> None:
    async with client("10.1.2.3") as c:
        codes = [(await c.get("/v1/auth", headers=nginx_headers("/search?q=1", "203.0.113.9"))
                  ).status_code for _ in range(3)]
        assert codes == [204, 204, 403]
        # another client address has its own counter; the query string is not the path
        r = await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.10"))
        assert r.status_code == 204
        assert r.headers["ratelimit-policy"] == '"search-per-ip";q=2;w=60'
        # POST /search does not match "GET /search*"
        r = await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.9", "post"))
        assert r.status_code == 204
        denied = await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.9"))
        assert denied.status_code == 403
        assert 1 <= int(denied.headers["retry-after"]) <= 60
        assert denied.headers["x-ratelimit-remaining"] == "0"
        assert denied.json()["status"] == 403
        # the subrequest may keep the original method (no proxy_method GET)
        r = await c.request("POST", "/v1/auth", headers=nginx_headers("/x", "198.51.100.1"))
        assert r.status_code == 204
        # optional identity headers
        hdrs = nginx_headers("/x", "198.51.100.1", **{"X-Stormguard-Api-Key": "k1"})
        assert [(await c.get("/v1/auth", headers=hdrs)).status_code for _ in range(2)] == \
            [204, 403]
        metrics = (await c.get("/metrics")).text
        assert 'stormguard_checks_total{result="denied",rule="search-per-ip"} 2.0' in metrics


async def test_untrusted_peer_cannot_choose_its_address_or_path(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "stormguard")
    async with client("192.0.2.50") as c:
        # the headers are ignored: no path, so the search rule never applies, and every
        # "client address" it claims is the peer's
        codes = [(await c.get("/v1/auth", headers=nginx_headers("/search", f"203.0.113.{i}",
                                                                **{"X-Stormguard-Api-Key": "k"}))
                  ).status_code for i in range(4)]
        assert codes == [204] * 4
    assert "not a trusted proxy" in caplog.text
    async with client("127.0.0.1", trusted=()) as c:  # nothing trusted by default
        codes = [(await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.1"))
                  ).status_code for _ in range(3)]
        assert codes == [204] * 3


async def test_bad_real_ip_is_a_clear_400() -> None:
    async with client("127.0.0.1") as c:
        r = await c.get("/v1/auth", headers=nginx_headers("/search", "not-an-ip"))
        assert r.status_code == 400
        assert "X-Real-IP" in r.json()["error"]
        # without X-Real-IP the peer is the client
        r = await c.get("/v1/auth", headers={"X-Original-URI": "/search",
                                             "X-Original-Method": "GET"})
        assert r.status_code == 204


async def test_store_outage_follows_on_error() -> None:
    async with client("127.0.0.1", store=DownStore()) as c:
        r = await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.9"))
        assert r.status_code == 204  # fail open
    async with client("127.0.0.1", store=DownStore(), on_error="deny") as c:
        r = await c.get("/v1/auth", headers=nginx_headers("/search", "203.0.113.9"))
        assert r.status_code == 403  # fail closed, never a 500


def test_trusted_proxies_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _parser().parse_args(["serve", "--trusted-proxies", "127.0.0.1, 10.0.0.0/8"])
    assert args.trusted_proxies == "127.0.0.1, 10.0.0.0/8"
    monkeypatch.setenv("STORMGUARD_TRUSTED_PROXIES", "192.168.0.0/16")
    assert _parser().parse_args(["serve"]).trusted_proxies == "192.168.0.0/16"
    assert main(["serve", "--trusted-proxies", "10.0.0.0/33"]) == 2


@pytest.mark.parametrize("uri", ["/%73earch?q=1", "//search", "/a/../search", "/./search",
                                 "/search/../search/x"])
async def test_the_path_is_the_one_the_application_serves(uri: str) -> None:
    """nginx passes ``$request_uri`` raw: an encoded or dotted path cannot slip past a
    rule on ``GET /search*``."""
    async with client("127.0.0.1") as c:
        codes = [(await c.get("/v1/auth", headers=nginx_headers(uri, "203.0.113.9"))
                  ).status_code for _ in range(3)]
    assert codes == [204, 204, 403]


def test_request_path() -> None:
    from stormguard.service.auth import request_path

    assert request_path("/a/b/?x=1") == "/a/b/"
    assert request_path("/") == "/"
    assert request_path("/../../etc") == "/etc"
    assert request_path("relative") == "/relative"
    assert request_path("/%2e%2e/x") == "/x"
