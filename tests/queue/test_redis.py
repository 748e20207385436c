"""The Redis Streams backend: leases on the server's clock (real time), a cluster, a
server that stops answering, a stream deleted under the worker."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard import DeferredQueue, StorageError
from tests.queue.histories import replay
from tests.redis_servers import RedisCluster, RedisServer, start_redis


def _stream() -> str:
    return f"r-{uuid.uuid4().hex[:10]}"


def test_an_expired_lease_is_claimed_by_another_consumer(redis_url: str) -> None:
    # real time: XAUTOCLAIM measures idleness on the Redis server's clock
    stream = _stream()
    a = DeferredQueue(redis_url, stream=stream, consumer="a")
    b = DeferredQueue(redis_url, stream=stream, consumer="b")
    job = a.defer("send_sms", {"order": 1}, key="sms:1")
    [held] = a.backend.take(1, a.clock.wall(), 0.2, "a")
    assert a.stats() == {"pending": 0, "in_flight": 1, "dead": 0}
    assert b.backend.take(1, b.clock.wall(), 0.2, "b") == []  # leased to a
    seen: list[int] = []

    def record(order: int) -> None:
        seen.append(order)

    t0 = time.monotonic()
    assert b.worker({"send_sms": record}, visibility_timeout=0.2,
                    poll_interval=0.02).drain(timeout=10)
    assert time.monotonic() - t0 >= 0.15
    assert seen == [1]
    assert not a.backend.ack(held)  # a's lease was lost: its answer changes nothing
    assert held.id == job
    assert b.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    # the key was freed with the job
    assert b.defer("send_sms", {"order": 1}, key="sms:1") != job
    a.close()
    b.close()


def test_a_cluster_queue(redis_cluster: RedisCluster) -> None:
    for node in redis_cluster.nodes:
        node.client().flushall()
    q = DeferredQueue(redis_cluster.url, stream="sms")
    ids = [q.defer("send_sms", {"order": i}, key=f"sms:{i % 5}") for i in range(10)]
    assert len(set(ids)) == 5
    seen: list[int] = []

    def send(order: int) -> None:
        if order == 4:
            raise RuntimeError("bad number")
        seen.append(order)

    assert q.worker({"send_sms": send}, max_attempts=2,
                    backoff=lambda n: 0.05).drain(timeout=20)
    assert sorted(seen) == [0, 1, 2, 3]
    [dead] = q.dead()
    assert (dead.payload, dead.attempts, dead.error) == ({"order": 4}, 2,
                                                         "RuntimeError: bad number")
    assert q.retry_dead() == 1
    assert q.stats() == {"pending": 1, "in_flight": 0, "dead": 0}
    q.close()


@pytest.mark.slow
def test_the_worker_rides_out_a_server_that_stops_answering() -> None:
    # real time: a real redis-server frozen with SIGSTOP, and the worker's real timeouts
    server: RedisServer = start_redis()
    try:
        q = DeferredQueue(server.url, stream="sms", timeout=0.2, connect_timeout=0.2)
        for i in range(20):
            q.defer("send_sms", {"order": i})
        seen: list[int] = []
        frozen = threading.Event()

        def send(order: int) -> None:
            seen.append(order)
            if len(seen) == 5 and not frozen.is_set():
                frozen.set()
                server.pause()  # the ack of this job and everything after time out

        worker = q.worker({"send_sms": send}, concurrency=1, visibility_timeout=0.5,
                          poll_interval=0.05)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert frozen.wait(10)
            time.sleep(1.0)  # real time: the worker keeps failing against a frozen server
            assert thread.is_alive()  # it logs and goes on; it does not die
            with pytest.raises(StorageError):
                q.defer("send_sms", {"order": 99})  # and the producer sees a clear error
        finally:
            server.resume()
        give_up = time.monotonic() + 15
        while set(seen) != set(range(20)) and time.monotonic() < give_up:
            time.sleep(0.05)  # real time: waiting for the worker thread
        worker.stop()
        thread.join(10)
        assert set(seen) >= set(range(20))  # nothing lost (the timed-out ack: once more)
        q.close()
    finally:
        server.resume()
        server.stop()


def test_a_stream_deleted_under_the_worker_is_made_again(redis_server: RedisServer,
                                                          redis_url: str) -> None:
    stream = _stream()
    q = DeferredQueue(redis_url, stream=stream)
    q.defer("t", {})
    redis_server.client().delete("{" + stream + "}:jobs")
    assert q.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    q.defer("t", {"n": 1})
    seen: list[int] = []

    def record(n: int) -> None:
        seen.append(n)

    assert q.worker({"t": record}).drain(timeout=10)
    assert seen == [1]
    q.close()


def test_bad_redis_options(redis_url: str) -> None:
    from stormguard import ConfigError

    with pytest.raises(ConfigError, match="stream: must not contain"):
        DeferredQueue(redis_url, stream="a{b}")
    with pytest.raises(ConfigError, match="stream: must not be empty"):
        DeferredQueue(redis_url, stream="")


def test_leases_that_end_unanswered_are_counted(redis_url: str) -> None:
    # real time: XAUTOCLAIM measures idleness on the Redis server's clock
    q = DeferredQueue(redis_url, stream=_stream())
    job = q.defer("send_sms", {"order": 1})
    lost = []
    for _ in range(3):
        [held] = q.backend.take(1, q.clock.wall(), 0.05, "doomed")
        lost.append(held.lost)
        time.sleep(0.08)  # real time: let the lease end on the server's clock
    assert lost == [0, 1, 2]
    seen: list[int] = []

    def record(order: int) -> None:
        seen.append(order)

    assert q.worker({"send_sms": record}, max_attempts=3, visibility_timeout=0.05,
                    poll_interval=0.02).drain(timeout=10)
    assert seen == []
    [dead] = q.dead()
    assert dead.id == job
    assert dead.error.startswith("lost 3 times")
    assert q.retry_dead() == 1  # a fresh start: no lost leases counted any more
    [again] = q.backend.take(1, q.clock.wall(), 30.0, "w")
    assert again.lost == 0
    q.close()


# the histories of test_sqlite.py with leases that outlast them (Redis ends leases on its
# own clock; every other time, the retries', is the queue's clock), and takes of every job
# due: the stream hands out jobs in the order they entered it (a retried or handed-back
# job re-enters at the end), SQLite and memory in the order they became due, so only a
# take of everything due has one answer
HISTORIES = st.lists(st.one_of(
    st.tuples(st.just("defer"), st.sampled_from([None, "a", "b", "c"])),
    st.tuples(st.just("take"), st.just(100)),
    st.tuples(st.sampled_from(["ack", "fail", "release", "bury"]), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 3.0])),
    st.tuples(st.just("retry_dead"), st.none()),
), max_size=30)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(HISTORIES)
def test_redis_answers_as_the_memory_backend(redis_server: RedisServer,
                                             ops: list[tuple[str, Any]]) -> None:
    if redis_server.proc.poll() is not None:
        redis_server.restart()
    redis = replay(redis_server.url, ops, lease=3600.0, stream=_stream())
    assert redis == replay("memory://", ops, lease=3600.0), ops


def test_unknown_redis_options_are_named(redis_url: str) -> None:
    from stormguard import ConfigError

    with pytest.raises(ConfigError, match="bogus_option"):
        DeferredQueue(redis_url, stream="x", bogus_option=1)
    with pytest.raises(ConfigError, match="timeout: must be > 0"):
        DeferredQueue(redis_url, stream="x", timeout=-1)
    with pytest.raises(ConfigError, match="connect_timeout: must be"):
        DeferredQueue(redis_url, stream="x", connect_timeout="soon")
