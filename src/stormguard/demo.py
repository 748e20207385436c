"""A one-minute tour of the limiter on the embedded store: ``python -m stormguard.demo``."""

from __future__ import annotations

from stormguard.ratelimit.limiter import RateLimiter
from stormguard.ratelimit.rule import Rule
from stormguard.stores.memory import MemoryStore
from stormguard.testing import FakeClock


def main() -> None:
    clock = FakeClock(start=1_700_000_040.0)  # 2023-11-14 22:14:00 UTC, a minute boundary
    limiter = RateLimiter(MemoryStore(clock=clock))
    print("stormguard demo: the same bot against each algorithm, 100 per minute\n")
    print(f"{'algorithm':<24}{'admitted of 200':>16}{'first Retry-After':>20}")
    for algorithm in ("fixed_window", "sliding_window_log", "sliding_window_counter",
                      "token_bucket", "gcra", "leaky_bucket"):
        rule = Rule(limit=100, window=60, algorithm=algorithm)
        admitted, retry = 0, None
        for _ in range(200):  # 200 requests in 2 seconds
            d = limiter.hit(f"bot:{algorithm}", rule)
            admitted += d.allowed
            if not d.allowed and retry is None:
                retry = d.headers()["Retry-After"]
            clock.advance(0.01)
        print(f"{algorithm:<24}{admitted:>16}{retry or '-':>20}")
    bucket = Rule(limit=2, window=1, burst=10, algorithm="token_bucket")
    clock.advance(60)
    admitted = sum(limiter.hit("bot", bucket).allowed for _ in range(500))
    print(f"\ntoken bucket 2/s burst 10, 500 requests at once: {admitted} admitted")
    d = limiter.hit("bot", bucket)
    print("headers of the next (denied) response:")
    for name, value in d.headers().items():
        print(f"  {name}: {value}")


if __name__ == "__main__":
    main()
