"""What observability costs per check, beside the alternatives, in one run.

    PYTHONPATH=src python bench/observability.py            # full run (~30 s)
    PYTHONPATH=src python bench/observability.py --quick    # a few seconds

Per check on the embedded store (``RateLimiter("memory://").hit``, one rule, 10,000 keys
round-robin), single thread, the minimum over rounds of (loop time / N), in µs, every
variant run once per round in turn (a burst of load on a shared machine hits them alike):

* plain: metrics not enabled (the limiter's ``hit`` is then the store's own method);
* counted: after ``observability.enable_prometheus()``: decisions by rule and result;
* counted + top-K: also ``top_keys=1000`` (the denied path feeds the sketch);
* by hand: the plain check followed by what a user would write without stormguard's
  schema, prometheus-client's ``Counter.labels(rule, result).inc()``.

And per update, denied keys from 1,000,000 distinct keys with a few heavy hitters:
stormguard's ``SpaceSaving(1000).add`` vs Apache DataSketches' ``frequent_strings_sketch``
(C++, lg_max_map_size 11: 1,536 counters) and a plain ``dict`` count (the physical limit:
unbounded memory). Plus the time to scrape the whole schema with 1,000 live components.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from stormguard import CircuitBreaker, RateLimiter, Rule, _speedups, observability
from stormguard.observability import SpaceSaving


def best(loop: Callable[[], None], n: int, repeats: int) -> float:
    """µs per operation: the fastest of ``repeats`` runs of ``loop`` (n operations)."""
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        loop()
        times.append(time.perf_counter() - t0)
    return min(times) / n * 1e6


def interleaved(loops: dict[str, Callable[[], None]], n: int, repeats: int
                ) -> dict[str, float]:
    """µs per operation of each loop: the fastest of ``repeats`` rounds, each round
    running every loop once in turn (so a burst of load on a shared machine hits them
    all alike)."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):
        for name, loop in loops.items():
            gc.collect()
            t0 = time.perf_counter()
            loop()
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) / n * 1e6 for name, t in times.items()}


def check_loop(hit: Callable[[str, Rule], Any], rule: Rule, keys: list[str], n: int,
               after: Callable[[Any], None] | None = None) -> Callable[[], None]:
    m = len(keys)
    if after is None:
        def loop() -> None:
            for i in range(n):
                hit(keys[i % m], rule)
    else:
        def loop() -> None:
            for i in range(n):
                after(hit(keys[i % m], rule))
    return loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 5_000 if args.quick else 200_000
    repeats = 2 if args.quick else 7
    print(f"python {platform.python_version()}, hot path: {_speedups.STATUS}; "
          f"{n:,} checks per loop, best of {repeats}")
    keys = [f"user:{i}" for i in range(10_000)]
    results: dict[str, dict[str, float]] = {}
    observability.enable_prometheus(CollectorRegistry())
    for path, limit in (("allowed", 10**9), ("denied", 1)):
        rule = Rule(limit, 86_400, name="r")
        # plain: what RateLimiter("memory://").hit is before metrics are enabled, the
        # store's own method (the limiter binds it: no frame of its own)
        plain = RateLimiter("memory://").store
        counted = RateLimiter("memory://")
        top = RateLimiter("memory://", top_keys=1000)
        hand = RateLimiter("memory://").store
        for k in keys:
            for h in (plain.hit, counted.hit, top.hit, hand.hit):
                h(k, rule)
        counter = Counter("bench_checks", "by hand", ["rule", "result"],
                          registry=CollectorRegistry())

        def by_hand(d: Any, counter: Counter = counter) -> None:
            counter.labels("r", "allowed" if d.allowed else "denied").inc()

        results[path] = interleaved({
            "plain": check_loop(plain.hit, rule, keys, n),
            "by hand": check_loop(hand.hit, rule, keys, n, by_hand),
            "counted": check_loop(counted.hit, rule, keys, n),
            "counted + top-K": check_loop(top.hit, rule, keys, n),
        }, n, repeats)
    print("\nper check, µs (ratio to plain)")
    print(f"{'path':<10}" + "".join(f"{c:>22}" for c in results["allowed"]))
    for path, row in results.items():
        base = row["plain"]
        print(f"{path:<10}" + "".join(f"{v:>13.3f} ({v / base:4.2f}x)" for v in row.values()))

    total = 50_000 if args.quick else 1_000_000
    stream = [f"user:{i}" if i % 50 else f"bot:{i % 7}" for i in range(total)]
    print(f"\nper update, {total:,} denied keys, µs (ratio to dict)")
    sketch = SpaceSaving(1000)
    add = sketch.add
    t_ss = best(lambda: [add(k, "r") for k in stream], total, max(1, repeats // 2))
    counts: dict[str, int] = {}
    get = counts.get

    def dict_loop() -> None:
        for k in stream:
            counts[k] = get(k, 0) + 1

    t_dict = best(dict_loop, total, max(1, repeats // 2))
    rows = [("dict (unbounded)", t_dict, len(counts)), ("stormguard SpaceSaving(1000)", t_ss,
                                                       len(sketch))]
    try:
        import datasketches

        fs = datasketches.frequent_strings_sketch(11)
        upd = fs.update
        t_ds = best(lambda: [upd(k) for k in stream], total, max(1, repeats // 2))
        rows.append(("datasketches frequent_strings (lg 11)", t_ds, fs.num_active_items))
    except ImportError:
        print("(datasketches not installed: pip install datasketches)")
    for name, t, held in rows:
        print(f"  {name:<40}{t:8.3f} ({t / t_dict:4.2f}x)  keys held: {held:,}")
    found = {t.key for t in sketch.top(7)} == {f"bot:{i}" for i in range(7)}
    print(f"  SpaceSaving's top 7 are the 7 heavy keys: {found}")

    live = [CircuitBreaker(name=f"b{i}") for i in range(100 if args.quick else 1000)]
    reg = CollectorRegistry()
    observability.enable_prometheus(reg)
    t_scrape = best(lambda: generate_latest(reg) and None, 1, 5) / 1000
    print(f"\nscrape of the whole schema with {len(live):,} live breakers: {t_scrape:.1f} ms")
    del live
    gc.collect()  # a breaker and its machine form a cycle: free them now, not later


if __name__ == "__main__":
    main()
