"""The contract every queue backend keeps (memory, SQLite, Redis Streams).

Times are epoch seconds on the queue's clock (``clock.wall()``), passed in by the caller
so that a :class:`~stormguard.testing.FakeClock` drives leases and retries. A job is
*pending* (waiting, or due later after a failure), *in flight* (leased to a worker until
its lease ends; then pending again) or *dead*. Every answer of a worker names the lease
it holds (``job.token``): the answer of a worker whose lease was lost changes nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from stormguard.queue.job import DeadLetter, Job

__all__ = ["Backend"]


class Backend(ABC):
    """One queue's storage."""

    durable: bool = True
    """True when a job survives the process that deferred it."""

    @abstractmethod
    def put(self, task: str, payload: str, key: str | None, now: float) -> str:
        """Enqueue a job (durable when this returns); with ``key``, return the id of the
        pending or in-flight job holding that key instead, enqueueing nothing."""

    async def aput(self, task: str, payload: str, key: str | None, now: float) -> str:
        """:meth:`put` from asyncio (default: the blocking call)."""
        return self.put(task, payload, key, now)

    @abstractmethod
    def take(self, n: int, now: float, lease: float, owner: str) -> list[Job]:
        """Lease up to ``n`` due jobs to ``owner`` for ``lease`` seconds."""

    @abstractmethod
    def ack(self, job: Job) -> bool:
        """The job succeeded: remove it (False when its lease was lost)."""

    def finish(self, done: Sequence[Job], n: int, now: float, lease: float,
               owner: str) -> tuple[list[bool], list[Job]]:
        """:meth:`ack` the jobs ``done``, then :meth:`take` up to ``n`` (0: none): what a
        worker does between two rounds, in one round trip where the backend can."""
        acked = [self.ack(job) for job in done]
        return acked, (self.take(n, now, lease, owner) if n > 0 else [])

    @abstractmethod
    def retry_later(self, job: Job, at: float, attempts: int, error: str) -> bool:
        """The attempt failed: pending again from ``at`` with ``attempts`` failures."""

    @abstractmethod
    def release(self, job: Job, now: float) -> bool:
        """Give the job back untouched (attempts unchanged), pending at once."""

    @abstractmethod
    def bury(self, job: Job, attempts: int, error: str, now: float) -> bool:
        """Move the job to the dead letters."""

    @abstractmethod
    def extend(self, jobs: Sequence[Job], now: float, lease: float) -> None:
        """Renew the leases of jobs still being worked on."""

    @abstractmethod
    def stats(self, now: float) -> dict[str, int]:
        """``{"pending": .., "in_flight": .., "dead": ..}``."""

    @abstractmethod
    def next_due(self, now: float) -> float | None:
        """When a job may next be taken (``<= now``: now), or None when the queue holds
        no pending and no in-flight job."""

    @abstractmethod
    def dead(self, limit: int) -> list[DeadLetter]:
        """The dead letters, oldest job first."""

    @abstractmethod
    def retry_dead(self, now: float) -> int:
        """Every dead letter back to pending with no failed attempt; returns how many.
        A dead letter whose key is held by a live job is dropped (that job stands for it)."""

    async def aclose(self) -> None:
        """Release this event loop's connections too (default: :meth:`close`)."""
        self.close()

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to close)
        """Release connections."""
