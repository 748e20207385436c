"""DeferredQueue: work that must happen, later.

``defer(task, payload, key=...)`` stores a job (a task name and a dict of keyword
arguments, as JSON); :meth:`DeferredQueue.worker` drains it through a pipeline;
:meth:`DeferredQueue.fallback` is the pipeline policy that defers a call that failed
because its dependency is refusing or too slow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard.observability.events import Listener
from stormguard.observability.metrics import track
from stormguard.queue.backends import Backend, open_backend
from stormguard.queue.job import DeadLetter, encode_payload
from stormguard.resilience._base import ExceptionSpec

if TYPE_CHECKING:
    from stormguard.queue.fallback import DeferFallback
    from stormguard.queue.worker import Worker
    from stormguard.resilience._base import Policy

__all__ = ["DeferredQueue"]

_log = logging.getLogger("stormguard.queue")


class DeferredQueue:
    """A durable queue of deferred work.

    ``url``: ``sqlite:///path/file.db`` (embedded, durable once :meth:`defer` returns),
    ``redis://host:6379/0`` or ``redis+cluster://h1:p1,h2:p2`` (a Redis stream and a
    consumer group; ``stream=`` names it), ``memory://`` (tests only: not durable).
    ``options`` go to the backend (SQLite: ``busy_timeout``; Redis: ``timeout``,
    ``connect_timeout`` and redis-py connection options).
    """

    def __init__(self, url: str, *, stream: str | None = None, group: str | None = None,
                 consumer: str | None = None, clock: Clock | None = None,
                 name: str | None = None, **options: Any) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock: must be a stormguard Clock (got {type(clock).__name__})")
        self.clock: Clock = system_clock if clock is None else clock
        self.url = url
        self.backend: Backend = open_backend(url, stream=stream, group=group,
                                             consumer=consumer, **options)
        self.name = validate.text("name", name if name is not None else stream or "deferred")
        """Names the queue in metrics (``stormguard_queue_pending{name=...}``): ``name=``,
        else ``stream=``, else ``"deferred"``."""
        track(self, "queue")  # metrics: pending, in flight, dead (read from stats())
        if not self.backend.durable:
            _log.warning("stormguard queue %s is not durable: its jobs live in this process "
                         "and are lost when it exits (tests and examples only)", url)

    def __repr__(self) -> str:
        durable = "" if self.durable else ", not durable"
        return f"DeferredQueue({self._redacted()!r}{durable})"

    def _redacted(self) -> str:
        scheme, sep, rest = self.url.partition("://")
        if "@" in rest.split("/", 1)[0]:
            return f"{scheme}{sep}***@{rest.split('@', 1)[1]}"
        return self.url

    @property
    def durable(self) -> bool:
        """False for ``memory://``: its jobs are lost with the process."""
        return self.backend.durable

    # -- producing ------------------------------------------------------------------------
    @staticmethod
    def _task(task: object) -> str:
        return validate.text("task", task, max_length=200)

    @staticmethod
    def _key(key: object) -> str | None:
        if key is None:
            return None
        return validate.text("key", key, max_length=1000)

    @staticmethod
    def _encode(payload: object, what: str = "payload") -> str:
        return encode_payload(payload, what)

    def _put(self, task: str, payload: str, key: str | None) -> str:
        return self.backend.put(task, payload, key, self.clock.wall())

    async def _aput(self, task: str, payload: str, key: str | None) -> str:
        return await self.backend.aput(task, payload, key, self.clock.wall())

    def defer(self, task: str, payload: Mapping[str, Any] | None = None, *,
              key: str | None = None) -> str:
        """Store a job: the worker will call ``handlers[task](**payload)``. Returns its id.

        With ``key`` (an idempotency key), a second defer while a job with that key is
        pending or in flight returns that job's id and enqueues nothing. Durable when it
        returns (SQLite; Redis as durable as the server's persistence)."""
        name = self._task(task)
        text = self._encode({} if payload is None else payload)
        return self._put(name, text, self._key(key))

    async def adefer(self, task: str, payload: Mapping[str, Any] | None = None, *,
                     key: str | None = None) -> str:
        """:meth:`defer` from asyncio."""
        name = self._task(task)
        text = self._encode({} if payload is None else payload)
        return await self._aput(name, text, self._key(key))

    def fallback(self, task: str, on: ExceptionSpec | None = None, *,
                 key: Callable[[dict[str, Any]], str | None] | None = None,
                 name: str | None = None, listeners: tuple[Listener, ...] = ()
                 ) -> DeferFallback:
        """A Fallback policy that defers the failed call's arguments under ``task`` and
        answers :class:`~stormguard.Deferred`.

        ``on`` (default: CircuitOpen, BulkheadFull, ShaperFull, DeadlineExceeded,
        RetryBudgetExhausted, TransientError) picks the failures to defer; ``key`` is a
        function of the payload giving the job's idempotency key."""
        from stormguard.queue.fallback import DeferFallback

        return DeferFallback(self, task, on, key=key, name=name, listeners=listeners)

    # -- consuming ------------------------------------------------------------------------
    def worker(self, handlers: Mapping[str, Callable[..., Any]], *,
               pipeline: Policy | None = None, concurrency: int = 8, max_attempts: int = 10,
               visibility_timeout: float = 30.0,
               backoff: Callable[[int], float] | None = None, poll_interval: float = 0.1,
               name: str = "worker", clock: Clock | None = None,
               listeners: tuple[Listener, ...] = ()) -> Worker:
        """A worker calling ``handlers[job.task](**payload)`` through ``pipeline``
        (see :class:`stormguard.queue.Worker`); ``clock`` defaults to the queue's."""
        from stormguard.queue.worker import Worker

        return Worker(self, handlers, pipeline=pipeline, concurrency=concurrency,
                      max_attempts=max_attempts, visibility_timeout=visibility_timeout,
                      backoff=backoff, poll_interval=poll_interval, name=name,
                      clock=clock, listeners=listeners)

    # -- operating ------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """``{"pending": .., "in_flight": .., "dead": ..}`` (pending includes jobs waiting
        for a retry; a job whose lease ended is pending again)."""
        return self.backend.stats(self.clock.wall())

    def dead(self, limit: int = 1000) -> list[DeadLetter]:
        """The dead letters (``task``, ``payload``, ``attempts``, ``error``), oldest first."""
        return self.backend.dead(validate.integer("limit", limit))

    def retry_dead(self) -> int:
        """Every dead letter back to pending, its attempts reset; returns how many."""
        return self.backend.retry_dead(self.clock.wall())

    def close(self) -> None:
        """Release the queue's connections."""
        self.backend.close()

    async def aclose(self) -> None:
        """Release the connections of the running event loop as well (Redis: call it
        before the loop that deferred ends)."""
        await self.backend.aclose()

    async def __aenter__(self) -> DeferredQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> DeferredQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
