from __future__ import annotations

import pytest

from tests.redis_servers import RedisCluster


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    for node in redis_cluster.nodes:
        node.client().flushall()
    return redis_cluster.url
