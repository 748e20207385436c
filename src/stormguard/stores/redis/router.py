"""One event loop's side of a Redis Cluster: a pipelined connection per master, each
command sent to its key's master, MOVED/ASK followed, the slot map reloaded in the
background (see :mod:`.cluster` for the rules)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from stormguard._core.errors import StorageCircuitOpen, StorageError
from stormguard.stores.redis.cluster import redirect, unavailable
from stormguard.stores.redis.mux import Mux, retrieve
from stormguard.stores.redis.protocol import ASKING, CLUSTER_SLOTS, Command, storage_error

if TYPE_CHECKING:
    from stormguard.stores.redis.cluster import ClusterTransport

__all__ = ["Router"]


class Router:
    """One event loop's side of the cluster: one :class:`~.mux.Mux` per master (the same
    pipelining and eager slices as on one node), each command sent to its slot's master,
    each master gated by its own breaker."""

    def __init__(self, transport: ClusterTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.t = transport
        self.loop = loop
        self.muxes: dict[str, Mux] = {}
        self.loading: asyncio.Task[None] | None = None
        self.waiting: list[tuple[Command, asyncio.Future[Any]]] = []
        self.refreshing: asyncio.Task[None] | None = None

    def submit(self, command: Command) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        if self.t.slots is None:
            self.waiting.append((command, fut))
            if self.loading is None:
                self.loading = self.loop.create_task(self._load())
        else:
            self._route(command, fut, 0)
        return fut

    def mux(self, name: str) -> Mux:
        mux = self.muxes.get(name)
        if mux is None:
            mux = self.muxes[name] = Mux(self.t.endpoint(name), self.loop, self.t,
                                         self.t.breakers(name))
        return mux

    async def _fetch(self, *, initial: bool = False) -> None:
        """``CLUSTER SLOTS`` from the first node that answers. The first load goes over a
        connection of its own (closed afterwards), so the masters' connections all start
        with the queue that waited for the map: one write each."""
        last: BaseException = StorageError("redis: no cluster node to ask for the slot map")
        for name in self.t.candidates():
            mux = Mux(self.t.endpoint(name), self.loop, self.t, None) if initial \
                else self.mux(name)
            try:
                reply = await mux.submit(CLUSTER_SLOTS)
            except StorageError as exc:
                if isinstance(exc.__cause__, ResponseError):
                    raise
                last = exc
                continue
            finally:
                if initial:
                    await mux.aclose()
            self.t.set_slots(reply, name)
            return
        raise last

    async def _load(self) -> None:
        """Load the slot map, then route what waited for it."""
        breaker = self.t.breakers("")
        try:
            if breaker is not None:
                breaker.acquire()  # the cluster as a whole: fail fast while unreachable
            await self._fetch(initial=True)
        except BaseException as exc:
            self.loading = None
            if breaker is not None and not isinstance(exc, StorageCircuitOpen
                                                      | asyncio.CancelledError):
                if isinstance(exc.__cause__, ResponseError):
                    breaker.success()
                else:
                    breaker.failure()
            waiting, self.waiting = self.waiting, []
            err = storage_error(exc)
            for _, fut in waiting:
                if not fut.done():
                    fut.set_exception(err)
            if not isinstance(exc, Exception):
                raise
            return
        if breaker is not None:
            breaker.success()
        self.loading = None
        waiting, self.waiting = self.waiting, []
        for command, fut in waiting:
            if not fut.done():
                self._route(command, fut, 0)

    def _route(self, command: Command, fut: asyncio.Future[Any], hops: int,
               to: str | None = None, asking: bool = False) -> None:
        try:
            self._send(command, fut, hops, to, asking)
        except Exception as exc:  # never leave a caller without an outcome
            if not fut.done():
                fut.set_exception(storage_error(exc))

    def _send(self, command: Command, fut: asyncio.Future[Any], hops: int,
              to: str | None, asking: bool) -> None:
        if to is None:
            to = self.t.node_of(command.key)
            if to is None:
                fut.set_exception(StorageError("redis: no cluster node serves this key"))
                self._refresh(force=True)
                return
        mux = self.mux(to)
        breaker = self.t.breakers(to)
        if breaker is not None:
            try:
                breaker.acquire()
            except StorageError as exc:  # this master's breaker is open: no network
                fut.set_exception(exc)
                return
        if asking:
            mux.submit(ASKING).add_done_callback(retrieve)
        inner = mux.submit(command)
        inner.add_done_callback(functools.partial(self._done, command, fut, hops))

    def _done(self, command: Command, fut: asyncio.Future[Any], hops: int,
              inner: asyncio.Future[Any]) -> None:
        if fut.done():
            return
        if inner.cancelled():
            fut.cancel()
            return
        exc = inner.exception()
        if exc is None:
            fut.set_result(inner.result())
            return
        cause = exc.__cause__
        if isinstance(cause, ResponseError):
            moved = redirect(cause)
            if moved is not None and hops < 3:
                kind, slot, to = moved
                if kind == "MOVED":
                    self.t.moved(slot, to)
                    self._refresh(force=True)
                self._route(command, fut, hops + 1, to, kind == "ASK")
                return
            if unavailable(cause):
                self._refresh(force=False)
        elif not isinstance(exc, StorageCircuitOpen):
            self._refresh(force=False)  # a node failed: perhaps a failover moved its slots
        fut.set_exception(exc)

    def _refresh(self, *, force: bool) -> None:
        """Reload the slot map in the background (at most once a second unless forced)."""
        t = self.t
        if t.slots is None or self.refreshing is not None:
            return
        if not force and t.clock.monotonic() - t.refreshed_at < 1.0:
            return
        t.refreshed_at = t.clock.monotonic()
        self.refreshing = self.loop.create_task(self._reload())

    async def _reload(self) -> None:
        try:
            await self._fetch()
        except Exception:  # noqa: S110 - the old map stays; the next failure tries again
            pass
        finally:
            self.refreshing = None

    async def aclose(self) -> None:
        for task in (self.loading, self.refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for mux in list(self.muxes.values()):
            await mux.aclose()
        self.muxes.clear()
        for _, fut in self.waiting:
            if not fut.done():
                fut.set_exception(StorageError("redis: store closed"))
        self.waiting = []
