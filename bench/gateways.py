"""Benchmark of Envoy's rate-limit service (gRPC) beside ``/v1/check`` (HTTP), in one run
(not a test).

    PYTHONPATH=src python bench/gateways.py [--duration 5] [--streams 64] [--rounds 3]

Targets, each its own process, one at a time, in ``--rounds`` interleaved rounds (each keeps
its best round: the machine is shared):

* ``grpc/bare``: a grpc.aio server answering every ``ShouldRateLimit`` with a constant OK
  (no limiter): the ceiling of Python's gRPC stack with this client;
* ``grpc/ShouldRateLimit``: ``stormguard serve --grpc-port`` with an envoyproxy/ratelimit
  configuration (one key-only descriptor, 1,000 values, a limit nothing reaches);
* ``http/v1/check``: the same ``serve`` process, ``POST /v1/check`` with a key and an inline
  limit on the same 1,000 keys;
* with ``--redis``, both again on a ``serve`` over a private redis-server (``RedisStore``).

The load: ``--streams`` concurrent calls for ``--duration`` seconds after a 1 s warm-up,
from this process on asyncio (grpc.aio over one HTTP/2 channel; HTTP/1.1 keep-alive over
``--streams`` raw connections, so neither client parses more than it must). Prints calls/s,
p50/p99 latency and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEYS = 1000
CONFIG = textwrap.dedent("""\
    domain: bench
    descriptors:
      - key: client
        rate_limit:
          unit: minute
          requests_per_unit: 1000000000
