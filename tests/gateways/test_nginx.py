"""A real nginx (Debian's package) with the ``auth_request`` configuration of
docs/deployment.md, in front of a tiny upstream, asking a real ``stormguard serve``: the
requests pass, the one over the limit gets 429 with ``Retry-After``, a store outage follows
``on_error``, and stormguard unreachable fails closed (500) or, with the documented
addition, open."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.gateways.conftest import ROOT, Serve
from tests.redis_servers import free_port, start_redis

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(not os.path.exists(NGINX),
                                reason="nginx is not installed (.ci/run installs it)")
DOC = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```nginx\n(.*?)```", DOC, flags=re.DOTALL)


class Upstream:
    """The application behind nginx: answers 200 and records what reached it."""

    def __init__(self) -> None:
        seen = self.seen = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                body = b"hello from upstream"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def nginx_conf(tmp: Path, sg_port: int, app_port: int, closed: int, opened: int) -> str:
    """The documented configuration twice: as written (fail closed) on ``closed``, and
    with the documented fail-open addition on ``opened``."""
    assert len(BLOCKS) == 2, "docs/deployment.md: the config and the fail-open addition"
    config, addition = BLOCKS
    config = config.replace("127.0.0.1:8080", f"127.0.0.1:{sg_port}").replace(
        "127.0.0.1:9000", f"127.0.0.1:{app_port}")
    upstream, server = config.split("\nserver {", 1)
    server = "server {" + server
    error_page, named = addition.strip().split("\n", 1)
    assert error_page.startswith("error_page")
    assert "location @stormguard_unreachable" in named
    fail_open = server.replace("        internal;\n", f"        internal;\n        {error_page}\n")
    fail_open = fail_open.rstrip()[:-1] + "\n    " + named.strip() + "\n}\n"
    assert fail_open.count("@stormguard_unreachable") == 2
    temps = "\n".join(f"    {name}_temp_path {tmp}/{name};" for name in
                      ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / name).mkdir(mode=0o777, exist_ok=True)
        os.chmod(tmp / name, 0o777)  # the worker may run as another user than the master
    return f"""
worker_processes 1;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
{temps}
{upstream}
{server.replace("listen 80;", f"listen 127.0.0.1:{closed};")}
{fail_open.replace("listen 80;", f"listen 127.0.0.1:{opened};")}
}}
"""


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Callable[[int, int], tuple[str, str]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(sg_port: int, app_port: int) -> tuple[str, str]:
        closed, opened = free_port(), free_port()
        (tmp_path / "nginx.conf").write_text(nginx_conf(tmp_path, sg_port, app_port, closed,
                                                        opened))
        proc = subprocess.Popen(
            [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e",
             str(tmp_path / "error.log"), "-g", f"daemon off; pid {tmp_path}/nginx.pid;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"nginx exited: {(tmp_path / 'error.log').read_text()}")
            try:
                httpx.get(f"http://127.0.0.1:{opened}/healthcheck-probe", timeout=0.5)
                return f"http://127.0.0.1:{closed}", f"http://127.0.0.1:{opened}"
            except httpx.TransportError:
                time.sleep(0.05)  # real time: waiting for a real nginx to bind its ports
        raise AssertionError("nginx did not start in 10 s")

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGQUIT)  # nginx's graceful stop, by PID
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@pytest.mark.slow
def test_nginx_auth_request(serve: Callable[..., Serve],
                            nginx: Callable[[int, int], tuple[str, str]]) -> None:
    redis = start_redis()
    upstream = Upstream()
    try:
        sg = serve("--store", redis.url, "--trusted-proxies", "127.0.0.1", grpc=False)
        closed, opened = nginx(sg.port, upstream.port)
        # the rule search-per-ip: 2 a minute for GET /search* by client address
        answers = [httpx.get(f"{closed}/search?q={i}") for i in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[0].text == "hello from upstream"
        denied = answers[2]
        assert 1 <= int(denied.headers["retry-after"]) <= 60
        assert denied.headers["ratelimit-policy"] == '"search-per-ip";q=2;w=60'
        assert "r=0" in denied.headers["ratelimit"]
        assert upstream.seen.count("/search?q=0") == 1
        assert "/search?q=2" not in upstream.seen
        # another path is not limited by that rule (the URI came through nginx's header)
        assert httpx.get(f"{closed}/about").status_code == 200
        # the same counters behind both server blocks
        assert httpx.get(f"{opened}/search?q=x").status_code == 429

        # the store fails (Redis SIGKILLed): on_error allow passes every request
        redis.stop()
        assert [httpx.get(f"{closed}/search?q=down").status_code for _ in range(3)] == \
            [200] * 3

        # stormguard itself unreachable: the documented config fails closed, the
        # documented addition fails open
        sg.stop()
        assert httpx.get(f"{closed}/search?q=gone").status_code == 500
        assert httpx.get(f"{opened}/search?q=gone").status_code == 200
        assert "/search?q=gone" in upstream.seen
    finally:
        upstream.stop()
        redis.stop()
