from __future__ import annotations

import pytest

from tests.redis_servers import RedisCluster, RedisServer


def flush_cluster(cluster: RedisCluster) -> None:
    for node in cluster.nodes:
        node.client().flushall()


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    flush_cluster(redis_cluster)
    return redis_cluster.url


@pytest.fixture
def server(redis_server: RedisServer, redis_url: str) -> RedisServer:
    """The session's private server, flushed and running."""
    return redis_server
