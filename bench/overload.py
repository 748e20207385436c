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

The server runs with ``sys.setswitchinterval(0.0001)`` (--switch, SHOP_SWITCH_INTERVAL;
CPython's default is 5 ms) under uvicorn's default loop and parser (uvloop, httptools;
--server-args for others): the event loop, which answers every 503, gets the GIL back
from the CPU-bound worker threads sooner. --gil-waits measures the loop's GIL wait per
503 per loop, parser and switch interval (perf trace); --switch-cost what the switch
interval costs the handlers' throughput. Each (configuration, load) point gets a fresh server:
--warmup seconds at that load (not counted; the adaptive limit learns), then --duration
counted seconds. Targets (with shedding): critical success >= 99.5 % at 2x and >= 99 %
at 4x, critical p99 <= 3x its unloaded p99, shed requests answered within 5 ms p99,
goodput >= 90 % of capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
#: extra uvicorn arguments for every server of the run (--server-args), e.g. the event loop
#: and the HTTP parser: ["--loop", "asyncio", "--http", "h11"]
SERVER_ARGS: list[str] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """uvicorn running the shop in its own process (1 worker), stopped by PID."""

    def __init__(self, protection: str, switch: str = "0.0001", **extra: str) -> None:
        self.port = free_port()
        env = dict(os.environ, SHOP_PROTECTION=protection, SHOP_SWITCH_INTERVAL=switch,
                   SHOP_TRACE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                   **extra)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.shop_app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1", "--no-access-log",
             "--log-level", "warning", "--no-proxy-headers", *SERVER_ARGS],
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

    def cpu(self) -> float:
        """The server process's CPU seconds so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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
    #: 503s per tier and reason ("capacity", "codel", "queue_timeout")
    reasons: dict[str, dict[str, int]] = field(default_factory=lambda: {t: {} for t in TIERS})
    duration: float = 1.0
    #: per request id: tier, path, when it was due, sent, answered (client side), status
    client: dict[str, tuple[str, str, float, float, float, int]] = field(default_factory=dict)
    #: per request id: the server's trace row (examples/shop_app.py, Trace)
    server: dict[str, list[float | None]] = field(default_factory=dict)
    cpu: float = 0.0  # the server's CPU seconds during the counted part

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
                "p99_all_503_ms": p99ms([x for d in (self.shed, self.waited)
                                         for v in d.values() for x in v]),
                "goodput": self.goodput(), "limits": self.limits, "reasons": self.reasons,
                "server_cpu_share": self.cpu / self.duration}


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

    async def one(i: int, method: str, path: str, tier: str, due: float) -> None:
        t0 = loop.time()
        try:
            async with asyncio.timeout(give_up):
                status, body = await client.request(method, f"{path}?i={i}")
        except (TimeoutError, OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            if point is not None:
                point.failed[tier] += 1
                point.client[str(i)] = (tier, path, due, t0, loop.time(), 0)
            return
        took = loop.time() - t0
        if point is None:
            return
        waited = status == 503 and b'"queue_timeout"' in body
        point.client[str(i)] = (tier, path, due, t0, t0 + took, 5030 if waited else status)
        if status == 200:
            point.ok[tier].append(took)
        elif status == 503:
            reason = json.loads(body).get("reason")
            point.reasons[tier][str(reason)] = point.reasons[tier].get(str(reason), 0) + 1
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
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, method, path, tier, due)))
    await asyncio.gather(*tasks)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    status, body = await client.request("GET", "/trace")  # the server's side of it
    if point is not None and status == 200:
        point.server = {row[0]: row[1:] for row in json.loads(body)}
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


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def breakdown(pt: Point) -> list[str]:
    """Where the time of a request goes, p50 / p99 in ms, per tier and answer, from the
    client's timestamps and the server's trace (one clock: CLOCK_MONOTONIC)."""
    spans: dict[tuple[str, int], dict[str, list[float]]] = {}
    for i, (tier, _path, due, sent, answered, status) in pt.client.items():
        row = pt.server.get(i)
        if row is None or status not in (200, 503, 5030):
            continue
        _, arrive, granted, run, ran, _done, out = row
        assert isinstance(arrive, float)
        assert isinstance(out, float)
        d = spans.setdefault((tier, status), {k: [] for k in (
            "late", "in", "wait", "to thread", "run", "back", "out", "server", "total")})
        d["late"].append(sent - due)          # the generator was behind its schedule
        d["in"].append(arrive - sent)         # socket -> the server's loop reads, parses it
        if status == 200 and granted is not None and run is not None and ran is not None:
            d["wait"].append(granted - arrive)  # for a slot
            d["to thread"].append(run - granted)  # the thread pool picks it up
            d["run"].append(ran - run)        # the handler's CPU work, GIL shared
            d["back"].append(out - ran)       # response written by the loop
        d["out"].append(answered - out)       # server wrote it -> the generator read it
        d["server"].append(out - arrive)
        d["total"].append(answered - sent)
    lines = [f"    {'tier':<9} {'answer':>6} {'n':>5} | " + " | ".join(
        f"{k:>11}" for k in ("late", "in", "wait", "to thread", "run", "back", "out",
                             "server", "total"))]
    lines.append("    (503: shed on arrival; 503 w: shed after waiting its queue_timeout)")
    for (tier, status), d in sorted(spans.items(), key=lambda kv: (TIERS.index(kv[0][0]),
                                                                    kv[0][1])):
        cells = []
        for k in ("late", "in", "wait", "to thread", "run", "back", "out", "server", "total"):
            xs = d[k]
            cells.append(f"{pct(xs, .5) * 1e3:>5.1f}/{pct(xs, .99) * 1e3:<5.1f}" if xs
                         else f"{'-':>11}")
        answer = {200: "200", 503: "503", 5030: "503 w"}[status]
        lines.append(f"    {tier:<9} {answer:>6} {len(d['total']):>5} | " + " | ".join(cells))
    return lines


def cpu_per_request(protection: str, paths: list[tuple[str, str]], seconds: float,
                    connections: int, **extra: str) -> dict[str, float]:
    """The server's CPU seconds per answered request, per (method, path), closed loop."""
    server = Server(protection, **extra)
    out: dict[str, float] = {}
    try:
        async def one_path(method: str, path: str) -> None:
            loop = asyncio.get_running_loop()
            clients = [Client(server.port, 10.0) for _ in range(connections)]
            for c in clients:  # connected before the count starts
                await c.request("GET", "/healthz")
            done = 0
            end = loop.time() + seconds

            async def worker(c: Client) -> None:
                nonlocal done
                while loop.time() < end:
                    await c.request(method, path)
                    done += 1

            cpu = server.cpu()
            await asyncio.gather(*(worker(c) for c in clients))
            out[path] = (server.cpu() - cpu) / max(1, done)
            for c in clients:
                c.close()

        async def run() -> None:
            for method, path in paths:
                await one_path(method, path)

        asyncio.run(run())
    finally:
        server.stop()
    return out


