"""The check API, operations endpoints and error answers, in-process over ASGITransport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore, RateLimiter
from stormguard.service import create_app
from stormguard.service.app import MAX_BODY
from stormguard.testing import FakeClock
from tests.service.helpers import RULES, DownStore, RefusingStore


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        yield c


async def test_check_by_key_and_rule(client: httpx.AsyncClient) -> None:
    answers = [await client.post("/v1/check", json={"key": "user:42", "rule": "search"})
               for _ in range(4)]
    assert [r.status_code for r in answers] == [200] * 4
    bodies = [r.json() for r in answers]
    assert [b["allowed"] for b in bodies] == [True, True, True, False]
    assert bodies[0] == {"allowed": True, "limit": 3, "remaining": 2, "reset_after": 60.0,
                         "retry_after": 0.0, "rule": "search", "shadow": False,
                         "degraded": False, "shadow_denied": [], "rules": ["search"],
                         "reset": 1_700_000_100}  # epoch s: the clock starts at ...040
    assert bodies[3]["retry_after"] == 60.0
    h = answers[3].headers
    assert h["retry-after"] == "60"
    assert h["x-ratelimit-limit"] == "3"
    assert h["x-ratelimit-remaining"] == "0"
    assert h["ratelimit-policy"] == '"search";q=3;w=60'
    assert "retry-after" not in answers[0].headers
    assert answers[0].headers["x-ratelimit-remaining"] == "2"


async def test_check_by_attributes_shares_counters_with_key_form(
        client: httpx.AsyncClient) -> None:
    attrs = {"user": "42", "ip": "10.1.1.1", "method": "GET", "path": "/search/books"}
    r = await client.post("/v1/check", json=attrs)
    b = r.json()
    assert b["allowed"]
    assert b["rule"] == "search"
    assert b["remaining"] == 2
    assert b["rules"] == ["search", "per-ip"]
    r = await client.post("/v1/check", json={"key": "user:42", "rule": "search", "cost": 2})
    assert r.json()["remaining"] == 0
    r = await client.post("/v1/check", json=attrs)
    assert r.json()["allowed"] is False
    r = await client.post("/v1/check", json={**attrs, "method": "POST"})
    assert r.json()["allowed"] is True
    assert r.json()["rule"] == "per-ip"


async def test_shadow_rule_reported_never_blocks(client: httpx.AsyncClient) -> None:
    r1 = await client.post("/v1/check", json={"api_key": "k1"})
    r2 = await client.post("/v1/check", json={"api_key": "k1"})
    assert r1.json()["shadow_denied"] == []
    b = r2.json()
    assert b["allowed"] is True
    assert b["shadow"] is True
    assert b["shadow_denied"] == ["dry"]
    assert "retry-after" not in r2.headers
    metrics = (await client.get("/metrics")).text
    assert 'stormguard_shadow_denials_total{rule="dry"} 1.0' in metrics


async def test_no_rule_matches(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/check", json={"method": "GET", "path": "/"})
    assert r.status_code == 200
    assert r.json()["allowed"] is True
    assert r.json()["rule"] is None
    assert "x-ratelimit-limit" not in r.headers


async def test_batch(client: httpx.AsyncClient) -> None:
    checks = [{"key": "user:7", "rule": "search"}] * 4 + [{"ip": "1.2.3.4"}]
    r = await client.post("/v1/check/batch", json={"checks": checks})
    assert r.status_code == 200
    assert [x["allowed"] for x in r.json()["results"]] == [True, True, True, False, True]
    r = await client.post("/v1/check/batch", json={"checks": [{"key": "a", "rule": "search"},
                                                               {"key": "b", "rule": "zzz"}]})
    assert r.status_code == 404
    assert r.json()["field"] == "checks[1].rule"
    # nothing was consumed by the refused batch
    r = await client.post("/v1/check", json={"key": "a", "rule": "search"})
    assert r.json()["remaining"] == 2
    # a cost no rule can admit, late in the batch: refused whole, nothing consumed
    r = await client.post("/v1/check/batch", json={"checks": [
        {"key": "c", "rule": "search"}, {"user": "c", "method": "GET", "path": "/search",
                                         "cost": 4}]})
    assert r.status_code == 422
    assert r.json()["field"] == "checks[1].cost"
    r = await client.post("/v1/check", json={"key": "user:c", "rule": "search"})
    assert r.json()["remaining"] == 2
    r = await client.post("/v1/check/batch", json={"checks": [{}] * 1001})
    assert r.status_code == 422
    r = await client.post("/v1/check/batch", json=[])
    assert r.status_code == 422


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{nope", 400, "malformed JSON"),
    (b"", 400, "empty"),
    (b"[" * 100_00 + b"]" * 100_00, 400, "malformed JSON"),
    (b'"text"', 422, "JSON object"),
    (json.dumps({"key": "k", "rule": "nope"}).encode(), 404, "unknown rule 'nope'"),
    (json.dumps({"key": "k", "rule": "search", "cost": -1}).encode(), 422, "cost"),
    (json.dumps({"key": "k", "rule": "search", "cost": 0}).encode(), 422, "cost"),
    (json.dumps({"key": "k", "rule": "search", "cost": 1.5}).encode(), 422, "cost"),
    (json.dumps({"key": "k", "rule": "search", "cost": True}).encode(), 422, "cost"),
    (json.dumps({"key": "k", "rule": "search", "cost": 4}).encode(), 422, "capacity"),
    (json.dumps({"key": "", "rule": "search"}).encode(), 422, "key"),
    (json.dumps({"key": "k"}).encode(), 422, "rule"),
    (json.dumps({"rule": "search"}).encode(), 422, "key"),
    (json.dumps({"key": "k", "rule": "search", "user": "u"}).encode(), 422, "not both"),
    (json.dumps({"user": 5}).encode(), 422, "user: must be a string"),
    (json.dumps({"usr": "5"}).encode(), 422, "usr: unknown field"),
])
async def test_bad_input_is_a_4xx_naming_the_problem(client: httpx.AsyncClient, body: bytes,
                                                     status: int, needle: str) -> None:
    r = await client.post("/v1/check", content=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert needle in r.json()["error"]


async def test_body_over_64k_is_413_even_without_content_length(
        client: httpx.AsyncClient) -> None:
    big = json.dumps({"key": "x" * MAX_BODY, "rule": "search"}).encode()
    r = await client.post("/v1/check", content=big)
    assert r.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to trust
        for _ in range(100):
            yield b" " * 1024

    r = await client.post("/v1/check", content=chunks())
    assert r.status_code == 413
    r = await client.post("/v1/check", content=b"{}", headers={"content-length": "x"})
    assert r.status_code == 400


async def test_unknown_paths_and_methods_are_json(client: httpx.AsyncClient) -> None:
    r = await client.get("/nope")
    assert r.status_code == 404
    assert "Not Found" in r.json()["error"]
    r = await client.get("/v1/check")
    assert r.status_code == 405
    assert r.json()["status"] == 405


async def test_health_ready_metrics_openapi(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["rules"] == 3
    for _ in range(4):
        await client.post("/v1/check", json={"key": "user:1", "rule": "search"})
    text = (await client.get("/metrics")).text
    assert 'stormguard_checks_total{result="allowed",rule="search"} 3.0' in text
    assert 'stormguard_checks_total{result="denied",rule="search"} 1.0' in text
    assert "stormguard_check_latency_seconds_count 4.0" in text
    assert "stormguard_degraded_decisions_total 0.0" in text
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) >= {"/v1/check", "/v1/check/batch", "/v1/rules",
                                 "/v1/rules/{name}", "/healthz", "/readyz", "/metrics"}



async def test_openapi_declares_the_rate_limit_headers(client: httpx.AsyncClient) -> None:
    """Every header a check answers with (allowed or denied) is in the OpenAPI document."""
    doc = (await client.get("/openapi.json")).json()
    declared = {h.lower() for h in doc["paths"]["/v1/check"]["post"]["responses"]["200"]
                ["headers"]}
    sent: set[str] = set()
    for _ in range(4):
        r = await client.post("/v1/check", json={"key": "user:7", "rule": "search"})
        sent |= set(r.headers) - {"content-type", "content-length"}
    assert "retry-after" in sent
    assert sent == declared


async def test_two_apps_have_separate_metrics(clock: FakeClock) -> None:
    apps = [create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=None)
            for _ in range(2)]
    transport = httpx.ASGITransport(app=apps[0])
    async with httpx.AsyncClient(transport=transport, base_url="http://a") as a:
        await a.post("/v1/check", json={"key": "k", "rule": "search"})
    metrics = [app.state.service.metrics.render().decode() for app in apps]
    assert 'rule="search"} 1.0' in metrics[0]
    assert 'rule="search"' not in metrics[1]


@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_store_down_follows_on_error_and_readyz_fails(on_error: str) -> None:
    store = DownStore()
    app = create_app(AsyncRateLimiter(store, on_error=on_error),  # type: ignore[arg-type]
                     RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        r = await c.post("/v1/check", json={"key": "user:1", "rule": "search"})
        assert r.status_code == 200
        assert r.json()["allowed"] is (on_error == "allow")
        assert r.json()["degraded"] is True
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert "backend down" in r.json()["error"]
        text = (await c.get("/metrics")).text
        assert "stormguard_degraded_decisions_total 1.0" in text
    assert store.calls >= 2


async def test_blocking_limiter_is_accepted(clock: FakeClock) -> None:
    app = create_app(RateLimiter(MemoryStore(clock=clock)), RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        r = await c.post("/v1/check", json={"key": "user:1", "rule": "search"})
        assert r.json()["remaining"] == 2
        assert (await c.get("/readyz")).status_code == 200


async def test_a_rule_the_store_refuses_is_a_422_not_a_500() -> None:
    app = create_app(AsyncRateLimiter(RefusingStore()), RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        r = await c.post("/v1/check", json={"key": "user:1", "rule": "search"})
        assert r.status_code == 422
        assert "the store refuses the rule" in r.json()["error"]
        r = await c.post("/v1/check/batch", json={"checks": [{"user": "1", "ip": "i"}]})
        assert r.status_code == 422
