"""Thread and asyncio safety of MemoryStore with real threads and many tasks."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from stormguard import AsyncRateLimiter, MemoryStore, RateLimiter, Rule
from stormguard.testing import FakeClock
from tests.core.util import ALGORITHMS, NOON, held

THREADS = 8
HITS = 2_000


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Make the interpreter switch threads every few bytecodes to provoke races."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(work: Callable[[], int]) -> int:
    barrier = threading.Barrier(THREADS)
    counts: list[int] = []
    lock = threading.Lock()

    def target() -> None:
        barrier.wait()
        n = work()
        with lock:
            counts.append(n)

    threads = [threading.Thread(target=target) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(counts) == THREADS
    return sum(counts)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_8_threads_x_2000_hits_admit_exactly_1000(algorithm: str) -> None:
    clock = FakeClock(start=NOON + 1)  # never moves: the count must be exact
    limiter = RateLimiter(MemoryStore(clock=clock))
    rule = Rule(limit=1000, window=60, algorithm=algorithm)

    def work() -> int:
        hit = limiter.hit
        return sum(hit("one-key", rule).allowed for _ in range(HITS))

    assert run_threads(work) == 1000
    assert limiter.peek("one-key", rule).remaining == 0


def test_threads_hit_all_is_atomic_across_rules() -> None:
    clock = FakeClock(start=NOON + 1)
    limiter = RateLimiter(MemoryStore(clock=clock))
    a = Rule(limit=700, window=60, algorithm="sliding_window_log")
    b = Rule(limit=900, window=60, algorithm="token_bucket")

    def work() -> int:
        return sum(limiter.hit_all("k", [a, b]).allowed for _ in range(HITS // 4))

    assert run_threads(work) == 700
    assert limiter.peek("k", b).remaining == 200  # b was charged only for admitted calls


def test_threads_on_many_keys_with_a_small_bounded_store() -> None:
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock, max_keys=50)
    limiter = RateLimiter(store)
    rule = Rule(limit=5, window=60, algorithm="fixed_window")
    hot = Rule(limit=1000, window=60, algorithm="gcra")

    def work() -> int:
        name = threading.current_thread().name
        admitted = 0
        for i in range(HITS // 4):
            limiter.hit(f"{name}:{i % 97}", rule)
            admitted += limiter.hit("hot", hot).allowed
            assert held(store) <= 50
        return admitted

    assert run_threads(work) == 1000  # the hot key is never evicted
    assert len(store) <= 50


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_async_tasks_admit_exactly_the_limit(algorithm: str) -> None:
    clock = FakeClock(start=NOON + 1)
    limiter = AsyncRateLimiter(MemoryStore(clock=clock))
    rule = Rule(limit=1000, window=60, algorithm=algorithm)

    async def task() -> int:
        admitted = 0
        for _ in range(10):
            admitted += (await limiter.hit("k", rule)).allowed
            await asyncio.sleep(0)
        return admitted

    results = await asyncio.gather(*(task() for _ in range(300)))
    assert sum(results) == 1000
    d = await limiter.peek("k", rule)
    assert not d.allowed
    await limiter.reset("k", rule)
    assert (await limiter.hit_all("k", [rule])).remaining == 999


async def test_async_limiter_from_threads_and_tasks_together() -> None:
    clock = FakeClock(start=NOON + 1)
    store = MemoryStore(clock=clock)
    sync = RateLimiter(store)
    limiter = AsyncRateLimiter(store)
    rule = Rule(limit=1000, window=60, algorithm="sliding_window_counter")

    def thread_work() -> int:
        return sum(sync.hit("k", rule).allowed for _ in range(500))

    async def task() -> int:
        n = 0
        for _ in range(5):
            n += (await limiter.hit("k", rule)).allowed
            await asyncio.sleep(0)
        return n

    threads = asyncio.gather(*(asyncio.to_thread(thread_work) for _ in range(2)))
    tasks = asyncio.gather(*(task() for _ in range(200)))
    t_counts, a_counts = await asyncio.gather(threads, tasks)
    assert sum(t_counts) + sum(a_counts) == 1000
