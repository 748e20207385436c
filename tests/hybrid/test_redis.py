"""HybridStore on real Redis servers and a real 3-master cluster (private processes on
free loopback ports; the Redis runs on the FakeClock's time: ``time_source="client"``)."""

from __future__ import annotations

import time

import pytest

from stormguard import HybridStore, RedisClusterStore, RedisStore, Rule
from stormguard.stores.hybrid import HybridDegraded
from stormguard.stores.redis.protocol import Command
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer, start_redis


def hybrid(url: str, clock: FakeClock, **options: object) -> HybridStore:
    options.setdefault("timeout", 1.0)  # a loaded CI machine: no spurious timeouts
    return HybridStore(url, sync_interval=None, clock=clock, time_source="client",
                       **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter",
                                       "token_bucket", "gcra", "leaky_bucket"])
def test_leases_and_direct_checks_share_one_counter(redis_url: str, clock: FakeClock,
                                                    algorithm: str) -> None:
    rule = Rule(50, 60, algorithm=algorithm)
    a = hybrid(redis_url, clock)
    direct = RedisStore(redis_url, clock=clock, time_source="client", timeout=1.0)
    try:
        got = 0
        for _ in range(20):
            got += a.hit("k", rule).allowed
        a.sync()  # a tops up its lease: the counter holds it
        while direct.hit("k", rule).allowed:
            got += 1
        while a.hit("k", rule).allowed:
            got += 1
        assert got == 50
    finally:
        a.close()
        direct.close()


def test_a_sync_is_one_round_trip_however_many_keys(redis_url: str, clock: FakeClock) -> None:
    a = hybrid(redis_url, clock)
    rule = Rule(1000, 60, algorithm="token_bucket")
    try:
        a.sync()  # the first round counts the processes: leases follow
        for k in range(600):  # more than one script batch (256 leases per EVALSHA)
            for _ in range(3):
                a.hit(f"user:{k}", rule)
        trips = a.stats()["backend_round_trips"]
        round_ = a.sync()
        assert round_["keys"] == 600
        assert round_["failed"] == 0
        assert round_["round_trips"] == 1
        assert a.stats()["backend_round_trips"] == trips + 1
    finally:
        a.close()


def test_cluster_sync_is_one_round_trip_per_master(cluster_url: str, clock: FakeClock) -> None:
    a = hybrid(cluster_url, clock)
    rule = Rule(1000, 60, algorithm="gcra")
    try:
        a.sync()
        for k in range(300):
            for _ in range(3):
                a.hit(f"user:{k}", rule)
        round_ = a.sync()
        assert round_["keys"] == 300
        assert round_["failed"] == 0
        assert round_["round_trips"] == 3
    finally:
        a.close()


def test_shards_spread_one_key_over_the_masters(cluster_url: str, clock: FakeClock) -> None:
    rule = Rule(3000, 60, algorithm="fixed_window")
    members = [hybrid(cluster_url, clock, shards=6) for _ in range(6)]
    direct = RedisClusterStore(cluster_url, clock=clock, time_source="client",
                               timeout=1.0)
    try:
        nodes = {direct.node_for(f"api\x00{i}", members[0]._shard_rule(rule, i))
                 for i in range(6)}
        assert len(nodes) == 3  # six sub-keys on the three masters
        homes = {m._home for m in members}
        got = 0
        for i in range(8000):
            got += members[i % 6].hit("api", rule).allowed
            if i % 500 == 0:
                for m in members:
                    m.sync()
        assert got == 3000  # the parts sum to the limit; spent shards spill to others
        parts = [direct.peek(f"api\x00{i}", members[0]._shard_rule(rule, i)) for i in range(6)]
        assert all(p.remaining == 0 for p in parts)
        assert len(homes) >= 2
    finally:
        for m in members:
            m.close()
        direct.close()


