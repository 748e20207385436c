"""Shared constants and helpers of the core tests."""

from __future__ import annotations

from datetime import UTC, datetime

from stormguard import MemoryStore, RateLimiter, Rule
from stormguard.testing import FakeClock

ALGORITHMS = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "gcra",
    "leaky_bucket",
)
BUCKETS = ("token_bucket", "gcra", "leaky_bucket")

#: 12:00:00.000 UTC on some day: an epoch-aligned minute (and hour) boundary.
NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()


def at(minute: int, second: float = 0.0) -> float:
    """Epoch seconds of 12:<minute>:<second> on that day."""
    return NOON + minute * 60 + second


def limiter_at(when: float = NOON) -> tuple[RateLimiter, FakeClock]:
    clock = FakeClock(start=when)
    return RateLimiter(MemoryStore(clock=clock)), clock


def admitted_exactly_after(limiter: RateLimiter, clock: FakeClock, key: str, rule: Rule,
                           wait: float, cost: int = 1) -> bool:
    """Advance to 1 ms before ``wait``: still denied; then to ``wait``: admitted (consumed)."""
    clock.advance(wait - 0.001)
    if limiter.peek(key, rule, cost).allowed:
        return False
    clock.advance(0.001)
    return limiter.hit(key, rule, cost).allowed


def held(store: MemoryStore) -> int:
    """Entries the store holds, expired ones included (``len(store)`` drops those first)."""
    return len(store._data)


def snapshot(store: MemoryStore) -> dict[object, list[object]]:
    """A copy of every entry's state, to prove that nothing was written."""
    return {k: list(v) for k, v in store._data.items()}
