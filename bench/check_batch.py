"""``POST /v1/check/batch`` on Redis: how long one batch of N checks takes.

One private redis-server (started here on a free port, stopped at the end), the service
app in process (httpx's ASGI transport: the handler's time, no sockets of our own),
batches of ``--size`` key+rule checks on distinct keys, ``--rounds`` times; prints the
median and best time per batch, and the same checks made by the library's concurrent
path (``asyncio.gather`` over ``AsyncRateLimiter.hit``) for comparison.

Run from the repository root::

    PYTHONPATH=src:. python bench/check_batch.py [--size 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# bench/redis.py would shadow redis-py: keep this directory off the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)


async def run(url: str, size: int, rounds: int) -> dict[str, list[float]]:
    import httpx

    from stormguard import AsyncRateLimiter
    from stormguard.service import create_app

    rules = [{"name": "api", "scope": "user", "limit": 1_000_000, "window": 60}]
    limiter = AsyncRateLimiter(url)
    app = create_app(limiter, rules=rules, admin_token=None)
    times: dict[str, list[float]] = {"batch": [], "gather": []}
    spec = app.service.source.current.get("api")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://bench") as c:
        body = {"checks": [{"key": f"user:{i}", "rule": "api"} for i in range(size)]}
        await c.post("/v1/check/batch", json=body)  # warm up (scripts loaded, connections)
        for _ in range(rounds):
            t0 = time.perf_counter()
            r = await c.post("/v1/check/batch", json=body)
            times["batch"].append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            assert len(r.json()["results"]) == size
        assert spec is not None
        rule = spec.rule
        for _ in range(rounds):
            t0 = time.perf_counter()
            await asyncio.gather(*(limiter.hit(f"user:{i}", rule) for i in range(size)))
            times["gather"].append(time.perf_counter() - t0)
    await limiter.aclose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from tests.redis_servers import start_redis

    server = start_redis()
    try:
        times = asyncio.run(run(server.url, args.size, args.rounds))
    finally:
        server.stop()
    print(f"| {args.size} checks on Redis | median ms | best ms |")
    print("| --- | --- | --- |")
    for name, label in (("batch", "POST /v1/check/batch"),
                        ("gather", "asyncio.gather(limiter.hit ...) (library)")):
        ts = times[name]
        print(f"| {label} | {statistics.median(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
