"""A Redis transport that knows nothing about rate limiting.

It carries :class:`Command` values (RESP bytes, the key that routes them, the name of
the registered script they run) to one Redis server, blocking or on asyncio, and gives
back the raw reply (``bytes``, ``int``, lists, as hiredis parses RESP2). Every
failure is a :class:`~stormguard.StorageError`; an open breaker is a
:class:`~stormguard.StorageCircuitOpen` raised without touching the network.

* **Blocking**: a bounded pool of redis-py connections (``max_connections``). A full
  pool is back-pressure: the caller waits for a connection, at most ``timeout`` (or
  the deadline in force), and a pool that stays full is a ``StorageError`` that says
  nothing about the server's health (the breaker does not count it).
* **asyncio**: one pipelined connection per event loop (:class:`~.mux.Mux`):
  everything submitted during one loop iteration is written at once, long queues in
  slices of :data:`~.mux.EAGER_BATCH`, writes never wait for earlier replies.
* **Scripts** (:mod:`.scripts`): ``NOSCRIPT`` is answered here, once for every user,
  by ``SCRIPT LOAD`` of the source registered under the command's script name and
  one more send; nothing is loaded at connect time.
* **Deadlines**: inside :func:`stormguard.deadline.scope` the wait for a connection and
  for the reply is clipped to the time left; a spent deadline fails at once.
* **Breaker** (optional): a :class:`~stormguard._core.breaker.BreakerMachine` whose
  ``acquire`` gates each call; connection errors, timeouts and protocol errors count as
  failures, replies (error replies included) as successes.

Usage, for any component that needs Redis (the stores, a rules source, a queue)::

    t = transport_for("redis://:pw@10.0.0.5:6379/2", timeout=0.2)
    t.call(Command.of("XADD", "jobs", "*", "n", 1, key="jobs"))          # blocking
    n = await t.acall(Command.of("XLEN", "jobs", key="jobs"))             # asyncio
    t.close(); await t.aclose()
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import hiredis
import redis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from stormguard._core import deadline
from stormguard._core.breaker import BreakerMachine
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageError
from stormguard.stores.redis import scripts

__all__ = ["BACKEND_ERRORS", "Command", "Endpoint", "NodePool", "RedisTransport", "Transport",
           "pack", "storage_error"]

#: Errors that mean "the server or the network failed" (they count towards the breaker).
BACKEND_ERRORS = (RedisError, OSError, asyncio.TimeoutError, hiredis.ProtocolError)

Arg = str | bytes | int | float
Breakers = Callable[[str], "BreakerMachine | None"]
"""Gives the breaker guarding a node (``"host:port"``; ``""``: the transport as a whole)."""


def pack(args: Sequence[Arg]) -> bytes:
    """One command as RESP bytes."""
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    return packed


class Command(NamedTuple):
    """One Redis command for the transport.

    ``packed`` is the command as RESP bytes; ``key`` routes it on a cluster (``None``:
    any master; give the key the command touches, every key of one command must share a
    slot); ``script`` names the registered script an ``EVALSHA`` runs, so that the
    transport can answer ``NOSCRIPT``.
    """

    packed: bytes
    key: bytes | None = None
    script: str | None = None

    @classmethod
    def of(cls, *args: Arg, key: str | bytes | None = None,
           script: str | None = None) -> Command:
        """Build a command from its arguments: ``Command.of("GET", k, key=k)``."""
        return cls(pack(args), key.encode() if isinstance(key, str) else key, script)


def storage_error(exc: BaseException, what: str = "redis") -> StorageError:
    """``exc`` as a StorageError (its cause)."""
    if isinstance(exc, StorageError):
        return exc
    err = StorageError(f"{what}: {type(exc).__name__}: {exc}" if not isinstance(
        exc, ResponseError) else f"{what}: {exc}")
    err.__cause__ = exc
    return err


def is_noscript(reply: object) -> bool:
    """A NOSCRIPT error reply (redis-py's NoScriptError, or hiredis's ResponseError)."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"))


class PoolFull(StorageError):
    """No connection of the blocking pool came free in time (back-pressure, not an outage)."""


