"""CircuitBreaker: stop calling a dependency that is failing or slow, probe it, come back.

The breaker follows Resilience4j's permission protocol, which is why one state
machine serves blocking and asyncio callers alike: ``_acquire()`` (may this
call go in? raises :class:`CircuitOpen`), then exactly one of
``_on_success``, ``_on_error`` (a failure or not, by ``failure_on``) or
``_release`` (cancelled: not counted). The lock is held only inside those
methods, never while the protected call runs.

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
ignored. Rejections (``CircuitOpen``, ``BulkheadFull`` from inner layers) and
cancellations are never failures.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from stormguard._core.clock import Clock
from stormguard._core.errors import BulkheadFull, CircuitOpen, ConfigError
from stormguard.observability.events import CallRejected, Listener, StateChanged
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    ExceptionSpec,
    Kwargs,
    Next,
    Policy,
    check_int,
    check_positive,
    matcher,
)

__all__ = ["CircuitBreaker"]

CLOSED, OPEN, HALF_OPEN, FORCED_CLOSED = 0, 1, 2, 3
STATES = ("closed", "open", "half_open", "closed")
_TIME_BUCKETS = 20
_NOT_FAILURES = (CircuitOpen, BulkheadFull)

def _default_failure(exc: BaseException) -> bool:
    return not isinstance(exc, _NOT_FAILURES)


def _failure_classifier(failure_on: ExceptionSpec | None) -> Callable[[BaseException], bool]:
    if failure_on is None:
        return _default_failure
    match = matcher("failure_on", failure_on)
    return lambda exc: match(exc) and not isinstance(exc, _NOT_FAILURES)


class CircuitBreaker(Policy):
    """A failure-rate and slow-call-rate circuit breaker with exact half-open admission."""

    __slots__ = ("_b_calls", "_b_fails", "_b_idx", "_b_slows", "_b_width", "_epoch", "_fails",
                 "_fast", "_forced", "_is_failure", "_lock", "_n", "_open_until", "_permits",
                 "_ring", "_slow", "_slows", "_state", "_timed", "_trial_ok", "failure_rate",
                 "half_open_calls", "min_calls", "open_for", "slow_call_duration",
                 "slow_call_rate", "window", "window_type")

    def __init__(self, window: float = 20, failure_rate: float = 0.5,
                 min_calls: int | None = None, open_for: float = 30.0,
                 half_open_calls: int = 3, slow_call_duration: float | None = None,
                 slow_call_rate: float = 1.0, *, window_type: str = "count",
                 failure_on: ExceptionSpec | None = None, name: str = "breaker",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        if window_type == "count":
            self.window: float = check_int("window", window)  # type: ignore[arg-type]
            default_min = int(self.window)
        elif window_type == "time":
            self.window = check_positive("window", window)
            default_min = 10
        else:
            raise ConfigError("window_type", window_type, 'must be "count" or "time"')
        self.window_type = window_type
        self.min_calls = default_min if min_calls is None else check_int("min_calls", min_calls)
        if window_type == "count" and self.min_calls > self.window:
            raise ConfigError("min_calls", min_calls, f"must be <= window ({window})")
        self.failure_rate = check_positive("failure_rate", failure_rate)
        if self.failure_rate > 1:
            raise ConfigError("failure_rate", failure_rate, "must be in (0, 1]")
        self.slow_call_rate = check_positive("slow_call_rate", slow_call_rate)
        if self.slow_call_rate > 1:
            raise ConfigError("slow_call_rate", slow_call_rate, "must be in (0, 1]")
        self.open_for = check_positive("open_for", open_for)
        self.half_open_calls = check_int("half_open_calls", half_open_calls)
        self.slow_call_duration = (None if slow_call_duration is None else
                                   check_positive("slow_call_duration", slow_call_duration))
        self._slow = self.slow_call_duration
        self._timed = self._slow is not None or window_type == "time"
        self._fast = window_type == "count"  # quick successes skip the lock (_on_success)
        self._is_failure = _failure_classifier(failure_on)
        super().__init__(name=name, clock=clock, listeners=listeners)
        self._lock = threading.Lock()
        self._state = CLOSED
        self._epoch = 0
        self._forced: str | None = None
        self._open_until = 0.0
        self._permits = 0
        self._trial_ok = 0
        self._b_width = self.window / _TIME_BUCKETS if window_type == "time" else 1.0
        self._clear_window()

    def __repr__(self) -> str:
        return (f"CircuitBreaker(name={self.name!r}, state={self.state!r}, "
                f"window={self.window!r}, window_type={self.window_type!r})")

    # -- public state ----------------------------------------------------------------------
    @property
    def state(self) -> str:
        """ "closed", "open" or "half_open" (a forced state reports as "open"/"closed")."""
        return STATES[self._state]

    @property
    def forced(self) -> str | None:
        """ "open" or "closed" after force_open()/force_closed(), else None."""
        return self._forced

    def snapshot(self) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the current window."""
        with self._lock:
            if self.window_type == "time":
                self._rotate(self._clock.monotonic())
            return self._counts()

    def force_open(self) -> None:
        """Reject every call until force_closed() or reset()."""
        with self._lock:
            self._forced = "open"
            change = self._to_open(float("inf"))
        self._changed(change)

    def force_closed(self) -> None:
        """Admit every call and record nothing until force_open() or reset()."""
        with self._lock:
            self._forced = "closed"
            change = self._to_closed()
            self._state = FORCED_CLOSED
        self._changed(change)

    def reset(self) -> None:
        """Back to closed with an empty window, forced state cleared."""
        with self._lock:
            self._forced = None
            change = self._to_closed()
        self._changed(change)

    # -- window ----------------------------------------------------------------------------
    # Count window: a deque(maxlen=window) of outcome codes (bit 1 = failed, bit 2 = slow),
    # replaced by a new deque on every transition, so a lock-free append that loses a race
    # with a transition lands in a deque nobody reads any more. Time window: 20 buckets.
    def _clear_window(self) -> None:
        self._n = self._fails = self._slows = 0
        if self.window_type == "count":
            self._ring: deque[int] = deque(maxlen=int(self.window))
        else:
            self._b_calls = [0] * _TIME_BUCKETS
            self._b_fails = [0] * _TIME_BUCKETS
            self._b_slows = [0] * _TIME_BUCKETS
            self._b_idx = int(self._clock.monotonic() // self._b_width)

    def _counts(self) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the window (caller holds the lock)."""
        if self.window_type == "count":
            ring = self._ring
            both = ring.count(3) if self._timed else 0
            return (len(ring), ring.count(1) + both,
                    ring.count(2) + both if self._timed else 0)
        return self._n, self._fails, self._slows

    def _rotate(self, now: float) -> None:
        idx = int(now // self._b_width)
        if idx <= self._b_idx:
            return
        if idx - self._b_idx >= _TIME_BUCKETS:
            self._clear_window()
            self._b_idx = idx
            return
        calls, fails, slows = self._b_calls, self._b_fails, self._b_slows
        for i in range(self._b_idx + 1, idx + 1):
            j = i % _TIME_BUCKETS
            self._n -= calls[j]
            self._fails -= fails[j]
            self._slows -= slows[j]
            calls[j] = fails[j] = slows[j] = 0
        self._b_idx = idx

    def _add(self, code: int, now: float) -> None:
        """Record one outcome in the closed-state window."""
        if self.window_type == "count":
            self._ring.append(code)
            return
        self._rotate(now)
        j = self._b_idx % _TIME_BUCKETS
        self._b_calls[j] += 1
        self._b_fails[j] += code & 1
        self._b_slows[j] += code >> 1
        self._n += 1
        self._fails += code & 1
        self._slows += code >> 1

    # -- transitions (caller holds the lock; returns (old, new) for _changed) -------------------
    def _to_open(self, until: float) -> tuple[int, int]:
        old = self._state
        self._state = OPEN
        self._epoch += 1
        self._open_until = until
        self._clear_window()
        return old, OPEN

    def _to_closed(self) -> tuple[int, int]:
        old = self._state
        self._state = CLOSED
        self._epoch += 1
        self._clear_window()
        return old, CLOSED

    def _to_half_open(self) -> tuple[int, int]:
        old = self._state
        self._state = HALF_OPEN
        self._epoch += 1
        self._permits = self.half_open_calls
        self._trial_ok = 0
        return old, HALF_OPEN

    def _changed(self, change: tuple[int, int] | None) -> None:
        if (change is not None and STATES[change[0]] != STATES[change[1]]
                and self._observed()):
            self._emit(StateChanged(self.name, self._clock.monotonic(),
                                    STATES[change[0]], STATES[change[1]]))

    # -- the permission protocol -----------------------------------------------------------------
    def _acquire(self) -> int:
        """Admit a call (returns the state epoch to report back with) or raise CircuitOpen."""
        if self._state == CLOSED:
            return self._epoch
        return self._acquire_slow()

    def _acquire_slow(self) -> int:
        change = None
        remaining, epoch = 0.0, -1
        with self._lock:
            state = self._state
            if state in (CLOSED, FORCED_CLOSED):
                return self._epoch
            now = self._clock.monotonic()
            if state == OPEN:
                if self._forced == "open":
                    reason, remaining = "forced_open", float("inf")
                elif now < self._open_until:
                    reason, remaining = "open", self._open_until - now
                else:
                    change = self._to_half_open()
                    reason = ""
            else:
                reason = ""
            if not reason:
                if self._permits > 0:
                    self._permits -= 1
                    epoch = self._epoch
                else:
                    reason, remaining = "half_open_full", 0.0
        self._changed(change)
        if reason:
            if self._observed():
                self._emit(CallRejected(self.name, now, reason, remaining))
            raise CircuitOpen(f"circuit breaker {self.name!r} is {reason.replace('_', ' ')}",
                              remaining=remaining, name=self.name)
        return epoch

    def _record(self, epoch: int, failed: bool, start: float) -> None:
        if self._timed:
            now = self._clock.monotonic()
            slow = self._slow is not None and now - start >= self._slow
        else:
            now, slow = 0.0, False
        change = None
        with self._lock:
            if epoch != self._epoch:
                return
            if self._state == CLOSED:
                self._add(failed | (slow << 1), now)
                n, fails, slows = self._counts()
                if n >= self.min_calls and (fails / n >= self.failure_rate
                                            or slows / n >= self.slow_call_rate):
                    change = self._to_open((now if self._timed else self._clock.monotonic())
                                           + self.open_for)
            elif self._state == HALF_OPEN:
                if failed or slow:
                    change = self._to_open((now if self._timed else self._clock.monotonic())
                                           + self.open_for)
                else:
                    self._trial_ok += 1
                    if self._trial_ok >= self.half_open_calls:
                        change = self._to_closed()
        if change is not None:
            self._changed(change)

    def _on_success(self, epoch: int, start: float) -> None:
        if self._fast and (self._slow is None or self._clock.monotonic() - start < self._slow):
            # Lock-free for the common case: a quick success, closed, count window, min_calls
            # already reached (a quick success can then only lower the rates: no decision to
            # take). Read the deque before the epoch: a transition bumps the epoch, then swaps
            # the deque, so an append that loses that race lands in a deque nobody reads.
            ring = self._ring
            if epoch == self._epoch and self._state == CLOSED and len(ring) >= self.min_calls:
                ring.append(0)
                return
        self._record(epoch, False, start)

    def _release(self, epoch: int) -> None:
        """A call ended without a verdict: give a half-open trial slot back."""
        with self._lock:
            if epoch == self._epoch and self._state == HALF_OPEN:
                self._permits += 1

    def _on_error(self, epoch: int, start: float, exc: BaseException) -> None:
        if isinstance(exc, Exception) and self._is_failure(exc):
            self._record(epoch, True, start)
        else:
            self._release(epoch)

    # -- drivers ---------------------------------------------------------------------------
    def _sync(self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
        epoch = self._epoch if self._state == CLOSED else self._acquire_slow()
        start = self._clock.monotonic() if self._timed else 0.0
        try:
            result = nxt(fn, args, kwargs)
        except BaseException as exc:
            self._on_error(epoch, start, exc)
            raise
        self._on_success(epoch, start)
        return result

    async def _async(self, nxt: AsyncNext, fn: Callable[..., Any], args: Args,
                     kwargs: Kwargs) -> Any:
        epoch = self._epoch if self._state == CLOSED else self._acquire_slow()
        start = self._clock.monotonic() if self._timed else 0.0
        try:
            result = await nxt(fn, args, kwargs)
        except BaseException as exc:
            self._on_error(epoch, start, exc)
            raise
        self._on_success(epoch, start)
        return result
