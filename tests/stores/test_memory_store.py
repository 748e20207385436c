"""MemoryStore: bounded, idle/expired keys first, len(), URLs."""

from __future__ import annotations

import time

from stormguard import MemoryStore, RateLimiter, Rule
from stormguard.stores.memory import DEFAULT_MAX_KEYS
from stormguard.testing import FakeClock
from tests.core.util import NOON, held


def test_flood_of_distinct_keys_never_exceeds_max_keys_and_an_active_key_survives() -> None:
    # An attacker rotating ids: 1,000,000 distinct keys into a 1,000-key store, while one
    # active user keeps hitting its own limit; its counter must never be evicted (and reset).
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock, max_keys=1000)
    rule = Rule(limit=50, window=3600, algorithm="fixed_window")
    bot = Rule(limit=50, window=3600, algorithm="sliding_window_log")
    hit = store.hit
    active_admitted = 0
    most_held = 0
    for i in range(1_000_000):
        hit(f"ip:{i}", rule)
        if i % 500 == 0:
            active_admitted += hit("active", bot).allowed
            most_held = max(most_held, held(store))
            if i % 5000 == 0:
                clock.advance(0.01)
    assert most_held == 1000
    assert len(store) == 1000
    assert active_admitted == 50  # 2,000 tries: its counter was never evicted and reset
    assert store.evictions == 1_000_000 + 1 - 1000


def test_default_max_keys_bounds_a_flood() -> None:
    assert DEFAULT_MAX_KEYS == MemoryStore().max_keys == 100_000
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock)
    rule = Rule(limit=5, window=60, algorithm="token_bucket")
    hit = store.hit
    t = time.perf_counter()
    for i in range(DEFAULT_MAX_KEYS + 20_000):
        hit(str(i), rule)
    elapsed = time.perf_counter() - t
    assert len(store) == DEFAULT_MAX_KEYS
    assert store.evictions == 20_000
    assert store.peek(str(DEFAULT_MAX_KEYS + 19_999), rule).remaining == 4  # kept
    assert store.peek("0", rule).remaining == 5  # the oldest went first
    assert elapsed < 60  # not a benchmark: catches an O(n) eviction


def test_expired_keys_go_before_live_idle_ones() -> None:
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock, max_keys=10)
    long = Rule(limit=5, window=3600, algorithm="fixed_window")
    short = Rule(limit=5, window=1, algorithm="sliding_window_counter")
    for i in range(5):
        store.hit(f"long:{i}", long)  # oldest: first in line for LRU eviction
    for i in range(5):
        store.hit(f"short:{i}", short)
    clock.advance(5)  # the short keys expire (2 windows); the long ones are idle but live
    for i in range(5):
        store.hit(f"new:{i}", long)
    assert store.evictions == 0
    assert len(store) == 10
    for i in range(5):
        assert store.peek(f"long:{i}", long).remaining == 4  # remembered


def test_len_drops_expired_keys_and_reset_and_clear_remove() -> None:
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock)
    rule = Rule(limit=3, window=10, algorithm="sliding_window_log")
    bucket = Rule(limit=1, window=2, burst=4, algorithm="leaky_bucket")
    store.hit("a", rule)
    store.hit("b", rule)
    store.hit("a", bucket)  # one key per (key, rule)
    assert len(store) == 3
    store.peek("c", rule)
    assert len(store) == 3  # peek stores nothing
    for _ in range(4):
        store.hit("d", bucket)
    store.hit("d", bucket)  # denied: stores nothing new
    assert len(store) == 4
    store.reset("b", rule)
    assert len(store) == 3
    clock.advance(2)  # a's bucket (one unit, drains 0.5/s) is empty after 2 s
    assert len(store) == 2
    clock.advance(6)  # d's bucket (4 units) empties at 8 s
    assert len(store) == 1
    clock.advance(2)  # the log entry leaves at exactly 10 s
    assert len(store) == 0
    store.hit("e", rule)
    store.clear()
    assert len(store) == 0


def test_memory_url_works_with_the_real_clock() -> None:
    limiter = RateLimiter("memory://")
    rule = Rule.parse("1/hour")
    assert limiter.hit("user:42", rule).allowed
    d = limiter.hit("user:42", rule)
    assert not d.allowed
    assert 0 < d.retry_after <= 7200  # limit 1: the previous window weighs until its end
    assert isinstance(limiter.store, MemoryStore)
    assert len(limiter.store) == 1
    clock = FakeClock(start=NOON)
    limiter = RateLimiter("memory://?max_keys=3", clock=clock)
    assert limiter.store.clock is clock
    assert limiter.store.max_keys == 3  # type: ignore[attr-defined]
    for i in range(10):
        limiter.hit(str(i), rule)
    assert len(limiter.store) == 3
    assert repr(limiter).startswith("RateLimiter(MemoryStore(max_keys=3")


