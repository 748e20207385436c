"""The test infrastructure itself: private servers, never 6379, stopped by PID."""

from __future__ import annotations

import os

import redis
import redis.cluster

from tests.redis_servers import RedisCluster, RedisServer, start_redis


def test_private_server_is_not_6379_and_answers(redis_server: RedisServer) -> None:
    assert redis_server.port != 6379
    assert redis_server.client().ping()


def test_stop_kills_by_pid() -> None:
    server = start_redis()
    pid = server.pid
    server.stop()
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_cluster_has_three_masters_covering_all_slots(redis_cluster: RedisCluster) -> None:
    c = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
    try:
        masters = [n for n in c.get_nodes() if n.server_type == "primary"]
        assert len(masters) == 3
        for i in range(50):
            c.set(f"k{i}", i)
        assert int(c.get("k7") or 0) == 7
    finally:
        c.close()
