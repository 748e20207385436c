"""The cold allowance and the board of exhausted keys: several HybridStores on one backend
on a FakeClock (and on a real Redis), with the bound of docs/hybrid.md as properties; and
the outage share by demand."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import ConfigError, HybridStore, MemoryStore, RedisStore, Rule, stores
from stormguard._core.errors import StorageError
from stormguard.ratelimit.decision import Decision
from stormguard.testing import FakeClock

START = 1_700_000_040.0


def fleet(clock: FakeClock, n: int, allowance: int,
          backend: MemoryStore | None = None) -> tuple[MemoryStore, list[HybridStore]]:
    backend = backend if backend is not None else MemoryStore(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, deny_hold=0.1,
                           cold_allowance=allowance) for _ in range(n)]
    for m in members:
        m.sync()  # each counts itself in
    return backend, members


def test_the_allowance_is_admitted_locally_and_charged_at_the_next_round(
        clock: FakeClock) -> None:
    backend, (a, b) = fleet(clock, 2, allowance=2)
    rule = Rule(10, 1, algorithm="fixed_window")
    trips = a.stats()["backend_round_trips"]
    assert a.hit("u", rule).allowed
    assert a.hit("u", rule).allowed
    assert a.stats()["backend_round_trips"] == trips  # no round trip: the allowance
    assert a.stats()["cold_admitted"] == 2
    assert backend.peek("u", rule).remaining == 10  # not charged yet
    a.hit("u", rule)  # the third in this window: a lease (exact)
    assert a.stats()["backend_round_trips"] == trips + 1
    assert a.stats()["cold_admitted"] == 2
    a.sync()
    # the two owed units are on the backend counter now, with the lease taken
    assert backend.peek("u", rule).remaining <= 10 - 3
    # the other process checks the key exactly: it sees them
    assert b.peek("u", rule).remaining == backend.peek("u", rule).remaining
    # a key this process saw busy (3 checks in a round) is leased from then on, exactly
    clock.advance(1.0)
    assert a.hit("u", rule).allowed
    assert a.stats()["cold_admitted"] == 2
    assert a.hit("v", rule).allowed  # a key it never saw: on the allowance
    assert a.stats()["cold_admitted"] == 3


def test_an_exhausted_key_is_denied_everywhere_after_one_round(clock: FakeClock) -> None:
    _, members = fleet(clock, 4, allowance=1)
    rule = Rule(3, 1, algorithm="fixed_window")
    a, b = members[0], members[1]
    # a exhausts the key: its allowance, then leases
    admitted = sum(a.hit("bot", rule).allowed for _ in range(5))
    # 1 on the allowance (not charged yet), then 3 leased: limit + a
    assert admitted == 3 + 1
    a.sync()  # the forced add and the lease that took the last unit are on the board
    b.sync()  # b reads the board
    assert b.stats()["board_keys"] >= 1
    trips = b.stats()["backend_round_trips"]
    for _ in range(20):
        d = b.hit("bot", rule)
        assert not d.allowed
        assert 0 < d.retry_after <= 1.0
    assert b.stats()["backend_round_trips"] == trips  # denied in memory
    assert b.stats()["cold_admitted"] == 0  # it never spent an allowance on the key
    # the next window: b checks the contended key exactly (no allowance)
    clock.advance(1.0)
    assert b.hit("bot", rule).allowed
    assert b.stats()["cold_admitted"] == 0
    assert b.stats()["backend_round_trips"] == trips + 1


def test_a_spread_over_limit_key_overshoots_by_at_most_a_per_process_and_only_once(
        clock: FakeClock) -> None:
    """A bot at 10x its limit spread over 20 processes: the first window may exceed the
    limit by the allowance of the processes that admitted it before learning; the next
    windows are exact (the key is contended)."""
    n = 20
    _, members = fleet(clock, n, allowance=1)
    rule = Rule(10, 1, algorithm="fixed_window")
    admitted: list[float] = []
    start = clock.wall()
    for i in range(1000):  # 100 per second for 10 s
        m = members[(i * 7) % n]
        if m.hit("bot", rule).allowed:
            admitted.append(clock.wall())
        clock.advance(0.01)
        if i % 10 == 9:
            for p in members:
                p.sync()
    counts = Counter(int(t - start) for t in admitted)
    per_window = [counts.get(w, 0) for w in range(10)]
    assert per_window[0] <= 10 + 1 * n
    assert all(c == 10 for c in per_window[1:]), per_window


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter",
                                       "token_bucket", "gcra", "leaky_bucket"])
def test_users_under_80_percent_are_never_denied_with_the_allowance(
        clock: FakeClock, algorithm: str) -> None:
    _, members = fleet(clock, 8, allowance=1)
    rule = Rule(1000, 2, algorithm=algorithm)
    denied = 0
    for i in range(4000):  # 400 per second, spread over the 8 processes
        denied += not members[i % 8].hit("user", rule).allowed
        clock.advance(0.0025)
        if i % 40 == 39:
            for m in members:
                m.sync()
    assert denied == 0


def test_bad_allowance_options_are_named() -> None:
    with pytest.raises(ConfigError, match="cold_allowance"):
        HybridStore("memory://", sync_interval=None, cold_allowance=-1)
    with pytest.raises(ConfigError, match="cold_allowance"):
        HybridStore("memory://", sync_interval=None, cold_allowance=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="board_size"):
        HybridStore("memory://", sync_interval=None, board_size=0)
    s = stores.from_url("hybrid+memory://?sync_interval=none&cold_allowance=2&board_size=64")
    assert isinstance(s, HybridStore)
    assert (s.cold_allowance, s.board_size) == (2, 64)


# -- the bound, on random traces ------------------------------------------------------
# (store index, cost, seconds to advance, sync this store after)
steps = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3),
                           st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3]),
                           st.booleans()), min_size=1, max_size=300)


def run(algorithm: str, limit: int, window: float, trace: list[tuple[int, int, float, bool]],
        allowance: int, keys: int = 1, native: bool = False
        ) -> tuple[list[tuple[float, int, str]], list[HybridStore]]:
    clock = FakeClock(start=START)
    backend = MemoryStore(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, deny_hold=0.1,
                           cold_allowance=allowance) for _ in range(4)]
    for m in members:
        m._b.native = native  # forced adds answered as the Redis backend's native path
    rule = Rule(limit, window, algorithm=algorithm)
    admitted = []
    for n, (i, cost, dt, sync) in enumerate(trace):
        key = f"k{n % keys}"
        if members[i].hit(key, rule, cost).allowed:
            admitted.append((clock.wall(), cost, key))
        clock.advance(dt)
        if sync:
            members[i].sync()
    return admitted, members


@settings(max_examples=60, deadline=None)
@given(trace=steps, limit=st.integers(3, 40), allowance=st.integers(1, 3),
       keys=st.sampled_from([1, 3]))
def test_fixed_window_admits_at_most_limit_plus_a_per_process_per_window(
        trace: list[tuple[int, int, float, bool]], limit: int, allowance: int,
        keys: int) -> None:
    admitted, _ = run("fixed_window", limit, 1.0, trace, allowance, keys)
    per_window = Counter[tuple[str, int]]()
    for t, cost, key in admitted:
        per_window[key, int(t // 1.0)] += cost
    assert all(v <= limit + allowance * 4 for v in per_window.values()), per_window


@settings(max_examples=60, deadline=None)
@given(trace=steps, limit=st.integers(3, 40), allowance=st.integers(1, 3),
       keys=st.sampled_from([1, 3]))
def test_the_bound_holds_with_native_adds_and_the_board_read_less_often(
        trace: list[tuple[int, int, float, bool]], limit: int, allowance: int,
        keys: int) -> None:
    """The same bound with native forced adds (a key present charged one round later, a
    full window not charged at all) and every process reading the board every 4th round
    (as one does once it has read 256 entries in vain)."""
    from unittest import mock

    from stormguard.stores.hybrid import store as hybrid_store

    with mock.patch.object(hybrid_store, "_BOARD_IDLE", 0):
        admitted, _ = run("fixed_window", limit, 1.0, trace, allowance, keys, native=True)
    per_window = Counter[tuple[str, int]]()
    for t, cost, key in admitted:
        per_window[key, int(t // 1.0)] += cost
    assert all(v <= limit + allowance * 4 for v in per_window.values()), per_window


@settings(max_examples=60, deadline=None)
@given(trace=steps, limit=st.integers(3, 40), allowance=st.integers(1, 3))
def test_sliding_window_estimate_stays_within_limit_plus_two_allowances(
        trace: list[tuple[int, int, float, bool]], limit: int, allowance: int) -> None:
    window = 1.0
    admitted, _ = run("sliding_window_counter", limit, window, trace, allowance)
    per_window = Counter[int]()
    for t, cost, _ in admitted:
        w = int(t // window)
        per_window[w] += cost
        elapsed = (t - w * window) / window
        estimate = per_window[w - 1] * (1 - elapsed) + per_window[w]
        assert estimate <= limit + 2 * allowance * 4 + 1e-6, (t, dict(per_window))


@settings(max_examples=60, deadline=None)
@given(trace=steps, burst=st.integers(3, 40), allowance=st.integers(1, 3),
       algorithm=st.sampled_from(["token_bucket", "gcra", "leaky_bucket"]))
def test_buckets_admit_at_most_burst_plus_rate_plus_a_per_process_per_window(
        trace: list[tuple[int, int, float, bool]], burst: int, allowance: int,
        algorithm: str) -> None:
    window = 2.0
    rate = burst / window
    admitted, _ = run(algorithm, burst, window, trace, allowance)
    total = 0
    for t, cost, _ in admitted:
        total += cost
        windows = int((t - START) // window) + 1  # the allowance windows begun so far
        assert total <= burst + rate * (t - START) + allowance * 4 * (windows + 1) + 1e-6


@settings(max_examples=40, deadline=None)
@given(trace=steps, allowance=st.integers(1, 3))
def test_each_process_spends_at_most_its_allowance_per_window(
        trace: list[tuple[int, int, float, bool]], allowance: int) -> None:
    _, members = run("fixed_window", 10**6, 1.0, trace, allowance)
    windows = int(sum(dt for _, _, dt, _ in trace) // 1.0) + 2
    for m in members:
        assert m.stats()["cold_admitted"] <= allowance * windows


# -- on a real Redis: forced adds on the rate-limit scripts' own state, the board --------
@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter",
                                       "token_bucket", "gcra", "leaky_bucket"])
def test_forced_adds_and_the_board_on_redis(redis_url: str, clock: FakeClock,
                                            algorithm: str) -> None:
    rule = Rule(2, 60, algorithm=algorithm)
    opts = {"sync_interval": None, "clock": clock, "time_source": "client", "timeout": 1.0,
            "cold_allowance": 1}
    a, b, c = (HybridStore(redis_url, **opts) for _ in range(3))  # type: ignore[arg-type]
    direct = RedisStore(redis_url, clock=clock, time_source="client", timeout=1.0)
    try:
        for m in (a, b, c):
            m.sync()
        key = f"cold-{algorithm}"
        for m in (a, b, c):  # one each on the allowances: one past the limit
            assert m.hit(key, rule).allowed
            assert m.stats()["cold_admitted"] == 1
        assert direct.peek(key, rule).remaining == 2  # nothing charged yet
        a.sync()
        assert direct.peek(key, rule).remaining == 1  # a's unit, on the shared counter
        b.sync()  # the last unit: the key goes on the board
        c.sync()  # past the limit: forced all the same
        assert not direct.hit(key, rule).allowed  # a direct check sees the charges
        a.sync()  # a reads the board
        trips = a.stats()["backend_round_trips"]
        d = a.hit(key, rule)
        assert not d.allowed
        assert d.retry_after > 0
        assert a.stats()["backend_round_trips"] == trips  # denied in memory
        assert a.stats()["board_keys"] >= 1
        for m in (b, c):  # their own replies said so
            assert not m.hit(key, rule).allowed
        if algorithm in ("token_bucket", "gcra", "leaky_bucket"):
            # the forced unit is a debt: the bucket frees one unit only after 2 x 30 s
            clock.advance(31.0)
            assert not direct.peek(key, rule).allowed
            clock.advance(30.0)
            assert direct.peek(key, rule).allowed
    finally:
        for m in (a, b, c):
            m.close()
        direct.close()


# -- the outage share: the part of the fleet's demand each process held -------------------
class Flaky(MemoryStore):
    """A memory backend that can be taken down (every call raises, ping answers False)."""

    down = False

    def hit(self, key: object, rule: Rule, cost: object = 1) -> Decision:
        if self.down:
            raise StorageError("down")
        return super().hit(key, rule, cost)

    def peek(self, key: object, rule: Rule, cost: object = 1) -> Decision:
        if self.down:
            raise StorageError("down")
        return super().peek(key, rule, cost)

    def ping(self) -> bool:
        return not self.down


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter"])
def test_during_an_outage_each_process_keeps_its_part_of_the_demand(
        clock: FakeClock, algorithm: str) -> None:
    clock.set_wall((clock.wall() // 2 + 1) * 2)  # the start of a window
    backend = Flaky(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, deny_hold=0.1)
               for _ in range(8)]
    for m in members:
        m.sync()
    rule = Rule(1000, 2, algorithm=algorithm)
    weights = [0.9] + [0.1 / 7] * 7

    def drive(seconds: float) -> list[int]:
        """1500 per second (3x), 90 % to process 0; admitted per process."""
        credit = [0.0] * 8
        admitted = [0] * 8
        for i in range(round(seconds * 1500)):
            for j in range(8):
                credit[j] += weights[j]
            j = max(range(8), key=credit.__getitem__)
            credit[j] -= 1.0
            admitted[j] += members[j].hit("k", rule).allowed
            clock.advance(1 / 1500)
            if i % 150 == 149:
                for m in members:
                    m.sync()
        return admitted

    drive(4.0)  # two windows with the backend up: the parts are learned
    backend.down = True
    during = drive(2.0)  # one whole window without it
    assert all(m.stats()["degraded"] for m in members)
    # the fleet stays near the limit (each part is measured at the process's own last
    # reply of the window, so the parts may sum to a little more than the whole), and the
    # busy process keeps most of it: an equal share would leave it 125 of its 1350
    assert sum(during) <= 1.05 * 1000, during
    assert during[0] >= 0.8 * 1000, during
    assert all(5 <= c <= 50 for c in during[1:]), during


def test_the_allowance_on_the_asyncio_api(clock: FakeClock) -> None:
    import asyncio

    backend = MemoryStore(clock=clock)
    a = HybridStore(backend, sync_interval=0.1, clock=clock, cold_allowance=1)
    b = HybridStore(backend, sync_interval=0.1, clock=clock, cold_allowance=1)
    rule = Rule(3, 60, algorithm="fixed_window")

    async def main() -> list[bool]:
        out = []
        await asyncio.sleep(0.15)  # virtual: both sync tasks have counted themselves in
        for i in range(8):
            out.append((await (a, b)[i % 2].ahit("u", rule)).allowed)
            await asyncio.sleep(0.2)  # virtual: a sync round of each between checks
        await a.aclose()
        await b.aclose()
        return out

    results = clock.run(main())
    # one unit each on the allowance, charged in the next rounds; then leases: 3 in all
    assert results == [True] * 3 + [False] * 5
    assert a.stats()["cold_admitted"] + b.stats()["cold_admitted"] == 2
    assert backend.peek("u", rule).remaining == 0


# -- native forced adds: SET NX GET in the round's pipeline on fixed windows --------------
def test_native_forced_adds_on_redis_share_the_counter(redis_url: str, clock: FakeClock
                                                       ) -> None:
    clock.set_wall(START + 30.0)  # mid-window: far from its edges
    rule = Rule(3, 60, algorithm="fixed_window")
    opts = {"sync_interval": None, "clock": clock, "time_source": "client", "timeout": 1.0,
            "cold_allowance": 1}
    a, b, c = (HybridStore(redis_url, **opts) for _ in range(3))  # type: ignore[arg-type]
    direct = RedisStore(redis_url, clock=clock, time_source="client", timeout=1.0)
    try:
        for m in (a, b, c):
            m.sync()
        for m in (a, b, c):
            assert m.hit("nat", rule).allowed  # one each, on the allowances
        a.sync()  # a new key: created by the native SET with a's unit
        assert (a._b.native_new, a._b.native_present) == (1, 0)
        assert direct.peek("nat", rule).remaining == 2  # the rate-limit script's state
        b.sync()  # present: not charged yet, the reply says 1 used
        assert (b._b.native_new, b._b.native_present) == (0, 1)
        assert direct.peek("nat", rule).remaining == 2
        c.sync()
        assert direct.peek("nat", rule).remaining == 2
        # c's reply: 1 used + c's unit owed = 2 of 3, one left: c still admits... on a lease
        for m in (b, c):
            m.sync()  # the script charges what the native add found present (close to
            # the limit: 1 left after the units, under half of it; the script posts the
            # key those units exhaust in the same round)
        assert (b._b.native_appends, c._b.native_appends) == (0, 0)
        assert (b._b.owe_keys, c._b.owe_keys) == (1, 1)
        assert direct.peek("nat", rule).remaining == 0
        assert not direct.hit("nat", rule).allowed  # a direct check sees every charge
        a.sync()  # the last charge exhausted the key: on the board, a reads it
        trips = a.stats()["backend_round_trips"]
        assert not a.hit("nat", rule).allowed
        assert a.stats()["backend_round_trips"] == trips  # denied in memory
    finally:
        for m in (a, b, c):
            m.close()
        direct.close()


def test_a_native_reply_that_says_the_key_is_exhausted_denies_in_memory(
        redis_url: str, clock: FakeClock) -> None:
    clock.set_wall(START + 30.0)
    rule = Rule(2, 60, algorithm="fixed_window")
    opts = {"sync_interval": None, "clock": clock, "time_source": "client", "timeout": 1.0,
            "cold_allowance": 1}
    a, b = (HybridStore(redis_url, **opts) for _ in range(2))  # type: ignore[arg-type]
    try:
        for m in (a, b):
            m.sync()
            assert m.hit("full", rule).allowed
        a.sync()  # 1 of 2 used
        b.sync()  # present: 1 used + b's unit owed = the limit
        trips = b.stats()["backend_round_trips"]
        d = b.hit("full", rule)
        assert not d.allowed
        assert d.retry_after > 0
        assert b.stats()["backend_round_trips"] == trips
    finally:
        for m in (a, b):
            m.close()


def test_a_native_add_on_a_full_window_is_not_charged_again(redis_url: str,
                                                             clock: FakeClock) -> None:
    """A native add that finds its key's window full already (a key over its limit) needs
    no script run in the next round: the count only grows until the window ends."""
    clock.set_wall(START + 30.0)
    rule = Rule(2, 60, algorithm="fixed_window")
    opts = {"sync_interval": None, "clock": clock, "time_source": "client", "timeout": 1.0,
            "cold_allowance": 1}
    a, b, c = (HybridStore(redis_url, **opts) for _ in range(3))  # type: ignore[arg-type]
    direct = RedisStore(redis_url, clock=clock, time_source="client", timeout=1.0)
    try:
        for m in (a, b, c):
            m.sync()
        assert direct.hit("over", rule, 2).allowed  # the window is full
        assert c.hit("over", rule).allowed  # c admitted it on its allowance before knowing
        scripts = c._b.scripts
        c.sync()  # native: present, full
        assert c._b.native_present == 1
        assert c._b.owe_keys == 0
        trips = c.stats()["backend_round_trips"]
        assert not c.hit("over", rule).allowed  # the reply said full: denied in memory
        assert c.stats()["backend_round_trips"] == trips
        c.sync()  # nothing owed: no forced add in the script
        assert c._b.owe_keys == 0
        assert c._b.scripts - scripts <= 2  # the rounds' peer counts only
        assert not direct.hit("over", rule).allowed
        assert direct.peek("over", rule).remaining == 0
    finally:
        for m in (a, b, c):
            m.close()
        direct.close()


def test_a_native_add_on_a_full_window_on_a_memory_backend(clock: FakeClock) -> None:
    # the simulation's emulation: the same, and a key not full is still charged
    clock.set_wall(START + 0.5)
    backend, (p, q) = fleet(clock, 2, 1)
    for m in (p, q):
        m._b.native = True
    rule = Rule(3, 1, algorithm="fixed_window")
    assert backend.hit("full", rule, 3).allowed
    assert backend.hit("part", rule, 1).allowed
    assert p.hit("full", rule).allowed  # the allowance
    assert p.hit("part", rule).allowed
    p.sync()
    assert p._b.native_present == 2
    p.sync()  # only "part" is charged, by the script (1 left after it: under half)
    assert (p._b.native_appends, p._b.owe_keys) == (0, 1)
    assert backend.peek("part", rule).remaining == 1
    assert not p.hit("full", rule).allowed


def native_fleet(clock: FakeClock, at: float) -> list[HybridStore]:
    """Six processes with an allowance of 1 on one memory backend that answers forced adds
    as the Redis backend's native path (the fleet simulation's emulation), at ``at``."""
    clock.set_wall(at)
    _, members = fleet(clock, 6, 1)
    for m in members:
        m._b.native = True
    return members


def test_native_adds_keep_the_fleet_bound_on_a_memory_backend(clock: FakeClock) -> None:
    # the simulation's emulation of the native path: per window at most limit + a x n
    members = native_fleet(clock, START + 0.5)
    rule = Rule(4, 1, algorithm="fixed_window")
    admitted = Counter[int]()
    for step in range(300):  # 3 s, every process checks the key every 10 ms
        for m in members:
            if m.hit("spread", rule).allowed:
                admitted[int(clock.wall())] += 1
        clock.advance(0.01)
        if step % 10 == 9:
            for m in members:
                m.sync()
    assert sum(m._b.native_new + m._b.native_present for m in members) > 0
    assert all(n <= rule.limit + 1 * len(members) for n in admitted.values())
    assert max(admitted.values()) > rule.limit  # the allowance did admit past the limit


def test_appends_on_a_memory_backend_keep_the_bound_and_post_what_they_exhaust(
        clock: FakeClock) -> None:
    # the emulation of the APPEND charge: a key present with half its limit or more left
    # is charged natively; one an APPEND exhausts is posted by the next round
    members = native_fleet(clock, START + 0.05)
    rule = Rule(6, 1, algorithm="fixed_window")
    admitted = Counter[int]()
    for _ in range(3):  # 3 windows: every process checks the key once a window (cold)
        for m in members:
            if m.hit("cold", rule).allowed:
                admitted[int(clock.wall())] += 1
        for _ in range(10):
            clock.advance(0.1)
            for m in members:
                m.sync()
    assert sum(m._b.native_appends for m in members) > 0
    assert sum(m._b.late_posts for m in members) > 0  # keys APPENDs exhausted, posted
    assert all(n <= rule.limit + 1 * len(members) for n in admitted.values()), admitted
    assert all(n >= rule.limit for n in admitted.values())  # and the limit is reached


def test_a_full_counter_reply_does_not_deny_what_the_process_holds_on_its_lease(
        clock: FakeClock) -> None:
    # sticky: one process takes a key's first unit on its allowance, the next ones on
    # leases (one of them ahead of demand); the round's reply says the counter is full,
    # but the units of the lease were taken already: they are still admitted
    clock.set_wall(START + 30.0)
    backend, (p,) = fleet(clock, 1, 1)
    p._b.native = True
    rule = Rule(5, 60, algorithm="fixed_window")
    for _ in range(3):
        assert p.hit("sticky", rule).allowed
    assert p.stats()["cold_admitted"] == 1
    held = p.stats()["lease_held"]
    assert held >= 1  # the last lease took more than its check
    p.sync()  # the allowance's unit: the key is present, the reply says 4 + 1 of 5
    admitted = sum(p.hit("sticky", rule).allowed for _ in range(held))
    assert admitted == held  # 3 + held <= 5: within the limit, never denied
    assert backend.peek("sticky", rule).remaining >= 0


def test_native_adds_can_be_turned_off(redis_url: str, clock: FakeClock) -> None:
    clock.set_wall(START + 30.0)
    rule = Rule(3, 60, algorithm="fixed_window")
    url = redis_url.replace("redis://", "hybrid+redis://", 1)
    p = stores.from_url(url + "?sync_interval=none&cold_allowance=1&native_adds=false",
                        clock=clock, time_source="client")
    assert isinstance(p, HybridStore)
    assert p.native_adds is False
    direct = RedisStore(redis_url, clock=clock, time_source="client", timeout=1.0)
    try:
        p.sync()
        assert p.hit("off", rule).allowed
        p.sync()  # charged in the script
        assert (p._b.native_new, p._b.native_present) == (0, 0)
        assert direct.peek("off", rule).remaining == 2
    finally:
        p.close()
        direct.close()


def test_bad_native_adds_are_named() -> None:
    with pytest.raises(ConfigError, match="native_adds"):
        HybridStore("memory://", sync_interval=None, native_adds="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="native_adds"):
        stores.from_url("hybrid+memory://?native_adds=maybe")


def test_an_outage_after_direct_checks_and_leases_keeps_the_window_at_the_limit(
        clock: FakeClock) -> None:
    # hot_rate: the key starts on the direct path, turns local (leases), then the
    # backend goes down: what each process admitted both ways counts against its share
    # (once, together: the two were charged one after the other, and the second, past
    # the share, was refused instead of counted, so the window reached 1.4 x the limit)
    clock.set_wall(START + 2.0)  # a window's start (START is a multiple of 2)
    backend = Flaky(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, hot_rate=50)
               for _ in range(8)]
    for m in members:
        m.sync()
    rule = Rule(800, 2, algorithm="fixed_window")
    admitted = Counter[int]()
    for step in range(2000):  # 2.4 checks per ms, even over the 8, for one window
        if step == 300:
            backend.down = True
        for k in range(3 if step % 5 < 2 else 2):
            admitted[0] += members[(step * 3 + k) % 8].hit("outage", rule).allowed
        clock.advance(0.001)
        if step % 100 == 99:
            for m in members:
                m.sync()
    assert sum(m.stats()["direct_checks"] for m in members) > 0  # both paths taken
    assert sum(m.stats()["degraded_decisions"] for m in members) > 0
    # the processes that took more than their share before the outage still spend the
    # leases they hold (taken from the counter already): a little over, never 1.4 x
    assert 0.9 * rule.limit <= admitted[0] <= 1.05 * rule.limit


def test_native_forced_adds_on_server_time(redis_url: str) -> None:
    # the default time source: the window is the server's, from the last script reply
    import time

    rule = Rule(5, 60, algorithm="fixed_window")
    opts = {"sync_interval": None, "timeout": 1.0, "cold_allowance": 1}
    a, b = (HybridStore(redis_url, **opts) for _ in range(2))  # type: ignore[arg-type]
    direct = RedisStore(redis_url, timeout=1.0)
    try:
        into = time.time() % 60  # (loopback: the server's clock is this machine's)
        if not 0.5 < into < 58.0:
            # real time: the server's window is its wall clock; start clear of its edges
            time.sleep((60.5 - into) % 60)
        for m in (a, b):
            m.sync()  # a script reply: the server's clock offset
        assert a.hit("srv", rule).allowed
        assert b.hit("srv", rule).allowed
        a.sync()  # a new key: native
        b.sync()  # present: native, not charged
        b.sync()  # charged by the script in this round
        assert direct.peek("srv", rule).remaining == 3  # both units, once each
        assert a._b.native_new + b._b.native_new == 1
        assert a._b.native_present + b._b.native_present == 1
    finally:
        for m in (a, b):
            m.close()
        direct.close()


def test_hybrid_stores_over_memory_stores_are_freed_without_a_crash() -> None:
    """The board of exhausted keys of a MemoryStore lives on the store, never behind a
    weak reference: the compiled MemoryStore (mypyc) does not clear weak references when
    it is freed, and a WeakKeyDictionary keyed by it crashed the interpreter at garbage
    collection (the compiled test run segfaulted). A child process, so a crash fails this
    test alone; it runs whichever build is installed (CI's first run is the compiled one)."""
    code = textwrap.dedent("""
        import gc
        from stormguard import HybridStore, MemoryStore, Rule
        rule = Rule(2, 1, algorithm="fixed_window")
        for _ in range(200):
            backend = MemoryStore()
            fleet = [HybridStore(backend, sync_interval=None, cold_allowance=1)
                     for _ in range(2)]
            for s in fleet:
                for _ in range(3):
                    s.hit("k", rule)
                s.sync()
            for s in fleet:
                s.close()
            del backend, fleet, s
            gc.collect()
        print("freed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "freed"


def test_keys_waiting_for_a_post_are_bounded(clock: FakeClock) -> None:
    # a process whose rounds never reach a board keeps at most _PENDING_MAX keys to post
    from stormguard.stores.hybrid import backend as hb

    members = native_fleet(clock, START + 0.05)
    b = members[0]._b
    b.posting = True
    rule = Rule(2, 1, algorithm="fixed_window")
    b._pending = [(0, f"x{i}", rule) for i in range(hb._PENDING_MAX)]
    members[0].backend.hit("full", rule)  # 1 of 2 used: the next unit exhausts it
    g = b._one_native("full", rule, 1, hb.FORCED_PRESENT)
    assert g[1] == 0  # exhausted
    assert len(b._pending) == hb._PENDING_MAX
    b._pending = []
    members[0].backend.hit("other", rule)
    b._one_native("other", rule, 1, hb.FORCED_PRESENT)
    assert [k for _, k, _ in b._pending] == ["other"]  # below the cap: it waits
