"""The check API's ``peek`` (nothing consumed), several limits or rules on one key (all
or nothing) and ``POST /v1/reset`` (a control-plane call): what ServiceStore needs to be a
whole Store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.service import create_app
from stormguard.service.openapi import openapi_document
from stormguard.testing import FakeClock
from tests.service.helpers import AUTH, RULES, TOKEN

A = {"name": "a", "limit": 2, "window": 3600, "algorithm": "fixed_window"}
B = {"name": "b", "limit": 3, "window": 3600, "algorithm": "fixed_window"}


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        yield c


async def _check(client: httpx.AsyncClient, **body: object) -> dict[str, object]:
    r = await client.post("/v1/check", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, object] = r.json()
    return answer


async def test_peek_consumes_nothing(client: httpx.AsyncClient) -> None:
    limit = {"limit": 2, "window": 60, "algorithm": "fixed_window"}
    for _ in range(3):
        d = await _check(client, key="k", peek=True, **limit)
        assert (d["allowed"], d["remaining"]) == (True, 2)  # as the store's peek says
    assert (await _check(client, key="k", **limit))["remaining"] == 1
    assert (await _check(client, key="k", **limit))["remaining"] == 0
    d = await _check(client, key="k", peek=True, **limit)
    assert d["allowed"] is False
    assert float(str(d["retry_after"])) > 0
    # in a batch too: the peeks leave the counter alone
    peek = {"key": "user:9", "rule": "search", "peek": True}
    r = await client.post("/v1/check/batch", json={"checks": [
        peek, peek, {"key": "user:9", "rule": "search"}, peek]})
    assert [a["remaining"] for a in r.json()["results"]] == [3, 3, 2, 2]


@pytest.mark.parametrize(("body", "field"), [
    ({"key": "k", "limit": 2, "window": 60, "peek": "yes"}, "peek"),
    ({"user": "1", "peek": True}, "peek"),
    ({"key": "k", "limits": []}, "limits"),
    ({"key": "k", "limits": [A] * 17}, "limits"),
    ({"key": "k", "limits": "a"}, "limits"),
    ({"key": "k", "limits": [A, A]}, "limits[1]"),
    ({"key": "k", "limits": [A, {**B, "window": "fortnight"}]}, "limits[1].window"),
    ({"key": "k", "limits": [A, {**B, "colour": "red"}]}, "limits[1].colour"),
    ({"key": "k", "limits": [A, 3]}, "limits[1]"),
    ({"key": "k", "limits": [A], "limit": 3, "window": 60}, "limit"),
    ({"key": "k", "limits": [A], "rule": "search"}, "limits"),
    ({"key": "k", "rule": []}, "rule"),
    ({"key": "k", "rule": ["search", 3]}, "rule"),
    ({"key": "k", "rule": ["search", "search"]}, "rule"),
])
async def test_bad_peek_and_limits_name_the_field(client: httpx.AsyncClient,
                                                  body: dict[str, object], field: str) -> None:
    r = await client.post("/v1/check", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert r.json()["error"].startswith(f"{field}: ")


async def test_several_limits_on_one_key_are_all_or_nothing(client: httpx.AsyncClient) -> None:
    answers = [await _check(client, key="k", limits=[A, B]) for _ in range(3)]
    assert [a["allowed"] for a in answers] == [True, True, False]
    assert answers[0]["rule"] == "a"  # the binding limit: the one with least left
    assert answers[2]["rule"] == "a"
    assert answers[0]["rules"] == ["a", "b"]
    # the denied check consumed nothing from b: b alone still has 1 left
    assert (await _check(client, key="k", limits=[B]))["remaining"] == 0
    assert (await _check(client, key="k", limits=[B]))["allowed"] is False
    # the name is part of the counters: the same parameters under another name are fresh
    assert (await _check(client, key="k", limits=[{**A, "name": "a2"}]))["remaining"] == 1


async def test_several_named_rules_on_one_key(client: httpx.AsyncClient) -> None:
    answers = [await _check(client, key="user:1", rule=["search", "per-ip"]) for _ in range(4)]
    assert [a["allowed"] for a in answers] == [True, True, True, False]  # search: 3/min
    assert answers[0]["rules"] == ["search", "per-ip"]
    assert answers[3]["rule"] == "search"
    # all or nothing: the denied check took nothing from per-ip (100/min, 3 used)
    assert (await _check(client, key="user:1", rule="per-ip"))["remaining"] == 96
    r = await client.post("/v1/check", json={"key": "user:1", "rule": ["search", "nope"]})
    assert (r.status_code, r.json()["field"]) == (404, "rule")


async def test_reset_forgets_the_counters(client: httpx.AsyncClient) -> None:
    limit = {"limit": 1, "window": 3600, "algorithm": "fixed_window"}
    await _check(client, key="k", **limit)
    assert (await _check(client, key="k", **limit))["allowed"] is False
    r = await client.post("/v1/reset", json={"key": "k", **limit})
    assert r.status_code == 401  # a control-plane call: the bearer token
    assert (await _check(client, key="k", **limit))["allowed"] is False
    r = await client.post("/v1/reset", json={"key": "k", **limit}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"reset": True, "key": "k", "rules": []}
    assert (await _check(client, key="k", **limit))["allowed"] is True
    # several limits, and a named rule of the service
    for _ in range(2):
        await _check(client, key="k2", limits=[A, B])
    r = await client.post("/v1/reset", json={"key": "k2", "limits": [A, B]}, headers=AUTH)
    assert r.json()["rules"] == ["a", "b"]
    assert (await _check(client, key="k2", limits=[A, B]))["remaining"] == 1
    before = await _check(client, key="user:5", rule="search")
    await _check(client, key="user:5", rule="search")
    r = await client.post("/v1/reset", json={"key": "user:5", "rule": "search"}, headers=AUTH)
    assert r.json()["rules"] == ["search"]
    assert (await _check(client, key="user:5", rule="search"))["remaining"] == before["remaining"]


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"user": "1"}, 422, "key"),
    ({"key": "k", "limit": 1, "window": 60, "cost": 1}, 422, "cost"),
    ({"key": "k", "limit": 1, "window": 60, "peek": True}, 422, "peek"),
    ({"key": "k", "rule": "nope"}, 404, "rule"),
    ({"key": "k", "limit": 0, "window": 60}, 422, "limit"),
])
async def test_bad_reset_names_the_field(client: httpx.AsyncClient, body: dict[str, object],
                                         status: int, field: str) -> None:
    r = await client.post("/v1/reset", json=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field


async def test_reset_without_a_control_plane_is_403(clock: FakeClock) -> None:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        r = await c.post("/v1/reset", json={"key": "k", "rule": "search"}, headers=AUTH)
    assert r.status_code == 403
    assert "STORMGUARD_ADMIN_TOKEN" in r.json()["error"]


def test_openapi_declares_peek_limits_and_reset() -> None:
    doc = openapi_document()
    variants = doc["components"]["schemas"]["Check"]["oneOf"]
    assert any("limits" in v.get("properties", {}) for v in variants)
    assert all("peek" in v["properties"] for v in variants if "key" in v["properties"])
    reset = doc["paths"]["/v1/reset"]["post"]
    assert reset["security"] == [{"bearer": []}]
    assert all("peek" not in v["properties"] and "cost" not in v["properties"]
               for v in reset["requestBody"]["content"]["application/json"]["schema"]["oneOf"])
