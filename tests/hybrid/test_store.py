"""HybridStore on a FakeClock: several stores on their own connections to one backend
stand in for processes (they share nothing but the backend)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from stormguard import ConfigError, HybridStore, MemoryStore, RateLimiter, Rule, stores
from stormguard.observability.events import Event
from stormguard.stores.hybrid import HybridDegraded, HybridSynced
from stormguard.stores.hybrid.sketch import HotKeys
from stormguard.testing import FakeClock

WINDOWS = ("fixed_window", "sliding_window_counter")
BUCKETS = ("token_bucket", "gcra", "leaky_bucket")


def fleet(clock: FakeClock, n: int, backend: MemoryStore | None = None,
          **options: object) -> tuple[MemoryStore, list[HybridStore]]:
    backend = backend if backend is not None else MemoryStore(clock=clock)
    options.setdefault("deny_hold", 0.1)
    return backend, [HybridStore(backend, sync_interval=None, clock=clock, **options)  # type: ignore[arg-type]
                     for _ in range(n)]


def drive(clock: FakeClock, members: list[HybridStore], rule: Rule, *, rate: float,
          seconds: float, weights: list[float] | None = None, key: str = "k",
          sync_every: float = 0.1) -> tuple[list[float], list[float]]:
    """``rate`` checks per second for ``seconds``, process i getting ``weights[i]`` of
    them (deterministic round robin by weight); every store syncs each ``sync_every``.
    Returns the wall times of the admitted and the denied checks."""
    n = len(members)
    weights = weights or [1.0 / n] * n
    credit = [0.0] * n
    admitted: list[float] = []
    denied: list[float] = []
    dt = 1.0 / rate
    steps = round(seconds * rate)
    per_sync = max(1, round(sync_every * rate))
    for i in range(steps):
        for j in range(n):
            credit[j] += weights[j]
        j = max(range(n), key=credit.__getitem__)
        credit[j] -= 1.0
        d = members[j].hit(key, rule)
        (admitted if d.allowed else denied).append(clock.wall())
        clock.advance(dt)
        if i % per_sync == per_sync - 1:
            for m in members:
                m.sync()
    return admitted, denied


def per_window(times: list[float], window: float, start: float, end: float) -> list[int]:
    """Admitted per whole window inside [start, end)."""
    counts = Counter(int(t // window) for t in times)
    first, last = int(start // window) + 1, int(end // window)
    return [counts.get(w, 0) for w in range(first, last)]


@pytest.mark.parametrize("skew", [False, True], ids=["even", "skewed"])
@pytest.mark.parametrize("algorithm", WINDOWS)
def test_windows_admit_the_limit_per_window_at_3x_demand(clock: FakeClock, algorithm: str,
                                                          skew: bool) -> None:
    _, members = fleet(clock, 8)
    rule = Rule(1000, 2, algorithm=algorithm)
    weights = [0.9] + [0.1 / 7] * 7 if skew else None
    start = clock.wall()
    admitted, _ = drive(clock, members, rule, rate=1500, seconds=8.1, weights=weights)
    counts = per_window(admitted, 2, start, clock.wall())
    assert len(counts) >= 3
    for c in counts:
        assert 970 <= c <= 1000, counts  # never above the limit: leases are paid first


@pytest.mark.parametrize("skew", [False, True], ids=["even", "skewed"])
@pytest.mark.parametrize("algorithm", BUCKETS)
def test_buckets_admit_burst_plus_rate_at_3x_demand(clock: FakeClock, algorithm: str,
                                                     skew: bool) -> None:
    _, members = fleet(clock, 8)
    rule = Rule(1000, 2, algorithm=algorithm)  # burst 1000, 500 per second
    weights = [0.9] + [0.1 / 7] * 7 if skew else None
    start = clock.wall()
    admitted, _ = drive(clock, members, rule, rate=1500, seconds=6.0, weights=weights)
    bound = 1000 + 500 * (clock.wall() - start)
    assert 0.97 * bound <= len(admitted) <= bound


@pytest.mark.parametrize("algorithm", WINDOWS + BUCKETS)
def test_users_under_80_percent_are_never_denied(clock: FakeClock, algorithm: str) -> None:
    _, members = fleet(clock, 8)
    rule = Rule(1000, 2, algorithm=algorithm)
    admitted, denied = drive(clock, members, rule, rate=0.8 * 500, seconds=10.0)
    assert denied == []
    assert len(admitted) == 4000
    # and most were decided in memory
    local = sum(m.stats()["local_decisions"] for m in members)
    assert local > 0.8 * len(admitted)


def test_a_direct_check_sees_the_leases_others_hold(clock: FakeClock) -> None:
    backend, (a, b) = fleet(clock, 2)
    rule = Rule(100, 10, algorithm="fixed_window")
    for _ in range(30):
        assert a.hit("k", rule)
    a.sync()  # tops its lease up to its recent demand
    held = backend.peek("k", rule)
    # the backend counter holds everything a admitted and the lease it still holds
    assert held.remaining <= 100 - 30
    # b, checking directly, can never spend what a holds
    got = 0
    while b.hit("k", rule).allowed:
        got += 1
    assert got == held.remaining
    while a.hit("k", rule).allowed:
        got += 1
    assert got + 30 == 100


def test_a_denied_key_costs_one_round_trip_per_hold(clock: FakeClock) -> None:
    _, (a,) = fleet(clock, 1, deny_hold=1.0)
    rule = Rule(10, 60, algorithm="fixed_window")
    while a.hit("bot", rule).allowed:
        pass
    trips = a.stats()["backend_round_trips"]
    for _ in range(1000):
        d = a.hit("bot", rule)
        assert not d.allowed
        assert d.retry_after > 0
    assert a.stats()["backend_round_trips"] == trips  # remembered until retry_after
    assert a.stats()["denials_cached"] >= 1000


def test_sliding_window_log_goes_to_the_backend_every_time(clock: FakeClock) -> None:
    backend, (a, b) = fleet(clock, 2)
    rule = Rule(10, 1, algorithm="sliding_window_log")
    results = [s.hit("k", rule).allowed for s in (a, b) * 8]
    assert results.count(True) == 10
    assert a.stats()["local_decisions"] == b.stats()["local_decisions"] == 0
    # each check asked the backend, but for the denials remembered (exact: until retry_after)
    for s in (a, b):
        assert s.stats()["direct_checks"] + s.stats()["denials_cached"] == 8
        assert s.stats()["direct_checks"] >= 5
    assert backend.peek("k", rule).remaining == 0


def test_hit_all_is_all_or_nothing_across_processes(clock: FakeClock) -> None:
    _, (a, b) = fleet(clock, 2)
    per_second = Rule(5, 1, algorithm="fixed_window")
    per_minute = Rule(8, 60, algorithm="fixed_window")
    admitted = 0
    for i in range(40):
        if (a, b)[i % 2].hit_all("k", [per_second, per_minute]).allowed:
            admitted += 1
        clock.advance(0.1)
    assert admitted == 8  # the minute rule binds; the second rule never overspent


def test_sync_is_one_round_trip_for_many_keys(clock: FakeClock) -> None:
    _, (a,) = fleet(clock, 1)
    a.sync()  # the first round counts the processes: leases follow
    rule = Rule(1000, 10, algorithm="token_bucket")
    for k in range(200):
        for _ in range(5):
            a.hit(f"user:{k}", rule)
    before = a.stats()["backend_round_trips"]
    round_ = a.sync()
    assert round_["keys"] == 200
    assert round_["round_trips"] == 1
    assert a.stats()["backend_round_trips"] == before + 1
    assert a.stats()["keys_synced"] == 200
    assert a.stats()["syncs"] == 2


def test_stats_and_events(clock: FakeClock) -> None:
    seen: list[Event] = []
    _, (a,) = fleet(clock, 1)
    a.sync()
    a.add_listener(seen.append)
    rule = Rule(100, 10, algorithm="gcra")
    a.hit("k", rule)
    a.hit("k", rule)
    a.sync()
    st = a.stats()
    for name in ("local_decisions", "backend_round_trips", "keys_synced", "syncs", "degraded"):
        assert name in st
    assert st["degraded"] is False
    assert [type(e) for e in seen] == [HybridSynced]
    assert seen[0].keys == 1  # type: ignore[attr-defined]
    assert HybridDegraded.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_hot_keys_go_local_cold_keys_go_direct(clock: FakeClock) -> None:
    _, (a,) = fleet(clock, 1, hot_rate=50, hot_period=1.0)
    a.sync()
    rule = Rule(10_000, 60, algorithm="sliding_window_counter")
    # cold: 10 keys at 2 per second each
    for _ in range(20):
        for k in range(10):
            a.hit(f"cold:{k}", rule)
        clock.advance(0.1)
    assert a.stats()["local_decisions"] == 0
    assert a.stats()["direct_checks"] == 200
    # hot: one key at 200 per second turns local within one period
    for i in range(400):
        a.hit("api-key", rule)
        clock.advance(0.005)
        if i % 20 == 19:
            a.sync()
    assert a.stats()["hot_keys"] == 1
    assert a.stats()["local_decisions"] > 150


def test_hot_key_hysteresis() -> None:
    hot = HotKeys(rate=100, period=1.0, size=16)
    t = 0
    for _ in range(150):  # 150 in the first period: hot
        hot.check("k", t)
        t += 6_000
    assert "k" in hot.hot
    t = 1_000_000
    for _ in range(70):  # 70 per second: under the rate, above half of it: stays hot
        hot.check("k", t)
        t += 14_000
    t = 2_000_000
    hot.check("other", t)
    assert "k" in hot.hot
    for _ in range(20):  # 20 per second: under half the rate: cold after the period
        hot.check("k", t)
        t += 45_000
    hot.check("other", 3_000_000)
    assert "k" not in hot.hot


def test_memory_is_bounded_whatever_the_number_of_keys(clock: FakeClock) -> None:
    _, (a,) = fleet(clock, 1, hot_rate=10, sketch_size=64, max_keys=100)
    rule = Rule(5, 1, algorithm="fixed_window")
    for k in range(5000):
        a.hit(f"k{k}", rule)
    assert len(a._hot._counts) <= 64  # type: ignore[union-attr]
    assert len(a._denied) <= 100
    _, (b,) = fleet(clock, 1, max_keys=100)
    for k in range(5000):
        b.hit(f"k{k}", rule)
    assert len(b) <= 100


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError, match="sync_interval"):
        HybridStore("memory://", sync_interval=-1)
    with pytest.raises(ConfigError, match="shards"):
        HybridStore("memory://", shards=0)
    with pytest.raises(ConfigError, match="hot_rate"):
        HybridStore("memory://", hot_rate=-2)
    with pytest.raises(ConfigError, match="backend"):
        HybridStore(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="hot_rate"):
        stores.from_url("hybrid+memory://?hot_rate=fast")
    store = HybridStore("memory://", sync_interval=None)
    with pytest.raises(TypeError, match="key"):
        store.hit(3, Rule.parse("1/s"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="rule"):
        store.hit("k", "1/s")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cost"):
        store.hit("k", Rule.parse("1/s"), 2)


def test_urls() -> None:
    s = stores.from_url("hybrid+memory://?sync_interval=none&hot_rate=5&shards=2&max_keys=9")
    assert isinstance(s, HybridStore)
    assert (s.sync_interval, s.hot_rate, s.shards) == (None, 5.0, 2)
    assert isinstance(s.backend, MemoryStore)
    assert s.max_keys == 9
    limiter = RateLimiter("hybrid+memory://?sync_interval=0.5&max_keys=7")
    assert isinstance(limiter.store, HybridStore)
    assert limiter.store.sync_interval == 0.5
    limiter.store.close()
    with pytest.raises(ConfigError, match="hybrid"):
        HybridStore("hybrid+memory://")


def test_shards_split_the_capacity_and_spill(clock: FakeClock) -> None:
    backend, members = fleet(clock, 4, shards=4)
    rule = Rule(1001, 60, algorithm="fixed_window")
    admitted = 0
    for i in range(3000):
        if members[0 if i % 10 else i % 4].hit("hot", rule).allowed:  # skewed to member 0
            admitted += 1
        if i % 100 == 0:
            for m in members:
                m.sync()
    assert admitted == 1001  # the parts sum to the limit; a spent home shard spills
    parts = [backend.peek(f"hot\x00{i}", members[0]._shard_rule(rule, i)) for i in range(4)]
    assert sum(p.limit for p in parts) == 1001
    assert all(p.remaining == 0 for p in parts)


def test_background_task_syncs_in_virtual_time(clock: FakeClock) -> None:
    backend = MemoryStore(clock=clock)
    store = HybridStore(backend, sync_interval=0.1, clock=clock)
    rule = Rule(1000, 10, algorithm="token_bucket")

    async def main() -> None:
        for _ in range(100):
            await store.ahit("k", rule)
            await asyncio.sleep(0.01)
        await store.aclose()

    clock.run(main())
    assert store._thread is None
    assert 8 <= store.stats()["syncs"] <= 11
    assert store.stats()["local_decisions"] > 80


@pytest.mark.parametrize("rate", [1000, 10_000])
def test_round_trips_follow_the_rounds_not_the_requests(clock: FakeClock, rate: int) -> None:
    """A busy key costs about one round trip per sync round, whatever its request rate."""
    _, (a,) = fleet(clock, 1)
    rule = Rule(10**9, 60, algorithm="token_bucket")
    a.sync()
    admitted, _ = drive(clock, [a], rule, rate=rate, seconds=5.0)
    assert len(admitted) == rate * 5
    per_second = a.stats()["backend_round_trips"] / 5.0
    assert per_second <= 2 / 0.1  # at most about 2 / sync_interval


def test_peek_and_reset(clock: FakeClock) -> None:
    backend, (a, b) = fleet(clock, 2)
    rule = Rule(5, 60, algorithm="fixed_window")
    assert a.peek("k", rule).allowed
    for _ in range(5):
        assert a.hit("k", rule).allowed
    assert not a.peek("k", rule).allowed
    assert not b.peek("k", rule).allowed  # b asks the backend: a took everything
    a.reset("k", rule)
    assert backend.peek("k", rule).remaining == 5
    assert a.hit("k", rule).allowed


def test_async_rate_limiter_over_a_hybrid_store(clock: FakeClock) -> None:
    from stormguard import AsyncRateLimiter

    store = HybridStore(MemoryStore(clock=clock), sync_interval=0.1, clock=clock)
    limiter = AsyncRateLimiter(store)
    rule = Rule(10, 60, algorithm="gcra")

    async def main() -> list[bool]:
        out = []
        for _ in range(15):
            out.append((await limiter.hit("k", rule)).allowed)
            await asyncio.sleep(0.05)
        await store.aclose()
        return out

    results = clock.run(main())
    assert results == [True] * 10 + [False] * 5
    assert store.stats()["syncs"] >= 5


def test_a_sharded_key_peeks_the_same_on_both_apis() -> None:
    """``apeek`` of a sharded key reads every shard, as ``peek`` does (it read the key
    unsharded, where nothing is counted, and answered another limit)."""
    clock = FakeClock()
    rule = Rule(30, 60, algorithm="fixed_window")
    store = HybridStore(MemoryStore(clock=clock), sync_interval=None, shards=3, clock=clock)
    for _ in range(10):
        store.hit("k", rule)
    store.sync()
    other = HybridStore(store.backend, sync_interval=None, shards=3, clock=clock)
    blocking = other.peek("k", rule)
    assert (blocking.allowed, blocking.limit) == (True, 30)
    assert blocking.remaining < 30  # the shards' counts are read
    assert asyncio.run(other.apeek("k", rule))[:3] == blocking[:3]
