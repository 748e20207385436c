"""The stormguard exception tree.

::

    StormguardError
    ├── ConfigError (also ValueError)      bad rule, policy option or argument
    ├── RateLimited                        a ``limiter.limit`` decorated call was denied
    ├── StorageError                       a backend (Redis, ...) failed or timed out
    │   └── StorageCircuitOpen             the store's own breaker is open: no network call
    ├── CircuitOpen                        a circuit breaker rejected the call
    ├── BulkheadFull                       a bulkhead had no free slot in time
    ├── ShaperFull                         a shaper's next slot is too far (or its queue full)
    ├── DeadlineExceeded (also TimeoutError) a timeout or overall deadline passed
    ├── RetryBudgetExhausted               the shared retry budget is spent
    ├── Shed                               overload: a concurrency limit refused the call
    └── Throttled                          client-side throttling refused the call locally

    TransientError                         raise (or subclass) it to say "retrying may help"
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BulkheadFull",
    "CircuitOpen",
    "ConfigError",
    "DeadlineExceeded",
    "RateLimited",
    "RetryBudgetExhausted",
    "ShaperFull",
    "Shed",
    "StorageCircuitOpen",
    "StorageError",
    "StormguardError",
    "Throttled",
    "TransientError",
]


class StormguardError(Exception):
    """Base class of every error stormguard raises itself."""


class ConfigError(StormguardError, ValueError):
    """Invalid configuration or argument; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}: {problem} (got {value!r})")


class RateLimited(StormguardError):
    """A call decorated with ``limiter.limit(...)`` was denied. ``decision`` is the
    :class:`~stormguard.Decision` (``decision.retry_after``, ``decision.headers()``)."""

    def __init__(self, decision: Any) -> None:
        # typed Any: _core is below the rate-limit layers (it cannot name Decision)
        self.decision = decision
        rule = decision.rule
        name = f" {rule.policy_name!r}" if rule is not None else ""
        super().__init__(f"rate limit{name} exceeded: retry after "
                         f"{decision.retry_after:.3g} s")

    def __reduce__(self) -> tuple[type[RateLimited], tuple[Any]]:
        return (type(self), (self.decision,))


class StorageError(StormguardError):
    """A storage backend failed: connection refused, timeout, script error, breaker open."""


class StorageCircuitOpen(StorageError):
    """The store's circuit breaker is open: the call was refused without touching the network.

    ``remaining`` is how many seconds it stays open (0.0 when half-open and the probe is
    taken), as on :class:`CircuitOpen`.
    """

    def __init__(self, message: str = "store circuit breaker is open", *,
                 remaining: float = 0.0, name: str | None = None) -> None:
        self.remaining = remaining
        self.name = name
        super().__init__(message)


class CircuitOpen(StormguardError):
    """The circuit breaker is open (or its half-open trial slots are taken).

    ``remaining`` is how many seconds it stays open (0.0 in half-open).
    """

    def __init__(self, message: str = "circuit breaker is open", *, remaining: float = 0.0,
                 name: str | None = None) -> None:
        self.remaining = remaining
        self.name = name
        super().__init__(message)


class BulkheadFull(StormguardError):
    """The bulkhead had no free slot within ``max_wait``."""


class DeadlineExceeded(StormguardError, TimeoutError):
    """A per-attempt timeout or the overall deadline passed."""


class RetryBudgetExhausted(StormguardError):
    """The shared retry budget is spent; ``__cause__`` is the original error."""


class Shed(StormguardError):
    """Overload: a concurrency limit had no slot for the call within its wait (or the
    queue stood too long). ``tier`` is the request's priority tier ("critical",
    "degraded", "sheddable"), ``retry_after`` the seconds a client should wait, ``reason``
    "capacity" (no wait allowed), "queue_timeout" or "codel" (a standing queue)."""

    def __init__(self, message: str = "overloaded: request shed", *, tier: str = "critical",
                 reason: str = "capacity", retry_after: float | None = None,
                 name: str | None = None) -> None:
        self.tier = tier
        self.reason = reason
        self.retry_after = retry_after
        self.name = name
        super().__init__(message)


class Throttled(StormguardError):
    """Client-side throttling (:class:`stormguard.AdaptiveThrottle`) rejected the call
    locally, without sending it: the dependency has been rejecting most calls.
    ``probability`` was the rejection probability at that moment."""

    def __init__(self, message: str = "throttled locally", *, probability: float = 0.0,
                 retry_after: float | None = None, name: str | None = None) -> None:
        self.probability = probability
        self.retry_after = retry_after
        self.name = name
        super().__init__(message)


class TransientError(Exception):
    """An error that says retrying may help. Subclass it, or raise it directly.

    ``retry_after`` (seconds) is honoured by :class:`stormguard.Retry` as the next delay.
    """

    def __init__(self, *args: object, retry_after: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after = retry_after


class ShaperFull(StormguardError):
    """A :class:`stormguard.Shaper` refused a call at once, booking nothing: its slot was
    further away than ``max_wait`` or the deadline in force, ``max_queue`` calls were
    already waiting, or (``on_error="deny"``) its store failed.

    ``retry_after`` is how many seconds from now a call would be accepted (when known:
    the queue drains at the shaper's pace); ``reason`` is ``"max_wait"``, ``"deadline"``,
    ``"max_queue"``, ``"paused"`` or ``"store"``.
    """

    def __init__(self, message: str = "shaper is full", *, retry_after: float = 0.0,
                 reason: str = "max_wait", name: str | None = None) -> None:
        self.retry_after = retry_after
        self.reason = reason
        self.name = name
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_shaper_full, (str(self), self.retry_after, self.reason, self.name))


def _shaper_full(message: str, retry_after: float, reason: str,
                 name: str | None) -> ShaperFull:
    return ShaperFull(message, retry_after=retry_after, reason=reason, name=name)
