"""CircuitBreaker: stop calling a dependency that is failing or slow, probe it, come back.

The state machine is :class:`stormguard._core.breaker.BreakerMachine` (the same one
protects the stores); this policy adds the calling styles, the failure classifier
(``failure_on``) and the events. It follows Resilience4j's permission protocol, which
is why one machine serves blocking and asyncio callers alike: ``acquire()`` (may this
call go in? raises :class:`CircuitOpen`), then exactly one of ``on_success``,
``on_failure`` or ``release`` (cancelled, or not a failure: not counted). The lock is
held only inside those methods, never while the protected call runs.

States:

* **closed**: every call goes through and is recorded in a window: the last
  ``window`` calls (``window_type="count"``) or the calls of the last
  ``window`` seconds (``window_type="time"``, 20 buckets). Once at least
  ``min_calls`` are recorded, a failure rate >= ``failure_rate`` or a
  slow-call rate >= ``slow_call_rate`` (calls taking ``slow_call_duration``
  or longer, failed or not) opens it.
* **open**: calls are rejected at once with ``CircuitOpen(remaining=...)``
  for ``open_for`` seconds.
* **half_open**: exactly ``half_open_calls`` trial calls are admitted (the
  rest rejected at once, ``remaining=0.0``). All succeed -> closed with a fresh
  window; one fails (or is slow) -> open again. A trial that ends without a
  verdict (cancelled, or an exception that is not a failure) hands its slot to
  the next caller.

Outcomes of calls admitted in an earlier state (before a transition) are
ignored. Rejections by inner layers (``CircuitOpen``, ``BulkheadFull``, ``ShaperFull``,
``Shed`` from a ``ConcurrencyLimit``, ``Throttled`` from an ``AdaptiveThrottle``: the
dependency was not asked) and cancellations are never failures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stormguard._core.breaker import CLOSED, STATES, BreakerMachine
from stormguard._core.clock import Clock
from stormguard._core.errors import BulkheadFull, CircuitOpen, ShaperFull, Shed, Throttled
from stormguard.observability.events import CallRejected, Listener, StateChanged
from stormguard.observability.metrics import track
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    ExceptionSpec,
    Kwargs,
    Next,
    Policy,
    matcher,
)

__all__ = ["CircuitBreaker"]

# inner layers refusing to call (the dependency was not asked): never its failures
_NOT_FAILURES = (CircuitOpen, BulkheadFull, ShaperFull, Shed, Throttled)


def _default_failure(exc: BaseException) -> bool:
    return not isinstance(exc, _NOT_FAILURES)


def _failure_classifier(failure_on: ExceptionSpec | None) -> Callable[[BaseException], bool]:
    if failure_on is None:
        return _default_failure
    match = matcher("failure_on", failure_on)
    return lambda exc: match(exc) and not isinstance(exc, _NOT_FAILURES)


class CircuitBreaker(Policy):
    """A failure-rate and slow-call-rate circuit breaker with exact half-open admission."""

    __slots__ = ("_is_failure", "_m", "machine")

    def __init__(self, window: float = 20, failure_rate: float = 0.5,
                 min_calls: int | None = None, open_for: float = 30.0,
                 half_open_calls: int = 3, slow_call_duration: float | None = None,
                 slow_call_rate: float = 1.0, *, window_type: str = "count",
                 failure_on: ExceptionSpec | None = None, name: str = "breaker",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        self._is_failure = _failure_classifier(failure_on)
        super().__init__(name=name, clock=clock, listeners=listeners)
        self._m = self.machine = BreakerMachine(
            window, failure_rate, min_calls, open_for, half_open_calls, slow_call_duration,
            slow_call_rate, window_type=window_type, name=name, clock=self._clock,
            on_change=self._on_change, on_reject=self._on_reject)
        track(self, "breaker")

    def __repr__(self) -> str:
        return (f"CircuitBreaker(name={self.name!r}, state={self.state!r}, "
                f"window={self.window!r}, window_type={self.window_type!r})")

    # -- configuration, as given (read-only views of the machine) ---------------------------
    window = property(lambda self: self._m.window)
    window_type = property(lambda self: self._m.window_type)
    min_calls = property(lambda self: self._m.min_calls)
    failure_rate = property(lambda self: self._m.failure_rate)
    slow_call_rate = property(lambda self: self._m.slow_call_rate)
    slow_call_duration = property(lambda self: self._m.slow_call_duration)
    open_for = property(lambda self: self._m.open_for)
    half_open_calls = property(lambda self: self._m.half_open_calls)

    # -- public state ----------------------------------------------------------------------
    @property
    def state(self) -> str:
        """ "closed", "open" or "half_open" (a forced state reports as "open"/"closed")."""
        return STATES[self._m.state_code]

    @property
    def forced(self) -> str | None:
        """ "open" or "closed" after force_open()/force_closed(), else None."""
        return self._m.forced

    def snapshot(self) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the current window."""
        return self._m.snapshot()

    def force_open(self) -> None:
        """Reject every call until force_closed() or reset()."""
        self._m.force_open()

    def force_closed(self) -> None:
        """Admit every call and record nothing until force_open() or reset()."""
        self._m.force_closed()

    def reset(self) -> None:
        """Back to closed with an empty window, forced state cleared."""
        self._m.reset()

    # -- events ----------------------------------------------------------------------------
    def _on_change(self, old: str, new: str, now: float) -> None:
        if self._observed():
            self._emit(StateChanged(self.name, now, old, new))

    def _on_reject(self, reason: str, remaining: float, now: float) -> None:
        if self._observed():
            self._emit(CallRejected(self.name, now, reason, remaining))

    def _on_error(self, epoch: int, start: float, exc: BaseException) -> None:
        if isinstance(exc, Exception) and self._is_failure(exc):
            self._m.on_failure(epoch, start)
        else:
            self._m.release(epoch)

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source breaker
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        m = self._m
        epoch = m.epoch if m.state_code == CLOSED else m.acquire()
        start = self._clock.monotonic() if m.timed else 0.0
        try:
            result = await nxt(fn, args, kwargs)
        except BaseException as exc:
            self._on_error(epoch, start, exc)
            raise
        m.on_success(epoch, start)
        return result
    # unasync: end

    # unasync: generated breaker (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        m = self._m
        epoch = m.epoch if m.state_code == CLOSED else m.acquire()
        start = self._clock.monotonic() if m.timed else 0.0
        try:
            result = nxt(fn, args, kwargs)
        except BaseException as exc:
            self._on_error(epoch, start, exc)
            raise
        m.on_success(epoch, start)
        return result
    # unasync: end
