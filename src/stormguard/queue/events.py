"""The queue's typed events (see :mod:`stormguard.observability.events`).

Built only when someone listens, on the slow paths: a call deferred by the fallback, a
failed attempt scheduled for a retry, a job sent to the dead letters, a worker pausing
for an open breaker or a shaper's slot. ``policy`` is the fallback's or the worker's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from stormguard.observability.events import Event

__all__ = ["JobDead", "JobDeferred", "JobRetryScheduled", "WorkerPaused"]


@dataclass(frozen=True, slots=True)
class JobDeferred(Event):
    """The fallback put the failed call into the queue as ``job_id`` because of ``cause``."""

    task: str
    job_id: str
    cause: BaseException


@dataclass(frozen=True, slots=True)
class JobRetryScheduled(Event):
    """Attempt ``attempt`` of ``job_id`` failed with ``error``; it is due again in
    ``delay`` seconds."""

    task: str
    job_id: str
    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, slots=True)
class JobDead(Event):
    """``job_id`` went to the dead letters after ``attempts`` failed attempts (0: its task
    has no handler), ``error`` being the last error's text."""

    task: str
    job_id: str
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class WorkerPaused(Event):
    """The worker takes no work for ``seconds``: its pipeline answered ``reason`` (the
    error class: ``CircuitOpen``, ``ShaperFull``); the job went back to pending."""

    task: str
    job_id: str
    seconds: float
    reason: str
