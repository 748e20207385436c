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
    Decision,
    RateLimiter,
    RedisClusterStore,
    RedisStore,
    Rule,
    StorageError,
    deadline,
)
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer, start_cluster

# Long enough that a healthy server answers in time on a loaded 2-core machine; the
# failure tests wait it out at most a few times (before the breaker opens).
TIMEOUT = 0.2
# Scheduling noise on a loaded 2-core machine. Every time bound below stays far under
# what the broken behaviour costs (a hang, one timeout per call, the full timeout).
SLACK = 0.25
RULE = Rule(1000, 60, algorithm="fixed_window")
PROBES = 4  # cool-downs allowed for a recovery probe that a loaded machine slows down
ROUNDS = 3  # rounds allowed for a batch to be served wholly by Redis


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


def recover(store: RedisStore, limiter: RateLimiter, clock: FakeClock) -> None:
    """The server is back: let the cool-down pass and probe, until a probe is answered.

    A probe that a loaded machine slows past the timeout fails and reopens the breaker;
    another cool-down then allows another probe (a few at most). The store and the
    limiter are never rebuilt: the recovery is their own.
    """
    for _ in range(PROBES):
        assert store.breaker.state == "open"
        clock.advance(1.0)
        if not limiter.hit("k", RULE).degraded:
            assert store.breaker.state == "closed"
            return
    pytest.fail(f"no probe reached Redis in {PROBES} cool-downs")


def served(store: RedisStore, limiter: RateLimiter, clock: FakeClock, n: int) -> None:
    """``n`` checks in a row are all served by Redis (not degraded). A check that a loaded
    machine slows past the timeout spoils its round; another round is allowed (after a
    recovery if those timeouts opened the breaker), a few at most."""
    for _ in range(ROUNDS):
        if not any(limiter.hit("k", RULE).degraded for _ in range(n)):
            return
        if store.breaker.state != "closed":
            recover(store, limiter, clock)
    pytest.fail(f"no round of {n} checks was wholly served by Redis in {ROUNDS} rounds")


def make(srv: RedisServer, clock: FakeClock, **kw: object) -> tuple[RedisStore, RateLimiter]:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT, breaker_threshold=5,
                                breaker_cooldown=1.0, **kw)  # type: ignore[arg-type]
    return store, RateLimiter(store, on_error="allow")


