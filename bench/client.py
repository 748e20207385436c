"""Benchmark of ``stormguard.client.ServiceStore`` against calling ``/v1/check`` by hand
with httpx (not a test).

    PYTHONPATH=src python bench/client.py [--n 3000] [--concurrency 1 8 64] [--rounds 3]

One ``stormguard serve`` process (memory store, one rule, started here on a free
loopback port with ``--http httptools``, stopped at the end). Targets, each in
``--rounds`` interleaved rounds keeping its best (the machine is shared):

* blocking, one caller: ``RateLimiter(ServiceStore(url)).hit`` in a loop against an
  ``httpx.Client`` posting ``{"key", "rule"}`` and reading the JSON answer by hand;
* asyncio, ``--concurrency`` callers on one loop (1, 8 and 64 by default):
  ``AsyncRateLimiter(ServiceStore(url))``
  (concurrent checks become ``/v1/check/batch`` requests) against one
  ``httpx.AsyncClient`` with a ``/v1/check`` per check.

Prints checks/s and the ratio of the client to the hand-written loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from stormguard import AsyncRateLimiter, RateLimiter, Rule  # noqa: E402
from stormguard.client import ServiceStore  # noqa: E402

RULES = "rules:\n  - {name: bench, scope: user, limit: 1000000, window: 1h}\n"
RULE = Rule(1_000_000, 3600, name="bench")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_serve(rules: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("STORMGUARD_ADMIN_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stormguard", "serve", "--port", str(port), "--rules",
         str(rules), "--http", "httptools", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # waiting for a real process to bind its port
    proc.kill()
    raise SystemExit(f"stormguard serve did not start: {proc.communicate()[1].decode()}")


def sync_client(base: str, n: int) -> float:
    with RateLimiter(ServiceStore(base, rules="named", timeout=5)) as limiter:
        limiter.hit("user:warm", RULE)
        t0 = time.perf_counter()
        for i in range(n):
            d = limiter.hit(f"user:{i % 1000}", RULE)
            assert d.allowed
            assert not d.degraded
        return n / (time.perf_counter() - t0)


def sync_by_hand(base: str, n: int) -> float:
    with httpx.Client(base_url=base, timeout=5) as client:
        client.post("/v1/check", json={"key": "user:warm", "rule": "bench"})
        t0 = time.perf_counter()
        for i in range(n):
            r = client.post("/v1/check", json={"key": f"user:{i % 1000}", "rule": "bench"})
            assert r.status_code == 200
            assert r.json()["allowed"]
        return n / (time.perf_counter() - t0)


async def _callers(concurrency: int, n: int, one: Callable[[int], Awaitable[None]]) -> float:
    per = n // concurrency

    async def caller(c: int) -> None:
        for i in range(per):
            await one(c * per + i)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(concurrency)))
    return per * concurrency / (time.perf_counter() - t0)


async def async_client(base: str, n: int, concurrency: int) -> float:
    store = ServiceStore(base, rules="named", timeout=5)
    limiter = AsyncRateLimiter(store)

    async def one(i: int) -> None:
        d = await limiter.hit(f"user:{i % 1000}", RULE)
        assert d.allowed
        assert not d.degraded

    await limiter.hit("user:warm", RULE)
    rate = await _callers(concurrency, n, one)
    await limiter.aclose()
    return rate


async def async_by_hand(base: str, n: int, concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=5, limits=limits) as client:
        async def one(i: int) -> None:
            r = await client.post("/v1/check", json={"key": f"user:{i % 1000}",
                                                     "rule": "bench"})
            assert r.status_code == 200
            assert r.json()["allowed"]

        await one(0)
        return await _callers(concurrency, n, one)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000, help="checks per target and round")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64],
                    help="asyncio callers on one loop (one pair of rows each)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.yaml"
        rules.write_text(RULES)
        proc, base = start_serve(rules)
        try:
            best: dict[str, float] = {}
            targets: dict[str, Callable[[], float]] = {
                "blocking: httpx by hand": lambda: sync_by_hand(base, args.n),
                "blocking: ServiceStore": lambda: sync_client(base, args.n),
            }
            for c in args.concurrency:
                targets[f"asyncio x{c}: httpx by hand"] = (
                    lambda c=c: asyncio.run(async_by_hand(base, args.n, c)))
                targets[f"asyncio x{c}: ServiceStore"] = (
                    lambda c=c: asyncio.run(async_client(base, args.n, c)))
            for _ in range(args.rounds):
                for name, run in targets.items():
                    best[name] = max(best.get(name, 0.0), run())
        finally:
            proc.terminate()
            proc.communicate(timeout=20)
    names = list(best)
    print(f"{'target':<40} {'checks/s':>10} {'vs by hand':>11}")
    for i, name in enumerate(names):
        ratio = best[name] / best[names[i - 1]] if i % 2 else 1.0
        print(f"{name:<40} {best[name]:>10.0f} {ratio:>10.2f}x")


if __name__ == "__main__":
    main()
