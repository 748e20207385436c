"""Hostile input against a real ``stormguard serve`` (not a test): the figures of
docs/failure-behaviour.md.

    PYTHONPATH=src python bench/hostile.py [--seconds 5]

Starts ``python -m stormguard serve`` on a free loopback port (memory store, a rules
file, an admin token) and measures, each while a second thread polls ``/healthz`` (its
worst latency is the "loop stalled" figure):

* a 64 MiB header streamed on one connection: bytes the server took before closing,
  the answer, RSS (VmRSS) before and after, peak RSS (VmHWM);
* 1,051 global rules (the issue's case), then one batch of 1,000 ``{}`` checks; the
  largest batch the bounds allow, timed;
* 50 pipelined checks followed by junk: the answers, and how many were charged;
* lone surrogates on one keep-alive connection; a non-ASCII admin token;
* ``POST /v1/check`` throughput over ``--seconds`` with 32 keep-alive connections from
  an asyncio client in this process, for ``serve --http h11`` (the default) and
  ``--http httptools`` (what ``stormguard serve`` used before): only the ratio means
  something on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TOKEN = "pässwörd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    def __init__(self, argv: list[str], port: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC), "STORMGUARD_ADMIN_TOKEN": TOKEN}
        self.port = port
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)  # a real process binding its port
        raise RuntimeError("server did not start")

    def status(self, field: str) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(rf"{field}:\s+(\d+) kB", text)
        assert m is not None
        return int(m[1]) // 1024

    def request(self, method: str, path: str, body: object = None,
                headers: dict[str, Any] | None = None) -> tuple[int, bytes, float]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = body if isinstance(body, bytes) or body is None \
            else json.dumps(body, separators=(",", ":")).encode()
        t0 = time.perf_counter()
        conn.request(method, path, data, headers or {})
        r = conn.getresponse()
        out = r.read()
        conn.close()
        return r.status, out, time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


class HealthProbe:
    """Polls /healthz from a thread; ``worst`` is its slowest answer (seconds)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            while True:
                try:
                    conn.request("GET", "/healthz")
                    conn.getresponse().read()
                    break
                except (ConnectionError, http.client.HTTPException):
                    conn.close()  # a stalled server may drop the idle keep-alive: again
            self.worst = max(self.worst, time.perf_counter() - t0)
            time.sleep(0.005)  # a poll every 5 ms

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def big_header(srv: Server) -> None:
    before = srv.status("VmRSS")
    with HealthProbe(srv.port) as probe, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: sg\r\nX-Big: ")
        sent, chunk, t0 = 0, b"a" * 65536, time.perf_counter()
        try:
            while sent < 64 * 1024 * 1024:
                s.sendall(chunk)
                sent += len(chunk)
            s.sendall(b"\r\n\r\n")  # all of it was taken: finish the request
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = s.recv(200).split(b"\r\n")[0].decode() or "connection closed"
        except ConnectionResetError:
            answer = "connection reset"
        took = time.perf_counter() - t0
    print(f"64 MiB header: the client wrote {sent // 1024} KiB (some into socket buffers), "
          f"{took * 1000:.1f} ms to the answer "
          f"answered {answer!r}; RSS {before} -> {srv.status('VmRSS')} MiB (peak "
          f"{srv.status('VmHWM')} MiB); worst /healthz {probe.worst * 1000:.1f} ms")


def _auth() -> dict[str, Any]:
    return {"Authorization": b"Bearer " + TOKEN.encode()}


def batches(srv: Server) -> None:
    rules = [{"name": f"g{i}", "scope": "global", "limit": 10**6, "window": 60}
             for i in range(1051)]
    status, _, took = srv.request("PUT", "/v1/rules", {"rules": rules}, _auth())
    print(f"PUT 1,051 rules: {status} in {took * 1000:.0f} ms")
    for n in (1000, 9):
        with HealthProbe(srv.port) as probe:
            status, body, took = srv.request("POST", "/v1/check/batch",
                                             {"checks": [{}] * n})
        print(f"batch of {n} x 1,051 rules: {status} in {took * 1000:.0f} ms, "
              f"{len(body)} bytes; worst /healthz {probe.worst * 1000:.1f} ms")
    status, _, _ = srv.request("PUT", "/v1/rules", {"rules": rules[:10]}, _auth())
    with HealthProbe(srv.port) as probe:
        status, body, took = srv.request("POST", "/v1/check/batch", {"checks": [{}] * 1000})
    print(f"batch of 1000 x 10 rules (10,000 pairs, the bound): {status} in "
          f"{took * 1000:.0f} ms; worst /healthz {probe.worst * 1000:.1f} ms")


