"""Redis Cluster routing for the transport: slot map, MOVED/ASK, background refresh.

Each :class:`~.transport.Command` names the key that routes it (``Command.key``); the
command goes to the master owning that key's slot (a key-less command to any master).
Every key of one command must share a slot (use a hash tag): the router never splits
a command.

* The slot map comes from ``CLUSTER SLOTS`` on a known node (the masters, then the
  URL's nodes), loaded on first use and shared by the blocking path and every event
  loop.
* ``MOVED <slot> <host:port>``: the slot's entry is updated, the command goes on to the
  named master, the whole map is reloaded in the background. ``ASK``: the command goes
  to the named master once, after ``ASKING``. At most 3 redirections per command.
* A node failure (a failover moves slots) or ``CLUSTERDOWN``/``TRYAGAIN`` reloads the
  map in the background, at most once a second.
* Neither path ever sleeps or retries on its own: a check on a healthy master answers
  within ``timeout`` whatever the rest of the cluster does (redis-py's cluster client
  sleeps 0.25 s on ``CLUSTERDOWN``, which is why it is not used here).
* Breakers: ``breakers("")`` guards loading the map (reaching the cluster at all),
  ``breakers("host:port")`` each master.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from stormguard._core.errors import ConfigError, StorageCircuitOpen, StorageError
from stormguard.stores.redis.pool import NodePool
from stormguard.stores.redis.protocol import (
    CLUSTER_SLOTS,
    Command,
    Endpoint,
    PoolFull,
    storage_error,
)
from stormguard.stores.redis.transport import Transport, guarded

__all__ = ["ClusterTransport", "parse_cluster_url", "redirect", "unavailable"]

_SLOTS = 16384
_UNAVAILABLE = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING")


def parse_cluster_url(url: str, *, timeout: float, connect_timeout: float,
                      options: dict[str, Any]) -> tuple[list[tuple[str, int]], Endpoint]:
    """``redis+cluster://[user:password@]h1:p1,h2:p2`` (``rediss+cluster://``: TLS) -> the
    startup nodes and the settings every node is reached with."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    tls = parts.scheme.startswith("rediss")
    auth = ""
    if len(netloc) == 2:
        user, _, password = netloc[0].partition(":")
        auth = f"{user}:{password}@" if password else f"{user}@"
    nodes = []
    for item in netloc[-1].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("url", url, f"cluster node {item!r} must be host:port")
        nodes.append((unquote(host.strip("[]")), int(port)))
    query = f"?{parts.query}" if parts.query else ""  # connection options, for every node
    first = f"{'rediss' if tls else 'redis'}://{auth}{nodes[0][0]}:{nodes[0][1]}/0{query}"
    base = Endpoint.from_url(first, timeout=timeout, connect_timeout=connect_timeout,
                             options=options)
    return nodes, base


def redirect(exc: BaseException) -> tuple[str, int, str] | None:
    """("MOVED" | "ASK", slot, "host:port") from a redirection error reply: redis-py's
    parsed MovedError/AskError (blocking path) or hiredis's raw "MOVED 3999 h:p"."""
    if isinstance(exc, AskError):  # MovedError is a subclass
        kind = "MOVED" if isinstance(exc, MovedError) else "ASK"
        return kind, int(exc.slot_id), f"{exc.host}:{exc.port}"
    parts = str(exc).split()
    if len(parts) == 3 and parts[0] in ("MOVED", "ASK") and parts[1].isdigit():
        target = parts[2]
        if target.startswith(":"):  # an empty host: the node that answered
            return None
        return parts[0], int(parts[1]), target
    return None


def unavailable(exc: BaseException) -> bool:
    """CLUSTERDOWN, TRYAGAIN, MASTERDOWN, LOADING: the node answers but cannot serve."""
    return isinstance(exc, ClusterDownError | TryAgainError | MasterDownError
                      | BusyLoadingError) or str(exc).startswith(_UNAVAILABLE)


