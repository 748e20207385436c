"""The overload load test: examples/shop_app.py under uvicorn (1 worker), open loop, at
1x, 2x and 4x its measured capacity, without protection, with a fixed concurrency
limit and with LoadSheddingMiddleware + AdaptiveLimit, in one run.

    python bench/overload.py                      # ~90 s; writes docs/overload.png
    python bench/overload.py --duration 1 --loads 1,4 --configs adaptive --plot ''

Open loop: requests leave on schedule (one every 1 / rate seconds) whether or not
earlier ones were answered, each on an idle keep-alive connection or a new one; a client
gives up after --timeout seconds (an answer later than that is not goodput). The mix:
20 % critical (POST /checkout 4 %, GET /cart 16 %), 30 % degraded (GET /reviews), 50 %
sheddable (GET /recommendations 30 %, GET /analytics 20 %). Capacity is measured first in
the same run (closed loop, 4 connections, no protection): requests/s at that mix.

The server runs with ``sys.setswitchinterval(0.001)`` (SHOP_SWITCH_INTERVAL; CPython's
default is 5 ms): the event loop, which answers every 503, gets the GIL back from the
CPU-bound worker threads sooner. Each (configuration, load) point gets a fresh server:
--warmup seconds at that load (not counted; the adaptive limit learns), then --duration
counted seconds. Targets (with shedding): critical success >= 99.5 % at 2x and >= 99 %
at 4x, critical p99 <= 3x its unloaded p99, shed requests answered within 5 ms p99,
goodput >= 90 % of capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIX = [("POST", "/checkout", "critical", 0.04), ("GET", "/cart", "critical", 0.16),
       ("GET", "/reviews", "degraded", 0.30),
       ("GET", "/recommendations", "sheddable", 0.30), ("GET", "/analytics", "sheddable", 0.20)]
TIERS = ("critical", "degraded", "sheddable")
CONFIGS = {"none": "no protection", "fixed": "fixed limit (8)",
           "adaptive": "LoadShedding + AdaptiveLimit"}
MAX_CONNECTIONS = 2000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """uvicorn running the shop in its own process (1 worker), stopped by PID."""

    def __init__(self, protection: str, switch: str = "0.001") -> None:
        self.port = free_port()
        env = dict(os.environ, SHOP_PROTECTION=protection, SHOP_SWITCH_INTERVAL=switch,
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.shop_app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1", "--no-access-log",
             "--log-level", "warning", "--no-proxy-headers"],
            cwd=ROOT, env=env)
        deadline = time.monotonic() + 30
        while True:  # real time: waiting for another process to listen
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Point:
    sent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    ok: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TIERS})
    shed: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TIERS})
    waited: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TIERS})
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    limits: list[int] = field(default_factory=list)  # the server's limit, sampled
    duration: float = 1.0

    def success(self, tier: str) -> float:
        return len(self.ok[tier]) / max(1, self.sent[tier])

    def goodput(self, tier: str | None = None) -> float:
        tiers = TIERS if tier is None else (tier,)
        return sum(len(self.ok[t]) for t in tiers) / self.duration

    def summary(self) -> dict[str, object]:
        return {"sent": self.sent, "ok": {t: len(v) for t, v in self.ok.items()},
                "shed": {t: len(v) for t, v in self.shed.items()},
                "shed_after_wait": {t: len(v) for t, v in self.waited.items()},
                "failed": self.failed,
                "p99_ok_ms": {t: p99ms(v) for t, v in self.ok.items()},
                "p99_shed_ms": p99ms([x for v in self.shed.values() for x in v]),
                "goodput": self.goodput(), "limits": self.limits}


def p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def p99ms(xs: list[float]) -> float:
    return round(p99(xs) * 1000, 1)


class Client:
    """A minimal HTTP/1.1 client on asyncio streams: keep-alive connections, no pipelining
    (cheap enough that the generator stays ahead of its schedule on a loaded machine)."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0

    async def request(self, method: str, path: str) -> tuple[int, bytes]:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            if self.open >= MAX_CONNECTIONS:
                raise ConnectionError("client connection cap")
            self.open += 1
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except BaseException:
                self.open -= 1
                raise
        try:
            writer.write(f"{method} {path} HTTP/1.1\r\nhost: shop\r\ncontent-length: 0\r\n\r\n"
                         .encode())
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("closed")
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
        except BaseException:
            self.open -= 1
            writer.close()
            raise
        self.idle.append((reader, writer))
        return int(status_line.split()[1]), body

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def offer(port: int, rate: float, seconds: float, give_up: float, rng: random.Random,
                point: Point | None) -> None:
    """Open loop: one request every 1 / rate s for ``seconds``; results into ``point``."""
    client = Client(port, give_up)
    loop = asyncio.get_running_loop()
    weights = [m[3] for m in MIX]
    tasks = []

    async def one(method: str, path: str, tier: str) -> None:
        t0 = loop.time()
        try:
            async with asyncio.timeout(give_up):
                status, body = await client.request(method, path)
        except (TimeoutError, OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            if point is not None:
                point.failed[tier] += 1
            return
        took = loop.time() - t0
        if point is None:
            return
        if status == 200:
            point.ok[tier].append(took)
        elif status == 503:
            reason = json.loads(body).get("reason")
            (point.waited if reason == "queue_timeout" else point.shed)[tier].append(took)
        else:
            point.failed[tier] += 1

    async def watch() -> None:  # the server's limit every 100 ms (an exempt path)
        probe = Client(port, give_up)
        try:
            while True:
                await asyncio.sleep(0.1)
                try:
                    status, body = await probe.request("GET", "/stats")
                except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                    continue
                if status == 200 and point is not None and b"limit" in body:
                    point.limits.append(json.loads(body)["limit"])
        finally:
            probe.close()

    watcher = asyncio.create_task(watch())
    start = loop.time()
    n = int(rate * seconds)
    for i in range(n):
        method, path, tier, _ = rng.choices(MIX, weights)[0]
        if point is not None:
            point.sent[tier] += 1
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(method, path, tier)))
    await asyncio.gather(*tasks)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    client.close()
    await asyncio.sleep(0)  # let the closed transports go


