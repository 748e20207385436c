"""The space-saving sketch of the most-denied keys: bounded memory, the guarantees of
the algorithm (held on random streams), exact totals under threads."""

from __future__ import annotations

import sys
import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import ConfigError, RateLimiter, Rule
from stormguard.observability import SpaceSaving


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 40), max_size=400))
def test_space_saving_guarantees(capacity: int, stream: list[int]) -> None:
    s = SpaceSaving(capacity)
    truth = Counter(f"k{x}" for x in stream)
    for x in stream:
        s.add(f"k{x}", "r")
    held = {t.key: t for t in s.top(capacity)}
    assert len(held) == min(capacity, len(truth))
    assert s.total == len(stream)
    # the counts of a full sketch add up to the stream's length (an evicted key's count
    # passes to its successor as that one's error)
    assert sum(t.count for t in held.values()) == len(stream)
    for key, t in held.items():
        assert t.count - t.error <= truth[key] <= t.count
    # every key seen more than total/capacity times is held
    for key, n in truth.items():
        if n > len(stream) / capacity:
            assert key in held, (key, n)
    if len(truth) <= capacity:  # room for every key: exact
        assert {k: t.count for k, t in held.items()} == dict(truth)
        assert all(t.error == 0 for t in held.values())


def test_top_orders_by_count_and_records_rules() -> None:
    s = SpaceSaving(10)
    for key, rule, n in [("a", "login", 5), ("b", "search", 9), ("c", "login", 1)]:
        for _ in range(n):
            s.add(key, rule)
    s.add("a", "search")
    assert [(t.key, t.count) for t in s.top(2)] == [("b", 9), ("a", 6)]
    assert s.top(3)[1].rules == ("login", "search")
    assert s.top(3)[1].to_dict() == {"key": "a", "count": 6, "error": 0,
                                     "rules": ["login", "search"]}


def _footprint(s: SpaceSaving) -> int:
    """Bytes the sketch holds: its containers and every key and entry they hold."""
    n = sys.getsizeof(s._counts) + sys.getsizeof(s._rules) + sys.getsizeof(s._heap)
    n += sum(sys.getsizeof(k) + sys.getsizeof(e) for k, e in s._counts.items())
    n += sum(sys.getsizeof(h) for h in s._heap)
    return n


@pytest.mark.slow
def test_memory_is_bounded_with_a_million_distinct_keys() -> None:
    """1,000,000 distinct keys (and three heavy ones among them): the sketch holds its
    capacity, its heap one entry per held key, the heavy keys are on top with their true counts
    inside the error bounds, and what it holds does not grow with the number of keys."""
    s = SpaceSaving(1000)
    largest = 0
    for i in range(1_000_000):
        s.add(f"user:{i}", "r")
        if i % 100 == 0:
            for heavy in ("bot:1", "bot:2", "bot:3"):
                s.add(heavy, "r")
        if i % 25_000 == 0:
            largest = max(largest, _footprint(s))
    assert len(s) == 1000
    assert len(s._heap) == 1000  # one entry per held key
    assert {t.key for t in s.top(3)} == {"bot:1", "bot:2", "bot:3"}
    for t in s.top(3):
        assert t.count - t.error <= 10_000 <= t.count  # each was denied 10,000 times
    # what it holds is bounded by its capacity, not by the keys seen: at most 400 bytes
    # per held key (its entry, its key, its heap entry), sampled all along
    assert largest <= 400 * 1000, largest


def test_threads_lose_nothing() -> None:
    s = SpaceSaving(5)
    start = threading.Barrier(8)

    def work(t: int) -> None:
        start.wait()
        for i in range(5000):
            s.add(f"k{(i + t) % 5}", "r")

    ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert s.total == 40_000
    assert sorted(t.count for t in s.top(5)) == [8000] * 5


def test_threads_evicting_keep_the_invariants() -> None:
    """8 threads, 500 keys through a sketch of 50 (evictions all along): it holds 50 keys
    whose counts add up to every update made."""
    s = SpaceSaving(50)
    start = threading.Barrier(8)

    def work(t: int) -> None:
        start.wait()
        for i in range(3000):
            s.add(f"k{(i * 7 + t) % 500}", "r")

    ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    held = s.top(50)
    assert len(held) == 50
    assert sum(t.count for t in held) == s.total == 24_000
    assert all(0 <= t.error < t.count for t in held)


def test_limiter_keeps_the_most_denied_keys() -> None:
    limiter = RateLimiter("memory://", top_keys=3)
    rule = Rule.parse("1/minute", name="login")
    for key, n in [("abuser", 50), ("noisy", 10), ("user:1", 1), ("user:2", 2)]:
        for _ in range(n):
            limiter.hit(key, rule)
    assert limiter.top is not None
    top = limiter.top.top(2)
    assert [(t.key, t.count, t.rules) for t in top] == [("abuser", 49, ("login",)),
                                                       ("noisy", 9, ("login",))]
    assert RateLimiter("memory://").top is None


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        SpaceSaving(0)
    with pytest.raises(ConfigError, match="n"):
        SpaceSaving(3).top(0)