def gil_handoffs(switches: list[str], burners: list[int], rate: float, seconds: float
                 ) -> list[str]:
    """A 503's latency (client side) while k threads burn CPU in the server, as k
    CPU-bound requests in flight do, at each switch interval."""
    lines = [f"    {'switch':>7} " + " ".join(f"{f'{k} busy':>15}" for k in burners)
             + "   (503 answer p50/p99 ms, arrival -> answer read)"]
    for switch in switches:
        cells = []
        for k in burners:
            server = Server("shed-all", switch=switch, SHOP_BURNERS=str(k))
            try:
                point = Point(duration=seconds)

                async def run(port: int = server.port, pt: Point = point) -> None:
                    await offer(port, rate, 0.3, 2.0, random.Random(1), None)
                    await offer(port, rate, seconds, 2.0, random.Random(2), pt)

                asyncio.run(run())
            finally:
                server.stop()
            xs = [c[4] - c[3] for c in point.client.values() if c[5] in (503, 5030)]
            cells.append(f"{pct(xs, .5) * 1e3:>7.2f}/{pct(xs, .99) * 1e3:<7.2f}")
        lines.append(f"    {float(switch) * 1e3:>5.1f}ms " + " ".join(f"{c:>15}" for c in cells))
    return lines


def switch_cost(switches: list[str], connections: list[int], seconds: float) -> list[str]:
    """What a switch interval costs the CPU-bound handlers: closed-loop requests/s at the
    mix and the server's CPU per answered request, with k connections (k handlers sharing
    the core under the GIL), no protection, at each switch interval."""
    lines = [f"    {'switch':>7} " + " ".join(f"{f'{k} conn':>17}" for k in connections)
             + "   (requests/s, server CPU ms per request)"]
    for switch in switches:
        cells = []
        for k in connections:
            server = Server("none", switch=switch)
            try:
                async def run(srv: Server = server, k: int = k) -> tuple[float, float]:
                    await closed_loop(srv.port, 0.3, k, random.Random(3))  # warm
                    cpu = srv.cpu()
                    rate = await closed_loop(srv.port, seconds, k, random.Random(4))
                    return rate, srv.cpu() - cpu

                rate, spent = asyncio.run(run())
            finally:
                server.stop()
            per = spent / max(1.0, rate * seconds) * 1e3
            cells.append(f"{rate:>7.1f} {per:>6.2f}ms")
        lines.append(f"    {float(switch) * 1e3:>5.2f}ms " + " ".join(f"{c:>17}" for c in cells))
    return lines