class ClusterTransport(Transport):
    """A Redis Cluster: per master a blocking pool and, per event loop, one pipelined
    connection; each command routed by its key's slot."""

    def __init__(self, startup: list[tuple[str, int]], base: Endpoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not startup:
            raise ConfigError("url", startup, "must name at least one cluster node")
        self.base = base
        self.startup = [f"{h}:{p}" for h, p in startup]
        self.slots: list[str | None] | None = None
        """The master of each slot (None until loaded)."""
        self.masters: list[str] = []
        self.refreshed_at = -1e9
        self._pools: dict[str, NodePool] = {}
        self._lock = threading.Lock()
        self._refreshing = False

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 0.05, connect_timeout: float | None = None,
                 max_connections: int = 64, clock: Any = None, breakers: Any = None,
                 **options: Any) -> ClusterTransport:
        ct = timeout if connect_timeout is None else connect_timeout
        startup, base = parse_cluster_url(url, timeout=timeout, connect_timeout=ct,
                                          options=options)
        return cls(startup, base, timeout=timeout, connect_timeout=ct,
                   max_connections=max_connections, clock=clock, breakers=breakers)

    # -- the slot map --------------------------------------------------------------------
    def endpoint(self, name: str) -> Endpoint:
        host, _, port = name.rpartition(":")
        return self.base.node(host, int(port))

    def set_slots(self, reply: Any, asked: str) -> None:
        """Install the map from a ``CLUSTER SLOTS`` reply given by node ``asked``."""
        table: list[str | None] = [None] * _SLOTS
        masters: list[str] = []
        for entry in reply:
            lo, hi, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            if host in ("", "?"):
                host = asked.rpartition(":")[0]
            name = f"{host}:{int(master[1])}"
            table[lo:hi + 1] = [name] * (hi - lo + 1)
            if name not in masters:
                masters.append(name)
        self.slots, self.masters = table, masters
        self.refreshed_at = self.clock.monotonic()

    def moved(self, slot: int, target: str) -> None:
        if self.slots is not None:
            self.slots[slot] = target

    def candidates(self) -> list[str]:
        """Nodes to ask for the map: the known masters, then the URL's nodes."""
        return [*self.masters, *(n for n in self.startup if n not in self.masters)]

    def node_of(self, key: bytes | None) -> str | None:
        """The master serving ``key`` (any master for None) on the loaded map."""
        slots = self.slots
        assert slots is not None
        if key is None:
            return self.masters[0] if self.masters else None
        return slots[key_slot(key)]

    def node_for(self, key: str | bytes) -> str:
        """The master (``host:port``) serving ``key`` (loads the map if needed)."""
        if self.slots is None:
            self._load()
        name = self.node_of(key.encode() if isinstance(key, str) else key)
        if name is None:
            raise StorageError("redis: no cluster node serves this key")
        return name

    def _fetch(self) -> None:
        last: BaseException = StorageError("redis: no cluster node to ask for the slot map")
        for name in self.candidates():
            try:
                reply = self._pool(name).call(CLUSTER_SLOTS, None, self.timeout)
            except ResponseError:
                raise  # e.g. NOAUTH: every node would say the same
            except Exception as exc:  # this node is down: ask the next
                last = exc
                continue
            self.set_slots(reply, name)
            return
        raise last

    def _load(self) -> None:
        with self._lock:
            if self.slots is None:
                guarded(self.breakers(""), self._fetch)

    def refresh(self, *, force: bool) -> None:
        """Reload the map in a background thread (at most once a second unless forced)."""
        with self._lock:
            if self._refreshing or self.slots is None or (
                    not force and self.clock.monotonic() - self.refreshed_at < 1.0):
                return
            self._refreshing = True
            self.refreshed_at = self.clock.monotonic()
        threading.Thread(target=self._refresh_worker, name="stormguard-slot-map",
                         daemon=True).start()

    def _refresh_worker(self) -> None:
        try:
            self._fetch()
        except Exception:  # noqa: S110 - the old map stays; the next failure tries again
            pass
        finally:
            self._refreshing = False

    def _pool(self, name: str) -> NodePool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools.setdefault(name, NodePool(self.endpoint(name),
                                                         self.max_connections, self))
        return pool

    # -- blocking ----------------------------------------------------------------------
    def call(self, command: Command) -> Any:
        timeout, wait = self._limits()
        if self.slots is None:
            self._load()
        to = self.node_of(command.key)
        asking = False
        for hop in range(4):
            if to is None:
                self.refresh(force=True)
                raise StorageError("redis: no cluster node serves this key")
            pool = self._pool(to)
            try:
                return guarded(self.breakers(to),
                               functools.partial(pool.call, command, timeout, wait, asking))
            except StorageError as exc:
                cause = exc.__cause__
                if isinstance(cause, ResponseError):
                    moved = redirect(cause)
                    if moved is not None and hop < 3:
                        kind, slot, to = moved
                        asking = kind == "ASK"
                        if not asking:
                            self.moved(slot, to)
                            self.refresh(force=True)
                        continue
                    if unavailable(cause):
                        self.refresh(force=False)
                elif not isinstance(exc, StorageCircuitOpen | PoolFull):
                    self.refresh(force=False)  # a node failed: perhaps a failover
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def call_many(self, commands: Sequence[Command]) -> list[Any]:
        """One round trip per master involved; a redirected command (MOVED/ASK) goes
        again on its own through :meth:`call`."""
        out: list[Any] = [None] * len(commands)
        try:
            timeout, wait = self._limits()
            if self.slots is None:
                self._load()
        except StorageError as exc:
            return [exc] * len(commands)
        groups: dict[str | None, list[int]] = {}
        for i, c in enumerate(commands):
            groups.setdefault(self.node_of(c.key), []).append(i)
        for node, idx in groups.items():
            if node is None:
                for i in idx:
                    out[i] = StorageError("redis: no cluster node serves this key")
                self.refresh(force=True)
                continue
            pool, batch = self._pool(node), [commands[i] for i in idx]
            try:
                replies = guarded(self.breakers(node),
                                  functools.partial(pool.call_many, batch, timeout, wait))
            except StorageError as exc:
                if not isinstance(exc, StorageCircuitOpen | PoolFull):
                    self.refresh(force=False)
                replies = [exc] * len(batch)
            for i, reply in zip(idx, replies, strict=True):
                out[i] = self._settle(commands[i], reply)
        return out

    def _settle(self, command: Command, reply: Any) -> Any:
        """A reply of :meth:`call_many`: a redirection goes again through :meth:`call`,
        an error reply becomes a StorageError."""
        if not isinstance(reply, ResponseError):
            return reply
        if redirect(reply) is None:
            return storage_error(reply)
        try:
            return self.call(command)
        except StorageError as exc:
            return exc

    def close(self) -> None:
        for pool in list(self._pools.values()):
            pool.close()

    # -- asyncio -----------------------------------------------------------------------
    def _new_runner(self, loop: asyncio.AbstractEventLoop) -> Any:
        from stormguard.stores.redis.router import Router

        return Router(self, loop)

    def _submit(self, runner: Any, command: Command) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = runner.submit(command)
        return fut
