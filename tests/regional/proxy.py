"""A latency-injecting TCP proxy for the cross-region links of the tests.

Every byte is forwarded ``delay`` seconds after it arrived, in each direction (so a
round trip through the proxy costs ``2 * delay`` more). ``partition()`` stops
forwarding: the connections stay open and nothing gets through (new ones are accepted
and held), which is what a client sees of a cut link: timeouts, not resets.
``heal()`` closes what was held and forwards again.

Real threads and real sockets on 127.0.0.1 (it proxies real redis-server processes);
its waits are real time because the bytes it delays are real.
"""

from __future__ import annotations

import contextlib
import heapq
import socket
import threading
import time


class LatencyProxy:
    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self._partitioned = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._held: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def partition(self) -> None:
        self._partitioned.set()

    def heal(self) -> None:
        """Forward again; the connections that lived through the cut are closed (their
        bytes were dropped, a client must reconnect)."""
        with self._lock:
            doomed = self._socks + self._held
            self._socks, self._held = [], []
        for s in doomed:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._partitioned.clear()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.heal()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._partitioned.is_set():
                with self._lock:
                    self._held.append(client)  # accepted, never answered
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), 2)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks += [client, upstream]
            self._pipe(client, upstream)
            self._pipe(upstream, client)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        """Bytes read from ``src`` are written to ``dst`` ``delay`` seconds later."""
        due: list[tuple[float, int, bytes]] = []
        ready = threading.Condition()
        seq = [0]

        def reader() -> None:
            while True:
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                with ready:
                    seq[0] += 1
                    heapq.heappush(due, (time.monotonic() + self.delay, seq[0], data))
                    ready.notify()
                if not data:
                    return

        def writer() -> None:
            while True:
                with ready:
                    while not due or due[0][0] > time.monotonic():
                        # real time: the bytes are due at a real instant
                        ready.wait(None if not due else due[0][0] - time.monotonic())
                    _, _, data = heapq.heappop(due)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                if self._partitioned.is_set():
                    continue  # a cut link drops what it carries
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=writer, daemon=True).start()