def test_an_empty_store_is_truthy() -> None:
    # Regression: __len__ made an empty MemoryStore falsy, so `store or MemoryStore()`
    # silently replaced a configured store (and bool() on other stores raised TypeError).
    store = MemoryStore(max_keys=7)
    assert len(store) == 0
    assert bool(store)
    assert (store or MemoryStore()) is store


def test_random_operations_on_tiny_stores_never_crash_or_overflow() -> None:
    # hit / hit_all / peek / reset on stores of 1..5 keys (constant eviction and sweeping)
    # next to a roomy store: the tiny ones stay bounded, the roomy one matches a
    # store that never evicts.
    import random

    from stormguard import ConfigError
    from tests.core.util import ALGORITHMS

    rng = random.Random(20261130)
    for _ in range(60):
        clock = FakeClock(start=NOON + rng.random() * 100)
        max_keys = rng.choice([1, 2, 3, 5, 1000])
        store = MemoryStore(clock=clock, max_keys=max_keys)
        ref = MemoryStore(clock=clock, max_keys=10**6)
        rules = [Rule(rng.randint(1, 5), rng.choice([0.01, 0.5, 1, 3]), algorithm=a,
                      name=str(i)) for i, a in enumerate(rng.sample(ALGORITHMS, 3))]
        for _ in range(150):
            key = rng.choice("abcd")
            op = rng.random()
            cost = rng.randint(1, 3)
            rule = rng.choice(rules)
            try:
                if op < 0.4:
                    pair = (store.hit(key, rule, cost), ref.hit(key, rule, cost))
                elif op < 0.6:
                    subset = rng.sample(rules, rng.randint(1, 3))
                    pair = (store.hit_all(key, subset, cost), ref.hit_all(key, subset, cost))
                elif op < 0.7:
                    store.reset(key, rule)
                    ref.reset(key, rule)
                    pair = (None, None)
                else:
                    pair = (store.peek(key, rule, cost), ref.peek(key, rule, cost))
            except ConfigError:  # cost above a rule's capacity: raised before any write
                continue
            assert held(store) <= max_keys
            if max_keys == 1000:
                assert pair[0] == pair[1]
            clock.advance(rng.choice([0, 0, 0.001, 0.01, 0.3, 2]))


def test_eviction_order_is_exactly_least_recently_used() -> None:
    # A model LRU next to the store: every hit (allowed or denied) and every hit_all
    # makes its keys the most recent; a hot key hit again and again stays in place only
    # while it is already the most recent one.
    import random
    from collections import OrderedDict

    rng = random.Random(7)
    clock = FakeClock(start=NOON + 1)
    rules = [Rule(10**6, 3600, algorithm="fixed_window", name="a"),
             Rule(10**6, 3600, algorithm="token_bucket", name="b")]
    store = MemoryStore(clock=clock, max_keys=4)
    model: OrderedDict[tuple[str, str], None] = OrderedDict()

    def use(k: tuple[str, str]) -> None:
        if k in model:
            model.move_to_end(k)
        else:
            model[k] = None

    for _ in range(3000):
        key = rng.choice("abcdefg"[: rng.randint(1, 7)])
        op = rng.random()
        if op < 0.6:
            rule = rng.choice(rules)
            store.hit(key, rule)
            use((rule.name, key))
        elif op < 0.9:
            subset = rng.sample(rules, 2)
            store.hit_all(key, subset)
            for r in subset:  # keys already held move first, then new ones are added
                if (r.name, key) in model:
                    use((r.name, key))
            for r in subset:
                model.setdefault((r.name, key))
        else:
            rule = rng.choice(rules)
            store.reset(key, rule)
            model.pop((rule.name, key), None)
        while len(model) > 4:
            model.popitem(last=False)
        names = {r._id: r.name for r in rules}
        assert [(names[i], k) for i, k in store._data] == list(model)


def test_a_long_log_drops_expired_entries_in_bulk_and_stays_small() -> None:
    # 200 live entries, one admission per step: the stored list never grows past twice the
    # live entries (expired ones are cut in bulk, not one memmove per admission).
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock)
    rule = Rule(limit=200, window=2, algorithm="sliding_window_log")
    longest = 0
    for _ in range(5000):
        assert store.hit("k", rule).allowed
        longest = max(longest, len(store._data[(rule._id, "k")][1]))
        clock.advance(0.01)
    assert store.peek("k", rule).remaining == 1  # the oldest of the last 200 just expired
    assert 200 < longest <= 2 * 200 + 1