def pipelined(srv: Server) -> None:
    body = b'{"key": "user:pipe", "rule": "big"}'
    one = (b"POST /v1/check HTTP/1.1\r\nHost: sg\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(one * 50 + b"\x00JUNK / HTTP/9\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    codes = re.findall(rb"HTTP/1\.1 (\d{3}) ", data)
    _, out, _ = srv.request("POST", "/v1/check", body)
    charged = 10**6 - 1 - json.loads(out)["remaining"]
    print(f"50 pipelined checks + junk: {codes.count(b'200')} x 200, "
          f"{codes.count(b'400')} x 400; charged {charged}")


def surrogates(srv: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    answers: list[object] = []

    def ask(method: str, path: str, body: bytes | None = None,
            headers: dict[str, Any] | None = None) -> None:
        try:
            conn.request(method, path, body, headers or {})
            r = conn.getresponse()
            r.read()
            answers.append(r.status if not r.will_close else f"{r.status}+close")
        except (ConnectionError, http.client.HTTPException):
            answers.append("dropped")
            conn.close()

    ask("POST", "/v1/check", b'{"\\ud800": 1}')
    ask("POST", "/v1/check", b'{"user": "\\ud800"}')
    ask("POST", "/v1/check", b'{"key": "user:s", "rule": "big"}')
    ask("PUT", "/v1/rules/big", b'{"scope": "user", "limit": 5, "window": 60, '
        b'"tier": "\\ud800"}', _auth())
    ask("GET", "/v1/rules", headers=_auth())
    print(f"surrogates (check key, check value, valid check, admin PUT tier, GET rules): "
          f"{answers}")
    status, _, _ = srv.request("GET", "/v1/rules", headers=_auth())
    print(f"admin token {TOKEN!r} (UTF-8): {status}")


async def _load(port: int, seconds: float, connections: int = 32) -> float:
    body = b'{"key":"user:1","rule":"big"}'
    req = (b"POST /v1/check HTTP/1.1\r\nHost: sg\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    done = 0
    stop = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head.lower())[1])  # type: ignore[index]
            await reader.readexactly(length)
            done += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done / seconds


def throughput(rules: str, seconds: float, rounds: int) -> None:
    results: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, best of N: the machine is shared
        for parser in ("h11", "httptools"):
            port = free_port()
            srv = Server([sys.executable, "-m", "stormguard", "serve", "--port", str(port),
                          "--rules", rules, "--log-level", "warning", "--http", parser], port)
            try:
                asyncio.run(_load(port, 1.0))  # warm-up
                rps = asyncio.run(_load(port, seconds))
                results[parser] = max(results.get(parser, 0.0), rps)
            finally:
                srv.stop()
    for parser, rps in results.items():
        print(f"POST /v1/check, 32 connections, {seconds:g} s, best of {rounds}: "
              f"serve --http {parser}: {rps:.0f} req/s")


def main() -> None:
    global SRC, TOKEN  # the script's settings
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2, help="throughput rounds (0: none)")
    p.add_argument("--src", type=Path, default=SRC,
                   help="the stormguard sources to serve (an older checkout, to compare)")
    p.add_argument("--token", default=TOKEN, help="the admin token (default %(default)s)")
    args = p.parse_args()
    SRC, TOKEN = args.src.resolve(), args.token
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.yaml")
        Path(rules).write_text("- {name: big, scope: user, limit: 1000000, window: 1h, "
                               "algorithm: fixed_window}\n")
        port = free_port()
        srv = Server([sys.executable, "-m", "stormguard", "serve", "--port", str(port),
                      "--rules", rules, "--log-level", "warning"], port)
        try:
            print(f"stormguard serve, pid {srv.proc.pid}, RSS {srv.status('VmRSS')} MiB")
            big_header(srv)
            pipelined(srv)
            surrogates(srv)
            batches(srv)
        finally:
            srv.stop()
        Path(rules).write_text("- {name: big, scope: user, limit: 1000000000, window: 1h, "
                               "algorithm: fixed_window}\n")
        if args.rounds:
            throughput(rules, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