#: the uvicorn event loop and HTTP parser settings --gil-waits compares
SERVER_KINDS = {"uvloop": [], "asyncio": ["--loop", "asyncio"],
                "asyncio+h11": ["--loop", "asyncio", "--http", "h11"],
                "uvloop+h11": ["--http", "h11"]}


def _perf_futex(path: Path, pid: int) -> tuple[int, float] | None:
    """The futex calls and milliseconds in them of thread ``pid`` (the event loop: uvicorn
    runs it in the main thread) in a ``perf trace -s`` summary; None: perf saw nothing of
    it (not permitted, say)."""
    text = path.read_text() if path.exists() else ""
    block = re.search(rf"\({pid}\), \d+ events.*?(?=\n \S.*\(\d+\), \d+ events|\Z)",
                      text, re.S)
    if block is None:
        return None
    row = re.search(r"^\s+futex\s+(\d+)\s+\d+\s+([\d.]+)", block[0], re.M)
    return (int(row[1]), float(row[2])) if row else (0, 0.0)


def gil_waits(kinds: list[str], switches: list[str], busy: int, rate: float, seconds: float,
              repeats: int) -> list[str]:
    """Per 503, how long the event loop's thread waits for the GIL while ``busy`` threads
    burn CPU: its time in futex(2) (CPython's GIL is a mutex and a condition variable; the
    loop's thread blocks nowhere else in a shed-only server but epoll), counted by
    ``perf trace -s`` on the server. A time in a system call, not a latency: other
    processes on the machine lengthen it less than they lengthen the 503's wall time. The
    configurations interleaved, ``repeats`` rounds, the order reversed every other round."""
    if shutil.which("perf") is None:
        return ["    (perf not found: skipped)"]
    combos = [(k, s) for k in kinds for s in switches]
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {c: [] for c in combos}
    out = Path(tempfile.mkdtemp()) / "perf.txt"
    for r in range(repeats):
        for kind, switch in combos if r % 2 == 0 else combos[::-1]:
            SERVER_ARGS[:] = SERVER_KINDS[kind]
            server = Server("shed-all", switch=switch, SHOP_BURNERS=str(busy))
            point = Point(duration=seconds)
            try:
                asyncio.run(offer(server.port, rate, 0.3, 2.0, random.Random(1), None))
                perf = subprocess.Popen(["perf", "trace", "-s", "-p", str(server.proc.pid),
                                         "-o", str(out)], stderr=subprocess.DEVNULL)
                time.sleep(0.3)  # real time: perf attaching to the server
                asyncio.run(offer(server.port, rate, seconds, 2.0, random.Random(2), point))
                perf.send_signal(signal.SIGINT)
                perf.wait()
                seen = _perf_futex(out, server.proc.pid)
            finally:
                server.stop()
            if seen is None:
                return ["    (perf trace saw nothing of the server: skipped)"]
            calls, ms = seen
            xs = [c[4] - c[3] for c in point.client.values() if c[5] in (503, 5030)]
            n = max(1, len(xs))
            got[(kind, switch)].append((ms / n, calls / n, pct(xs, .5) * 1e3))
    SERVER_ARGS[:] = []
    lines = [f"    {'uvicorn':<12} {'switch':>7} | GIL wait per 503 (ms, median of {repeats}; "
             "min-max) | futex calls per 503 | 503 p50 ms (median)"]
    for (kind, switch), rows in got.items():
        waits = sorted(w for w, _, _ in rows)
        calls_ = sorted(c for _, c, _ in rows)
        p50s = sorted(p for _, _, p in rows)
        m = len(rows) // 2
        lines.append(f"    {kind:<12} {float(switch) * 1e3:>5.2f}ms | {waits[m]:>6.3f} "
                     f"({waits[0]:.3f}-{waits[-1]:.3f}){'':>20} | {calls_[m]:>5.1f} | "
                     f"{p50s[m]:>6.2f}")
    return lines


