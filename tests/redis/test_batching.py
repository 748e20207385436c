"""Concurrent awaits on one loop are coalesced into pipelined round trips, with the
decisions of one-by-one checks."""

from __future__ import annotations

import asyncio

import pytest
from redis.crc import key_slot

from stormguard import (
    AsyncRateLimiter,
    MemoryStore,
    RedisClusterStore,
    RedisStore,
    Rule,
    StorageError,
    deadline,
)
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer

RULES = [Rule(7, 60, algorithm=a) for a in sorted(ALGORITHMS)]


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_500_concurrent_callers_batched_with_unbatched_decisions(
        backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url" if backend == "redis" else "cluster_url")
    clock = FakeClock()
    cls: type[RedisStore | RedisClusterStore] = RedisClusterStore if backend == "cluster" \
        else RedisStore
    store = cls.from_url(url, clock=clock, time_source="client", max_connections=2,
                         timeout=1.0)
    limiter = AsyncRateLimiter(store, on_error="deny")
    memory = MemoryStore(clock=FakeClock())
    calls = [(f"user:{i % 13}", RULES[i % len(RULES)], 1 + i % 3) for i in range(500)]
    calls = [(k, r, min(c, r.capacity)) for k, r, c in calls]
    want = [memory.hit(k, r, c) for k, r, c in calls]
    got = await asyncio.gather(*[limiter.hit(k, r, c) for k, r, c in calls])
    assert limiter.degraded_count == 0
    assert got == want
    assert store.round_trips < 10
    # a second wave, mixed with peeks and hit_all, still agrees with one-by-one checks
    before = store.round_trips
    wave = [limiter.peek("user:1", RULES[0]), limiter.hit_all("user:2", RULES[:3]),
            limiter.hit("fresh", RULES[4])]
    got2 = await asyncio.gather(*wave)
    want2 = [memory.peek("user:1", RULES[0]), memory.hit_all("user:2", RULES[:3]),
             memory.hit("fresh", RULES[4])]
    assert got2 == want2
    # one round trip per server: on a cluster, one per master owning these keys' slots
    servers = 1 if backend == "redis" else len({
        store.node_for(k, RULES[0]) for k in ("user:1", "user:2", "fresh")})
    assert store.round_trips == before + servers
    await limiter.aclose()


async def test_many_callers_on_a_busy_connection_go_in_ordered_slices(redis_url: str) -> None:
    """On an open connection, a long queue leaves in slices of EAGER_BATCH during the
    loop iteration (Redis works while the client builds the next slice); the slices
    keep submission order, so decisions equal one-by-one checks."""
    from stormguard.stores.redis import EAGER_BATCH

    clock = FakeClock()
    store = RedisStore.from_url(redis_url, clock=clock, time_source="client", timeout=1.0)
    limiter = AsyncRateLimiter(store, on_error="deny")
    memory = MemoryStore(clock=FakeClock())
    assert (await limiter.hit("warm-up", RULES[0])) == memory.hit("warm-up", RULES[0])
    calls = [(f"user:{i % 5}", RULES[i % len(RULES)], 1 + i % 2) for i in range(300)]
    want = [memory.hit(k, r, c) for k, r, c in calls]
    before = store.round_trips
    got = await asyncio.gather(*[limiter.hit(k, r, c) for k, r, c in calls])
    assert limiter.degraded_count == 0
    assert got == want
    slices = store.round_trips - before
    assert EAGER_BATCH < 300
    assert 300 // EAGER_BATCH <= slices <= 300 // EAGER_BATCH + 2
    await limiter.aclose()


async def test_sequential_awaits_are_one_round_trip_each(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, timeout=1.0)
    await store.ahit("k", RULES[0])  # may load the script (NOSCRIPT -> EVAL)
    start = store.round_trips
    for i in range(5):
        await store.ahit("k", RULES[i])
        assert store.round_trips == start + i + 1
    await store.aclose()


def test_sync_is_one_round_trip_per_check(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, timeout=1.0)
    store.hit("k", RULES[0])  # the first call loads the script (NOSCRIPT -> EVAL)
    start = store.round_trips
    store.hit("k", RULES[1])
    store.peek("k", RULES[2])
    store.hit_all("k", RULES)
    assert store.round_trips == start + 3
    store.close()


async def test_script_cache_flush_is_survived(redis_server: RedisServer,
                                              redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, timeout=1.0)
    rule = RULES[0]  # fixed_window, 7 per minute
    assert (await store.ahit("k", rule)).remaining == 6
    redis_server.client().script_flush()
    ds = await asyncio.gather(*[store.ahit("k", rule) for _ in range(10)])
    assert [d.remaining for d in ds] == [5, 4, 3, 2, 1, 0, 0, 0, 0, 0]
    assert [d.allowed for d in ds] == [True] * 6 + [False] * 4
    # more callers than one slice: every slice meets NOSCRIPT, and is sent again
    redis_server.client().script_flush()
    store.reset("k", rule)
    ds = await asyncio.gather(*[store.ahit("k", rule) for _ in range(50)])
    assert sum(d.allowed for d in ds) == 7
    assert sorted(d.remaining for d in ds if d.allowed) == list(range(7))
    redis_server.client().script_flush()
    store.reset("k", rule)
    assert store.hit("k", rule).remaining == 6
    await store.aclose()


async def test_async_deadline(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, timeout=1.0)
    assert (await store.ahit("k", RULES[0])).allowed
    with deadline.scope(0.0), pytest.raises(StorageError, match="deadline"):
        await store.ahit("k", RULES[0])
    with deadline.scope(0.01):
        assert (await store.ahit("k", RULES[0])).allowed
    await store.aclose()


async def test_cluster_follows_moved_with_a_stale_slot_map(cluster_url: str) -> None:
    """A slot map that points at the wrong master: that master answers MOVED, the check
    goes on to the master it names, and the map is reloaded in the background."""
    store = RedisClusterStore.from_url(cluster_url, timeout=1.0)
    limiter = AsyncRateLimiter(store)
    rule = RULES[0]
    assert (await limiter.hit("moved", rule)).remaining == 6
    transport = store.transport
    router = transport._runner()
    slot = key_slot(store.key("moved", rule).encode())
    assert transport.slots is not None
    right = transport.slots[slot]
    wrong = next(n for n in transport.masters if n != right)
    transport.slots[slot] = wrong
    ds = await asyncio.gather(*[limiter.hit("moved", rule) for _ in range(3)])
    assert [d.remaining for d in ds] == [5, 4, 3]
    assert not any(d.degraded for d in ds)
    if router.refreshing is not None:
        await router.refreshing
    assert transport.slots[slot] == right  # the map was reloaded
    assert (await limiter.hit("moved", rule)).remaining == 2
    await limiter.aclose()


async def test_cluster_follows_ask_during_a_slot_migration() -> None:
    """A slot being migrated: the old master answers ASK for a key it does not hold, and
    the check runs on the new master after ASKING (Redis's migration protocol)."""
    from tests.redis_servers import start_cluster

    cluster = start_cluster(3)  # its own cluster: this test changes slot states
    try:
        store = RedisClusterStore.from_url(cluster.url, timeout=1.0)
        limiter = AsyncRateLimiter(store)
        rule = RULES[0]
        assert (await limiter.hit("warm-up", rule)).allowed
        key = store.key("migrating", rule)
        slot = key_slot(key.encode())
        source = store.node_for("migrating", rule)
        target = next(n for n in store.transport.masters if n != source)
        by_name = {f"127.0.0.1:{n.port}": n for n in cluster.nodes}
        src, dst = by_name[source].client(), by_name[target].client()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING",
                            src.execute_command("CLUSTER", "MYID"))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING",
                            dst.execute_command("CLUSTER", "MYID"))
        d = await limiter.hit("migrating", rule)
        assert (d.allowed, d.remaining, d.degraded) == (True, 6, False)
        # the new master holds the key, the old one does not
        assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        await limiter.aclose()
        store.close()
    finally:
        cluster.stop()