""")
BARE = textwrap.dedent("""
    import asyncio, sys
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    OK = rls_pb2.RateLimitResponse(overall_code=1, statuses=[
        rls_pb2.RateLimitResponse.DescriptorStatus(code=1, limit_remaining=1)])

    class S(rls_pb2_grpc.RateLimitServiceServicer):
        async def ShouldRateLimit(self, request, context):
            return OK

    async def main():
        server = grpc.aio.server()
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(S(), server)
        server.add_insecure_port("127.0.0.1:" + sys.argv[1])
        await server.start()
        await server.wait_for_termination()

    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"target exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)  # real time: a real process binding its port
    raise SystemExit(f"port {port} not open after {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return e


async def load(call: Any, streams: int, duration: float, warmup: float
               ) -> tuple[float, float, float]:
    """``streams`` concurrent loops of ``call(i)``: (calls/s, p50 ms, p99 ms)."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + warmup + duration
    measure_from = time.perf_counter() + warmup
    count = 0

    async def loop(worker: int) -> None:
        nonlocal count
        i = worker
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            await call(i % KEYS)
            t1 = time.perf_counter()
            if t0 >= measure_from:
                latencies.append(t1 - t0)
                count += 1
            i += streams

    await asyncio.gather(*(loop(w) for w in range(streams)))
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000 if latencies else float("nan")
    p99 = latencies[int(len(latencies) * 0.99)] * 1000 if latencies else float("nan")
    return count / duration, p50, p99


async def grpc_target(port: int, args: argparse.Namespace) -> tuple[float, float, float]:
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    d = ratelimit_pb2.RateLimitDescriptor
    requests = [rls_pb2.RateLimitRequest(domain="bench", descriptors=[
        d(entries=[d.Entry(key="client", value=f"c{i}")])]) for i in range(KEYS)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        first = await stub.ShouldRateLimit(requests[0], timeout=10)
        assert first.overall_code == 1, first

        async def call(i: int) -> None:
            await stub.ShouldRateLimit(requests[i], timeout=10)

        return await load(call, args.streams, args.duration, args.warmup)


async def http_target(port: int, args: argparse.Namespace) -> tuple[float, float, float]:
    bodies = [(b'{"key":"c%d","limit":1000000000,"window":60,"algorithm":"fixed_window"}' % i)
              for i in range(KEYS)]
    requests = [b"POST /v1/check HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies]
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(args.streams)]
    free = asyncio.Queue[Any]()
    for c in conns:
        free.put_nowait(c)

    async def call(i: int) -> None:
        reader, writer = await free.get()
        writer.write(requests[i])
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        free.put_nowait((reader, writer))

    try:
        return await load(call, args.streams, args.duration, args.warmup)
    finally:
        for _, writer in conns:
            writer.close()


def in_process(n: int = 20_000) -> tuple[float, float]:
    """Microseconds per call of the service's own work, no sockets: (descriptor check,
    check + building the protobuf response)."""
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2

    from stormguard import AsyncRateLimiter
    from stormguard.gateways import EnvoyChecker, loads_envoy_config
    from stormguard.gateways.grpc import to_response

    checker = EnvoyChecker(AsyncRateLimiter("memory://"), loads_envoy_config(CONFIG))
    d = ratelimit_pb2.RateLimitDescriptor
    requests = [rls_pb2.RateLimitRequest(domain="bench", descriptors=[
        d(entries=[d.Entry(key="client", value=f"c{i}")])]) for i in range(KEYS)]

    async def run(build: bool) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            r = requests[i % KEYS]
            descs = [([(e.key, e.value) for e in x.entries], 0) for x in r.descriptors]
            result = await checker.check(r.domain, descs, r.hits_addend)
            if build:
                to_response(result, False)
        return (time.perf_counter() - t0) / n * 1e6

    return asyncio.run(run(False)), asyncio.run(run(True))


def run_round(args: argparse.Namespace, cfg: Path) -> dict[str, tuple[float, float, float]]:
    out: dict[str, tuple[float, float, float]] = {}
    port = free_port()
    bare = subprocess.Popen([sys.executable, "-c", BARE, str(port)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, bare)
        out["grpc/bare (constant OK, no limiter)"] = asyncio.run(grpc_target(port, args))
    finally:
        stop(bare)
    stores = [("memory store", "memory://")]
    if args.redis_url:
        stores.append(("redis store", args.redis_url))
    for label, url in stores:
        http, grpc_port = free_port(), free_port()
        serve = subprocess.Popen([sys.executable, "-m", "stormguard", "serve", "--port",
                                  str(http), "--grpc-port", str(grpc_port), "--envoy-config",
                                  str(cfg), "--store", url, "--http", "httptools",
                                  "--log-level", "warning"],
                                 env=env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            wait_port(http, serve)
            wait_port(grpc_port, serve)
            out[f"grpc/ShouldRateLimit (serve, {label})"] = asyncio.run(
                grpc_target(grpc_port, args))
            out[f"http/v1/check (same serve, {label})"] = asyncio.run(
                http_target(http, args))
        finally:
            stop(serve)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    ap.add_argument("--in-process", type=int, default=20_000, metavar="N",
                    help="calls of the in-process measurement")
    ap.add_argument("--redis", action="store_true",
                    help="also on a private redis-server (needs redis-server on the PATH)")
    args = ap.parse_args()
    args.redis_url = None
    redis = None
    if args.redis:
        import shutil

        port = free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                                  str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=subprocess.DEVNULL)
        wait_port(port, redis)
        args.redis_url = f"redis://127.0.0.1:{port}/0"
    try:
        best = _measure(args)
    finally:
        if redis is not None:
            stop(redis)
    _report(args, best)


def _measure(args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench.yaml"
        cfg.write_text(CONFIG)
        best: dict[str, tuple[float, float, float]] = {}
        for _ in range(args.rounds):
            for name, r in run_round(args, cfg).items():
                if name not in best or r[0] > best[name][0]:
                    best[name] = r
    return best


def _report(args: argparse.Namespace, best: dict[str, tuple[float, float, float]]) -> None:
    print(f"\n{args.streams} concurrent calls, {args.duration:g} s per target, best of "
          f"{args.rounds} rounds; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; client: this process (asyncio)")
    print(f"| {'target':<44} | {'calls/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} |")
    print(f"|{'-' * 46}|{'-' * 9}:|{'-' * 8}:|{'-' * 8}:|")
    for name, (rps, p50, p99) in best.items():
        print(f"| {name:<44} | {rps:>8.0f} | {p50:>7.2f} | {p99:>7.2f} |")
    check_us, full_us = in_process(args.in_process)
    print(f"\nin-process, no sockets: the descriptor check {check_us:.1f} µs/call, with the "
          f"protobuf response {full_us:.1f} µs/call")
    g = best["grpc/ShouldRateLimit (serve, memory store)"][0]
    bare = best["grpc/bare (constant OK, no limiter)"][0]
    http = best["http/v1/check (same serve, memory store)"][0]
    print(f"\nShouldRateLimit / bare gRPC: {g / bare:.2f}x; "
          f"ShouldRateLimit / HTTP /v1/check: {g / http:.2f}x")


if __name__ == "__main__":
    main()
