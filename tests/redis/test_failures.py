"""Redis down, Redis hung, Redis back: no exception escapes, no check waits long,
the breaker answers fast while open and recovers by itself."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from stormguard import (
    AsyncRateLimiter,
    RateLimiter,
    RedisClusterStore,
    RedisStore,
    Rule,
    StorageError,
    deadline,
)
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer, start_cluster

TIMEOUT = 0.05
SLACK = 0.05  # scheduling noise on a loaded 2-core machine
RULE = Rule(1000, 60, algorithm="fixed_window")


@pytest.fixture
def srv(server: RedisServer) -> Iterator[RedisServer]:
    yield server
    if server.proc.poll() is None:
        server.resume()
    else:
        server.restart()


def timed_hit(limiter: RateLimiter, key: str = "k") -> tuple[bool, float]:
    t = time.perf_counter()
    d = limiter.hit(key, RULE)
    return d.degraded, time.perf_counter() - t


def make(srv: RedisServer, clock: FakeClock, **kw: object) -> tuple[RedisStore, RateLimiter]:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT, breaker_threshold=5,
                                breaker_cooldown=1.0, **kw)  # type: ignore[arg-type]
    return store, RateLimiter(store, on_error="allow")


@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_outage_and_recovery(srv: RedisServer, clock: FakeClock, failure: str) -> None:
    store, limiter = make(srv, clock)
    for _ in range(10):
        assert timed_hit(limiter) == (False, pytest.approx(0, abs=TIMEOUT))
    srv.stop() if failure == "killed" else srv.pause()
    results = [timed_hit(limiter) for _ in range(200)]
    assert all(degraded for degraded, _ in results)
    assert max(t for _, t in results) < TIMEOUT + SLACK
    assert store.breaker.state == "open"
    # after at most 5 failures the breaker answers without touching the network
    fast = sorted(t for _, t in results[5:])
    assert fast[len(fast) // 2] < 0.0002
    assert fast[int(len(fast) * 0.99)] < 0.001
    assert limiter.degraded_count == 200
    srv.restart() if failure == "killed" else srv.resume()
    assert timed_hit(limiter)[0]  # still open: the cool-down has not passed
    clock.advance(1.0)
    degraded, _ = timed_hit(limiter)  # the half-open probe reaches Redis and closes
    assert not degraded
    assert store.breaker.state == "closed"
    assert not any(timed_hit(limiter)[0] for _ in range(20))
    store.close()


def test_probe_failure_reopens(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    srv.stop()
    for _ in range(5):
        limiter.hit("k", RULE)
    assert store.breaker.state == "open"
    clock.advance(1.0)
    assert store.breaker.state == "half_open"
    assert limiter.hit("k", RULE).degraded  # the probe fails
    assert store.breaker.state == "open"
    assert store.breaker.trips == 1
    store.close()


def test_kill_and_restart_under_threaded_load(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    stop = threading.Event()
    errors: list[BaseException] = []
    slowest = [0.0]
    served = {"redis": 0, "degraded": 0}
    lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            try:
                degraded, took = timed_hit(limiter, f"k{threading.get_ident() % 3}")
            except BaseException as exc:  # the test asserts none escape
                errors.append(exc)
                return
            with lock:
                slowest[0] = max(slowest[0], took)
                served["degraded" if degraded else "redis"] += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        def wait_for(pred: object, limit: float = 10.0) -> None:
            end = time.monotonic() + limit
            while not pred() and time.monotonic() < end:  # type: ignore[operator]
                time.sleep(0.001)  # let the workers run; not a timing assumption

        wait_for(lambda: served["redis"] > 50)
        srv.stop()
        wait_for(lambda: store.breaker.state == "open")
        before = served["degraded"]
        wait_for(lambda: served["degraded"] > before + 100)
        srv.restart()
        clock.advance(1.0)
        after = served["redis"]
        wait_for(lambda: served["redis"] > after + 50)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert served["redis"] > 100
    assert served["degraded"] > 100
    assert slowest[0] < TIMEOUT + 0.15  # 4 threads on 2 shared cores: generous slack
    store.close()


async def test_async_outage_and_recovery(srv: RedisServer, clock: FakeClock) -> None:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT, breaker_cooldown=1.0)
    limiter = AsyncRateLimiter(store, on_error="deny")
    ds = await asyncio.gather(*[limiter.hit(f"k{i}", RULE) for i in range(100)])
    assert not any(d.degraded for d in ds)
    srv.pause()
    t = time.perf_counter()
    for _ in range(10):
        ds = await asyncio.gather(*[limiter.hit(f"k{i}", RULE) for i in range(50)])
        assert all(d.degraded and not d.allowed for d in ds)
    assert time.perf_counter() - t < 6 * (TIMEOUT + SLACK)  # the breaker opened early
    srv.resume()
    clock.advance(1.0)
    assert not (await limiter.hit("k", RULE)).degraded
    ds = await asyncio.gather(*[limiter.hit(f"k{i}", RULE) for i in range(100)])
    assert not any(d.degraded for d in ds)
    await limiter.aclose()


def test_script_error_changes_nothing(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    good = Rule(5, 60, algorithm="fixed_window", name="good")
    bad = Rule(5, 60, algorithm="sliding_window_log", name="bad")
    assert limiter.hit("u", good).remaining == 4
    srv.client().hset(store.key("u", bad), "x", "y")  # wrong type: the script fails
    with pytest.raises(StorageError, match="WRONGTYPE"):
        store.hit_all("u", [good, bad])
    d = limiter.hit_all("u", [good, bad])
    assert d.degraded
    assert limiter.peek("u", good).remaining == 4  # nothing was consumed
    store.close()


def test_deadline_clips_the_timeout(srv: RedisServer) -> None:
    store = RedisStore.from_url(srv.url, timeout=0.5)
    assert store.hit("k", RULE).allowed
    with deadline.scope(0.0), pytest.raises(StorageError, match="deadline"):
        store.hit("k", RULE)
    assert store.breaker.failures == 0  # a spent deadline says nothing about Redis
    srv.pause()
    t = time.perf_counter()
    with deadline.scope(0.02), pytest.raises(StorageError):
        store.hit("k", RULE)
    assert time.perf_counter() - t < 0.02 + SLACK
    store.close()


async def test_cluster_with_one_master_down_degrades_only_its_keys() -> None:
    cluster = start_cluster(3)  # its own cluster: this test kills a node
    try:
        store = RedisClusterStore.from_url(cluster.url, timeout=TIMEOUT)
        limiter = RateLimiter(store)
        alimiter = AsyncRateLimiter(RedisClusterStore.from_url(cluster.url, timeout=TIMEOUT))
        keys = [f"user:{i}" for i in range(60)]
        assert not any(limiter.hit(k, RULE).degraded for k in keys)
        dead = cluster.nodes[1]
        on_dead = {k for k in keys
                   if store._sync_client().get_node_from_key(store.key(k, RULE)).port == dead.port}
        assert 0 < len(on_dead) < len(keys)
        dead.stop()
        t = time.perf_counter()
        sync = [limiter.hit(k, RULE) for k in keys]
        ds = await asyncio.gather(*[alimiter.hit(k, RULE) for k in keys])
        assert time.perf_counter() - t < 2 * len(on_dead) * (TIMEOUT + SLACK)
        assert {k for k, d in zip(keys, sync, strict=True) if d.degraded} == on_dead
        assert {k for k, d in zip(keys, ds, strict=True) if d.degraded} == on_dead
        limiter.close()
        await alimiter.aclose()
    finally:
        cluster.stop()


def test_a_lost_probe_does_not_wedge_the_breaker(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    srv.stop()
    for _ in range(5):
        limiter.hit("k", RULE)
    srv.restart()
    clock.advance(1.0)
    store.breaker.before()  # a probe starts, and its outcome never arrives
    assert limiter.hit("k", RULE).degraded  # others still fail fast meanwhile
    clock.advance(1.0)  # the probe's lease ends: the next check probes and closes
    assert not limiter.hit("k", RULE).degraded
    assert store.breaker.state == "closed"
    store.close()


async def test_async_connection_survives_an_idle_restart(srv: RedisServer,
                                                         clock: FakeClock) -> None:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT)
    limiter = AsyncRateLimiter(store, on_error="deny")
    assert not (await limiter.hit("k", RULE)).degraded
    srv.stop()
    srv.restart()
    await asyncio.sleep(0)
    assert not (await limiter.hit("k", RULE)).degraded  # a fresh connection, no failure
    assert store.breaker.failures == 0
    srv.stop()
    d = await limiter.hit("k", RULE)
    assert d.degraded
    assert not d.allowed
    srv.restart()
    assert not (await limiter.hit("k", RULE)).degraded  # the breaker is still closed
    await limiter.aclose()