def ideal(events: list[tuple[float, str, str]], cost: dict[str, float], shed_cost: float,
          answer_sheds: bool, queue_timeout: float = math.inf) -> tuple[float, float]:
    """The critical p99 and success of an ideal scheduler on one core, on the arrivals
    ``events`` (time, tier, path; any order): critical requests preempt everything else
    and run one at a time, first come first served, each costing the CPU a 200 of its
    path costs (``cost``); no degraded or sheddable request is run at all. With
    ``answer_sheds``, every other request costs ``shed_cost`` of the core at the highest
    priority (answered at once, as the 5 ms target asks). A critical request that would
    start more than ``queue_timeout`` after its arrival is shed instead (it costs
    nothing). No network, no parsing delay: a floor for the p99, a ceiling for the
    success, not a model."""
    events = sorted(events)
    if not events:
        return float("nan"), float("nan")
    t0 = events[0][0]
    busy: list[tuple[float, float]] = []  # the sheds' busy intervals (top priority), merged
    if answer_sheds:
        free_at = 0.0
        for due, tier, _ in events:
            if tier == "critical":
                continue
            start = max(due - t0, free_at)
            free_at = start + shed_cost
            if busy and busy[-1][1] >= start:
                busy[-1] = (busy[-1][0], free_at)
            else:
                busy.append((start, free_at))
    latencies = []
    served = total = 0
    now = 0.0
    j = 0  # the first busy interval that may still matter

    def skip(t: float) -> float:  # the first instant from t on that the sheds leave free
        nonlocal j
        while True:
            while j < len(busy) and busy[j][1] <= t:
                j += 1
            if j < len(busy) and busy[j][0] <= t:
                t = busy[j][1]
                continue
            return t

    for due, tier, path in events:
        if tier != "critical":
            continue
        total += 1
        arrive = due - t0
        start = skip(max(now, arrive))
        if start - arrive > queue_timeout:
            continue  # shed after waiting in vain: costs the core nothing
        served += 1
        now, need = start, cost[path]
        while need > 1e-12:  # work in the gaps the sheds leave
            now = skip(now)
            gap = (busy[j][0] - now) if j < len(busy) else math.inf
            step = min(need, gap)
            now += step
            need -= step
        latencies.append(now - arrive)
    return p99(latencies), served / max(1, total)


def schedule(load: float, cost: dict[str, float], seconds: float, rng: random.Random
             ) -> list[tuple[float, str, str]]:
    """The generator's arrivals (time, tier, path) at ``load`` x the capacity that
    ``cost`` (CPU seconds per path) gives the mix: one every 1 / rate s, paths at random."""
    rate = load / sum(share * cost[path] for _, path, _, share in MIX)
    weights = [m[3] for m in MIX]
    out = []
    for i in range(int(rate * seconds)):
        _, path, tier, _ = rng.choices(MIX, weights)[0]
        out.append((i / rate, tier, path))
    return out


