"""The service's rules source reaches Redis with the store's connection settings: a
password-protected server or cluster takes control-plane writes (it used to answer every
write with 503 while /readyz said ready: the cluster URL's credentials were dropped)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from stormguard import AsyncRateLimiter
from stormguard.ratelimit.rules import RuleSet
from stormguard.service import create_app
from stormguard.service.sources import RedisRules
from tests.redis_servers import RedisCluster, RedisServer, start_cluster, start_redis
from tests.service.helpers import AUTH, RULES, TOKEN

PASSWORD = "pässwörd-1"  # non-ASCII on purpose: it goes through the URL, percent-encoded
QUOTED = "p%C3%A4ssw%C3%B6rd-1"
NEW_RULE = {"scope": "ip", "limit": 2, "window": "1s"}


def _lock(server: RedisServer) -> None:
    with server.client() as c:
        c.config_set("masterauth", PASSWORD)
        c.config_set("requirepass", PASSWORD)


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    server = start_redis()
    _lock(server)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def locked_cluster() -> Iterator[RedisCluster]:
    cluster = start_cluster(3)  # its own: a password is set on every node
    for node in cluster.nodes:
        _lock(node)
    yield cluster
    cluster.stop()


def _url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("locked_server")
        return f"redis://:{QUOTED}@127.0.0.1:{server.port}/0"
    cluster: RedisCluster = request.getfixturevalue("locked_cluster")
    nodes = ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
    return f"redis+cluster://:{QUOTED}@{nodes}"


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_control_plane_writes_reach_a_password_protected_redis(
        kind: str, request: pytest.FixtureRequest) -> None:
    url = _url(kind, request)
    prefix = f"sg-{kind}"
    limiter_url = f"{url}?timeout=1"  # a loaded CI machine: no spurious 50 ms timeouts
    apps = [create_app(AsyncRateLimiter(limiter_url), RULES, admin_token=TOKEN, rules_url=url,
                       rules_prefix=prefix, poll_interval=0) for _ in range(2)]
    for app in apps:
        await app.state.service.start()
    try:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                     base_url="http://sg") for app in apps]
        a, b = clients
        assert (await a.get("/readyz")).status_code == 200
        r = await a.put("/v1/rules/x", headers=AUTH, json=NEW_RULE)
        assert r.status_code in (200, 201), r.text  # created
        await apps[1].state.service.source.refresh()
        r = await b.get("/v1/rules/x", headers=AUTH)
        assert r.status_code == 200
        assert r.json()["rule"]["limit"] == 2
        r = await a.post("/v1/check", json={"key": "k", "rule": "search"})
        assert r.json()["degraded"] is False  # the store reached the same Redis
        for c in clients:
            await c.aclose()
    finally:
        for app in apps:
            await app.state.service.stop()
            await app.state.service.limiter.aclose()


async def test_rules_source_without_the_password_fails_as_storage_error(
        locked_server: RedisServer) -> None:
    source = RedisRules(f"redis://127.0.0.1:{locked_server.port}/0", seed=RuleSet(),
                        poll_interval=0)
    await source.start()  # serves the seed, logs the failure
    assert source.current.version == 0
    with pytest.raises(Exception, match=r"NOAUTH|rules in Redis"):
        await source.refresh()
    await source.stop()