def test_backend_down_then_back(clock: FakeClock) -> None:
    server: RedisServer = start_redis()
    rule = Rule(800, 10, algorithm="fixed_window")
    members = [hybrid(server.url, clock, timeout=0.2) for _ in range(4)]
    events: list[object] = []
    members[0].add_listener(events.append)
    clock.set_wall((clock.wall() // 10 + 1) * 10)  # the start of a window
    for m in members:
        m.sync()
    try:
        for _ in range(20):  # steady traffic, even over the four: each holds a share
            for m in members:
                assert m.hit("k", rule).allowed
            clock.advance(0.01)
        for m in members:
            m.sync()
        used = RedisStore(server.url, clock=clock, time_source="client", timeout=1.0)
        before = 800 - used.peek("k", rule).remaining
        used.close()
        server.stop()  # SIGKILL
        admitted = degraded = 0
        for i in range(4000):
            d = members[i % 4].hit("k", rule)
            admitted += d.allowed
            degraded += d.allowed and d.degraded
            if i % 400 == 0:
                for m in members:
                    m.sync()  # fails: the backend is gone
        assert all(m.stats()["degraded"] for m in members)
        assert degraded > 0
        # every process enforces the share it held (1/4 each): the fleet stays at the limit
        assert 80 + admitted <= 800 + 4
        assert admitted >= 600
        server.restart()
        clock.advance(1.1)  # past the Redis store's breaker cool-down (1 s): it probes again
        for m in members:
            m.sync()
        assert not any(m.stats()["degraded"] for m in members)
        transitions = [e.degraded for e in events if isinstance(e, HybridDegraded)]
        assert transitions == [True, False]
        check = RedisStore(server.url, clock=clock, time_source="client", timeout=1.0)
        try:
            # what was admitted on the outage shares is charged to the (fresh) counter; the
            # leases spent meanwhile were paid on the server before it died
            charged = 800 - check.peek("k", rule).remaining
            assert charged == degraded
            assert before >= 80
        finally:
            check.close()
        assert members[0].hit("k", rule) is not None
    finally:
        for m in members:
            m.close()
        server.stop()


def test_asyncio_api_on_redis(redis_url: str) -> None:
    """The asyncio path on a real server (real time: real sockets): leases asked with
    ``acall``, the sync task on the running loop."""
    import asyncio

    # The store runs on Redis's clock, so its windows turn with the wall's: a run that
    # crossed a turn admits other than 500 by design (the previous window's weight falls,
    # and units leased but unspent are void at the turn: 497 in one CI run, 501 in a
    # loop here). An hour's window, and never the last 10 s of one.
    rule = Rule(500, 3600, algorithm="sliding_window_counter")
    direct = RedisStore(redis_url, timeout=1.0)
    try:
        now = float(direct.transport.call(Command.of("TIME"))[0])
    finally:
        direct.close()
    if 3600 - now % 3600 < 10:
        time.sleep(3600 - now % 3600 + 0.1)  # real time: Redis's clock, the wall's

    async def main() -> dict[str, object]:
        store = HybridStore(redis_url, sync_interval=0.02, timeout=1.0)  # a loaded machine
        try:
            got = 0
            for _ in range(50):
                for _ in range(20):
                    got += (await store.ahit("k", rule)).allowed
                await asyncio.sleep(0.005)  # real time: the sync task runs meanwhile
            assert got == 500
            return store.stats()
        finally:
            await store.aclose()

    stats = asyncio.run(main())
    assert stats["syncs"] >= 1
    assert stats["local_decisions"] > 0
    direct = RedisStore(redis_url, timeout=1.0)
    try:
        assert direct.peek("k", rule).remaining == 0
    finally:
        direct.close()


def test_asyncio_slow_paths_on_redis(redis_url: str) -> None:
    """apeek, ahit_all, areset and aping reach the backend without blocking the loop
    (real time: real sockets)."""
    import asyncio

    per_second = Rule(3, 1, algorithm="fixed_window")
    per_minute = Rule(5, 60, algorithm="fixed_window")

    clock = FakeClock()  # the store's time (windows never turn mid-test); the loop's is real

    async def main() -> None:
        store = HybridStore(redis_url, sync_interval=None, clock=clock, time_source="client",
                            timeout=1.0)
        assert await store.aping()
        assert (await store.apeek("k", per_minute)).allowed
        got = [(await store.ahit_all("k", [per_second, per_minute])).allowed
               for _ in range(4)]
        assert got == [True, True, True, False]
        await store.areset("k", [per_second, per_minute])
        assert (await store.ahit_all("k", [per_second, per_minute])).allowed
        await store.aclose()

    asyncio.run(main())


def test_hybrid_cluster_url(cluster_url: str) -> None:
    from stormguard import RateLimiter

    url = cluster_url.replace("redis+cluster://", "hybrid+redis+cluster://", 1)
    limiter = RateLimiter(url + "?sync_interval=none&shards=3", timeout=1.0)
    store = limiter.store
    try:
        assert isinstance(store, HybridStore)
        assert isinstance(store.backend, RedisClusterStore)
        assert (store.sync_interval, store.shards) == (None, 3)
        rule = Rule(30, 60, algorithm="fixed_window")
        assert limiter.peek("k", rule).remaining == 30  # the sum over the shards
        assert sum(limiter.hit("k", rule).allowed for _ in range(12)) == 12
        assert limiter.peek("k", rule).remaining == 18
        assert sum(limiter.hit("k", rule).allowed for _ in range(40)) == 18
        assert not limiter.peek("k", rule).allowed
    finally:
        store.close()
