"""Issue 11 defects 3, 4, 7 and 9 against a real ``stormguard serve`` process (the claims
are about the HTTP server, so no in-process transport): oversized and too many headers,
pipelined requests followed by junk, a lone surrogate on a keep-alive connection, a
non-ASCII admin token."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stormguard.cli import _parser, main
from tests.redis_servers import free_port
from tests.service.helpers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
RULES = """rules:
  - {name: big, scope: user, limit: 100000, window: 1h, algorithm: fixed_window}
"""
TOKEN = "pässwörd"


class Serve:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"VmRSS:\s+(\d+) kB", status)
        assert m is not None
        return int(m[1])

    def remaining(self, user: str) -> int:
        r = httpx.post(f"{self.base}/v1/check", json={"key": f"user:{user}", "rule": "big"},
                       timeout=5)
        assert r.status_code == 200, r.text
        value: int = r.json()["remaining"]
        return value

    def exchange(self, data: bytes, timeout: float = 10.0) -> bytes:
        """Send raw bytes, read until the server closes the connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    rules = tmp_path_factory.mktemp("serve") / "rules.yaml"
    rules.write_text(RULES)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "STORMGUARD_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stormguard", "serve", "--port", str(port), "--rules",
         str(rules), "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield Serve(proc, port)
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"(?:^|\r\n|[}\n])HTTP/1\.1 (\d{3}) ", data)]


def _post_check(user: str, extra: bytes = b"") -> bytes:
    body = b'{"key": "user:' + user.encode() + b'", "rule": "big"}'
    return (b"POST /v1/check HTTP/1.1\r\nHost: sg\r\n" + extra
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_oversized_header_is_refused_and_memory_stays(serve: Serve) -> None:
    before = serve.rss_kib()
    sent = 0
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", serve.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: sg\r\nX-Big: ")
            chunk = b"a" * 65536
            sent = 0
            try:
                while sent < 32 * 1024 * 1024:  # up to 32 MiB of one header
                    s.sendall(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                answer = s.recv(65536)
            except ConnectionResetError:
                answer = b""  # closed with our unread header in its buffer: a reset
        assert sent < 4 * 1024 * 1024, "the server kept reading a 32 MiB header"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert serve.rss_kib() - before < 8 * 1024, (before, serve.rss_kib())
    # a large but bounded header still passes (16 KiB for the request line + headers)
    r = httpx.get(f"{serve.base}/healthz", headers={"X-Big": "a" * 12000}, timeout=5)
    assert r.status_code == 200


def test_too_many_headers_is_431(serve: Serve) -> None:
    fields = b"".join(b"X-H%d: v\r\n" % i for i in range(100))  # + Host: 101 fields
    answer = serve.exchange(b"GET /healthz HTTP/1.1\r\nHost: sg\r\n" + fields + b"\r\n")
    assert _statuses(answer) == [431]
    assert b'"status":431' in answer
    fields = b"".join(b"X-H%d: v\r\n" % i for i in range(98))  # + Host, Connection: 100
    answer = serve.exchange(b"GET /healthz HTTP/1.1\r\nHost: sg\r\nConnection: close\r\n"
                            + fields + b"\r\n")
    assert _statuses(answer) == [200]


def test_pipelined_requests_then_junk_are_all_answered_and_charged_once(
        serve: Serve) -> None:
    start = serve.remaining("pipe")
    answer = serve.exchange(b"".join(_post_check("pipe") for _ in range(50))
                            + b"\x00JUNK / HTTP/9\r\n\r\n")
    assert _statuses(answer) == [200] * 50 + [400]
    # every answered request was charged once, the junk nothing
    assert serve.remaining("pipe") == start - 51


def test_lone_surrogate_is_422_and_the_connection_stays_open(serve: Serve) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", serve.port, timeout=5)
    try:
        for body in (b'{"\\ud800": 1}', b'{"user": "\\udfff"}'):
            conn.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 422
            assert b"surrogate" in r.read()
        conn.request("POST", "/v1/check", b'{"key": "user:s", "rule": "big"}')
        r = conn.getresponse()  # the same keep-alive connection
        assert r.status == 200
        r.read()
        auth = {"Authorization": b"Bearer " + TOKEN.encode()}
        conn.request("PUT", "/v1/rules/big", b'{"scope": "user", "limit": 5, "window": 60, '
                     b'"tier": "\\ud800"}', auth)
        r = conn.getresponse()
        assert r.status == 422
        r.read()
        conn.request("GET", "/v1/rules", headers=auth)
        r = conn.getresponse()
        assert r.status == 200  # nothing was applied; the rules still read back
        assert b'"tier":null' in r.read()
    finally:
        conn.close()


def test_non_ascii_admin_token_over_http(serve: Serve) -> None:
    ok = httpx.get(f"{serve.base}/v1/rules", timeout=5,
                   headers={"Authorization": b"Bearer " + TOKEN.encode()})
    assert ok.status_code == 200
    wrong = httpx.get(f"{serve.base}/v1/rules", timeout=5,
                      headers={"Authorization": b"Bearer " + TOKEN.encode("latin-1")})
    assert wrong.status_code == 401


def test_http_parser_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parser().parse_args(["serve"]).http == "h11"  # the bounded one by default
    monkeypatch.setenv("STORMGUARD_HTTP", "httptools")
    assert _parser().parse_args(["serve"]).http == "httptools"
    assert main(["serve", "--http", "picohttp"]) == 2
