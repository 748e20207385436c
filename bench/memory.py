"""Cost of one rate-limit check on the embedded (in-process) store, stormguard vs peers.

    PYTHONPATH=src python bench/memory.py           # full run (a few minutes)
    PYTHONPATH=src python bench/memory.py --quick   # fewer iterations, 10,000 keys
    STORMGUARD_PURE=1 PYTHONPATH=src python bench/memory.py --no-peers   # pure-Python hot path

The ``hybrid`` column is :class:`HybridStore` over a MemoryStore (its local decision;
``hyb/mem`` = hybrid / stormguard, the cost of deciding on a lease rather than in the
store itself). For every algorithm, on the allowed and the denied path, with 1 key and with 100,000
keys (cycled round-robin, all created before timing), single thread: the minimum over
several repeats of (time of a loop of N checks) / N, in µs per check. Peers, in the same
process, on their comparable algorithms, each with its in-memory storage:

* limits (MemoryStorage): FixedWindowRateLimiter, MovingWindowRateLimiter (an exact log),
  SlidingWindowCounterRateLimiter;
* throttled-py (MemoryStore): fixed_window, sliding_window (a counter estimate),
  token_bucket, leaking_bucket, gcra;
* pyrate-limiter (Limiter over one bucket per key; InMemoryBucket for the logs,
  StateBucket for the token bucket / GCRA): FixedWindow, SlidingWindowLog, TokenBucket,
  GCRA; try_acquire(blocking=False).

Allowed path: a limit so high that nothing is denied (fresh limiter per repeat, so the
logs hold at most N entries per key; for the exact logs at most 2,000, see LOG_CAP).
Denied path: limit 1 per day, one admitted hit per key before timing, then every timed
check is denied.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from stormguard import HybridStore, MemoryStore, Rule, _speedups
from stormguard import __version__ as sg_version

Check = Callable[[str], Any]
Factory = Callable[[int, int], Check]  # (limit, window seconds) -> check(key)

ALGORITHMS = ("fixed_window", "sliding_window_log", "sliding_window_counter",
              "token_bucket", "gcra", "leaky_bucket")
BIG = 10**9  # allowed path: never reached
DAY = 86_400
#: A log's cost grows with its live entries: on the allowed path a log key holds at most
#: this many (a 2,000/window limit), so the 1-key loop is shortened and repeated more.
LOG_CAP = 2_000


# -- stormguard -------------------------------------------------------------------------

def hybrid(algorithm: str) -> Factory:
    """HybridStore over a MemoryStore backend, no background sync: the local decision
    (the backend is asked when a lease runs out; leases double while demand lasts)."""
    def make(limit: int, window: int) -> Check:
        store = HybridStore(MemoryStore(max_keys=1_000_000), sync_interval=None,
                            max_keys=1_000_000)
        store.sync()  # what the sync thread does first: count the processes
        rule = Rule(limit=limit, window=window, algorithm=algorithm)
        hit = store.hit
        return lambda key: hit(key, rule)
    return make


def stormguard(algorithm: str) -> Factory:
    def make(limit: int, window: int) -> Check:
        store = MemoryStore(max_keys=1_000_000)
        rule = Rule(limit=limit, window=window, algorithm=algorithm)
        hit = store.hit
        return lambda key: hit(key, rule)
    return make


# -- limits -----------------------------------------------------------------------------

def limits_lib(strategy: str) -> Factory:
    from limits import RateLimitItemPerSecond, strategies
    from limits.storage import MemoryStorage

    cls = getattr(strategies, strategy)

    def make(limit: int, window: int) -> Check:
        limiter = cls(MemoryStorage())
        item = RateLimitItemPerSecond(limit, window)
        hit = limiter.hit
        return lambda key: hit(item, key)
    return make


# -- throttled-py -----------------------------------------------------------------------

def throttled_lib(using: str) -> Factory:
    from throttled import MemoryStore as TMemoryStore
    from throttled import Throttled, per_duration

    def make(limit: int, window: int) -> Check:
        from datetime import timedelta

        quota = per_duration(timedelta(seconds=window), limit, burst=limit)
        throttle = Throttled(using=using, quota=quota,
                             store=TMemoryStore(options={"MAX_SIZE": 1_000_000}))
        check: Check = throttle.limit
        return check
    return make


# -- pyrate-limiter ---------------------------------------------------------------------

def pyrate_lib(algorithm: str) -> Factory:
    from pyrate_limiter import (
        GCRA,
        BucketFactory,
        FixedWindow,
        InMemoryBucket,
        Limiter,
        Rate,
        RateItem,
        SlidingWindowLog,
        StateBucket,
        TokenBucket,
    )

    def bucket(limit: int, window: int) -> Any:
        rate = Rate(limit, window * 1000)
        if algorithm == "fixed_window":
            return InMemoryBucket([rate], algorithm=FixedWindow())
        if algorithm == "sliding_window_log":
            return InMemoryBucket([rate], algorithm=SlidingWindowLog())
        return StateBucket([rate], algorithm=TokenBucket() if algorithm == "token_bucket"
                           else GCRA())

    class PerKey(BucketFactory):  # pyrate's documented way to get one bucket per key
        def __init__(self, limit: int, window: int) -> None:
            self.args = (limit, window)
            self.buckets: dict[str, Any] = {}
            self.now = bucket(limit, window).now

        def wrap_item(self, name: str, weight: int = 1) -> Any:
            return RateItem(name, self.now(), weight=weight)

        def get(self, item: Any) -> Any:
            b = self.buckets.get(item.name)
            if b is None:
                b = self.buckets[item.name] = bucket(*self.args)
            return b

    def make(limit: int, window: int) -> Check:
        limiter = Limiter(PerKey(limit, window))
        acquire = limiter.try_acquire
        return lambda key: acquire(key, blocking=False)
    return make


PEERS: dict[str, dict[str, Callable[[], Factory]]] = {
    "fixed_window": {
        "limits": lambda: limits_lib("FixedWindowRateLimiter"),
        "throttled-py": lambda: throttled_lib("fixed_window"),
        "pyrate-limiter": lambda: pyrate_lib("fixed_window"),
    },
    "sliding_window_log": {
        "limits": lambda: limits_lib("MovingWindowRateLimiter"),
        "pyrate-limiter": lambda: pyrate_lib("sliding_window_log"),
    },
    "sliding_window_counter": {
        "limits": lambda: limits_lib("SlidingWindowCounterRateLimiter"),
        "throttled-py": lambda: throttled_lib("sliding_window"),
    },
    "token_bucket": {
        "throttled-py": lambda: throttled_lib("token_bucket"),
        "pyrate-limiter": lambda: pyrate_lib("token_bucket"),
    },
    "gcra": {
        "throttled-py": lambda: throttled_lib("gcra"),
        "pyrate-limiter": lambda: pyrate_lib("gcra"),
    },
    "leaky_bucket": {
        "throttled-py": lambda: throttled_lib("leaking_bucket"),
    },
}


def measure_row(contenders: dict[str, Factory], allowed: bool, n_keys: int, n: int,
                repeats: int) -> dict[str, float]:
    """Minimum µs per check over ``repeats`` loops of ``n`` checks, per contender.

    The contenders take turns within each repeat, so a burst of load from elsewhere on
    the machine hits them alike rather than one of them."""
    keys = [f"user:{i}" for i in range(n_keys)]
    loop_keys = (keys * (n // n_keys + 1))[:n]
    best = dict.fromkeys(contenders, float("inf"))
    checks: dict[str, Check] = {}
    for _ in range(repeats):
        for name, make in contenders.items():
            check = checks.get(name)
            if check is None or allowed:  # the allowed path starts fresh: logs stay short
                check = make(BIG, DAY) if allowed else make(1, DAY)
                for k in keys:  # create every key before timing
                    check(k)
                checks[name] = check
            gc.collect()  # cheap: main() froze everything imported before
            gc.disable()
            try:
                t = time.perf_counter()
                for k in loop_keys:
                    check(k)
                elapsed = time.perf_counter() - t
            finally:
                gc.enable()
            best[name] = min(best[name], elapsed / n * 1e6)
        if allowed:
            checks.clear()  # free the old limiters before the next repeat
    return best


def sanity(make: Factory) -> None:
    """Every contender must admit then deny with limit 1 (catches a broken adapter)."""
    check = make(1, DAY)
    results = [check("sanity") for _ in range(2)]
    ok = [r if isinstance(r, bool) else
          (not r.limited) if hasattr(r, "limited") else bool(r) for r in results]
    if ok != [True, False]:
        raise SystemExit(f"adapter broken: {results}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 checks x 3 repeats, 10,000 keys instead of 100,000")
    parser.add_argument("-n", type=int, default=100_000, help="checks per timed loop")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keys", type=int, default=100_000, help="the many-keys case")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--no-peers", action="store_true", help="stormguard only")
    args = parser.parse_args()
    n, repeats, many = (20_000, 3, 10_000) if args.quick else (args.n, args.repeats, args.keys)
    import importlib.metadata as md

    versions = {p: md.version(p) for p in ("limits", "throttled-py", "pyrate-limiter")}
    print(f"Python {platform.python_version()} on {platform.machine()}, stormguard "
          f"{sg_version}, " + ", ".join(f"{p} {v}" for p, v in versions.items()))
    print(f"stormguard hot path: {_speedups.STATUS}")
    print(f"µs per check, min of {repeats} x {n:,} checks; ratio = peer fastest / stormguard")
    print()
    header = (f"{'algorithm':<24}{'path':<9}{'keys':>8}{'stormguard':>12}{'limits':>10}"
              f"{'throttled':>11}{'pyrate':>10}{'fastest peer':>14}{'ratio':>8}"
              f"{'hybrid':>9}{'hyb/mem':>9}")
    print(header)
    print("-" * len(header))
    for algorithm in args.algorithms.split(","):
        contenders: dict[str, Factory] = {"stormguard": stormguard(algorithm),
                                          "hybrid": hybrid(algorithm)}
        if not args.no_peers:
            contenders.update({name: f() for name, f in PEERS[algorithm].items()})
        for make in contenders.values():
            sanity(make)
        gc.collect()
        gc.freeze()  # the libraries' own objects: never rescanned by the collects below
        for allowed in (True, False):
            for n_keys in (1, many):
                n_run, rep = n, repeats
                if allowed and algorithm == "sliding_window_log" and n > LOG_CAP * n_keys:
                    n_run = LOG_CAP * n_keys
                    rep = min(4 * repeats, repeats * n // n_run)
                row = measure_row(contenders, allowed, n_keys, n_run, rep)
                peers = {k: v for k, v in row.items() if k not in ("stormguard", "hybrid")}
                fastest = min(peers, key=lambda k: peers[k]) if peers else None
                cells = "".join(
                    f"{row[name]:>{w}.2f}" if name in row else f"{'-':>{w}}"
                    for name, w in (("limits", 10), ("throttled-py", 11),
                                    ("pyrate-limiter", 10)))
                ratio = f"{peers[fastest] / row['stormguard']:>7.1f}x" if fastest else ""
                print(f"{algorithm:<24}{'allowed' if allowed else 'denied':<9}{n_keys:>8,}"
                      f"{row['stormguard']:>12.2f}{cells}{fastest or '-':>16}{ratio:>8}"
                      f"{row['hybrid']:>9.2f}{row['hybrid'] / row['stormguard']:>8.2f}x")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