def steady_floor(load: float, cost: dict[str, float], seconds: float = 400.0
                 ) -> tuple[float, float, float]:
    """The ideal scheduler (:func:`ideal`, the 503s free) over a long run at ``load``:
    its critical p99 over its own unloaded (0.25x) p99, and its critical success with
    waits cut at 50 ms and at 250 ms; the arrivals seeded, the same every run."""
    base = ideal(schedule(0.25, cost, seconds, random.Random(1)), cost, 0.0, False)[0]
    trace = schedule(load, cost, seconds, random.Random(2))
    return (ideal(trace, cost, 0.0, False)[0] / base,
            ideal(trace, cost, 0.0, False, 0.05)[1], ideal(trace, cost, 0.0, False, 0.25)[1])


def measure(protection: str, rate: float, args: argparse.Namespace, seed: int) -> Point:
    server = Server(protection, switch=args.switch,
                    SHOP_CRITICAL_WAIT=str(args.critical_wait))
    try:
        point = Point(duration=args.duration)
        rng = random.Random(seed)

        async def run() -> None:
            await offer(server.port, rate, args.warmup, args.timeout, rng, None)
            cpu = server.cpu()
            await offer(server.port, rate, args.duration, args.timeout, rng, point)
            point.cpu = server.cpu() - cpu

        asyncio.run(run())
        return point
    finally:
        server.stop()