async def closed_loop(port: int, seconds: float, connections: int, rng: random.Random) -> float:
    """Requests/s at the mix with ``connections`` clients each sending the next request
    when the last is answered: the capacity."""
    weights = [m[3] for m in MIX]
    done = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def worker() -> None:
        nonlocal done
        client = Client(port, 10.0)
        while loop.time() < end:
            method, path, _, _ = rng.choices(MIX, weights)[0]
            status, _ = await client.request(method, path)
            done += status == 200
        client.close()

    t0 = loop.time()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return done / (loop.time() - t0)


def measure(protection: str, rate: float, args: argparse.Namespace, seed: int) -> Point:
    server = Server(protection)
    try:
        point = Point(duration=args.duration)
        rng = random.Random(seed)

        async def run() -> None:
            await offer(server.port, rate, args.warmup, args.timeout, rng, None)
            await offer(server.port, rate, args.duration, args.timeout, rng, point)

        asyncio.run(run())
        return point
    finally:
        server.stop()


def plot(path: Path, loads: list[float], results: dict[str, dict[float, Point]],
         capacity: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2))
    styles = {"none": ":", "fixed": "--", "adaptive": "-"}
    colors = {"critical": "tab:red", "degraded": "tab:orange", "sheddable": "tab:blue"}
    for config, points in results.items():
        ax1.plot(loads, [points[x].goodput() / capacity for x in loads], styles[config],
                 color="black", marker="o", label=f"all tiers, {CONFIGS[config]}")
        for tier in TIERS:
            if config in ("adaptive", "none"):
                ax1.plot(loads, [points[x].goodput(tier) / capacity for x in loads],
                         styles[config], color=colors[tier], marker=".",
                         label=f"{tier}, {CONFIGS[config]}")
                ax2.plot(loads, [p99(points[x].ok[tier]) * 1000 for x in loads],
                         styles[config], color=colors[tier], marker="o",
                         label=f"{tier}, {CONFIGS[config]}")
    ax1.set(xlabel="offered load (x capacity)", ylabel="goodput (x capacity)",
            title="goodput (200 within the client timeout)")
    ax2.set(xlabel="offered load (x capacity)", ylabel="p99 of 200s (ms, log)",
            title="p99 latency per tier", yscale="log")
    ax1.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    ax2.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    for ax in (ax1, ax2):
        ax.set_xticks(loads)
        ax.grid(alpha=0.3)
    fig.suptitle(f"examples/shop_app.py, uvicorn 1 worker, capacity {capacity:.0f} req/s "
                 "(bench/overload.py)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="1,2,4")
    ap.add_argument("--configs", default="none,fixed,adaptive")
    ap.add_argument("--duration", type=float, default=4.0, help="counted seconds per point")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds per point, not counted")
    ap.add_argument("--capacity-seconds", type=float, default=3.0)
    ap.add_argument("--capacity", type=float, default=0.0, help="skip measuring: req/s")
    ap.add_argument("--timeout", type=float, default=2.0, help="client timeout (s)")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "overload.png"))
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")

    capacity = args.capacity
    if not capacity:  # the best of two closed-loop runs: the machine's load comes and goes
        server = Server("none")
        try:
            runs = [asyncio.run(closed_loop(server.port, args.capacity_seconds / 2, 4,
                                            random.Random(i))) for i in range(2)]
        finally:
            server.stop()
        capacity = max(runs)
        print(f"capacity runs: {', '.join(f'{r:.1f}' for r in runs)} req/s")
    print(f"capacity: {capacity:.1f} req/s at the mix (closed loop, 4 connections, "
          f"no protection); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    unloaded = measure("adaptive" if "adaptive" in configs else configs[0], 0.25 * capacity,
                       args, seed=99)
    base_p99 = p99(unloaded.ok["critical"])
    print(f"unloaded (0.25x): critical p99 {base_p99 * 1000:.1f} ms")

    results: dict[str, dict[float, Point]] = {c: {} for c in configs}
    for load in loads:  # the configurations side by side at each load, as close in time
        for config in configs:
            results[config][load] = measure(config, load * capacity, args, seed=int(load * 10))
        print(f"  {load:g}x done, load average {os.getloadavg()[0]:.1f}", flush=True)

    print(f"\n{'config':<30} {'load':>4} | {'critical':>9} {'degraded':>9} {'sheddable':>9} | "
          f"{'p99 crit':>8} {'x unl.':>6} | {'shed p99':>8} {'waited':>6} | {'goodput':>8} | "
          "limit")
    for config in configs:
        for load in loads:
            pt = results[config][load]
            shed_all = [x for t in TIERS for x in pt.shed[t]]
            waited = sum(len(pt.waited[t]) for t in TIERS)
            crit = p99(pt.ok["critical"])
            print(f"{CONFIGS[config]:<30} {load:>3g}x | "
                  + " ".join(f"{pt.success(t):>9.2%}" for t in TIERS)
                  + f" | {crit * 1000:>6.1f}ms {crit / base_p99:>5.1f}x"
                  + f" | {p99(shed_all) * 1000:>6.1f}ms {waited:>6}"
                  + f" | {pt.goodput() / capacity:>7.0%}"
                  + (f" | {min(pt.limits)}-{sorted(pt.limits)[len(pt.limits) // 2]}-"
                     f"{max(pt.limits)}" if pt.limits else " | -"))
    print("(success: 200 within the client timeout / sent; shed p99: 503s answered at once; "
          "waited: 503s after waiting queue_timeout in vain; goodput: 200s/s / capacity; "
          "limit: min-median-max of the server's limit)")
    if "adaptive" in results and "none" in results:
        def ratio(a: float, b: float) -> str:
            return f"{a / b:.1f}x" if b else ("same (both 0)" if not a else "inf (none: 0)")

        for load in loads:
            a, n = results["adaptive"][load], results["none"][load]
            print(f"{load:g}x: adaptive / none: critical success "
                  f"{ratio(a.success('critical'), n.success('critical'))}, "
                  f"goodput {ratio(a.goodput(), n.goodput())}")
    if args.plot:
        plot(Path(args.plot), loads, results, capacity)
        print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"capacity": capacity, "unloaded_critical_p99_ms": base_p99 * 1000,
             "points": {c: {str(x): p.summary() for x, p in pts.items()}
                        for c, pts in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
