"""The asyncio side of the transport: one pipelined connection per event loop and server.

Protocol subset (RESP2, parsed by hiredis): ``AUTH <password>`` or ``AUTH <user>
<password>`` and ``SELECT <db>`` in the handshake (nothing when neither is set), then
any command the caller packs — ``EVALSHA`` (a registered script's ``SCRIPT LOAD`` goes
in front of its first ``EVALSHA`` on a connection, and again on ``NOSCRIPT``, see
:mod:`.scripts`), ``ASKING`` before a command redirected by ``ASK``, ``XADD``,
``HGET``... Replies are hiredis values (``bytes``, ``int``, lists, ``None``); an error
reply fails its own caller's future with a StorageError whose ``__cause__`` is the
``ResponseError``. No RESP3, no pub/sub, no blocking commands (``BLPOP``,
``XREADGROUP BLOCK``): a reply must come within ``timeout``, since every caller
behind it on the connection waits for it.

Every command that leaves the queue is in ``inflight`` before a byte is written, and
every exception on a write path (a transport uvloop has closed raises ``RuntimeError``
from ``write``) fails what is in flight and queued: nothing submitted can be left
without an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import hiredis
from redis.exceptions import ResponseError

from stormguard._core.errors import StorageError
from stormguard.stores.redis import scripts
from stormguard.stores.redis.protocol import (
    BACKEND_ERRORS,
    Command,
    Endpoint,
    is_noscript,
    pack,
    storage_error,
)

if TYPE_CHECKING:
    from stormguard.stores.redis.transport import Transport

__all__ = ["EAGER_BATCH", "Mux", "retrieve"]

#: On a busy connection, a queue this long is written at once instead of at the end of
#: the event loop iteration (client and server then work in parallel: see Mux.submit).
EAGER_BATCH = 16

Item = tuple[Command, "asyncio.Future[Any]", bool]  # (command, its future, sent again)


class Outcomes(Protocol):
    """Told when the connection works (a reply came) or failed (the breaker)."""

    def success(self) -> None: ...

    def failure(self) -> None: ...


class _Nothing:
    def success(self) -> None:
        pass

    def failure(self) -> None:
        pass


def retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # a SCRIPT LOAD nobody awaits: its error is seen by its command


class Mux:
    """One event loop's pipelined connection to one Redis server (hiredis on asyncio
    streams). Commands submitted during one loop iteration are written together (one
    round trip; a queue of ``EAGER_BATCH`` leaves at once); writes never wait for earlier
    replies, and a reader task resolves the callers' futures in order."""

    def __init__(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop,
                 owner: Transport, outcomes: Outcomes | None) -> None:
        self.endpoint = endpoint
        self.loop = loop
        self.owner = owner  # timeouts and the round-trip count
        self.outcomes: Outcomes = outcomes if outcomes is not None else _Nothing()
        self.queue: list[Item] = []
        self.inflight: deque[Item] = deque()
        self.loads: set[str] = set()  # scripts whose SCRIPT LOAD is queued
        self.known: set[str] = set()  # scripts loaded through this connection
        self.scheduled = False
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.reading: asyncio.Task[None] | None = None

    def submit(self, command: Command) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        queue = self.queue
        queue.append((command, fut, False))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        elif len(queue) >= EAGER_BATCH:
            # Many callers: send this slice now instead of at the end of the loop
            # iteration, so Redis works on it while the rest of the iteration builds the
            # next one (otherwise client and server take turns, each idle half the time).
            self._send()
        return fut

    def _flush(self) -> None:
        self.scheduled = False
        if self.queue:
            self._send()

    def _send(self) -> None:
        try:
            writer = self.writer
            if writer is not None:
                if not self.inflight and (writer.is_closing() or self._stale()):
                    self._drop()  # died while idle (a restart): reconnect, not a failure
                elif writer.is_closing():
                    # closed under us (a reset) with replies pending: those will never
                    # come; the queue goes out on a new connection
                    self._lost(ConnectionError("redis closed the connection"))
            if self.writer is None:
                if self.connecting is None:
                    self.connecting = self.loop.create_task(self._connect())
                return
            self._write(self.writer)
        except BaseException as exc:  # never leave a command without an outcome
            self._lost(exc)
            self._fail(self._take_queue(), exc)
            if not isinstance(exc, Exception):
                raise

    def _write(self, writer: asyncio.StreamWriter) -> None:
        batch = self._take_queue()
        known = self.known
        new = {c.script for c, _, _ in batch if c.script is not None and c.script not in known}
        if new:
            batch = [*self._loads(new), *batch]
        self.inflight.extend(batch)  # first: a failed write below fails them
        self.owner.round_trips += 1
        writer.write(b"".join([c.packed for c, _, _ in batch]))
        if self.reading is None:
            self.reading = self.loop.create_task(self._read(self.reader, self.inflight))

    def _loads(self, names: set[str]) -> list[Item]:
        """``SCRIPT LOAD`` of each registered script first used on this connection, sent in
        the same write as its first ``EVALSHA`` (no extra round trip, no NOSCRIPT storm
        when many callers start at once)."""
        items: list[Item] = []
        for name in names:
            try:
                script = scripts.get(name)
            except KeyError:
                continue  # not registered: its command meets NOSCRIPT and fails
            self.known.add(name)
            fut: asyncio.Future[Any] = self.loop.create_future()
            fut.add_done_callback(retrieve)
            items.append((Command(script.load), fut, True))
        return items

    def _take_queue(self) -> list[Item]:
        batch = self.queue
        self.queue = []
        self.loads.clear()
        return batch

    def _stale(self) -> bool:
        """An idle connection with something to read (EOF, an error) is dead: Redis sends
        nothing unasked. One zero-timeout poll, only when no reply is pending."""
        assert self.reader is not None
        assert self.writer is not None
        if self.reader.at_eof():
            return True
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def _connect(self) -> None:
        owner, params = self.owner, self.endpoint.params
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(owner.connect_timeout):
                if params.get("path"):
                    reader, writer = await asyncio.open_unix_connection(params["path"])
                else:
                    reader, writer = await asyncio.open_connection(
                        params.get("host", "localhost"), params.get("port", 6379),
                        ssl=self.endpoint.tls)
            hello: list[tuple[Any, ...]] = []
            if params.get("password"):
                hello.append(("AUTH", params["username"], params["password"])
                             if params.get("username") else ("AUTH", params["password"]))
            if params.get("db"):
                hello.append(("SELECT", params["db"]))
            if hello:
                await self._handshake(reader, writer, hello)
        except (*BACKEND_ERRORS, ssl.SSLError, ResponseError) as exc:
            self.connecting = None
            if writer is not None:
                writer.close()
            self.outcomes.failure()  # a refused AUTH too: no usable connection (as sync)
            self._fail([*self.inflight, *self._take_queue()], exc)
            self.inflight.clear()
            return
        except BaseException as exc:
            self.connecting = None
            if writer is not None:
                writer.close()
            self._fail([*self.inflight, *self._take_queue()], exc)
            self.inflight.clear()
            raise
        self.reader, self.writer = reader, writer
        self.inflight = deque()  # this connection's own
        self.known = set()
        self.reading = None
        self.connecting = None
        self._flush()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         hello: list[tuple[Any, ...]]) -> None:
        parser = hiredis.Reader(replyError=ResponseError)
        writer.write(b"".join([pack(c) for c in hello]))
        self.owner.round_trips += 1
        replies: list[Any] = []
        async with asyncio.timeout(self.owner.timeout):
            while len(replies) < len(hello):
                reply = parser.gets()
                if reply is False:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("redis closed the connection")
                    parser.feed(data)
                else:
                    replies.append(reply)
        for r in replies:
            if isinstance(r, ResponseError):
                raise r

    async def _read(self, reader: asyncio.StreamReader | None,
                    inflight: deque[Item]) -> None:
        """Read the replies of ``inflight`` (one connection's) in order."""
        assert reader is not None
        timeout = self.owner.timeout
        outcomes = self.outcomes
        parser = hiredis.Reader(replyError=ResponseError)
        me = asyncio.current_task()
        try:
            while inflight:
                async with asyncio.timeout(timeout):
                    data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("redis closed the connection")
                parser.feed(data)
                reply = parser.gets()
                while reply is not False:
                    command, fut, again = inflight.popleft()
                    if isinstance(reply, ResponseError):
                        if command.script is not None and not again and is_noscript(reply):
                            self._load_and_resend(command, fut)
                        elif not fut.done():
                            fut.set_exception(storage_error(reply))
                    elif not fut.done():
                        fut.set_result(reply)
                    reply = parser.gets()
                outcomes.success()
        except (*BACKEND_ERRORS, IndexError) as exc:  # IndexError: a reply nobody asked for
            if self.reader is reader:  # still the current connection: it failed
                outcomes.failure()
                self._drop()
            self._fail(inflight, exc)
            inflight.clear()
        except BaseException as exc:
            if self.reader is reader:
                self._drop()
            self._fail(inflight, exc)
            inflight.clear()
            raise
        finally:
            if self.reading is me:
                self.reading = None

    def _load_and_resend(self, command: Command, fut: asyncio.Future[Any]) -> None:
        """NOSCRIPT (a restarted server, SCRIPT FLUSH): queue the script's SCRIPT LOAD (once
        per batch) and the command again behind it."""
        name = command.script
        assert name is not None
        try:
            script = scripts.get(name)
        except KeyError:
            fut.set_exception(StorageError(f"redis: NOSCRIPT for unregistered script {name!r}"))
            return
        if name not in self.loads:
            self.loads.add(name)
            load: asyncio.Future[Any] = self.loop.create_future()
            load.add_done_callback(retrieve)
            self.queue.append((Command(script.load), load, True))
        self.queue.append((command, fut, True))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)

    def _lost(self, exc: BaseException) -> None:
        """The connection is unusable: drop it, fail what it had in flight."""
        if self.writer is not None:
            self.outcomes.failure()
        self._drop()
        inflight, self.inflight = self.inflight, deque()
        self._fail(inflight, exc)
        inflight.clear()

    def _drop(self) -> None:
        writer, self.writer, self.reader = self.writer, None, None
        self.reading = None  # a reader still finishing belongs to the old connection
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    def _fail(items: Any, exc: BaseException) -> None:
        err = storage_error(exc)
        for _, fut, _ in items:
            if not fut.done():
                fut.set_exception(err)

    async def aclose(self) -> None:
        for task in (self.connecting, self.reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        writer = self.writer
        self._drop()
        closed = ConnectionError("store closed")
        self._fail([*self.inflight, *self._take_queue()], closed)
        self.inflight.clear()
        if writer is not None:
            # bounded: a shutdown never waits on a peer that went away (an unanswered
            # TLS close, say)
            with contextlib.suppress(*BACKEND_ERRORS, ssl.SSLError, RuntimeError):
                async with asyncio.timeout(self.owner.connect_timeout):
                    await writer.wait_closed()
