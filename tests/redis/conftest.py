from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stormguard import MemoryStore, RedisClusterStore, RedisStore, Store
from stormguard.testing import FakeClock
from tests.redis_servers import RedisCluster, RedisServer

StoreFactory = Callable[..., Store]


def flush_cluster(cluster: RedisCluster) -> None:
    for node in cluster.nodes:
        node.client().flushall()


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    flush_cluster(redis_cluster)
    return redis_cluster.url


@pytest.fixture(params=["memory", "redis", "cluster"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(kind: str, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """Build stores of the parametrized kind (client time: deterministic with FakeClock)."""
    made: list[Store] = []
    url = ""
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
    elif kind == "cluster":
        url = request.getfixturevalue("cluster_url")

    def make(clock: FakeClock, **options: Any) -> Store:
        store: Store
        if kind == "memory":
            store = MemoryStore(clock=clock)
        elif kind == "redis":
            store = RedisStore.from_url(url, clock=clock, time_source="client", **options)
        else:
            store = RedisClusterStore.from_url(url, clock=clock, time_source="client",
                                               timeout=0.5, **options)
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()


@pytest.fixture
def server(redis_server: RedisServer, redis_url: str) -> RedisServer:
    """The session's private server, flushed and running."""
    return redis_server