@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_outage_and_recovery(srv: RedisServer, clock: FakeClock, failure: str) -> None:
    store, limiter = make(srv, clock)
    served(store, limiter, clock, 10)
    degraded_before = limiter.degraded_count
    srv.stop() if failure == "killed" else srv.pause()
    results = [timed_hit(limiter) for _ in range(5)]
    assert store.breaker.state == "open"  # 5 consecutive failures open it
    trips = store.round_trips
    results += [timed_hit(limiter) for _ in range(195)]
    assert all(degraded for degraded, _ in results)
    # no call waits longer than one timeout (a hung server without one would block)
    assert max(t for _, t in results) < TIMEOUT + SLACK
    # the open breaker answers without touching the network ...
    assert store.round_trips == trips
    assert store.breaker.state == "open"
    # ... so at once: the median is far below any network wait (a preempted call or
    # two on a loaded machine may be slow, but no call waits out the timeout)
    fast = sorted(t for _, t in results[5:])
    assert fast[len(fast) // 2] < 0.001
    assert fast[-1] < TIMEOUT
    assert limiter.degraded_count == degraded_before + 200
    srv.restart() if failure == "killed" else srv.resume()
    assert timed_hit(limiter)[0]  # still open: the cool-down has not passed
    assert store.round_trips == trips
    recover(store, limiter, clock)  # the half-open probe reaches Redis and closes
    served(store, limiter, clock, 20)
    store.close()


def tripped(srv: RedisServer, clock: FakeClock) -> tuple[RedisStore, RateLimiter]:
    """A store whose breaker the killed server has just opened."""
    store, limiter = make(srv, clock)
    srv.stop()
    for _ in range(5):
        assert limiter.hit("k", RULE).degraded
    assert store.breaker.state == "open"
    return store, limiter


def test_probe_failure_reopens(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = tripped(srv, clock)
    clock.advance(1.0)
    assert store.breaker.state == "half_open"
    assert limiter.hit("k", RULE).degraded  # the probe fails
    assert store.breaker.state == "open"
    assert store.breaker.opened == 2  # opened, then reopened by the failed probe
    store.close()


def test_kill_and_restart_under_threaded_load(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    stop = threading.Event()
    errors: list[BaseException] = []
    slowest = [0.0]
    counts = {"redis": 0, "degraded": 0}
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
                counts["degraded" if degraded else "redis"] += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        def wait_for(pred: object, limit: float = 10.0) -> None:
            end = time.monotonic() + limit
            while not pred() and time.monotonic() < end:  # type: ignore[operator]
                time.sleep(0.001)  # real time: threads on a real server (no timing assumed)

        wait_for(lambda: counts["redis"] > 50)
        srv.stop()
        wait_for(lambda: store.breaker.state == "open")
        before = counts["degraded"]
        wait_for(lambda: counts["degraded"] > before + 100)
        srv.restart()
        after = counts["redis"]
        # the cool-down passes (again, if a probe slowed by the load failed and reopened
        # the breaker, a few times at most) and the workers' own calls close it
        for _ in range(PROBES):
            clock.advance(1.0)
            wait_for(lambda: counts["redis"] > after + 50, limit=5.0)
            if counts["redis"] > after + 50:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()  # real threads: waiting for them to finish
    assert errors == []
    assert counts["redis"] > after + 50  # served by Redis again, by the same store
    assert counts["degraded"] > 100
    # a killed server refuses at once and the open breaker answers without the network:
    # no call comes near a hang (4 threads on 2 shared cores: generous slack)
    assert slowest[0] < TIMEOUT + 2 * SLACK
    store.close()


async def _abatch(limiter: AsyncRateLimiter, n: int) -> list[Decision]:
    return list(await asyncio.gather(*[limiter.hit(f"k{i}", RULE) for i in range(n)]))


async def _arecover(store: RedisStore, limiter: AsyncRateLimiter, clock: FakeClock) -> None:
    """As :func:`recover`, on the event loop."""
    for _ in range(PROBES):
        assert store.breaker.state == "open"
        clock.advance(1.0)
        if not (await limiter.hit("k", RULE)).degraded:
            assert store.breaker.state == "closed"
            return
    pytest.fail(f"no probe reached Redis in {PROBES} cool-downs")


async def _aserved(store: RedisStore, limiter: AsyncRateLimiter, clock: FakeClock,
                   n: int) -> None:
    """As :func:`served`, for concurrent batches of ``n`` checks."""
    for _ in range(ROUNDS):
        ds = await _abatch(limiter, n)
        if not any(d.degraded for d in ds):
            assert all(d.allowed for d in ds)
            return
        if store.breaker.state != "closed":
            await _arecover(store, limiter, clock)
    pytest.fail(f"no batch of {n} was wholly served by Redis in {ROUNDS} rounds")


async def test_async_outage_and_recovery(srv: RedisServer, clock: FakeClock) -> None:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT, breaker_cooldown=1.0)
    limiter = AsyncRateLimiter(store, on_error="deny")
    await _aserved(store, limiter, clock, 100)
    srv.pause()
    took = []
    trips = []
    for _ in range(10):
        trips.append(store.round_trips)
        t = time.perf_counter()
        ds = await _abatch(limiter, 50)
        took.append(time.perf_counter() - t)
        assert all(d.degraded and not d.allowed for d in ds)
    # a batch is one round trip: each failed one waits out one timeout, not one per
    # check (50 x TIMEOUT); after 5 the breaker answers at once
    assert max(took) < TIMEOUT + SLACK
    assert store.breaker.state == "open"
    assert max(took[5:]) < TIMEOUT  # no round waits out a timeout any more
    assert trips[5] == trips[9] == store.round_trips  # ... because nothing is sent
    srv.resume()
    assert (await limiter.hit("k", RULE)).degraded  # still open: no cool-down yet
    assert store.round_trips == trips[9]
    await _arecover(store, limiter, clock)  # the same store recovers by itself
    await _aserved(store, limiter, clock, 100)
    await limiter.aclose()


def test_script_error_changes_nothing(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = make(srv, clock)
    good = Rule(5, 60, algorithm="fixed_window", name="good")
    bad = Rule(5, 60, algorithm="sliding_window_log", name="bad")
    assert limiter.hit("u", good).remaining == 4
    srv.client().hset(store.key("u", bad), "x", "y")  # wrong type: the script fails
    for _ in range(10):
        with pytest.raises(StorageError, match="WRONGTYPE"):
            store.hit_all("u", [good, bad])
    assert store.breaker.state == "closed"  # Redis answered: one bad key is not an outage
    d = limiter.hit_all("u", [good, bad])
    assert d.degraded
    assert limiter.peek("u", good).remaining == 4  # nothing was consumed
    store.close()


def test_deadline_clips_the_timeout(srv: RedisServer) -> None:
    store = RedisStore.from_url(srv.url, timeout=0.5)
    assert store.hit("k", RULE).allowed
    with deadline.scope(0.0), pytest.raises(StorageError, match="deadline"):
        store.hit("k", RULE)
    assert store.breaker.snapshot()[1] == 0  # a spent deadline says nothing about Redis
    srv.pause()
    t = time.perf_counter()
    with deadline.scope(0.02), pytest.raises(StorageError):
        store.hit("k", RULE)
    assert time.perf_counter() - t < 0.25  # clipped: well under the 0.5 s timeout
    store.close()


def test_cluster_deadline_clips_the_timeout() -> None:
    cluster = start_cluster(3)  # its own cluster: this test hangs a node
    try:
        store = RedisClusterStore.from_url(cluster.url, timeout=1.0)
        keys = [f"user:{i}" for i in range(40)]
        assert all(store.hit(k, RULE).allowed for k in keys)  # connections, slot map
        hung = cluster.nodes[0]
        on_hung = [k for k in keys if store.node_for(k, RULE) == f"127.0.0.1:{hung.port}"]
        elsewhere = [k for k in keys if k not in on_hung]
        assert len(on_hung) >= 2
        with deadline.scope(0.5):  # the clipped path answers like the normal one
            assert [store.hit(on_hung[0], RULE).remaining for _ in range(2)] == [998, 997]
        hung.pause()
        try:
            t = time.perf_counter()
            with deadline.scope(0.05), pytest.raises(StorageError):
                store.hit(on_hung[0], RULE)
            assert time.perf_counter() - t < 0.5  # clipped: well under the 1 s timeout
            with deadline.scope(0.5):
                assert store.hit(elsewhere[0], RULE).remaining == 998
        finally:
            hung.resume()
        # the connection that timed out was dropped, not reused: this peek reads its own
        # reply (on_hung[1]: 999 left), not the late one of the timed-out hit (996)
        with deadline.scope(0.5):
            assert store.peek(on_hung[1], RULE).remaining == 999
        assert store.peek(on_hung[1], RULE).remaining == 999
        store.close()
    finally:
        cluster.stop()


async def test_cluster_with_one_master_down_degrades_only_its_keys() -> None:
    cluster = start_cluster(3)  # its own cluster: this test kills a node
    try:
        # a generous timeout: on a loaded machine live nodes must not time out here
        store = RedisClusterStore.from_url(cluster.url, timeout=1.0)
        limiter = RateLimiter(store)
        alimiter = AsyncRateLimiter(RedisClusterStore.from_url(cluster.url, timeout=1.0))
        keys = [f"user:{i}" for i in range(60)]
        assert not any(limiter.hit(k, RULE).degraded for k in keys)
        dead = cluster.nodes[1]
        on_dead = {k for k in keys if store.node_for(k, RULE) == f"127.0.0.1:{dead.port}"}
        assert 0 < len(on_dead) < len(keys)
        dead.stop()
        t = time.perf_counter()
        sync = [limiter.hit(k, RULE) for k in keys]
        ds = await asyncio.gather(*[alimiter.hit(k, RULE) for k in keys])
        # a dead node refuses at once: its checks do not wait out the 1 s timeout
        assert time.perf_counter() - t < len(on_dead) / 2
        assert {k for k, d in zip(keys, sync, strict=True) if d.degraded} == on_dead
        assert {k for k, d in zip(keys, ds, strict=True) if d.degraded} == on_dead
        # the dead master's own breaker opened; the cluster's and the others' did not
        assert store.breakers[f"127.0.0.1:{dead.port}"].state == "open"
        assert store.breaker.state == "closed"
        assert all(b.state == "closed" for name, b in store.breakers.items()
                   if name != f"127.0.0.1:{dead.port}")
        trips = store.round_trips
        again = [limiter.hit(k, RULE) for k in keys]  # dead-node keys fail without network
        assert {k for k, d in zip(keys, again, strict=True) if d.degraded} == on_dead
        assert store.round_trips == trips + len(keys) - len(on_dead)
        limiter.close()
        await alimiter.aclose()
    finally:
        cluster.stop()


def test_a_lost_probe_does_not_wedge_the_breaker(srv: RedisServer, clock: FakeClock) -> None:
    store, limiter = tripped(srv, clock)
    srv.restart()
    clock.advance(1.0)
    store.breaker.acquire()  # a probe starts, and its outcome never arrives
    trips = store.round_trips
    assert limiter.hit("k", RULE).degraded  # others still fail fast meanwhile
    assert store.round_trips == trips
    clock.advance(1.0)  # the probe's lease ends: the next check probes and closes
    if limiter.hit("k", RULE).degraded:
        # that probe was sent but a loaded machine slowed it past the timeout (a breaker
        # still wedged would not have sent it); it reopened the breaker: recover as usual
        assert store.round_trips > trips
        recover(store, limiter, clock)
    assert store.breaker.state == "closed"
    store.close()


async def test_async_connection_survives_an_idle_restart(srv: RedisServer,
                                                         clock: FakeClock) -> None:
    store = RedisStore.from_url(srv.url, clock=clock, timeout=TIMEOUT)
    limiter = AsyncRateLimiter(store, on_error="deny")
    assert not (await limiter.hit("k", RULE)).degraded
    srv.stop()
    srv.restart()
    await asyncio.sleep(0)  # one loop iteration: the closed connection is noticed
    assert not (await limiter.hit("k", RULE)).degraded  # a fresh connection, no failure
    assert store.breaker.snapshot()[1] == 0
    srv.stop()
    d = await limiter.hit("k", RULE)
    assert d.degraded
    assert not d.allowed
    srv.restart()
    assert not (await limiter.hit("k", RULE)).degraded  # the breaker is still closed
    await limiter.aclose()
