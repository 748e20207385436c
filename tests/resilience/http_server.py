"""A real HTTP server on 127.0.0.1 (free port) whose replies, latency included, a test scripts."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: deque[Reply] = deque()
        self.seen: list[Seen] = []
        self.completed: list[int] = []
        """The status of every reply written out in full, in order."""
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        """Replies for the next requests, in order (then 200 "ok")."""
        with self.lock:
            self.replies.extend(replies)

    def next_reply(self, seen: Seen) -> Reply:
        with self.lock:
            self.seen.append(seen)
            return self.replies.popleft() if self.replies else Reply()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: ScriptedServer

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = self.server.next_reply(Seen(self.command, self.path,
                                            {k.lower(): v for k, v in self.headers.items()},
                                            body))
        if reply.delay and self.server.stopping.wait(reply.delay):
            return
        try:
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
            with self.server.lock:
                self.server.completed.append(reply.status)
        except OSError:  # the client gave up (its timeout): nothing to answer
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def scripted_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