# -- where a node is and how to talk to it -------------------------------------------------
class Endpoint(NamedTuple):
    """How to reach one server: for the blocking pool (a redis-py connection class and its
    keyword arguments) and for the asyncio connection (``params``: ``host``/``port`` or
    ``path``, ``username``, ``password``, ``db``; ``tls``: an SSL context or None)."""

    name: str
    connection_class: type
    connection_kwargs: dict[str, Any]
    params: dict[str, Any]
    tls: ssl.SSLContext | None

    @classmethod
    def from_url(cls, url: str, *, timeout: float, connect_timeout: float,
                 options: dict[str, Any]) -> Endpoint:
        """``redis://``, ``rediss://`` or ``unix://`` plus redis-py connection options."""
        from redis.connection import parse_url

        try:
            pool = redis.ConnectionPool.from_url(url, socket_timeout=timeout,
                                                 socket_connect_timeout=connect_timeout,
                                                 **options)
            params: dict[str, Any] = {**parse_url(url), **options}  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise ConfigError("url", url, f"not a usable Redis URL: {exc}") from None
        try:  # no I/O: a connection connects on first use; a bad option fails here
            pool.connection_class(**pool.connection_kwargs)
        except TypeError as exc:
            raise ConfigError("options", options, f"not redis-py connection options: {exc}"
                              ) from None
        params.pop("connection_class", None)
        tls = tls_context(params) if url.startswith("rediss") else None
        name = params.get("path") or f"{params.get('host', 'localhost')}:{params.get('port', 6379)}"
        return cls(name, pool.connection_class, dict(pool.connection_kwargs), params, tls)

    def node(self, host: str, port: int) -> Endpoint:
        """The same settings (credentials, TLS, timeouts) for another ``host:port``."""
        kwargs = {**self.connection_kwargs, "host": host, "port": port}
        params = {**self.params, "host": host, "port": port}
        return Endpoint(f"{host}:{port}", self.connection_class, kwargs, params, self.tls)


def tls_context(params: dict[str, Any]) -> ssl.SSLContext:
    """TLS for the asyncio connections from redis-py's options: ``ssl_ca_certs``,
    ``ssl_ca_path``, ``ssl_certfile``/``ssl_keyfile`` (client certificate),
    ``ssl_cert_reqs="none"`` (no verification), ``ssl_check_hostname``."""
    ctx = ssl.create_default_context(cafile=params.get("ssl_ca_certs"),
                                     capath=params.get("ssl_ca_path"))
    if params.get("ssl_certfile"):
        ctx.load_cert_chain(params["ssl_certfile"], params.get("ssl_keyfile"),
                            params.get("ssl_password"))
    reqs = params.get("ssl_cert_reqs", "required")
    if reqs == ssl.CERT_NONE or str(reqs).lower() == "none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif params.get("ssl_check_hostname") is False:
        ctx.check_hostname = False
    return ctx


# -- the blocking path ------------------------------------------------------------------------
class NodePool:
    """A bounded LIFO pool of redis-py connections to one server. Connections are made
    lazily (they connect, authenticate and select on first use and reconnect after a
    failure); when all ``size`` are busy, :meth:`call` waits for one, first come first
    served (a released connection goes straight to the longest waiter, so no thread
    starves behind newcomers)."""

    __slots__ = ("_idle", "_lock", "_made", "_waiters", "endpoint", "size", "stats")

    def __init__(self, endpoint: Endpoint, size: int, stats: Transport) -> None:
        self.endpoint = endpoint
        self.size = size
        self.stats = stats
        self._idle: list[Any] = []
        self._made = 0
        self._waiters: deque[list[Any]] = deque()  # [lock held until handed, connection]
        self._lock = threading.Lock()

    def _get(self, wait: float) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._made < self.size:
                self._made += 1
                return self.endpoint.connection_class(**self.endpoint.connection_kwargs)
            handed = threading.Lock()
            handed.acquire()
            box: list[Any] = [handed, None]
            self._waiters.append(box)
        handed.acquire(timeout=wait)
        with self._lock:
            if box[1] is not None:  # handed over (perhaps just as the wait ended)
                return box[1]
            self._waiters.remove(box)
        raise PoolFull(f"redis: all {self.size} connections to {self.endpoint.name} "
                       f"stayed busy for {wait:g} s")

    def _put(self, conn: Any) -> None:
        with self._lock:
            if self._waiters:
                box = self._waiters.popleft()
                box[1] = conn
                box[0].release()
            else:
                self._idle.append(conn)

    def call(self, command: Command, timeout: float | None, wait: float,
             asking: bool = False) -> Any:
        """Send ``command`` (after ``ASKING``), read its reply within ``timeout`` (None:
        the socket timeout); on ``NOSCRIPT``, load the named script and send it again."""
        conn = self._get(wait)
        stats = self.stats
        try:
            head = [_ASKING, command.packed] if asking else [command.packed]
            stats.round_trips += 1
            conn.send_packed_command(head, check_health=False)
            if asking:
                _read(conn, timeout, errors=True)  # +OK; never leave a reply unread
            try:
                return _read(conn, timeout)
            except ResponseError as exc:
                if command.script is None or not is_noscript(exc):
                    raise
            load = scripts.get(command.script).load
            stats.round_trips += 1
            conn.send_packed_command([load, *head], check_health=False)
            replies = [_read(conn, timeout, errors=True) for _ in range(len(head) + 1)]
            for r in replies:
                if isinstance(r, ResponseError):
                    raise r
            return replies[-1]
        except ResponseError:
            raise  # the reply was read: the connection is in a clean state
        except BaseException:
            conn.disconnect()  # a reply may still be on its way: never reuse this socket
            raise
        finally:
            self._put(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._made -= len(idle)
        for conn in idle:
            conn.disconnect()


def _read(conn: Any, timeout: float | None, errors: bool = False) -> Any:
    try:
        if timeout is None:
            return conn.read_response()
        return conn.read_response(timeout=timeout)
    except ResponseError as exc:
        if errors:
            return exc
        raise


_ASKING = pack(("ASKING",))


class Transport:
    """What both transports share: timeouts, clock, breakers, one asyncio runner per
    event loop, and the count of network round trips."""

    def __init__(self, *, timeout: float, connect_timeout: float, max_connections: int,
                 clock: Clock | None = None, breakers: Breakers | None = None) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.clock = clock if clock is not None else system_clock
        self.breakers: Breakers = breakers if breakers is not None else _no_breaker
        self.round_trips = 0
        """Network round trips made (a pipelined batch counts once)."""
        self._loops: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}
        self._loops_lock = threading.Lock()

    def call(self, command: Command) -> Any:
        """Run ``command`` and return its reply (blocking)."""
        raise NotImplementedError

    def acall(self, command: Command) -> Awaitable[Any]:
        """Run ``command`` on the running event loop; await the result for the reply."""
        left = deadline.remaining()
        if left is not None and left < self.timeout:
            return self._acall_within(command, left)
        return self._submit(self._runner(), command)

    def _submit(self, runner: Any, command: Command) -> asyncio.Future[Any]:
        raise NotImplementedError

    async def _acall_within(self, command: Command, left: float) -> Any:
        if left <= 0:
            raise StorageError("redis: the deadline in force has passed")
        fut = self._submit(self._runner(), command)
        try:
            async with asyncio.timeout(left):
                return await fut
        except TimeoutError:
            raise StorageError("redis: no reply before the deadline in force") from None

    def _limits(self) -> tuple[float | None, float]:
        """(reply timeout or None for the socket's, pool wait) under the deadline in force."""
        left = deadline.remaining()
        if left is None:
            return None, self.timeout
        if left <= 0:
            raise StorageError("redis: the deadline in force has passed")
        if left < self.timeout:
            return max(left, 0.0001), left
        return None, self.timeout

    def _runner(self) -> Any:
        loop = asyncio.get_running_loop()
        entry = self._loops.get(id(loop))
        if entry is not None and entry[0] is loop:
            return entry[1]
        with self._loops_lock:
            for lid, (old, _) in list(self._loops.items()):
                if old.is_closed():
                    del self._loops[lid]
            runner = self._new_runner(loop)
            self._loops[id(loop)] = (loop, runner)
            return runner

    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Close the blocking connections."""

    async def aclose(self) -> None:
        """Close this event loop's connections (and the blocking ones)."""
        loop = asyncio.get_running_loop()
        entry = self._loops.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()
        self.close()


