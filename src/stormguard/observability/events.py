"""Typed events every policy emits, and the listeners that receive them.

A listener is any ``Callable[[Event], None]``. Register it on one policy
(``policy.add_listener(fn)``) or for every policy in the process
(:func:`add_listener`). Events are built only when someone listens, and only
on the slow paths (a retry, a rejection, a state change, a timeout), so an
unobserved policy pays nothing for them. A listener that raises is logged and
ignored: observability never breaks the call it observes.

Metrics exporters (Prometheus, OpenTelemetry) plug in here: one listener that
maps each event type to a counter or a span event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BudgetExhausted",
    "BulkheadRejected",
    "CallRejected",
    "CallThrottled",
    "Event",
    "FallbackUsed",
    "LimitChanged",
    "Listener",
    "LoggingListener",
    "RequestShed",
    "RetryGaveUp",
    "RetryScheduled",
    "ShaperDegraded",
    "ShaperPaused",
    "ShaperRejected",
    "ShaperWaited",
    "StateChanged",
    "TimedOut",
    "add_listener",
    "remove_listener",
]

_log = logging.getLogger("stormguard")


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: which policy (its ``name``) and when (monotonic seconds)."""

    policy: str
    at: float


@dataclass(frozen=True, slots=True)
class RetryScheduled(Event):
    """Attempt ``attempt`` failed with ``error``; the next one starts after ``delay`` s."""

    attempt: int
    delay: float
    error: BaseException


@dataclass(frozen=True, slots=True)
class RetryGaveUp(Event):
    """Retry stops and raises: ``reason`` is "attempts", "not_retryable" or "deadline"."""

    attempt: int
    reason: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class BudgetExhausted(Event):
    """The shared retry budget refused a retry after ``error``."""

    attempt: int
    error: BaseException


@dataclass(frozen=True, slots=True)
class StateChanged(Event):
    """A circuit breaker moved from ``old`` to ``new`` ("closed", "open", "half_open")."""

    old: str
    new: str


@dataclass(frozen=True, slots=True)
class CallRejected(Event):
    """A breaker rejected a call; ``reason``: "open", "half_open_full" or "forced_open"."""

    reason: str
    remaining: float


@dataclass(frozen=True, slots=True)
class BulkheadRejected(Event):
    """A bulkhead had no free slot within ``waited`` seconds."""

    max_concurrent: int
    waited: float


@dataclass(frozen=True, slots=True)
class TimedOut(Event):
    """A timeout's deadline passed; ``seconds`` was its budget (after clipping)."""

    seconds: float
    total: bool


@dataclass(frozen=True, slots=True)
class FallbackUsed(Event):
    """A fallback answered instead; ``cause`` is the exception or the rejected result."""

    cause: object


@dataclass(frozen=True, slots=True)
class ShaperWaited(Event):
    """A shaper held a call ``wait`` seconds for its slot (emitted when it departs)."""

    wait: float


@dataclass(frozen=True, slots=True)
class ShaperRejected(Event):
    """A shaper refused a call (:class:`~stormguard.ShaperFull`): ``reason`` is "max_wait",
    "deadline", "max_queue", "paused" or "store"; ``wait`` the wait it would have had
    (0.0 when unknown), ``retry_after`` what the error carries."""

    reason: str
    wait: float
    retry_after: float


@dataclass(frozen=True, slots=True)
class ShaperPaused(Event):
    """A shaper paused: nobody departs for ``seconds``; ``cause`` is the error whose
    ``retry_after`` asked for it (None: ``pause()`` was called)."""

    seconds: float
    cause: BaseException | None


@dataclass(frozen=True, slots=True)
class ShaperDegraded(Event):
    """A shaper's store failed (``error``); the call was handled by ``on_error``
    (``action``: "local", "allow" or "deny")."""

    action: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class RequestShed(Event):
    """Overload protection refused a request or call of ``tier`` ("critical", "degraded",
    "sheddable"); ``reason``: "capacity" (its tier's slots were taken and it could not
    wait), "queue_timeout" (no slot within the wait) or "codel" (a standing queue: shed
    on arrival). ``in_flight`` and ``limit`` are the concurrency then."""

    tier: str
    reason: str
    in_flight: int
    limit: int


@dataclass(frozen=True, slots=True)
class LimitChanged(Event):
    """An adaptive concurrency limit moved from ``old`` to ``new``; ``ratio`` was the
    measured latency over its no-load minimum that moved it."""

    old: int
    new: int
    ratio: float


@dataclass(frozen=True, slots=True)
class CallThrottled(Event):
    """Client-side throttling rejected a call locally, with ``probability``;
    ``requests`` and ``accepts`` are the counts over its window."""

    probability: float
    requests: int
    accepts: int


Listener = Callable[[Event], None]

_global: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Receive the events of every policy in the process."""
    _global.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop a listener added with :func:`add_listener` (ValueError if absent)."""
    _global.remove(listener)


def emit(listeners: list[Listener], event: Event) -> None:
    """Deliver ``event`` to the policy's listeners, then the global ones."""
    for listener in (*listeners, *_global):
        try:
            listener(event)
        except Exception:
            _log.exception("stormguard event listener %r failed on %r", listener, event)


def observed(listeners: list[Listener]) -> bool:
    """True when building an event is worth it."""
    return bool(listeners or _global)


class LoggingListener:
    """Log every event on ``logger`` (default ``"stormguard"``).

    An event class with a ``log_level`` class attribute logs at that level (the
    deferred queue's: a job deferred, a retry scheduled and a worker pausing at INFO,
    a job sent to the dead letters at ERROR). Otherwise state changes, rejections,
    exhausted budgets and timeouts log at WARNING; scheduled retries, fallbacks and the
    overload events (one per shed request or throttled call, many under overload;
    limit changes) at INFO.
    """

    __slots__ = ("logger",)

    _INFO = (RetryScheduled, FallbackUsed, LimitChanged, RequestShed, CallThrottled,
             ShaperWaited)

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger if logger is not None else _log

    @classmethod
    def level(cls, event: Event) -> int:
        """The level ``event`` is logged at."""
        level = getattr(event, "log_level", None)
        if isinstance(level, int):
            return level
        return logging.INFO if isinstance(event, cls._INFO) else logging.WARNING

    def __call__(self, event: Event) -> None:
        level = self.level(event)
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s: %s", event.policy, event)
