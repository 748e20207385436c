"""Where regions leave each other their demand reports: a *board* in each region's store.

Region ``A`` writes its report to the board of every peer region ``P`` (one batched
write per peer and sync) and reads its own board (reports the peers left for it). A
report is opaque bytes here; a board keeps the latest one per sender.

* :class:`RedisBoard`: a hash ``{prefix}:regional:{group}`` in the region's Redis (one
  field per sender, the key expiring ``ttl`` after the last write), over a transport of
  its own with the cross-region timeouts (hundreds of ms), never the one of the
  request path (tens of ms).
* :class:`MemoryBoard`: the same in process, for regions whose store is a
  :class:`~stormguard.MemoryStore` (tests, simulations, one process per "region").
"""

from __future__ import annotations

import threading
from typing import Any

from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError, StorageError
from stormguard.stores.base import Store
from stormguard.stores.memory import MemoryStore

__all__ = ["Board", "MemoryBoard", "RedisBoard", "board_for"]


class Board:
    """A region's inbox of peer reports (the latest one per sender)."""

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        """Leave ``payload`` as ``sender``'s latest report (raises StorageError)."""
        raise NotImplementedError

    def read(self) -> dict[str, bytes]:
        """Every sender's latest report (raises StorageError)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""


class MemoryBoard(Board):
    """A board in process memory; reports expire ``ttl`` seconds (of ``clock``) after
    their write."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else system_clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[float, bytes]] = {}

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        with self._lock:
            self._data[sender] = (self.clock.monotonic() + ttl, payload)

    def read(self) -> dict[str, bytes]:
        now = self.clock.monotonic()
        with self._lock:
            return {s: p for s, (exp, p) in self._data.items() if exp > now}


def _no_setinfo(options: dict[str, Any]) -> dict[str, Any]:
    """The redis-py option that turns the CLIENT SETINFO handshake off (``driver_info=None``
    since redis-py 7, ``lib_name``/``lib_version=None`` before), unless the caller chose."""
    import inspect

    from redis.connection import Connection

    if {"driver_info", "lib_name", "lib_version"} & set(options):
        return {}
    params = inspect.signature(Connection.__init__).parameters
    if "driver_info" in params:
        return {"driver_info": None}
    if "lib_name" in params:
        return {"lib_name": None, "lib_version": None}
    return {}


class RedisBoard(Board):
    """A board in a Redis hash, reached over its own transport (see the module)."""

    def __init__(self, url: str, *, group: str = "default", prefix: str = "stormguard",
                 timeout: float = 0.5, clock: Clock | None = None,
                 **client_options: Any) -> None:
        from stormguard.stores.redis import transport_for
        from stormguard.stores.redis.protocol import Command

        self.url = url
        self.key = f"{prefix}:regional:{group}"
        self._command = Command
        # no CLIENT SETINFO handshake: two round trips saved on every new cross-region
        # connection (redis-py sends them by default)
        client_options.update(_no_setinfo(client_options))
        self.transport = transport_for(url, timeout=timeout, connect_timeout=timeout,
                                       max_connections=4,
                                       clock=clock if clock is not None else system_clock,
                                       **client_options)

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        c = self._command
        replies = self.transport.call_many([
            c.of("HSET", self.key, sender, payload, key=self.key),
            c.of("PEXPIRE", self.key, max(1, round(ttl * 1000)), key=self.key)])
        for r in replies:
            if isinstance(r, StorageError):
                raise r

    def read(self) -> dict[str, bytes]:
        reply = self.transport.call(self._command.of("HGETALL", self.key, key=self.key))
        if isinstance(reply, dict):  # the blocking path answers a map
            pairs = list(reply.items())
        else:  # a flat list of field, value
            items = list(reply or [])
            pairs = [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        return {(f.decode() if isinstance(f, bytes) else str(f)): v for f, v in pairs}

    def close(self) -> None:
        self.transport.close()


# the board of a MemoryStore lives as long as the store: every RegionalStore handed the
# same MemoryStore object (regions simulated in one process) meets at the same board
_LOCK = threading.Lock()
_BOARD_ATTR = "_stormguard_regional_board"
"""A MemoryStore's board lives on the store itself (an attribute), not in a
WeakKeyDictionary: the compiled (mypyc) MemoryStore does not clear weak references when
it is freed, so a weak reference to one crashes the interpreter at garbage collection."""


def board_for(target: str | Store, *, group: str, timeout: float,
              clock: Clock | None = None) -> Board:
    """The board of a region's store, given as a URL or a store: a Redis URL or a Redis
    store (a board over the same server, with ``timeout``) or a MemoryStore."""
    if isinstance(target, str):
        scheme = target.split("://", 1)[0].lower() if "://" in target else ""
        if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
            return RedisBoard(target, group=group, timeout=timeout, clock=clock)
        raise ConfigError("stores", target, "a peer region's store must be a Redis URL "
                          "(redis://, rediss://, unix://, redis+cluster://), a Redis store "
                          "or a MemoryStore, or its board given in boards=")
    if isinstance(target, MemoryStore):
        with _LOCK:
            board = getattr(target, _BOARD_ATTR, None)
            if not isinstance(board, MemoryBoard):
                board = MemoryBoard(target.clock)
                setattr(target, _BOARD_ATTR, board)
        return board
    inner = getattr(target, "backend", None)
    if isinstance(inner, Store) and inner is not target:
        # a store over a store (a HybridStore over Redis): the board beside its backend
        return board_for(inner, group=group, timeout=timeout, clock=clock)
    url = getattr(target, "url", None)
    if isinstance(url, str):
        options = dict(getattr(target, "client_options", None) or {})
        return RedisBoard(url, group=group, timeout=timeout, clock=clock,
                          prefix=getattr(target, "prefix", "stormguard"), **options)
    raise ConfigError("stores", target, f"cannot reach a {type(target).__name__} as a peer: "
                      "give a Redis URL, a Redis store or a MemoryStore, or its board in "
                      "boards=")
