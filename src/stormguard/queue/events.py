"""The queue's typed events (see :mod:`stormguard.observability.events`).

Built only when someone listens, on the slow paths: a call deferred by the fallback, a
failed attempt scheduled for a retry, a job sent to the dead letters, a worker pausing
for an open breaker or a shaper's slot. ``policy`` is the fallback's or the worker's name.

Each kind says the level :class:`~stormguard.observability.events.LoggingListener` logs
it at (``log_level``): the queue doing its work (a call deferred, a retry scheduled, a
worker waiting for a breaker or a shaper) is INFO; a job given up, in the dead letters
until someone acts, is ERROR.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from stormguard.observability.events import Event

__all__ = ["JobDead", "JobDeferred", "JobRetryScheduled", "WorkerPaused"]


@dataclass(frozen=True, slots=True)
class JobDeferred(Event):
    """The fallback put the failed call into the queue as ``job_id`` because of ``cause``."""

    log_level: ClassVar[int] = logging.INFO

    task: str
    job_id: str
    cause: BaseException


@dataclass(frozen=True, slots=True)
class JobRetryScheduled(Event):
    """Attempt ``attempt`` of ``job_id`` failed with ``error``; it is due again in
    ``delay`` seconds."""

    log_level: ClassVar[int] = logging.INFO

    task: str
    job_id: str
    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, slots=True)
class JobDead(Event):
    """``job_id`` went to the dead letters after ``attempts`` failed attempts (0: its task
    has no handler), ``error`` being the last error's text."""

    log_level: ClassVar[int] = logging.ERROR

    task: str
    job_id: str
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class WorkerPaused(Event):
    """The worker takes no work for ``seconds``: its pipeline answered ``reason`` (the
    error class: ``CircuitOpen``, ``ShaperFull``); the job went back to pending."""

    log_level: ClassVar[int] = logging.INFO

    task: str
    job_id: str
    seconds: float
    reason: str
