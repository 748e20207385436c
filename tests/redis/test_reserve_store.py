"""RedisStore.reserve / RedisClusterStore.reserve: the same answers as MemoryStore's, sync
and asyncio, and atomic across processes' worth of connections (real threads, one key)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest

from stormguard import ConfigError, MemoryStore, RedisClusterStore, RedisStore, Rule
from stormguard.testing import FakeClock
from tests.redis_servers import RedisCluster

RULES = [Rule(10, 1.0, "gcra", burst=3), Rule(5, 2.0, "token_bucket", burst=2),
         Rule(4, 1.0, "leaky_bucket", burst=2)]
# (seconds to advance, cost, max_wait, book)
TRACE = [(0, 1, None, True), (0, 1, None, True), (0, 1, None, True), (0, 1, None, True),
         (0, 1, 0.05, True), (0, 1, 0.0, False), (0.25, 2, None, True), (0.01, 1, 1.0, False),
         (3.0, 1, None, True), (0, 1, None, True)]


def _run(store: Any, clock: FakeClock, rule: Rule, *, use_async: bool) -> list[Any]:
    out = []
    loop = asyncio.new_event_loop() if use_async else None
    try:
        for dt, cost, max_wait, book in TRACE:
            clock.advance(dt)
            if loop is not None:
                r = loop.run_until_complete(
                    store.areserve("k", rule, cost, max_wait=max_wait, book=book))
            else:
                r = store.reserve("k", rule, cost, max_wait=max_wait, book=book)
            out.append((r.ok, round(r.wait, 6), round(r.at, 6)))
            # a hit between reservations sees them (the same state)
            out.append(tuple(store.peek("k", rule)[:3]))
    finally:
        if loop is not None:
            loop.run_until_complete(store.aclose())
            loop.close()
    return out


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.algorithm)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_redis_reservations_equal_memory_ones(redis_url: str, rule: Rule,
                                              use_async: bool) -> None:
    mem_clock, redis_clock = FakeClock(), FakeClock()
    expected = _run(MemoryStore(clock=mem_clock), mem_clock, rule, use_async=False)
    store = RedisStore(redis_url, time_source="client", clock=redis_clock, timeout=2)
    assert _run(store, redis_clock, rule, use_async=use_async) == expected
    assert expected[0][0] is True
    assert any(not ok for ok, *_ in expected[::2])


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_cluster_reservations_equal_memory_ones(redis_cluster: RedisCluster,
                                                use_async: bool) -> None:
    rule = RULES[0]
    mem_clock, redis_clock = FakeClock(), FakeClock()
    expected = _run(MemoryStore(clock=mem_clock), mem_clock, rule, use_async=False)
    store = RedisClusterStore(redis_cluster.url, time_source="client", clock=redis_clock,
                              timeout=2, prefix="reserve-cluster")
    store.reset("k", rule)
    try:
        assert _run(store, redis_clock, rule, use_async=use_async) == expected
    finally:
        store.close()


def test_reservations_are_atomic_across_connections(redis_url: str) -> None:
    """16 threads, each with its own store (its own connections, as separate processes
    would have), book 25 slots each on one key at the same client time: every slot is
    distinct and they are exactly one emission interval (0.01 s) apart."""
    rule = Rule(100, 1.0, "gcra", burst=1)
    clock = FakeClock()  # never advanced: every booking is made "at the same instant"
    stores = [RedisStore(redis_url, time_source="client", clock=clock, timeout=5)
              for _ in range(16)]
    slots: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def work(store: RedisStore) -> None:
        start.wait()
        mine = [store.reserve("shared", rule).at for _ in range(25)]
        with lock:
            slots.extend(mine)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    slots.sort()
    assert len(slots) == 400
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(slots)}
    assert gaps == {0.01}
    assert slots[0] == pytest.approx(clock.wall())


def test_server_time_reservation(redis_url: str) -> None:
    store = RedisStore(redis_url, timeout=1.0)
    rule = Rule(10, 1.0, "gcra", burst=1)
    first, second = store.reserve("srv", rule), store.reserve("srv", rule)
    assert first.ok
    assert second.ok
    assert second.at - first.at == pytest.approx(0.1, abs=0.02)  # server time moved a bit
    assert 0.05 < second.wait <= 0.1
    assert not store.reserve("srv", rule, max_wait=0.0)  # not booked: the slot is later
    store.close()


def test_window_algorithms_refuse_reservations_without_a_round_trip(redis_url: str) -> None:
    store = RedisStore(redis_url, timeout=1)
    before = store.round_trips
    with pytest.raises(ConfigError, match="algorithm"):
        store.reserve("k", Rule(5, 1.0, "fixed_window"))
    with pytest.raises(ConfigError, match="max_wait"):
        store.reserve("k", Rule(5, 1.0, "gcra"), max_wait=-1)
    assert store.round_trips == before
    store.close()
