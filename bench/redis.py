"""Rate-limit checks on Redis: stormguard vs a raw EVALSHA loop and the peers.

One run, one private redis-server (started here on a free port, stopped at the end):

* one client (blocking): checks/s, p50 and p99 latency, for a raw redis-py EVALSHA
  loop (the physical limit of one client), stormguard per algorithm, and ``limits``,
  ``throttled-py``, ``pyrate-limiter`` on Redis;
* 64 concurrent asyncio callers on one event loop: checks/s (the peers' asyncio APIs);
* with ``--cluster``: 64 asyncio callers on a private 3-master Redis Cluster.

Run from the repository root::

    PYTHONPATH=src:. python bench/redis.py [--n 5000] [--async-n 20000] [--cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
from tests.redis_servers import start_cluster, start_redis  # noqa: E402

from stormguard import (  # noqa: E402
    AsyncRateLimiter,
    RateLimiter,
    RedisClusterStore,
    RedisStore,
    Rule,
)
from stormguard.ratelimit.algorithms import ALGORITHMS  # noqa: E402
from stormguard.stores.redis import SCRIPT  # noqa: E402

KEYS = [f"user:{i}" for i in range(1000)]
LIMIT = 1_000_000  # per hour: the benchmark measures the admitted path
CALLERS = 64


def sync_rows(impls: dict[str, Callable[[str], Any]], n: int,
              rounds: int = 5) -> dict[str, tuple[float, float, float]]:
    """Round-robin over the implementations (``rounds`` slices of ``n / rounds`` calls
    each), so load from other processes on the machine hits every row alike."""
    pc = time.perf_counter
    lat: dict[str, list[float]] = {name: [] for name in impls}
    spent = dict.fromkeys(impls, 0.0)
    keys = {name: [f"{j}/{k}" for k in KEYS] for j, name in enumerate(impls)}  # no sharing
    for name, fn in impls.items():
        for i in range(200):
            fn(keys[name][i % 1000])
    per = n // rounds
    for r in range(rounds):
        for name, fn in impls.items():
            out = lat[name]
            ks = keys[name]
            t0 = pc()
            for i in range(r * per, (r + 1) * per):
                t = pc()
                fn(ks[i % 1000])
                out.append(pc() - t)
            spent[name] += pc() - t0
    res = {}
    for name, ls in lat.items():
        ls.sort()
        res[name] = (len(ls) / spent[name], ls[len(ls) // 2] * 1e6, ls[int(len(ls) * 0.99)] * 1e6)
    return res


async def async_rows(impls: dict[str, Callable[[str], Awaitable[Any]]], n: int,
                     rounds: int = 3) -> dict[str, float]:
    per = n // CALLERS // rounds

    keys = {name: [f"a{j}/{k}" for k in KEYS] for j, name in enumerate(impls)}

    async def caller(fn: Callable[[str], Awaitable[Any]], ks: list[str], c: int,
                     k: int) -> None:
        for i in range(k):
            await fn(ks[(c * k + i) % 1000])

    for name, fn in impls.items():  # warm-up: connections, scripts
        await asyncio.gather(*[caller(fn, keys[name], c, 3) for c in range(CALLERS)])
    spent = dict.fromkeys(impls, 0.0)
    for _ in range(rounds):
        for name, fn in impls.items():
            t0 = time.perf_counter()
            await asyncio.gather(*[caller(fn, keys[name], c, per) for c in range(CALLERS)])
            spent[name] += time.perf_counter() - t0
    return {name: per * CALLERS * rounds / t for name, t in spent.items()}


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
    ap.add_argument("--cluster", action="store_true",
                    help="also: 64 asyncio callers on a private 3-master Redis Cluster")
    args = ap.parse_args()
    server = start_redis()
    print(f"redis-server {redis.Redis.from_url(server.url).info()['redis_version']} on "
          f"{server.url}; python {sys.version.split()[0]}; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    try:
        run(server.url, args.n, args.async_n)
    finally:
        server.stop()
    if args.cluster:
        cluster = start_cluster(3)
        try:
            asyncio.run(run_cluster(cluster.url, args.async_n))
        finally:
            cluster.stop()


async def run_cluster(url: str, n: int) -> None:
    """stormguard only: the peers' cluster support differs too much to compare."""
    impls: dict[str, Callable[[str], Awaitable[Any]]] = {}
    limiters = []
    for algo in ("fixed_window", "sliding_window_counter", "token_bucket"):
        lim = AsyncRateLimiter(RedisClusterStore.from_url(url))
        limiters.append(lim)
        r = Rule(LIMIT, 3600, algorithm=algo)
        impls[f"stormguard {algo} (batched, per-master connections)"] = \
            lambda k, lim=lim, r=r: lim.hit(k, r)
    res = await async_rows(impls, n)
    for lim in limiters:
        await lim.aclose()
    print(f"\n### {CALLERS} concurrent asyncio callers on a 3-master Redis Cluster "
          f"({n} checks per row; the 3 servers share this machine's cores)\n")
    print("| implementation | checks/s |")
    print("|---|---:|")
    for name, rate in res.items():
        print(f"| {name} | {rate:,.0f} |")


