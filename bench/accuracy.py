"""How wrong is the sliding window counter? Replay a synthetic trace through it and
through the exact sliding window log (and fixed window, for scale).

    PYTHONPATH=src python bench/accuracy.py            # 10,000 sources, ~1.5M requests
    PYTHONPATH=src python bench/accuracy.py --quick    # a tenth of that

The trace (deterministic seed): mostly well-behaved users (Poisson arrivals below the
limit), bursty users (quiet, then dozens of requests in a few seconds), and bots (steady
floods, plus "boundary bots" that fire a full quota just before and just after each
minute boundary). Every source is its own key; the rule is 100/minute, windows
epoch-aligned. The pure algorithms are called directly (the MemoryStore adds nothing to
the arithmetic).

Two ways of counting errors:

* vs the exact rule: each decision is compared with what the exact sliding window would
  decide given the requests *this limiter actually admitted* (no drift between the
  two histories). This is the figure comparable to Cloudflare's.
* vs an independent exact limiter: the same trace through sliding_window_log with its own
  state; a request is "wrongly admitted" when ours admits it and the log denies it.

An under-limit source is one whose raw requests never exceed 100 in any 60 s interval:
the exact limiter never denies it, so any denial is a false positive.
"""

from __future__ import annotations

import argparse
import random
import time
from bisect import bisect_right
from typing import Any

from stormguard.ratelimit.algorithms import (
    Algorithm,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
)

LIMIT = 100
WINDOW_S = 60
W = WINDOW_S * 1_000_000
T0 = 1_700_000_040 * 1_000_000  # a minute boundary (epoch microseconds)


def poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out = []
    t = start + rng.expovariate(rate)
    while t < end:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def make_trace(sources: int, duration: float, seed: int) -> dict[str, list[list[int]]]:
    """kind -> list of per-source sorted request times (epoch µs)."""
    rng = random.Random(seed)
    n_bots = sources * 3 // 100
    n_bursty = sources // 10
    n_users = sources - n_bots - n_bursty
    trace: dict[str, list[list[int]]] = {"user": [], "bursty": [], "bot": []}
    for _ in range(n_users):  # 12 to 72 requests/minute on average
        ts = poisson(rng, rng.uniform(0.2, 1.2), 0, duration)
        trace["user"].append([T0 + int(t * 1e6) for t in ts])
    for _ in range(n_bursty):
        ts = poisson(rng, rng.uniform(0.05, 0.3), 0, duration)
        t = rng.uniform(0, 60)
        while t < duration:  # a burst every 30 s to 5 min: 20 to 120 requests in 1-8 s
            n = rng.randint(20, 120)
            span = rng.uniform(1, 8)
            ts.extend(t + rng.uniform(0, span) for _ in range(n))
            t += rng.uniform(30, 300)
        trace["bursty"].append(sorted(T0 + int(t * 1e6) for t in ts if t < duration))
    for b in range(n_bots):
        if b % 5 == 0:  # boundary bot: 100 in the last second of a minute, 100 in the next
            ts = []
            for m in range(1, int(duration // 60) + 1):
                edge = m * 60.0
                ts.extend(edge - rng.uniform(0, 1) for _ in range(LIMIT))
                ts.extend(edge + rng.uniform(0, 1) for _ in range(LIMIT))
            ts = sorted(t for t in ts if t < duration)
        else:  # steady flood of 2 to 8 requests per second, starting anywhere
            start = rng.uniform(0, duration / 2)
            ts = poisson(rng, rng.uniform(2, 8), start, duration)
        trace["bot"].append([T0 + int(t * 1e6) for t in ts])
    return trace


def under_limit(times: list[int]) -> bool:
    """True when no half-open interval [t, t + W) holds more than LIMIT requests."""
    return all(j + LIMIT >= len(times) or times[j + LIMIT] >= t + W
               for j, t in enumerate(times))


def replay(algo: Algorithm, times: list[int], exact: SlidingWindowLog) -> tuple[
        list[bool], int, int]:
    """Decisions of ``algo``, and how many disagree with the exact rule applied to the
    requests ``algo`` admitted: (decisions, wrongly_admitted, wrongly_denied)."""
    decide = algo.decide
    state: Any = None
    admitted: list[int] = []
    out = []
    wa = wd = 0
    for now in times:
        ok, new, *_ = decide(state, now, 1, True)
        live = len(admitted) - bisect_right(admitted, now - W)
        should = live + 1 <= LIMIT
        if ok:
            state = new
            admitted.append(now)
            wa += not should
        else:
            wd += should
        out.append(ok)
    return out, wa, wd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 sources")
    parser.add_argument("--sources", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of traffic")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    sources = 1_000 if args.quick else args.sources
    t = time.perf_counter()
    trace = make_trace(sources, args.duration, args.seed)
    all_sources = [(k, ts) for k, lst in trace.items() for ts in lst]
    total = sum(len(ts) for _, ts in all_sources)
    print(f"trace: {len(all_sources):,} sources ({len(trace['user']):,} users, "
          f"{len(trace['bursty']):,} bursty, {len(trace['bot']):,} bots), {total:,} requests "
          f"over {args.duration:g} s, rule {LIMIT}/{WINDOW_S}s, seed {args.seed} "
          f"(built in {time.perf_counter() - t:.1f} s)")
    by_kind = {k: sum(len(ts) for ts in lst) for k, lst in trace.items()}
    print("requests by kind: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_kind.items()))

    exact = SlidingWindowLog(LIMIT, W, LIMIT)
    algos = {"sliding_window_counter": SlidingWindowCounter(LIMIT, W, LIMIT),
             "fixed_window": FixedWindow(LIMIT, W, LIMIT)}
    t = time.perf_counter()
    log_decisions = [replay(exact, ts, exact)[0] for _, ts in all_sources]
    exact_admitted = sum(sum(d) for d in log_decisions)
    is_under = [under_limit(ts) for _, ts in all_sources]
    print(f"exact sliding_window_log admits {exact_admitted / total:.2%} of requests; "
          f"{sum(is_under):,} sources ({sum(is_under) / len(all_sources):.1%}) never exceed "
          "the limit in any 60 s interval")
    kinds = [*trace, "all"]
    for name, algo in algos.items():
        # per kind: requests, wrongly admitted, wrongly denied, independent +/-, under, victims
        acc = {k: [0, 0, 0, 0, 0, 0, 0] for k in kinds}
        for i, (kind, ts) in enumerate(all_sources):
            decisions, a, d = replay(algo, ts, exact)
            ind_a = ind_d = 0
            for ours, ref in zip(decisions, log_decisions[i], strict=True):
                if ours != ref:
                    if ours:
                        ind_a += 1
                    else:
                        ind_d += 1
            row = (len(ts), a, d, ind_a, ind_d, is_under[i], is_under[i] and not all(decisions))
            for k in (kind, "all"):
                acc[k] = [x + y for x, y in zip(acc[k], row, strict=True)]
        print(f"\n{name} (shares of the requests of each kind)")
        print(f"{'kind':<8}{'requests':>11}{'wrongly':>11}{'wrongly':>11}{'total':>11}"
              f"{'vs independent log':>24}{'under-limit sources':>24}")
        print(f"{'':<8}{'':>11}{'admitted':>11}{'denied':>11}{'wrong':>11}"
              f"{'admitted+':>12}{'denied+':>12}{'ever denied':>24}")
        for k in kinds:
            n, a, d, ia, idn, under, victims = acc[k]
            print(f"{k:<8}{n:>11,}{a / n:>11.4%}{d / n:>11.4%}{(a + d) / n:>11.4%}"
                  f"{ia / n:>12.4%}{idn / n:>12.4%}"
                  f"{f'{victims:,} of {under:,} ({victims / max(under, 1):.2%})':>24}")
    print(f"\n(replayed in {time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