def plot(path: Path, loads: list[float], results: dict[str, dict[float, Point]],
         capacity: float, floors: dict[float, float], base_p99: float) -> None:
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
    ax2.plot(loads, [floors[x] * 1000 for x in loads], "-", color="grey", linewidth=3,
             alpha=0.5, label="critical, ideal scheduler on the same arrivals (floor)")
    ax2.axhline(3 * base_p99 * 1000, color="grey", linestyle="-.", linewidth=1,
                label="target: 3x the unloaded critical p99")
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
    ap.add_argument("--unloaded-seconds", type=float, default=16.0,
                    help="counted seconds of the unloaded (0.25x) point")
    ap.add_argument("--capacity-seconds", type=float, default=3.0)
    ap.add_argument("--capacity", type=float, default=0.0, help="skip measuring: req/s")
    ap.add_argument("--timeout", type=float, default=2.0, help="client timeout (s)")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "overload.png"))
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--gil", default="0.005,0.001,0.0001",
                    help="switch intervals for the GIL hand-off table ('' skips it)")
    ap.add_argument("--critical-wait", type=float, default=0.25,
                    help="the shop's critical queue_timeout (SHOP_CRITICAL_WAIT), for the "
                    "ideal scheduler's ceiling")
    ap.add_argument("--switch", default="0.0001", help="the server's switch interval")
    ap.add_argument("--switch-cost", default="",
                    help="switch intervals at which to measure the handlers' closed-loop "
                    "throughput with 1 and 4 connections ('' skips it)")
    ap.add_argument("--server-args", default="",
                    help="extra uvicorn arguments for every server, e.g. '--loop asyncio'")
    ap.add_argument("--gil-waits", default="",
                    help="uvicorn kinds (uvloop, asyncio, asyncio+h11, uvloop+h11) at which to "
                    "measure the event loop's GIL wait per 503 with perf trace, one busy "
                    "thread, at the --gil switch intervals; then exit")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of --gil-waits")
    args = ap.parse_args()
    if args.gil_waits:
        print("the event loop's GIL wait per 503 (its futex time, perf trace -s), every "
              f"request shed, 1 thread burning CPU, 100 req/s; load average "
              f"{os.getloadavg()[0]:.1f}:")
        for line in gil_waits(args.gil_waits.split(","), args.gil.split(","), 1, 100.0, 2.0,
                              args.repeats):
            print(line)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        return
    SERVER_ARGS[:] = args.server_args.split()
    if SERVER_ARGS:
        print(f"uvicorn {' '.join(SERVER_ARGS)}")
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
    # what a request costs the server's one core (its CPU time, all threads)
    cost = cpu_per_request("none", [(m, p) for m, p, _, _ in MIX], 0.6, 1)
    shed_cost = cpu_per_request("shed-all", [("GET", "/recommendations")], 1.0, 2)[
        "/recommendations"]
    print("server CPU per request (closed loop): " + ", ".join(
        f"{p} {c * 1e3:.2f} ms" for p, c in cost.items())
        + f"; a shed 503 {shed_cost * 1e3:.3f} ms")
    crit_cost = sum(sh * cost[p] for _, p, t, sh in MIX if t == "critical")
    other = sum(sh for _, _, t, sh in MIX if t != "critical")
    for load in loads:
        rate = load * capacity
        print(f"  {load:g}x ({rate:.0f} req/s): critical work {rate * crit_cost:.0%} of one "
              f"core, answering every other request with a 503 "
              f"{rate * other * shed_cost:.0%}: {rate * (crit_cost + other * shed_cost):.0%}")
    mean = sum(sh * cost[p] for _, p, _, sh in MIX)
    print(f"an ideal scheduler at these costs (capacity 1 / mean cost = {1 / mean:.1f} req/s; "
          "one core, critical first and preemptive, nothing else run, the 503s free), 400 s "
          "at each multiple of that capacity:")
    for load in loads:
        ratio, s50, s250 = steady_floor(load, cost)
        print(f"  {load:g}x: critical p99 {ratio:.2f}x its own unloaded p99 (target 3x); "
              f"critical success with waits cut at 50 ms {s50:.2%}, at 250 ms {s250:.2%}")
    if args.switch_cost:
        print("what the switch interval costs the handlers (closed loop, no protection):")
        for line in switch_cost(args.switch_cost.split(","), [1, 4], 1.5):
            print(line)
    if args.gil:
        print("GIL hand-offs: every request shed, k threads burning CPU in the server "
              "(as k CPU-bound requests in flight), 100 req/s:")
        for line in gil_handoffs(args.gil.split(","), [0, 1, 2, 4], 100.0, 1.0):
            print(line)
    # the unloaded point counts --unloaded-seconds: at 0.25x a few seconds hold a few dozen
    # critical requests, whose "p99" is their slowest
    quiet = argparse.Namespace(**{**vars(args), "duration": args.unloaded_seconds})
    unloaded = measure("adaptive" if "adaptive" in configs else configs[0], 0.25 * capacity,
                       quiet, seed=99)
    base_p99 = p99(unloaded.ok["critical"])
    print(f"unloaded (0.25x, {args.unloaded_seconds:g} s): critical p99 {base_p99 * 1000:.1f} "
          f"ms of {len(unloaded.ok['critical'])} critical requests")

    results: dict[str, dict[float, Point]] = {c: {} for c in configs}
    busiest = os.getloadavg()[0]
    for load in loads:  # the configurations side by side at each load, as close in time
        for config in configs:
            results[config][load] = measure(config, load * capacity, args, seed=int(load * 10))
        busiest = max(busiest, os.getloadavg()[0])
        print(f"  {load:g}x done, load average {os.getloadavg()[0]:.1f}", flush=True)

    print(f"\n{'config':<30} {'load':>4} | {'critical':>9} {'degraded':>9} {'sheddable':>9} | "
          f"{'p99 crit':>8} {'x unl.':>6} | {'shed p99':>8} {'waited':>6} {'all 503':>8} | "
          f"{'goodput':>8} | "
          "limit")
    for config in configs:
        for load in loads:
            pt = results[config][load]
            shed_all = [x for t in TIERS for x in pt.shed[t]]
            waited = sum(len(pt.waited[t]) for t in TIERS)
            every = shed_all + [x for t in TIERS for x in pt.waited[t]]
            crit = p99(pt.ok["critical"])
            print(f"{CONFIGS[config]:<30} {load:>3g}x | "
                  + " ".join(f"{pt.success(t):>9.2%}" for t in TIERS)
                  + f" | {crit * 1000:>6.1f}ms {crit / base_p99:>5.1f}x"
                  + f" | {p99(shed_all) * 1000:>6.1f}ms {waited:>6} {p99(every) * 1000:>6.1f}ms"
                  + f" | {pt.goodput() / capacity:>7.0%}"
                  + (f" | {min(pt.limits)}-{sorted(pt.limits)[len(pt.limits) // 2]}-"
                     f"{max(pt.limits)}" if pt.limits else " | -"))
    print("(success: 200 within the client timeout / sent; shed p99: 503s answered at once; "
          "waited: 503s after waiting queue_timeout in vain; all 503: the p99 of every 503, "
          "those too; goodput: 200s/s / capacity; "
          "limit: min-median-max of the server's limit)")
    for config in configs:
        print(f"\nwhere the time goes, {CONFIGS[config]} (ms, p50/p99; late: the generator "
              "behind its schedule; in: sent -> the server's app has it; wait: for a slot; "
              "to thread: slot -> handler starts; run: the handler; back: handler done -> "
              "answer written; out: written -> read by the generator; server: in the "
              "server's app):")
        for load in loads:
            pt = results[config][load]
            n503 = sum(1 for c in pt.client.values() if c[5] in (503, 5030))
            print(f"  {load:g}x: server CPU {pt.cpu / pt.duration:.0%} of a core, of which "
                  f"about {n503 * shed_cost / pt.duration:.0%} answering {n503} 503s")
            for line in breakdown(pt):
                print(line)
    floors: dict[float, float] = {}
    print("\nthe physical floor: critical p99 of an ideal scheduler on the same arrivals, one "
          "core, critical first and preemptive, nothing else run; 'alone': the 503s cost "
          "nothing; 'with 503s': every other request answered at once at its measured cost")
    for config in configs:
        for load in loads:
            pt = results[config][load]
            crit = p99(pt.ok["critical"])
            trace = [(due, tier, path) for tier, path, due, *_ in pt.client.values()]
            alone = ideal(trace, cost, shed_cost, False)[0]
            shed = ideal(trace, cost, shed_cost, True)[0]
            if config == configs[-1]:
                floors[load] = shed
            p_wait, s_wait = ideal(trace, cost, shed_cost, True, args.critical_wait)
            s_50 = ideal(trace, cost, shed_cost, True, 0.05)[1]
            print(f"  {CONFIGS[config]:<30} {load:>3g}x: critical p99 measured "
                  f"{crit * 1e3:6.1f} ms = {crit / base_p99:.1f}x unl. | floor: critical alone "
                  f"{alone * 1e3:5.1f} ms = {alone / base_p99:.2f}x, with the 503s "
                  f"{shed * 1e3:5.1f} ms = {shed / base_p99:.2f}x, waits cut at "
                  f"{args.critical_wait * 1e3:g} ms {p_wait * 1e3:5.1f} ms = "
                  f"{p_wait / base_p99:.2f}x | measured / floor {crit / p_wait:.2f}")
            print(f"  {'':<30} {'':>4}  critical success measured "
                  f"{pt.success('critical'):.2%} | ceiling: critical waits cut at 50 ms "
                  f"{s_50:.2%}, at {args.critical_wait * 1e3:g} ms {s_wait:.2%}")
    cores = os.cpu_count() or 1
    if busiest > cores:
        print(f"\nWARNING: load average up to {busiest:.1f} on {cores} cores: other processes "
              "took CPU from the server and the generator; the figures above measure the "
              "machine as much as the shedding (see 'server CPU ... of a core')")
    if "adaptive" in results and "none" in results:
        def ratio(a: float, b: float) -> str:
            return f"{a / b:.1f}x" if b else ("same (both 0)" if not a else "inf (none: 0)")

        for load in loads:
            a, n = results["adaptive"][load], results["none"][load]
            print(f"{load:g}x: adaptive / none: critical success "
                  f"{ratio(a.success('critical'), n.success('critical'))}, "
                  f"goodput {ratio(a.goodput(), n.goodput())}")
    if args.plot:
        plot(Path(args.plot), loads, results, capacity, floors, base_p99)
        print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"capacity": capacity, "unloaded_critical_p99_ms": base_p99 * 1000,
             "points": {c: {str(x): p.summary() for x, p in pts.items()}
                        for c, pts in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
