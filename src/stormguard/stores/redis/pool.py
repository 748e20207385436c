"""The blocking path: a bounded, first-come-first-served pool of redis-py connections
to one server, and one round trip on it (with ``ASKING`` and ``NOSCRIPT`` handled)."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from stormguard.stores.redis import scripts
from stormguard.stores.redis.protocol import ASKING, Command, Endpoint, PoolFull, is_noscript

if TYPE_CHECKING:
    from stormguard.stores.redis.transport import Transport

__all__ = ["NodePool"]


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
            head = [ASKING.packed, command.packed] if asking else [command.packed]
            stats.round_trips += 1
            conn.send_packed_command(head, check_health=False)
            if asking:
                _read(conn, timeout, errors=True)  # +OK; never leave a reply unread
            try:
                return _read(conn, timeout)
            except ResponseError as exc:
                if command.script is None or not is_noscript(exc):
                    raise
            try:
                load = scripts.get(command.script).load
            except KeyError:
                raise ResponseError(f"NOSCRIPT and no script registered as "
                                    f"{command.script!r}") from None
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

    def call_many(self, commands: list[Command], timeout: float | None,
                  wait: float) -> list[Any]:
        """Send ``commands`` in one write and read their replies (an error reply in its
        place, as a ``ResponseError``); the ones that met ``NOSCRIPT`` go again, behind
        their scripts' ``SCRIPT LOAD``, in one more round trip."""
        conn = self._get(wait)
        stats = self.stats
        try:
            stats.round_trips += 1
            conn.send_packed_command([c.packed for c in commands], check_health=False)
            replies = [_read(conn, timeout, errors=True) for _ in commands]
            again = [i for i, c in enumerate(commands)
                     if c.script is not None and is_noscript(replies[i])]
            if again:
                names = {commands[i].script for i in again}
                loads = [scripts.registered()[n].load for n in names
                         if n in scripts.registered()]
                stats.round_trips += 1
                conn.send_packed_command([*loads, *(commands[i].packed for i in again)],
                                         check_health=False)
                for _ in loads:
                    _read(conn, timeout, errors=True)
                for i in again:
                    replies[i] = _read(conn, timeout, errors=True)
            return replies
        except BaseException:
            conn.disconnect()
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