def _no_breaker(name: str) -> None:
    return None


def guarded(breaker: BreakerMachine | None, run: Callable[[], Any]) -> Any:
    """``run()`` under ``breaker``'s permission protocol: backend errors are failures,
    replies (error replies too) successes, anything else (a full pool, a cancelled
    call) gives the permit back. Every exception leaves as a StorageError."""
    if breaker is None:
        try:
            return run()
        except (*BACKEND_ERRORS, ResponseError) as exc:
            raise storage_error(exc) from exc
    epoch = breaker.acquire()
    try:
        reply = run()
    except ResponseError as exc:  # Redis answered (e.g. WRONGTYPE): not an outage
        breaker.on_success(epoch)
        raise storage_error(exc) from exc
    except PoolFull:
        breaker.release(epoch)
        raise
    except BACKEND_ERRORS as exc:
        breaker.on_failure(epoch)
        raise storage_error(exc) from exc
    except BaseException:
        breaker.release(epoch)
        raise
    breaker.on_success(epoch)
    return reply


class RedisTransport(Transport):
    """One Redis server (``redis://``, ``rediss://``, ``unix://``): a blocking pool and one
    pipelined connection per event loop, guarded by ``breakers("")``."""

    def __init__(self, endpoint: Endpoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint = endpoint
        self.pool = NodePool(endpoint, self.max_connections, self)
        self.breaker = self.breakers("")

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 0.05, connect_timeout: float | None = None,
                 max_connections: int = 64, clock: Clock | None = None,
                 breakers: Breakers | None = None, **options: Any) -> RedisTransport:
        """``options`` are redis-py connection options (``ssl_ca_certs=...``)."""
        ct = timeout if connect_timeout is None else connect_timeout
        endpoint = Endpoint.from_url(url, timeout=timeout, connect_timeout=ct, options=options)
        return cls(endpoint, timeout=timeout, connect_timeout=ct,
                   max_connections=max_connections, clock=clock, breakers=breakers)

    def call(self, command: Command) -> Any:
        timeout, wait = self._limits()
        pool = self.pool
        return guarded(self.breaker, lambda: pool.call(command, timeout, wait))

    def _submit(self, runner: Any, command: Command) -> asyncio.Future[Any]:
        breaker = self.breaker
        if breaker is not None:
            breaker.acquire()  # raises when open: no network
        fut: asyncio.Future[Any] = runner.submit(command)
        return fut

    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> Any:
        from stormguard.stores.redis.mux import Mux

        return Mux(self.endpoint, loop, self, self.breaker)

    def close(self) -> None:
        self.pool.close()
