"""Rate-limit checks on Redis: stormguard vs a raw EVALSHA loop and the peers.

One run, one private redis-server (started here on a free port, stopped at the end):

* one client (blocking): checks/s, p50 and p99 latency, for a raw redis-py EVALSHA
  loop (the physical limit of one client), stormguard per algorithm, and ``limits``,
  ``throttled-py``, ``pyrate-limiter`` on Redis;
* 64 concurrent asyncio callers on one event loop: checks/s (the peers' asyncio APIs).

Run from the repository root::

    PYTHONPATH=src:. python bench/redis.py [--n 5000] [--async-n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this file is named redis.py: keep its directory off the path so `import redis` is redis-py
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import redis  # noqa: E402 - after the path setup above
import redis.asyncio  # noqa: E402

from stormguard import AsyncRateLimiter, RateLimiter, RedisStore, Rule  # noqa: E402
from stormguard.algorithms import ALGORITHMS  # noqa: E402
from stormguard.stores.redis import SCRIPT  # noqa: E402
from tests.redis_servers import start_redis  # noqa: E402

KEYS = [f"user:{i}" for i in range(1000)]
LIMIT = 1_000_000  # per hour: the benchmark measures the admitted path
CALLERS = 64


def sync_run(fn: Callable[[str], Any], n: int) -> tuple[float, float, float]:
    for i in range(200):
        fn(KEYS[i % 1000])
    lat = []
    pc = time.perf_counter
    t0 = pc()
    for i in range(n):
        t = pc()
        fn(KEYS[i % 1000])
        lat.append(pc() - t)
    total = pc() - t0
    lat.sort()
    return n / total, lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


async def async_run(fn: Callable[[str], Awaitable[Any]], n: int) -> float:
    per = n // CALLERS

    async def caller(c: int) -> None:
        for i in range(per):
            await fn(KEYS[(c * per + i) % 1000])

    await asyncio.gather(*[caller(c) for c in range(CALLERS)])  # warm-up: connections
    t0 = time.perf_counter()
    await asyncio.gather(*[caller(c) for c in range(CALLERS)])
    return per * CALLERS / (time.perf_counter() - t0)


def peers_sync(url: str) -> dict[str, Callable[[str], Any]]:
    out: dict[str, Callable[[str], Any]] = {}
    import limits
    import limits.storage
    import limits.strategies
    storage = limits.storage.RedisStorage(url)
    item = limits.RateLimitItemPerHour(LIMIT)
    for name, cls in (("fixed_window", limits.strategies.FixedWindowRateLimiter),
                      ("moving_window", limits.strategies.MovingWindowRateLimiter),
                      ("sliding_window_counter",
                       limits.strategies.SlidingWindowCounterRateLimiter)):
        lim = cls(storage)
        out[f"limits {name}"] = lambda k, lim=lim: lim.hit(item, k)

    import throttled
    tstore = throttled.RedisStore(server=url)
    for using in ("fixed_window", "sliding_window", "token_bucket", "gcra", "leaking_bucket"):
        th = throttled.Throttled(using=using, quota=throttled.rate_limiter.per_hour(LIMIT),
                                 store=tstore)
        out[f"throttled-py {using}"] = lambda k, th=th: th.limit(k)

    import pyrate_limiter
    client = redis.Redis.from_url(url)
    bucket = pyrate_limiter.RedisBucket.init(
        [pyrate_limiter.Rate(LIMIT, pyrate_limiter.Duration.HOUR)], client, "pyrate-bench")
    plim = pyrate_limiter.Limiter(bucket)
    out["pyrate-limiter redis bucket"] = lambda k: plim.try_acquire(k, blocking=False)
    return out


async def peers_async(url: str) -> dict[str, Callable[[str], Awaitable[Any]]]:
    out: dict[str, Callable[[str], Awaitable[Any]]] = {}
    import limits
    import limits.aio.storage
    import limits.aio.strategies
    storage = limits.aio.storage.RedisStorage("async+" + url, implementation="redispy")
    item = limits.RateLimitItemPerHour(LIMIT)
    for name, cls in (("fixed_window", limits.aio.strategies.FixedWindowRateLimiter),
                      ("moving_window", limits.aio.strategies.MovingWindowRateLimiter),
                      ("sliding_window_counter",
                       limits.aio.strategies.SlidingWindowCounterRateLimiter)):
        lim = cls(storage)
        out[f"limits {name}"] = lambda k, lim=lim: lim.hit(item, k)

    import throttled.asyncio
    tstore = throttled.asyncio.RedisStore(server=url)
    for using in ("fixed_window", "sliding_window", "token_bucket", "gcra", "leaking_bucket"):
        th = throttled.asyncio.Throttled(
            using=using, quota=throttled.rate_limiter.per_hour(LIMIT), store=tstore)
        out[f"throttled-py {using}"] = lambda k, th=th: th.limit(k)

    import pyrate_limiter
    client = redis.asyncio.Redis.from_url(url)
    bucket = await pyrate_limiter.RedisBucket.init(
        [pyrate_limiter.Rate(LIMIT, pyrate_limiter.Duration.HOUR)], client, "pyrate-abench")
    plim = pyrate_limiter.Limiter(bucket)
    out["pyrate-limiter redis bucket"] = lambda k: plim.try_acquire_async(k, blocking=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="checks per one-client row")
    ap.add_argument("--async-n", type=int, default=20_000, help="checks per 64-caller row")
    args = ap.parse_args()
    server = start_redis()
    try:
        run(server.url, args.n, args.async_n)
    finally:
        server.stop()


def run(url: str, n: int, async_n: int) -> None:
    client = redis.Redis.from_url(url)
    sha = client.script_load(SCRIPT)
    rule = Rule(LIMIT, 3600)  # sliding_window_counter
    raw_args = ("", 1, 1, 0, "swc", LIMIT, 3_600_000_000, LIMIT)

    def raw(k: str) -> Any:
        return client.evalsha(sha, 1, k, *raw_args)

    rows: list[tuple[str, float, float, float]] = []
    raw_first = sync_run(raw, n)
    rows.append(("raw redis-py EVALSHA loop", *raw_first))
    sg: dict[str, float] = {}
    for algo in sorted(ALGORITHMS):
        client.flushall()
        lim = RateLimiter(RedisStore.from_url(url))
        r = Rule(LIMIT, 3600, algorithm=algo)
        res = sync_run(lambda k, lim=lim, r=r: lim.hit(k, r), n)
        sg[algo] = res[0]
        rows.append((f"stormguard {algo}", *res))
        lim.close()
    raw_last = sync_run(raw, n)
    rows.append(("raw redis-py EVALSHA loop (again)", *raw_last))
    peer_best = 0.0
    for name, fn in peers_sync(url).items():
        client.flushall()
        res = sync_run(fn, n)
        peer_best = max(peer_best, res[0])
        rows.append((name, *res))

    raw_rate = (raw_first[0] + raw_last[0]) / 2
    print(f"\n### One client, blocking ({n} checks per row, 1000 keys, admitted path)\n")
    print("| implementation | checks/s | p50 µs | p99 µs | vs raw EVALSHA |")
    print("|---|---:|---:|---:|---:|")
    for name, rate, p50, p99 in rows:
        print(f"| {name} | {rate:,.0f} | {p50:.0f} | {p99:.0f} | {rate / raw_rate:.2f} |")
    print(f"\nstormguard (sliding_window_counter) / raw EVALSHA = "
          f"{sg['sliding_window_counter'] / raw_rate:.2f}; "
          f"slowest stormguard algorithm / raw = {min(sg.values()) / raw_rate:.2f}; "
          f"stormguard / fastest peer = {sg['sliding_window_counter'] / peer_best:.2f}x")

    asyncio.run(run_async(url, async_n, rule))


async def run_async(url: str, n: int, rule: Rule) -> None:
    rows: list[tuple[str, float]] = []
    client = redis.asyncio.Redis.from_url(url)
    sha = await client.script_load(SCRIPT)
    raw_args = ("", 1, 1, 0, "swc", LIMIT, 3_600_000_000, LIMIT)
    rows.append(("raw redis.asyncio EVALSHA (no batching)",
                 await async_run(lambda k: client.evalsha(sha, 1, k, *raw_args), n)))
    sg: dict[str, float] = {}
    for algo in sorted(ALGORITHMS):
        await client.flushall()
        lim = AsyncRateLimiter(RedisStore.from_url(url))
        r = Rule(LIMIT, 3600, algorithm=algo)
        sg[algo] = await async_run(lambda k, lim=lim, r=r: lim.hit(k, r), n)
        rows.append((f"stormguard {algo} (batched)", sg[algo]))
        await lim.aclose()
    peer_best = 0.0
    for name, fn in (await peers_async(url)).items():
        await client.flushall()
        rate = await async_run(fn, n)
        peer_best = max(peer_best, rate)
        rows.append((name, rate))
    await client.aclose()
    print(f"\n### {CALLERS} concurrent asyncio callers, one event loop ({n} checks per row)\n")
    print("| implementation | checks/s | vs fastest peer |")
    print("|---|---:|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {rate / peer_best:.2f}x |")
    print(f"\nstormguard slowest algorithm / fastest peer = {min(sg.values()) / peer_best:.2f}x; "
          f"sliding_window_counter / fastest peer = "
          f"{sg['sliding_window_counter'] / peer_best:.2f}x")


if __name__ == "__main__":
    main()