def run(url: str, n: int, async_n: int) -> None:
    client = redis.Redis.from_url(url)
    sha = client.script_load(SCRIPT)
    raw_args = ("", 1, 1, 0, "swc", LIMIT, 3_600_000_000, LIMIT)
    impls: dict[str, Callable[[str], Any]] = {
        "raw redis-py EVALSHA loop (same script)": lambda k: client.evalsha(sha, 1, k, *raw_args),
    }
    for algo in sorted(ALGORITHMS):
        lim = RateLimiter(RedisStore.from_url(url))
        r = Rule(LIMIT, 3600, algorithm=algo)
        impls[f"stormguard {algo}"] = lambda k, lim=lim, r=r: lim.hit(k, r)
    peers = peers_sync(url)
    impls.update(peers)
    res = sync_rows(impls, n)
    raw_rate = res["raw redis-py EVALSHA loop (same script)"][0]
    sg = {k: v[0] for k, v in res.items() if k.startswith("stormguard")}
    peer_best = max(res[k][0] for k in peers)
    print(f"\n### One client, blocking ({n} checks per row, 1000 keys, admitted path)\n")
    raw_p50 = res["raw redis-py EVALSHA loop (same script)"][1]
    print("| implementation | checks/s | p50 µs | p99 µs | checks/s vs raw | p50 vs raw |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (rate, p50, p99) in res.items():
        print(f"| {name} | {rate:,.0f} | {p50:.0f} | {p99:.0f} | {rate / raw_rate:.2f} "
              f"| {p50 / raw_p50:.2f} |")
    sg50 = {k: v[1] for k, v in res.items() if k.startswith("stormguard")}
    print(f"\nstormguard / raw EVALSHA, checks/s: {min(sg.values()) / raw_rate:.2f} (slowest "
          f"algorithm) to {max(sg.values()) / raw_rate:.2f} (fastest); p50 latency: "
          f"{min(sg50.values()) / raw_p50:.2f} to {max(sg50.values()) / raw_p50:.2f} of raw; "
          f"stormguard sliding_window_counter / fastest peer = "
          f"{sg['stormguard sliding_window_counter'] / peer_best:.2f}x")
    server_cost(url, client)
    asyncio.run(run_async(url, async_n))


def server_cost(url: str, client: redis.Redis) -> None:
    """Redis-side time per script call (INFO commandstats), against a one-GET script."""
    get_sha = client.script_load("return redis.call('GET', KEYS[1])")
    print("\n### Redis-side cost per call (INFO commandstats usec_per_call)\n")
    print("| script | µs per call |")
    print("|---|---:|")
    rows: list[tuple[str, Callable[[str], Any]]] = [
        ("one GET (calibration)", lambda k: client.evalsha(get_sha, 1, k))]
    for algo in sorted(ALGORITHMS):
        lim = RateLimiter(RedisStore.from_url(url))
        r = Rule(LIMIT, 3600, algorithm=algo)
        rows.append((f"stormguard {algo}", lambda k, lim=lim, r=r: lim.hit(k, r)))
    for name, fn in rows:
        client.config_resetstat()
        for i in range(2000):
            fn(f"cost/{KEYS[i % 1000]}")
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        print(f"| {name} | {stats.get('usec_per_call', 0.0):.1f} |")


async def run_async(url: str, n: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    sha = await client.script_load(SCRIPT)
    raw_args = ("", 1, 1, 0, "swc", LIMIT, 3_600_000_000, LIMIT)
    impls: dict[str, Callable[[str], Awaitable[Any]]] = {
        "raw redis.asyncio EVALSHA (no batching)":
            lambda k: client.evalsha(sha, 1, k, *raw_args),
    }
    limiters = []
    for algo in sorted(ALGORITHMS):
        lim = AsyncRateLimiter(RedisStore.from_url(url))
        limiters.append(lim)
        r = Rule(LIMIT, 3600, algorithm=algo)
        impls[f"stormguard {algo} (batched)"] = lambda k, lim=lim, r=r: lim.hit(k, r)
    peers = await peers_async(url)
    impls.update(peers)
    res = await async_rows(impls, n)
    for lim in limiters:
        await lim.aclose()
    await client.aclose()
    peer_best = max(res[k] for k in peers)
    sg = {k: v for k, v in res.items() if k.startswith("stormguard")}
    print(f"\n### {CALLERS} concurrent asyncio callers, one event loop ({n} checks per row)\n")
    print("| implementation | checks/s | vs fastest peer |")
    print("|---|---:|---:|")
    for name, rate in res.items():
        print(f"| {name} | {rate:,.0f} | {rate / peer_best:.2f}x |")
    print(f"\nstormguard / fastest peer: {min(sg.values()) / peer_best:.2f}x (slowest algorithm) "
          f"to {max(sg.values()) / peer_best:.2f}x (fastest)")


if __name__ == "__main__":
    main()
