"""Shaper: cost per call when no wait is needed, and pacing accuracy at 500/s on the real
clock, side by side with aiolimiter's leaky bucket and the machine's own sleep, one run.

    PYTHONPATH=src python bench/shaper.py [--quick] [--redis]

1. Overhead: a tight loop of calls that never wait (a rate far above the loop's), minus
   the bare call; rounds interleaved, minimum kept. aiolimiter is asyncio only.
2. Pacing: N calls arrive at once and must leave 2 ms apart (500/s). For each departure,
   its lateness against the ideal schedule (first departure + k x 2 ms); the most
   departures in any 10 ms and in any 1 s; "physical limit": the lateness of a bare
   ``time.sleep`` / ``asyncio.sleep`` of 2 ms on this machine in the same run.
   aiolimiter is run twice: ``AsyncLimiter(500, 1)`` (the documented form: its bucket
   holds ``max_rate``, so the first 500 leave at once) and ``AsyncLimiter(1, 0.002)``
   (a bucket of one: its closest form to a shaper).
3. ``--redis``: the same pacing through a private redis-server (one booking round trip
   per call, server time), and the cost of a booking against a raw redis-py PING.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# bench/ holds a redis.py: keep it off the path so `import redis` is redis-py
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from aiolimiter import AsyncLimiter  # noqa: E402 - after the path setup above

from stormguard import Shaper  # noqa: E402

QUICK = "--quick" in sys.argv
N = 3_000 if QUICK else 20_000
ROUNDS = 3 if QUICK else 15
PACED = 200 if QUICK else 1_500
RATE = 500
INTERVAL = 1 / RATE


def f() -> None:
    return None


async def af() -> None:
    return None


# -- 1. overhead --------------------------------------------------------------------------
def time_sync(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    return (time.perf_counter() - t0) / N


async def time_async(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    for _ in range(N):
        await fn()
    return (time.perf_counter() - t0) / N


def fast_shaper() -> Shaper:
    return Shaper(rate=1e9, burst=10**6, max_wait=None)  # never waits in a loop


def limited(limiter: AsyncLimiter) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        async with limiter:
            return

    return call


def overhead() -> None:
    sync = {"stormguard Shaper.call": fast_shaper()(f)}
    asyncs: dict[str, Callable[[], Awaitable[None]]] = {
        "stormguard Shaper.acall": fast_shaper()(af),
        "aiolimiter `async with AsyncLimiter`": limited(AsyncLimiter(1e9, 1)),
    }
    best = dict.fromkeys([*sync, *asyncs], float("inf"))
    bare = abare = float("inf")

    async def arounds() -> None:
        nonlocal abare
        abare = min(abare, await time_async(af))
        for name, fn in asyncs.items():
            best[name] = min(best[name], await time_async(fn))

    loop = asyncio.new_event_loop()
    try:
        for _ in range(ROUNDS):
            bare = min(bare, time_sync(f))
            for name, fn in sync.items():
                best[name] = min(best[name], time_sync(fn))
            loop.run_until_complete(arounds())
    finally:
        loop.close()
    peer = best["aiolimiter `async with AsyncLimiter`"] - abare
    print(f"\n### Overhead per call, no wait needed (bare call {bare * 1e6:.3f} µs sync, "
          f"{abare * 1e6:.3f} µs async)\n")
    print("| candidate | µs over bare call | x aiolimiter |")
    print("|---|---:|---:|")
    for name, t in best.items():
        c = t - (bare if name in sync else abare)
        print(f"| {name} | {c * 1e6:.2f} | {c / peer:.2f} |")


# -- 2. pacing ----------------------------------------------------------------------------
def most_within(times: list[float], span: float) -> int:
    return max(bisect.bisect_left(times, t + span - 1e-9) - i for i, t in enumerate(times))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


#: (departure time, its slot): the slot is NaN in process (the ideal schedule is used)
Departure = tuple[float, float]
Row = tuple[str, list[Departure]]
#: the slot the store gave the booking of the current thread / task (Redis rows)
SLOT: contextvars.ContextVar[float] = contextvars.ContextVar("slot", default=math.nan)


def observe_slots() -> None:
    """Read each Redis booking's slot from the script's reply (observing, not changing)."""
    from stormguard.stores.redis import shaping

    booking = shaping.booking

    def observed(reply: Any) -> Any:
        SLOT.set(reply[1] / 1e6)
        return booking(reply)

    shaping.booking = observed


def lateness(departures: list[Departure]) -> list[float]:
    """Each departure minus its slot: the store's when known, else the ideal schedule
    (the first departure + k x 2 ms)."""
    if all(not math.isnan(slot) for _, slot in departures):
        return [t - slot for t, slot in departures]
    d = sorted(t for t, _ in departures)
    return [t - d[0] - k * INTERVAL for k, t in enumerate(d)]


def report_pacing(title: str, rows: list[Row], sleeps: list[Row]) -> None:
    print(f"\n### {title}\n")
    print("| candidate | lateness p50 ms | p99 ms | max ms | most in 10 ms | most in 1 s "
          "| run s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, deps in rows:
        d = sorted(t for t, _ in deps)
        late = lateness(deps)
        print(f"| {name} | {pct(late, 0.5) * 1e3:.3f} | {pct(late, 0.99) * 1e3:.3f} | "
              f"{max(late) * 1e3:.3f} | {most_within(d, 0.010)} | {most_within(d, 1.0)} | "
              f"{d[-1] - d[0]:.2f} |")
    for name, late in sleeps:
        print(f"| physical limit: {name} | {pct(late, 0.5) * 1e3:.3f} | "
              f"{pct(late, 0.99) * 1e3:.3f} | {max(late) * 1e3:.3f} | | | |")


async def gather_departures(call: Callable[[], Awaitable[None]],
                            now: Callable[[], float] = time.monotonic) -> list[Departure]:
    out: list[Departure] = []

    async def one() -> None:
        await call()
        out.append((now(), SLOT.get()))

    await asyncio.gather(*(one() for _ in range(PACED)))
    return out


def shaper_async(shaper: Shaper) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        await shaper.acall(af)

    return call


def threads_departures(shaper: Shaper, threads: int = 4,
                       now: Callable[[], float] = time.monotonic) -> list[Departure]:
    out: list[Departure] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        for _ in range(k):
            shaper.call(f)
            t = now()
            with lock:
                out.append((t, SLOT.get()))

    ts = [threading.Thread(target=run, args=(PACED // threads,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def sleep_lateness() -> list[float]:
    late = []
    for _ in range(min(PACED, 500)):
        t = time.monotonic()
        time.sleep(INTERVAL)
        late.append(time.monotonic() - t - INTERVAL)
    return late


async def asleep_lateness() -> list[float]:
    late = []
    for _ in range(min(PACED, 500)):
        t = time.monotonic()
        await asyncio.sleep(INTERVAL)
        late.append(time.monotonic() - t - INTERVAL)
    return late


def pacing() -> None:
    rows: list[Row] = [
        ("stormguard Shaper(500/s), asyncio", asyncio.run(gather_departures(
            shaper_async(Shaper(rate=RATE, max_wait=None))))),
        ("stormguard Shaper(500/s), 4 threads", threads_departures(
            Shaper(rate=RATE, max_wait=None))),
        ("aiolimiter AsyncLimiter(500, 1)", asyncio.run(gather_departures(
            limited(AsyncLimiter(RATE, 1))))),
        ("aiolimiter AsyncLimiter(1, 0.002)", asyncio.run(gather_departures(
            limited(AsyncLimiter(1, INTERVAL))))),
    ]
    sleeps = [("time.sleep(2 ms)", sleep_lateness()),
              ("asyncio.sleep(2 ms)", asyncio.run(asleep_lateness()))]
    report_pacing(f"Pacing {PACED} calls that arrive at once, 500/s, real clock "
                  "(lateness against first departure + k x 2 ms)", rows, sleeps)


# -- 3. Redis -----------------------------------------------------------------------------
def redis_part() -> None:
    import redis
    from tests.redis_servers import start_redis

    from stormguard import RedisStore

    server = start_redis()
    try:
        store = RedisStore(server.url, timeout=1.0)
        shaper = Shaper(rate=1e9, burst=10**6, max_wait=None, store=store, key="bench")
        raw = redis.Redis(host="127.0.0.1", port=server.port)
        n = max(N // 10, 300)
        best_b = best_p = float("inf")
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(n):
                raw.ping()
            best_p = min(best_p, (time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                shaper.call(f)
            best_b = min(best_b, (time.perf_counter() - t0) / n)
        print("\n### Redis: one booking per call (blocking, one client, loopback)\n")
        print("| candidate | µs per call | x raw redis-py PING |")
        print("|---|---:|---:|")
        print(f"| raw redis-py PING | {best_p * 1e6:.1f} | 1.00 |")
        print(f"| stormguard Shaper.call on Redis (no wait) | {best_b * 1e6:.1f} | "
              f"{best_b / best_p:.2f} |")
        observe_slots()
        paced = Shaper(rate=RATE, max_wait=None, store=RedisStore(server.url, timeout=1.0),
                       key="paced")
        rows: list[Row] = [
            ("stormguard Shaper(500/s) on Redis, asyncio",
             asyncio.run(gather_departures(shaper_async(paced), time.time))),
            ("stormguard Shaper(500/s) on Redis, 4 threads",
             threads_departures(Shaper(rate=RATE, max_wait=None, key="paced2",
                                       store=RedisStore(server.url, timeout=1.0)),
                                now=time.time)),
        ]
        report_pacing("Pacing on Redis, 500/s (lateness against the slot the server gave, "
                      "its TIME and time.time() being one clock here)", rows, [])
    finally:
        server.stop()


def main() -> None:
    print(f"Python {platform.python_version()} on {platform.machine()}, "
          f"{N} calls x {ROUNDS} interleaved rounds (overhead), {PACED} paced calls; "
          f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    overhead()
    pacing()
    if "--redis" in sys.argv:
        redis_part()


if __name__ == "__main__":
    main()
