"""Cost of outbound-resilience policies per successful call, stormguard vs peers, one run.

    PYTHONPATH=src python bench/resilience.py [--quick]

Every candidate wraps the same trivial function (sync ``def f(x)``, async
``async def f(x)``) as a decorator; we time a tight loop of successful calls
and subtract the bare call. Rounds are interleaved (every candidate once per
round, the minimum kept), so load on a shared machine hits all alike. Prints
a Markdown table: overhead in microseconds per call and ratios against the
cheapest peer retry decorator and the fastest peer circuit breaker.
"""

from __future__ import annotations

import asyncio
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import backoff
import circuitbreaker
import pybreaker
import stamina
import tenacity

from stormguard import (
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    Fallback,
    Pipeline,
    Retry,
    RetryBudget,
    Timeout,
)

QUICK = "--quick" in sys.argv
N = 20_000 if QUICK else 50_000
ROUNDS = 5 if QUICK else 9


def f(x: int) -> int:
    return x


async def af(x: int) -> int:
    return x


def full() -> Pipeline:
    """The measured "full pipeline": timeout + retry + breaker + bulkhead."""
    return Pipeline(Timeout(total=3.0), Retry(attempts=3), CircuitBreaker(), Bulkhead(100))


def recommended() -> Pipeline:
    """The documented outbound order, every layer present."""
    return Pipeline(Fallback(lambda e: None, on=(CircuitOpen, BulkheadFull)), Timeout(total=3.0),
                    Retry(attempts=3, budget=RetryBudget()), CircuitBreaker(), Bulkhead(100),
                    Timeout(1.0))


# name -> (kind, decorator factory); kind: "sg" stormguard, "retry"/"breaker" peers
SYNC: dict[str, tuple[str, Callable[[], Callable[[Any], Any]]]] = {
    "stormguard Timeout(1.0)": ("sg", lambda: Timeout(1.0)),
    "stormguard Retry(attempts=3)": ("sg", lambda: Retry(attempts=3)),
    "stormguard Retry + RetryBudget": ("sg", lambda: Retry(attempts=3, budget=RetryBudget())),
    "stormguard CircuitBreaker()": ("sg", CircuitBreaker),
    "stormguard CircuitBreaker(slow_call_duration=1)": (
        "sg", lambda: CircuitBreaker(slow_call_duration=1.0)),
    "stormguard Bulkhead(100)": ("sg", lambda: Bulkhead(100)),
    "stormguard Fallback": ("sg", lambda: Fallback(lambda e: None)),
    "stormguard full pipeline (timeout+retry+breaker+bulkhead)": ("sg", full),
    "stormguard recommended 6-layer pipeline": ("sg", recommended),
    "tenacity @retry(stop_after_attempt(3))": (
        "retry", lambda: tenacity.retry(stop=tenacity.stop_after_attempt(3))),
    "stamina @retry(attempts=3)": ("retry", lambda: stamina.retry(on=Exception, attempts=3)),
    "backoff @on_exception(expo, max_tries=3)": (
        "retry", lambda: backoff.on_exception(backoff.expo, Exception, max_tries=3)),
    "pybreaker CircuitBreaker()": ("breaker", pybreaker.CircuitBreaker),
    "circuitbreaker @circuit": ("breaker", lambda: circuitbreaker.circuit(failure_threshold=5)),
}

ASYNC = {name: spec for name, spec in SYNC.items() if not name.startswith("pybreaker")}


def time_sync(fn: Callable[[int], Any]) -> float:
    t0 = time.perf_counter()
    for _ in range(N):
        fn(1)
    return (time.perf_counter() - t0) / N


async def time_async(fn: Callable[[int], Awaitable[Any]]) -> float:
    # Let the loop run every 256 calls, as in a real service: it is the loop that drops
    # cancelled timers (Timeout arms one per call); without it they pile up by millions.
    t0 = time.perf_counter()
    for i in range(N):
        await fn(1)
        if not i & 255:
            await asyncio.sleep(0)
    return (time.perf_counter() - t0) / N


def run_sync() -> tuple[float, dict[str, float]]:
    wrapped = {name: make()(f) for name, (_, make) in SYNC.items()}
    best = dict.fromkeys(wrapped, float("inf"))
    bare = float("inf")
    for _ in range(ROUNDS):
        bare = min(bare, time_sync(f))
        for name, fn in wrapped.items():
            best[name] = min(best[name], time_sync(fn))
    return bare, {name: t - bare for name, t in best.items()}


async def run_async() -> tuple[float, dict[str, float]]:
    wrapped = {name: make()(af) for name, (_, make) in ASYNC.items()}
    best = dict.fromkeys(wrapped, float("inf"))
    bare = float("inf")
    for _ in range(ROUNDS):
        bare = min(bare, await time_async(af))
        for name, fn in wrapped.items():
            best[name] = min(best[name], await time_async(fn))
    return bare, {name: t - bare for name, t in best.items()}


def report(title: str, bare: float, cost: dict[str, float],
           specs: dict[str, tuple[str, Any]]) -> None:
    peer_retry = min(c for n, c in cost.items() if specs[n][0] == "retry")
    peer_breaker = min(c for n, c in cost.items() if specs[n][0] == "breaker")
    print(f"\n### {title} (bare call {bare * 1e6:.3f} µs)\n")
    print("| candidate | µs over bare call | x cheapest peer retry | x fastest peer breaker |")
    print("|---|---:|---:|---:|")
    for name, c in cost.items():
        print(f"| {name} | {c * 1e6:.2f} | {c / peer_retry:.2f} | {c / peer_breaker:.2f} |")
    pipe = cost["stormguard full pipeline (timeout+retry+breaker+bulkhead)"]
    brk = cost["stormguard CircuitBreaker()"]
    print(f"\nfull pipeline is {peer_retry / pipe:.1f}x cheaper than the cheapest peer retry; "
          f"breaker alone is {brk / peer_breaker:.2f}x the fastest peer breaker")


def main() -> None:
    print(f"Python {platform.python_version()} on {platform.machine()}, "
          f"{N} calls x {ROUNDS} interleaved rounds, minimum kept")
    bare, cost = run_sync()
    report("sync", bare, cost, SYNC)
    abare, acost = asyncio.run(run_async())
    report("asyncio", abare, acost, ASYNC)


if __name__ == "__main__":
    main()
