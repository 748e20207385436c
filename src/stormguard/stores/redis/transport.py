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
  one more send; nothing is loaded at connect time (an asyncio connection sends a
  script's ``SCRIPT LOAD`` in the same write as its first ``EVALSHA`` of it).
* **Deadlines**: inside :func:`stormguard.deadline.scope` the wait for a connection and
  for the reply is clipped to the time left; a spent deadline fails at once.
* **Breaker** (optional): a :class:`~stormguard._core.breaker.BreakerMachine` whose
  ``acquire`` gates each call; connection errors, timeouts and protocol errors count as
  failures, replies (error replies included) as successes.

Usage, for any component that needs Redis (the stores, a rules source, a queue)::

    t = transport_for("redis://:pw@10.0.0.5:6379/2", timeout=0.2)
    t.call(Command.of("XADD", "jobs", "*", "n", 1, key="jobs"))          # blocking
    n = await t.acall(Command.of("XLEN", "jobs", key="jobs"))             # asyncio
    replies = t.call_many([Command.of("INCR", k, key=k) for k in keys])   # one round trip
    t.close(); await t.aclose()

Breakers come from ``breakers(name)`` (``""``: the transport as a whole, ``"host:port"``
a cluster master); a transport without them (the rules source) never fails fast.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from stormguard._core import deadline
from stormguard._core.breaker import BreakerMachine
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import StorageError
from stormguard.stores.redis.pool import NodePool
from stormguard.stores.redis.protocol import (
    BACKEND_ERRORS,
    Command,
    Endpoint,
    PoolFull,
    storage_error,
)

__all__ = ["Breakers", "Command", "Endpoint", "RedisTransport", "Transport", "guarded"]

Breakers = Callable[[str], "BreakerMachine | None"]
"""Gives the breaker guarding a node (``"host:port"``; ``""``: the transport as a whole)."""


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

    def call_many(self, commands: Sequence[Command]) -> list[Any]:
        """Run ``commands`` with one round trip per server (blocking) and return their
        replies in order; a command that failed (an error reply, its node down) has a
        :class:`StorageError` in its place instead of raising. On asyncio no such call
        is needed: concurrent :meth:`acall` s of one loop iteration share one write."""
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

    def call_many(self, commands: Sequence[Command]) -> list[Any]:
        commands = list(commands)
        if not commands:
            return []
        try:
            timeout, wait = self._limits()
            pool = self.pool
            replies = guarded(self.breaker, lambda: pool.call_many(commands, timeout, wait))
        except StorageError as exc:
            return [exc] * len(commands)
        return [storage_error(r) if isinstance(r, ResponseError) else r for r in replies]

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
