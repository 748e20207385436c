"""``/v1/check`` with an inline limit (the design document's ``ALLOW? key limit window``)
and ``reset`` (epoch seconds) in every answer (issue 17, 12)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import httpx
import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.service import create_app
from stormguard.service.openapi import openapi_document
from stormguard.testing import FakeClock
from tests.service.helpers import RULES

START = 1_700_000_040  # the clock fixture's start, on a minute boundary


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sg") as c:
        yield c


async def test_the_design_documents_check(client: httpx.AsyncClient,
                                          clock: FakeClock) -> None:
    check = {"key": "user:42:GET:/search", "limit": 3, "window": 60,
             "algorithm": "fixed_window"}
    answers = [(await client.post("/v1/check", json=check)).json() for _ in range(4)]
    assert [a["allowed"] for a in answers] == [True, True, True, False]
    assert [a["remaining"] for a in answers] == [2, 1, 0, 0]
    assert answers[0]["limit"] == 3
    assert answers[0]["rule"] is None
    assert answers[0]["rules"] == []
    assert {a["reset"] for a in answers} == {START + 60}
    clock.advance(0.5)
    r = await client.post("/v1/check", json={**check, "window": "1m"})  # the same limit
    assert r.json()["allowed"] is False
    assert r.json()["reset"] == START + 60
    assert r.headers["retry-after"] == "60"
    assert r.headers["x-ratelimit-limit"] == "3"


async def test_inline_options(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/check", json={"key": "k", "limit": 10, "window": 1,
                                             "algorithm": "token_bucket", "burst": 20,
                                             "cost": 5})
    assert r.status_code == 200, r.text
    assert (r.json()["limit"], r.json()["remaining"]) == (20, 15)
    # another limit on the same key: its own counter; so is a named rule
    r = await client.post("/v1/check", json={"key": "k", "limit": 2, "window": 1})
    assert r.json()["remaining"] == 1
    r = await client.post("/v1/check", json={"key": "user:1", "limit": 3, "window": 60,
                                             "algorithm": "fixed_window"})
    r = await client.post("/v1/check", json={"key": "user:1", "rule": "search"})
    assert r.json()["remaining"] == 2


@pytest.mark.parametrize(("check", "field"), [
    ({"key": "k", "limit": 0, "window": 60}, "limit"),
    ({"key": "k", "limit": "100", "window": 60}, "limit"),
    ({"key": "k", "limit": True, "window": 60}, "limit"),
    ({"key": "k", "limit": 100}, "window"),
    ({"key": "k", "window": 60}, "limit"),
    ({"key": "k", "limit": 100, "window": "fortnight"}, "window"),
    ({"key": "k", "limit": 100, "window": -1}, "window"),
    ({"key": "k", "limit": 100, "window": 366 * 86400 + 1}, "window"),
    ({"key": "k", "limit": 100, "window": 60, "algorithm": "magic"}, "algorithm"),
    ({"key": "k", "limit": 100, "window": 60, "burst": 5}, "burst"),
    ({"key": "k", "limit": 100, "window": 60, "algorithm": "gcra", "burst": 0}, "burst"),
    ({"key": "k", "limit": 2**52, "window": 86400}, "limit"),
    ({"key": "k", "limit": 5, "window": 60, "cost": 6}, "cost"),
    ({"key": "k", "limit": 5, "window": 60, "rule": "search"}, "limit"),
    ({"key": "k", "limit": 5, "window": 60, "user": "1"}, "user"),
    ({"limit": 5, "window": 60}, "key"),
    ({"key": "", "limit": 5, "window": 60}, "key"),
])
async def test_inline_limits_are_validated_like_rules(client: httpx.AsyncClient,
                                                      check: dict[str, object],
                                                      field: str) -> None:
    r = await client.post("/v1/check", json=check)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert r.json()["error"].startswith(f"{field}: ")


async def test_every_answer_has_reset(client: httpx.AsyncClient, clock: FakeClock) -> None:
    clock.advance(0.25)
    r = await client.post("/v1/check", json={"ip": "10.0.0.1"})  # per-ip: sliding window
    assert r.json()["reset"] == math.ceil(START + 0.25 + r.json()["reset_after"])
    r = await client.post("/v1/check", json={"tier": "none"})  # nothing matches
    assert r.json()["rule"] is None
    assert r.json()["reset"] == START + 1  # now, rounded up
    r = await client.post("/v1/check/batch", json={"checks": [
        {"key": "user:1", "rule": "search"}, {"key": "x", "limit": 1, "window": "1h"}, {},
        {"key": "x", "limit": 1, "window": "1h", "cost": 2}]})
    assert r.status_code == 422
    assert r.json()["field"] == "checks[3].cost"
    r = await client.post("/v1/check/batch", json={"checks": [
        {"key": "user:1", "rule": "search"}, {"key": "x", "limit": 1, "window": "1h",
                                              "algorithm": "fixed_window"}, {}]})
    results = r.json()["results"]
    hour = math.ceil(START / 3600) * 3600  # fixed windows are aligned to the epoch
    assert [a["reset"] for a in results] == [START + 60, hour, START + 1]
    assert results[1]["rules"] == []
    r = await client.post("/v1/check/batch", json={"checks": [{"key": "x", "limit": 0,
                                                               "window": 1}]})
    assert (r.status_code, r.json()["field"]) == (422, "checks[0].limit")


def test_openapi_declares_the_inline_check_and_reset() -> None:
    schemas = openapi_document()["components"]["schemas"]
    inline = schemas["Check"]["oneOf"][1]
    assert inline["required"] == ["key", "limit", "window"]
    assert set(inline["properties"]) == {"key", "limit", "window", "algorithm", "burst",
                                         "cost", "peek"}
    assert "reset" in schemas["CheckResult"]["required"]
    assert schemas["CheckResult"]["properties"]["reset"]["type"] == "integer"
