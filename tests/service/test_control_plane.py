"""The rules control plane: auth, versions/ETags, file persistence, Redis hot reload."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.ratelimit.rules import RuleSet
from stormguard.service import create_app
from stormguard.service.sources import RedisRules
from stormguard.testing import FakeClock
from tests.service.helpers import AUTH, RULES, TOKEN

NEW_RULE = {"scope": "ip", "limit": 2, "window": "1s"}


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                             base_url="http://sg")


@pytest.fixture
async def admin(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=TOKEN)
    async with _client(app) as c:
        yield c


async def test_disabled_without_token_but_checks_work(clock: FakeClock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORMGUARD_ADMIN_TOKEN", raising=False)
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES)
    async with _client(app) as c:
        for method, path in [("GET", "/v1/rules"), ("PUT", "/v1/rules"),
                             ("PUT", "/v1/rules/x"), ("DELETE", "/v1/rules/search")]:
            r = await c.request(method, path, headers=AUTH, json={})
            assert r.status_code == 403, (method, path)
            assert "STORMGUARD_ADMIN_TOKEN" in r.json()["error"]
        r = await c.post("/v1/check", json={"key": "k", "rule": "search"})
        assert r.status_code == 200


async def test_token_from_environment(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORMGUARD_ADMIN_TOKEN", "from-env")
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES)
    async with _client(app) as c:
        r = await c.get("/v1/rules", headers={"Authorization": "Bearer from-env"})
        assert r.status_code == 200


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}",
                                    f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}",
                                    "Bearer \u00e9\u00e9"])
async def test_wrong_credentials_are_401(admin: httpx.AsyncClient, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header.encode()}
    r = await admin.get("/v1/rules", headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = await admin.put("/v1/rules/x", headers=headers, json=NEW_RULE)
    assert r.status_code == 401


async def test_get_put_delete_with_versions(admin: httpx.AsyncClient) -> None:
    r = await admin.get("/v1/rules", headers=AUTH)
    assert r.status_code == 200
    assert r.headers["etag"] == '"0"'
    assert [x["name"] for x in r.json()["rules"]] == ["search", "per-ip", "dry"]
    assert set(r.json()["rules"][0]) == {"name", "scope", "endpoint", "tier", "limit",
                                         "window", "algorithm", "burst", "shadow"}
    r = await admin.put("/v1/rules/burst", headers={**AUTH, "If-Match": '"0"'}, json=NEW_RULE)
    assert r.status_code == 201
    assert r.headers["etag"] == '"1"'
    r = await admin.post("/v1/check", json={"ip": "1.1.1.1"})
    assert "burst" in r.json()["rules"]
    r = await admin.put("/v1/rules/burst", headers=AUTH, json={**NEW_RULE, "limit": 3})
    assert r.status_code == 200
    assert r.headers["etag"] == '"2"'
    r = await admin.get("/v1/rules/burst", headers=AUTH)
    assert r.json()["rule"]["limit"] == 3
    r = await admin.delete("/v1/rules/burst", headers={**AUTH, "If-Match": '"2"'})
    assert r.status_code == 200
    assert r.json() == {"version": 3, "deleted": "burst"}
    r = await admin.delete("/v1/rules/burst", headers=AUTH)
    assert r.status_code == 404
    r = await admin.get("/v1/rules/burst", headers=AUTH)
    assert r.status_code == 404


async def test_stale_if_match_is_412_and_changes_nothing(admin: httpx.AsyncClient) -> None:
    etag = (await admin.get("/v1/rules", headers=AUTH)).headers["etag"]
    # admin A and admin B both read version 0; A writes first
    r = await admin.put("/v1/rules/a", headers={**AUTH, "If-Match": etag}, json=NEW_RULE)
    assert r.status_code == 201
    r = await admin.put("/v1/rules/b", headers={**AUTH, "If-Match": etag}, json=NEW_RULE)
    assert r.status_code == 412
    assert r.json()["version"] == 1
    assert r.headers["etag"] == '"1"'
    r = await admin.put("/v1/rules", headers={**AUTH, "If-Match": etag}, json={"rules": []})
    assert r.status_code == 412
    r = await admin.delete("/v1/rules/a", headers={**AUTH, "If-Match": 'W/"1"'})
    assert r.status_code == 412  # weak tags never match If-Match
    r = await admin.get("/v1/rules", headers=AUTH)
    assert [x["name"] for x in r.json()["rules"]] == ["search", "per-ip", "dry", "a"]
    r = await admin.delete("/v1/rules/a", headers={**AUTH, "If-Match": '"7", "1"'})
    assert r.status_code == 200
    r = await admin.put("/v1/rules/a", headers={**AUTH, "If-Match": "*"}, json=NEW_RULE)
    assert r.status_code == 201


async def test_invalid_rule_set_is_refused_whole(admin: httpx.AsyncClient) -> None:
    bad = {"rules": [{"name": "ok", "scope": "ip", "limit": 1, "window": 1},
                     {"name": "bad", "scope": "planet", "limit": 0, "window": 1}]}
    r = await admin.put("/v1/rules", headers=AUTH, json=bad)
    assert r.status_code == 422
    problems = r.json()["problems"]
    assert {(p["rule"], p["field"]) for p in problems} == {("bad", "scope"),
                                                           ("bad", "limit")}
    r = await admin.get("/v1/rules", headers=AUTH)
    assert r.headers["etag"] == '"0"'
    assert len(r.json()["rules"]) == 3
    r = await admin.put("/v1/rules/x", headers=AUTH, json={"scope": "ip"})
    assert r.status_code == 422
    assert "required" in r.json()["error"]
    r = await admin.put("/v1/rules/x", headers=AUTH, json={**NEW_RULE, "name": "y"})
    assert r.status_code == 422
    assert r.json()["field"] == "name"
    r = await admin.put("/v1/rules/bad%20name", headers=AUTH, json=NEW_RULE)
    assert r.status_code == 422
    r = await admin.put("/v1/rules", headers=AUTH, content=b"{")
    assert r.status_code == 400
    r = await admin.put("/v1/rules", headers=AUTH, json={"version": 0})  # no "rules"
    assert r.status_code == 422
    assert r.json()["field"] == "rules"
    r = await admin.patch("/v1/rules/search", headers=AUTH)
    assert r.status_code == 405
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD", "PUT", "DELETE"}


async def test_put_replaces_whole_set(admin: httpx.AsyncClient) -> None:
    new = [{"name": "only", "scope": "global", "limit": 1, "window": 60}]
    r = await admin.put("/v1/rules", headers=AUTH, json=new)  # a bare list works too
    assert r.status_code == 200
    assert r.json()["version"] == 1
    r = await admin.post("/v1/check", json={"key": "user:1", "rule": "search"})
    assert r.status_code == 404
    r1 = await admin.post("/v1/check", json={})
    r2 = await admin.post("/v1/check", json={})
    assert (r1.json()["allowed"], r2.json()["allowed"]) == (True, False)


def _file_app(path: Path, clock: FakeClock) -> Any:
    """An app whose rules live in ``path`` (not polled: tests refresh explicitly)."""
    return create_app(AsyncRateLimiter(MemoryStore(clock=clock)), rules_path=path,
                      admin_token=TOKEN, poll_interval=0)


async def test_memory_store_persists_to_the_rules_file_atomically(
        tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": RULES}))
    async with _client(_file_app(path, clock)) as c:
        r = await c.put("/v1/rules/burst", headers=AUTH, json=NEW_RULE)
        assert r.status_code == 201
    on_disk = RuleSet.load(path)
    assert on_disk.version == 1
    assert [x.name for x in on_disk] == ["search", "per-ip", "dry", "burst"]
    assert os.listdir(tmp_path) == ["rules.yaml"]  # no temp files left
    # a restarted instance reads the same rules and version
    async with _client(_file_app(path, clock)) as c:
        r = await c.get("/v1/rules", headers=AUTH)
        assert r.headers["etag"] == '"1"'
        assert len(r.json()["rules"]) == 4


async def test_rules_file_edit_is_picked_up_and_invalid_edit_refused(
        tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": RULES}))
    source = _file_app(path, clock).state.service.source
    path.write_text(yaml.safe_dump({"rules": [*RULES, {"name": "new", **NEW_RULE}]}))
    assert await source.refresh()
    assert "new" in source.current
    assert source.current.version == 1
    path.write_text("rules:\n  - {name: broken, scope: nowhere, limit: 1, window: 1}\n")
    assert not await source.refresh()
    assert "new" in source.current
    assert source.reload_errors == 1


async def _within_one_second(condition: Callable[[], bool]) -> None:
    """Wait (polling the condition) for another instance's poll loop; the requirement is
    one second, the injected poll interval makes it take a few milliseconds."""
    deadline = time.monotonic() + 1.0
    while not condition():
        assert time.monotonic() < deadline, "the other instance did not pick up the change"
        await asyncio.sleep(0.005)


async def test_redis_rules_hot_reload_across_two_instances(redis_url: str,
                                                           clock: FakeClock) -> None:
    """Two instances share one Redis: a change through A is served by B after B's next
    poll; the poll interval is injected, and the loop is also driven directly."""
    apps = [create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=TOKEN,
                       rules_url=redis_url, poll_interval=0.02) for _ in range(2)]
    services = [app.state.service for app in apps]
    for s in services:
        await s.start()
    try:
        async with _client(apps[0]) as a, _client(apps[1]) as b:
            r = await b.get("/v1/rules", headers=AUTH)
            assert r.headers["etag"] == '"1"'  # seeded once into Redis by the first start
            r = await a.put("/v1/rules/burst", headers={**AUTH, "If-Match": '"1"'},
                            json=NEW_RULE)
            assert r.status_code == 201
            await _within_one_second(lambda: "burst" in services[1].source.current)
            r = await b.post("/v1/check", json={"ip": "3.3.3.3"})
            assert "burst" in r.json()["rules"]
            # B writes with A's (now stale) ETag: refused, whichever instance holds it
            r = await b.put("/v1/rules/other", headers={**AUTH, "If-Match": '"1"'},
                            json=NEW_RULE)
            assert r.status_code == 412
            assert r.headers["etag"] == '"2"'
            r = await b.delete("/v1/rules/burst", headers={**AUTH, "If-Match": '"2"'})
            assert r.status_code == 200
            await _within_one_second(lambda: "burst" not in services[0].source.current)
    finally:
        for s in services:
            await s.stop()
    raw = redis.Redis.from_url(redis_url)
    assert int(raw.hget("stormguard:rules", "version") or 0) == 3
    raw.close()


async def test_redis_rules_concurrent_blind_writes_all_land(redis_url: str) -> None:
    """Edits without If-Match from several instances at once: compare-and-set retries,
    so every rule lands and the version counts every edit."""
    sources = [RedisRules(redis_url, seed=RuleSet(), poll_interval=0) for _ in range(4)]
    for s in sources:
        await s.start()
    try:
        from stormguard.ratelimit.rules import RuleSpec

        async def add(i: int) -> None:
            spec = RuleSpec(f"r{i}", "ip", 5, 60)
            await sources[i % 4].edit(lambda cur, v: cur.with_rule(spec, version=v), None)

        await asyncio.gather(*(add(i) for i in range(20)))
        await sources[0].refresh()
        assert sorted(r.name for r in sources[0].current) == sorted(f"r{i}" for i in range(20))
        assert sources[0].current.version == 21
    finally:
        for s in sources:
            await s.stop()


async def test_invalid_rules_in_redis_are_refused(redis_url: str) -> None:
    source = RedisRules(redis_url, seed=RuleSet.from_data(RULES), poll_interval=0)
    await source.start()
    try:
        raw = redis.Redis.from_url(redis_url)
        raw.hset("stormguard:rules", mapping={"version": 9, "doc": '[{"name": 1}]'})
        raw.close()
        assert not await source.refresh()
        assert len(source.current) == 3
        assert source.reload_errors == 1
    finally:
        await source.stop()


async def test_redis_down_for_rules_is_503_not_500(clock: FakeClock, redis_url: str) -> None:
    from tests.redis_servers import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=TOKEN,
                     rules_url=dead, poll_interval=0)
    async with _client(app) as c:
        r = await c.post("/v1/check", json={"key": "user:1", "rule": "search"})
        assert r.status_code == 200  # the seed rules are served while Redis is away
        r = await c.put("/v1/rules/x", headers=AUTH, json=NEW_RULE)
        assert r.status_code == 503
        r = await c.get("/v1/rules", headers=AUTH)
        assert r.status_code == 200
        assert len(r.json()["rules"]) == 3
    await app.state.service.stop()


async def test_two_instances_share_counters_and_rules_on_redis(redis_url: str) -> None:
    """The central deployment: two service instances on one Redis for counters and rules
    (runs once ``stormguard.stores.redis`` is in the tree)."""
    pytest.importorskip("stormguard.stores.redis")
    rules = [{"name": "shared", "scope": "user", "limit": 3, "window": 60,
              "algorithm": "fixed_window"}]
    limiter_url = f"{redis_url}?timeout=1"  # a loaded CI machine: no spurious 50 ms timeouts
    apps = [create_app(AsyncRateLimiter(limiter_url), rules, admin_token=TOKEN,
                       rules_url=redis_url, poll_interval=0.02) for _ in range(2)]
    for app in apps:
        await app.state.service.start()
    try:
        async with _client(apps[0]) as a, _client(apps[1]) as b:
            answers = [await c.post("/v1/check", json={"user": "7"}) for c in (a, b, a, b)]
            assert [r.json()["allowed"] for r in answers] == [True, True, True, False]
            assert answers[3].json()["degraded"] is False
            assert (await b.get("/readyz")).status_code == 200
            r = await a.put("/v1/rules/shared", headers=AUTH,
                            json={"scope": "user", "limit": 5, "window": 60,
                                  "algorithm": "fixed_window"})
            assert r.status_code == 200
            await _within_one_second(
                lambda: apps[1].state.service.source.current.get("shared").limit == 5)
    finally:
        for app in apps:
            await app.state.service.stop()
            await app.state.service.limiter.aclose()


async def test_redis_losing_the_rules_recovers_by_itself(redis_url: str,
                                                         clock: FakeClock) -> None:
    """FLUSHALL (or a Redis restart without persistence) while instances run: the next
    refresh re-seeds Redis from the instance's current rules, version kept, and writes
    work again with or without If-Match (they used to conflict until a restart)."""
    app = create_app(AsyncRateLimiter(MemoryStore(clock=clock)), RULES, admin_token=TOKEN,
                     rules_url=redis_url, poll_interval=0)
    service = app.state.service
    await service.start()
    raw = redis.Redis.from_url(redis_url)
    try:
        async with _client(app) as c:
            r = await c.put("/v1/rules/burst", headers={**AUTH, "If-Match": '"1"'},
                            json=NEW_RULE)
            assert r.status_code == 201
            assert r.headers["etag"] == '"2"'
            raw.flushall()
            r = await c.put("/v1/rules/other", headers=AUTH, json=NEW_RULE)
            assert r.status_code == 201, r.text
            assert r.headers["etag"] == '"3"'
            raw.flushall()
            r = await c.put("/v1/rules/third", headers={**AUTH, "If-Match": '"3"'},
                            json=NEW_RULE)
            assert r.status_code == 201, r.text
            raw.flushall()
            r = await c.put("/v1/rules", headers=AUTH, json={"rules": RULES})
            assert r.status_code == 200, r.text
            raw.flushall()
            await service.source.refresh()  # the poll loop's step: re-seeds at once
        assert int(raw.hget("stormguard:rules", "version") or 0) == 5
        reread = RedisRules(redis_url, poll_interval=0)
        await reread.start()
        assert [r.name for r in reread.current] == [r["name"] for r in RULES]
        await reread.stop()
    finally:
        await service.stop()
        raw.close()


async def test_redis_restore_converges_on_the_newest_rules(redis_url: str) -> None:
    """After a FLUSHALL a stale instance (it missed the last edit) may restore first: the
    up-to-date instance sees an older version than its own and writes its rules back, so
    the newest rules win, never the stale ones."""
    fresh = RedisRules(redis_url, seed=RuleSet.from_data(RULES), poll_interval=0)
    stale = RedisRules(redis_url, poll_interval=0)
    await fresh.start()
    await stale.start()
    raw = redis.Redis.from_url(redis_url)
    try:
        assert stale.current.version == 1
        await fresh.edit(lambda cur, v: cur.without("dry", version=v), None)
        raw.flushall()
        await stale.refresh()  # restores version 1 (it never saw version 2)
        assert int(raw.hget("stormguard:rules", "version") or 0) == 1
        await fresh.refresh()  # Redis went back from 2 to 1: restores version 2
        assert int(raw.hget("stormguard:rules", "version") or 0) == 2
        assert await stale.refresh()
        assert stale.current.version == 2
        assert "dry" not in stale.current
    finally:
        await fresh.stop()
        await stale.stop()
        raw.close()
