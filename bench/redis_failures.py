"""What a caller gets when Redis fails: the figures of docs/redis.md's "Failure behaviour".

Private servers and a private cluster on loopback (stopped at the end), default store
options (timeout 50 ms) unless said. Run from the repository root::

    PYTHONPATH=src:. python bench/redis_failures.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import uvloop  # noqa: E402
from redis.crc import key_slot  # noqa: E402
from tests.redis.test_hardening import ResettingServer, _wait_for_fail  # noqa: E402
from tests.redis_servers import start_cluster, start_redis  # noqa: E402

from stormguard import (  # noqa: E402
    AsyncRateLimiter,
    RateLimiter,
    RedisClusterStore,
    RedisStore,
    Rule,
    StorageError,
)

RULE = Rule(1_000_000, 3600, algorithm="fixed_window")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def reset_under(loop_kind: str) -> str:
    server = ResettingServer()

    async def main() -> str:
        store = RedisStore.from_url(server.url)
        limiter = AsyncRateLimiter(store, on_error="allow")
        first = asyncio.ensure_future(limiter.hit("k0", RULE))
        while not server.got_evalsha.is_set():  # noqa: ASYNC110 - set by the server's thread
            await asyncio.sleep(0.001)
        server.go.set()
        server.reset_done.wait(5)
        time.sleep(0.02)  # noqa: ASYNC251 - the loop must not see the reset yet
        t = time.perf_counter()
        rest = [asyncio.ensure_future(limiter.hit(f"k{i}", RULE)) for i in range(1, 41)]
        _, pending = await asyncio.wait([first, *rest], timeout=5)
        took = time.perf_counter() - t
        degraded = sum(task.result().degraded for task in [first, *rest] if task.done())
        await limiter.aclose()
        return f"{41 - len(pending)}/41 ended ({degraded} degraded) in {ms(took)}"

    factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        out = runner.run(main())
    server.go.set()
    server.close()
    return out


def pool_exhaustion(threads: int) -> str:
    server = start_redis()
    try:
        store = RedisStore.from_url(server.url)  # 64 connections, 50 ms
        limiter = RateLimiter(store, on_error="allow")
        lat: list[float] = []
        degraded = [0]
        lock = threading.Lock()
        barrier = threading.Barrier(threads)

        def worker(i: int) -> None:
            barrier.wait()
            mine = []
            bad = 0
            for j in range(40):
                t = time.perf_counter()
                bad += limiter.hit(f"u{(i * 40 + j) % 500}", RULE).degraded
                mine.append(time.perf_counter() - t)
            with lock:
                lat.extend(mine)
                degraded[0] += bad

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        store.close()
        return (f"{threads} threads x 40: {degraded[0] / len(lat):.2%} degraded, p50 "
                f"{ms(pct(lat, 0.5))}, p99 {ms(pct(lat, 0.99))}, breaker opened "
                f"{store.breaker.opened}x")
    finally:
        server.stop()


def master_killed() -> list[str]:
    cluster = start_cluster(3)
    rows = []
    try:
        store = RedisClusterStore.from_url(cluster.url)
        limiter = RateLimiter(store, on_error="allow")
        keys = [f"user:{i}" for i in range(90)]
        for k in keys:
            limiter.hit(k, RULE)
        dead = cluster.nodes[1]
        per = 16384 // 3
        on_dead = [k for k in keys
                   if min(key_slot(store.key(k, RULE).encode()) // per, 2) == 1]
        healthy = [k for k in keys if k not in on_dead]
        dead.stop()
        first = [timed(lambda k=k: limiter.hit(k, RULE)) for k in on_dead[:5]]
        rest = [timed(lambda k=k: limiter.hit(k, RULE)) for k in on_dead[5:]]
        ok = [timed(lambda k=k: limiter.hit(k, RULE)) for k in healthy]
        rows.append(f"dead master's keys: first 5 (refused) max {ms(max(first))}, then breaker "
                    f"open p50 {ms(pct(rest, 0.5))}; healthy masters (before the cluster "
                    f"notices) p50 {ms(pct(ok, 0.5))}, degraded "
                    f"{sum(limiter.hit(k, RULE).degraded for k in healthy)}/{len(healthy)}")
        _wait_for_fail(cluster, dead)
        lat, bad = [], 0
        for k in healthy * 3:
            t = time.perf_counter()
            bad += limiter.hit(k, RULE).degraded
            lat.append(time.perf_counter() - t)
        rows.append(f"cluster_state:fail (require-full-coverage yes): healthy masters' keys "
                    f"{bad}/{len(lat)} degraded (CLUSTERDOWN), p50 {ms(pct(lat, 0.5))}, max "
                    f"{ms(max(lat))}")
        limiter.close()
    finally:
        cluster.stop()
    return rows


def breaker_and_noscript() -> list[str]:
    server = start_redis()
    try:
        store = RedisStore.from_url(server.url)
        limiter = RateLimiter(store, on_error="allow")
        for _ in range(100):
            limiter.hit("k", RULE)
        warm = [timed(lambda: limiter.hit("k", RULE)) for _ in range(200)]
        noscript = []
        for _ in range(20):
            with server.client() as c:
                c.script_flush()
            noscript.append(timed(lambda: limiter.hit("k", RULE)))
        server.stop()
        for _ in range(5):
            limiter.hit("k", RULE)
        assert store.breaker.state == "open"
        opened = [timed(lambda: limiter.hit("k", RULE)) for _ in range(1000)]
        try:
            store.hit("k", RULE)
        except StorageError as exc:
            kind = type(exc).__name__
        store.close()
        return [f"breaker open: {kind}, p50 {pct(opened, 0.5) * 1e6:.1f} µs, p99 "
                f"{pct(opened, 0.99) * 1e6:.1f} µs (no network)",
                f"NOSCRIPT after SCRIPT FLUSH (sync): p50 {ms(pct(noscript, 0.5))} vs "
                f"{ms(pct(warm, 0.5))} warm (SCRIPT LOAD + the check again)"]
    finally:
        server.stop()


def main() -> None:
    print(f"python {sys.version.split()[0]}; load average {os.getloadavg()[0]:.2f}")
    for kind in ("asyncio", "uvloop"):
        print(f"reset mid-flight ({kind}): {reset_under(kind)}")
    for n in (100, 200):
        print(f"pool exhaustion: {pool_exhaustion(n)}")
    for row in master_killed():
        print(f"master killed: {row}")
    for row in breaker_and_noscript():
        print(row)


if __name__ == "__main__":
    main()
