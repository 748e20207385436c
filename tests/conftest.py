from __future__ import annotations

from collections.abc import Iterator

import pytest

from stormguard import _speedups
from stormguard.testing import FakeClock
from tests.redis_servers import RedisCluster, RedisServer, start_cluster, start_redis


def pytest_report_header() -> str:
    return f"stormguard hot path: {_speedups.STATUS}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_700_000_040.0)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the session (flush it in tests that need it empty)."""
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's private server, flushed before the test."""
    if redis_server.proc.poll() is not None:
        redis_server.restart()
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A private 3-master Redis Cluster for the session."""
    cluster = start_cluster(3)
    yield cluster
    cluster.stop()
