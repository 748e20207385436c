"""RateLimiter / AsyncRateLimiter when the store raises StorageError."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from stormguard import AsyncRateLimiter, Decision, MemoryStore, RateLimiter, Rule, StorageError
from stormguard.stores.base import Store
from stormguard.testing import FakeClock
from tests.core.util import NOON


class FlakyStore(Store):
    """A MemoryStore that raises StorageError while ``down`` is True (a test double)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.inner = MemoryStore(clock=clock)
        self.down = True

    def _check(self) -> None:
        if self.down:
            raise StorageError("connection refused")

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        self._check()
        return self.inner.hit(key, rule, cost)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        self._check()
        return self.inner.peek(key, rule, cost)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        self._check()
        return self.inner.hit_all(key, rules, cost)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self._check()
        self.inner.reset(key, rule)


RULE = Rule(limit=10, window=60, algorithm="fixed_window", name="api")
HOUR = Rule(limit=4, window=3600, algorithm="sliding_window_log", name="hour")


@pytest.fixture
def store() -> FlakyStore:
    return FlakyStore(FakeClock(start=NOON + 1))


def test_allow_fails_open_and_counts(store: FlakyStore) -> None:
    seen: list[tuple[Rule, StorageError]] = []
    limiter = RateLimiter(store, on_degraded=lambda r, e: seen.append((r, e)))
    assert limiter.on_error == "allow"  # the default
    for _ in range(20):
        d = limiter.hit("k", RULE)
        assert (d.allowed, d.degraded, d.limit, d.remaining, d.retry_after, d.rule) == (
            True, True, 10, 10, 0.0, RULE)
    assert limiter.peek("k", RULE).degraded
    assert limiter.hit_all("k", [RULE, HOUR]).allowed
    assert limiter.degraded_count == 22
    assert len(seen) == 22
    assert seen[0][0] is RULE
    assert isinstance(seen[0][1], StorageError)
    store.down = False
    d = limiter.hit("k", RULE)
    assert not d.degraded
    assert d.remaining == 9
    assert limiter.degraded_count == 22


def test_deny_fails_closed_with_retry_after(store: FlakyStore) -> None:
    limiter = RateLimiter(store, on_error="deny", deny_retry_after=5)
    d = limiter.hit("k", RULE)
    assert (d.allowed, d.degraded, d.remaining, d.retry_after) == (False, True, 0, 5.0)
    assert d.headers()["Retry-After"] == "5"
    assert not limiter.peek("k", RULE).allowed
    assert not limiter.hit_all("k", [RULE, HOUR]).allowed
    assert limiter.degraded_count == 3
    assert RateLimiter(store, on_error="deny", deny_retry_after=0).hit(
        "k", RULE).headers()["Retry-After"] == "1"


def test_local_enforces_a_share_of_the_limit_in_process(store: FlakyStore) -> None:
    limiter = RateLimiter(store, on_error="local", local_share=0.5)
    results = [limiter.hit("k", RULE) for _ in range(7)]
    assert [d.allowed for d in results] == [True] * 5 + [False] * 2
    assert all(d.degraded for d in results)
    assert all(d.rule is RULE for d in results)  # reported as the original rule
    assert results[0].limit == 5
    assert limiter.hit("other", RULE).allowed  # per key
    p = limiter.peek("k", HOUR)
    assert p.allowed
    assert p.degraded
    assert limiter.peek("k", HOUR) == p  # peek consumed nothing locally either
    d = limiter.hit_all("k", [HOUR, RULE])
    assert not d.allowed
    assert d.rule is RULE
    assert limiter.peek("k", HOUR).remaining == 2  # hour share 2, untouched by the denial
    assert limiter.degraded_count == 12
    store.down = False
    limiter.reset("k", RULE)  # resets the store and the local fallback
    store.down = True
    assert limiter.hit("k", RULE).allowed


def test_local_keeps_cost_within_the_local_capacity(store: FlakyStore) -> None:
    limiter = RateLimiter(store, on_error="local", local_share=0.2)
    d = limiter.hit("k", RULE, cost=8)  # the local rule only holds 2
    assert d.allowed
    assert d.degraded


def test_reset_failure_raises(store: FlakyStore) -> None:
    limiter = RateLimiter(store)
    with pytest.raises(StorageError):
        limiter.reset("k", RULE)


@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
async def test_async_limiter_degrades_the_same_way(store: FlakyStore, on_error: str) -> None:
    limiter = AsyncRateLimiter(store, on_error=on_error)  # type: ignore[arg-type]
    sync = RateLimiter(FlakyStore(store.clock), on_error=on_error)  # type: ignore[arg-type, arg-type]
    for _ in range(12):
        a = await limiter.hit("k", RULE)
        b = sync.hit("k", RULE)
        assert a == b
        assert a.degraded
    assert await limiter.peek("k", RULE) == sync.peek("k", RULE)
    assert await limiter.hit_all("k", [RULE, HOUR]) == sync.hit_all("k", [RULE, HOUR])
    assert limiter.degraded_count == 14
    store.down = False
    await limiter.reset("k", RULE)
    assert not (await limiter.hit("k", RULE)).degraded
    async with limiter:
        assert await limiter.ping()


def test_storage_errors_never_reach_the_caller_of_hit(store: FlakyStore) -> None:
    for on_error in ("allow", "deny", "local"):
        limiter = RateLimiter(store, on_error=on_error)  # type: ignore[arg-type]
        assert isinstance(limiter.hit("k", RULE), Decision)
        assert isinstance(limiter.peek("k", RULE), Decision)
        assert isinstance(limiter.hit_all("k", [RULE, HOUR]), Decision)


def test_local_fallback_is_exact_under_threads(store: FlakyStore) -> None:
    # Regression: the local store was created lazily without a lock, so threads failing
    # over at the same moment could each charge a store of their own.
    import sys
    import threading

    rule = Rule(limit=1000, window=60, algorithm="gcra")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(5):
            limiter = RateLimiter(store, on_error="local")
            barrier = threading.Barrier(8)
            counts: list[int] = []

            def work(lim: RateLimiter = limiter, bar: threading.Barrier = barrier,
                     out: list[int] = counts) -> None:
                bar.wait()
                out.append(sum(lim.hit("k", rule).allowed for _ in range(250)))

            threads = [threading.Thread(target=work) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert sum(counts) == 1000
            assert limiter.degraded_count == 2000
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
@pytest.mark.parametrize("rules", [[RULE, HOUR], [HOUR, RULE]])
def test_degraded_names_the_rule_and_limit_a_healthy_answer_names(
        store: FlakyStore, on_error: str, rules: list[Rule]) -> None:
    """Issue 17 (8): a degraded answer used to name the first rule (``api``, limit 10)
    where the healthy store names the binding one (``hour``, limit 4)."""
    seen: list[Rule] = []
    limiter = RateLimiter(store, on_error=on_error,  # type: ignore[arg-type]
                          on_degraded=lambda r, e: seen.append(r))
    degraded = limiter.hit_all("k", rules)
    store.down = False
    healthy = limiter.hit_all("fresh", rules)
    assert degraded.degraded
    assert not healthy.degraded
    assert (degraded.rule, degraded.limit) == (healthy.rule, healthy.limit) == (HOUR, 4)
    assert seen == [HOUR]
