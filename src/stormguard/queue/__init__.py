"""The durable deferred-work queue: ``DeferredQueue``, its fallback and its worker.

::

    q = DeferredQueue("sqlite:///var/lib/shop/deferred.db")
    job = q.defer("send_sms", {"order": 4711, "to": "+8801700000000"}, key="sms:4711")
    worker = q.worker({"send_sms": send_sms}, pipeline=Pipeline(breaker, Timeout(1.0)))
    worker.drain(timeout=60)
"""

from __future__ import annotations

from stormguard.queue.core import DeferredQueue
from stormguard.queue.events import JobDead, JobDeferred, JobRetryScheduled, WorkerPaused
from stormguard.queue.fallback import DEFAULT_ON, DeferFallback, bind_payload
from stormguard.queue.job import Backoff, DeadLetter, Deferred, Job
from stormguard.queue.worker import Worker

__all__ = [
    "DEFAULT_ON",
    "Backoff",
    "DeadLetter",
    "DeferFallback",
    "Deferred",
    "DeferredQueue",
    "Job",
    "JobDead",
    "JobDeferred",
    "JobRetryScheduled",
    "Worker",
    "WorkerPaused",
    "bind_payload",
]
