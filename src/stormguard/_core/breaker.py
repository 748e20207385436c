"""The one circuit-breaker state machine: pure, clock-injected, thread-safe.

It serves :class:`stormguard.CircuitBreaker` (the outbound policy) and the stores'
own protection (a store stops calling a sick backend). It does no I/O and never
blocks: callers follow Resilience4j's permission protocol,

* :meth:`BreakerMachine.acquire` — may this call go in? Returns the state *epoch* to
  report back with, or raises the error made by ``reject`` (:class:`CircuitOpen` by
  default);
* then exactly one of :meth:`on_success`, :meth:`on_failure` or :meth:`release`
  (the call ended without a verdict: cancelled, or an error that is not a failure).

States:

* **closed**: every call goes through and is recorded in a window: the last
  ``window`` calls (``window_type="count"``) or the calls of the last ``window``
  seconds (``window_type="time"``, 20 buckets). Once at least ``min_calls`` are
  recorded, a failure rate >= ``failure_rate`` or a slow-call rate >=
  ``slow_call_rate`` (calls taking ``slow_call_duration`` or longer) opens it.
  ``window=N, failure_rate=1.0, min_calls=N`` is "N consecutive failures".
* **open**: calls are rejected at once (``remaining`` = seconds left) for ``open_for``.
* **half_open**: exactly ``half_open_calls`` trial calls are admitted (the rest are
  rejected with ``remaining=0.0``). All succeed -> closed with a fresh window; one fails
  (or is slow) -> open again. With ``probe_lease``, a trial whose outcome never arrives
  gives its slot back after that many seconds.

Outcomes of calls admitted in an earlier state (before a transition) are ignored.
State changes and rejections are reported to the ``on_change(old, new, now)`` and
``on_reject(reason, remaining, now)`` callbacks (outside the lock), which the owners
turn into events.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import CircuitOpen, ConfigError

__all__ = ["CLOSED", "FORCED_CLOSED", "HALF_OPEN", "OPEN", "STATES", "BreakerMachine"]

CLOSED, OPEN, HALF_OPEN, FORCED_CLOSED = 0, 1, 2, 3
STATES = ("closed", "open", "half_open", "closed")
_TIME_BUCKETS = 20

OnChange = Callable[[str, str, float], None]
OnReject = Callable[[str, float, float], None]
Reject = Callable[[str, float], BaseException]


def _circuit_open(name: str) -> Reject:
    def reject(reason: str, remaining: float) -> BaseException:
        return CircuitOpen(f"circuit breaker {name!r} is {reason.replace('_', ' ')}",
                           remaining=remaining, name=name)
    return reject


class BreakerMachine:
    """Closed / open / half-open with exact half-open admission (see the module doc)."""

    __slots__ = ("_b_calls", "_b_fails", "_b_idx", "_b_slows", "_b_width", "_failed", "_fails",
                 "_forfeited", "_lease_until", "_lock", "_n", "_ok", "_open_until", "_permits",
                 "_rejected", "_ring", "_slows", "_trial_ok", "clock", "epoch", "failure_rate",
                 "fast", "forced", "half_open_calls", "min_calls", "name", "on_change", "on_reject",
                 "open_for", "opened", "probe_lease", "reject", "slow_call_duration",
                 "slow_call_rate", "state_code", "timed", "window", "window_type")

    def __init__(self, window: float = 20, failure_rate: float = 0.5,
                 min_calls: int | None = None, open_for: float = 30.0,
                 half_open_calls: int = 3, slow_call_duration: float | None = None,
                 slow_call_rate: float = 1.0, *, window_type: str = "count",
                 probe_lease: float | None = None, name: str = "breaker",
                 clock: Clock | None = None, on_change: OnChange | None = None,
                 on_reject: OnReject | None = None, reject: Reject | None = None) -> None:
        if window_type == "count":
            self.window: float = validate.integer("window", window)
            default_min = int(self.window)
        elif window_type == "time":
            self.window = validate.number("window", window)
            default_min = 10
        else:
            raise ConfigError("window_type", window_type, 'must be "count" or "time"')
        self.window_type = window_type
        self.min_calls = (default_min if min_calls is None
                          else validate.integer("min_calls", min_calls))
        if window_type == "count" and self.min_calls > self.window:
            raise ConfigError("min_calls", min_calls, f"must be <= window ({window})")
        self.failure_rate = validate.number("failure_rate", failure_rate, maximum=1.0)
        self.slow_call_rate = validate.number("slow_call_rate", slow_call_rate, maximum=1.0)
        self.open_for = validate.number("open_for", open_for)
        self.half_open_calls = validate.integer("half_open_calls", half_open_calls)
        self.slow_call_duration = (None if slow_call_duration is None else
                                   validate.number("slow_call_duration", slow_call_duration))
        self.probe_lease = (None if probe_lease is None
                            else validate.number("probe_lease", probe_lease))
        self.name = name
        self.clock: Clock = system_clock if clock is None else clock
        self.on_change = on_change
        self.on_reject = on_reject
        self.reject: Reject = reject if reject is not None else _circuit_open(name)
        #: the protected call's duration matters (slow calls or a time window)
        self.timed = self.slow_call_duration is not None or window_type == "time"
        #: quick successes may skip the lock (see on_success)
        self.fast = window_type == "count"
        self._lock = threading.Lock()
        # outcome counters (for metrics): next() on an itertools.count is one atomic C call
        self._ok = itertools.count()
        self._failed = itertools.count()
        self._rejected = itertools.count()
        self.state_code = CLOSED
        self.epoch = 0
        self.forced: str | None = None
        self.opened = 0
        """How many times the machine went to open (forced opens included)."""
        self._open_until = 0.0
        self._lease_until = 0.0
        self._forfeited = 0  # trial slots handed on by the lease, not to be given back again
        self._permits = 0
        self._trial_ok = 0
        self._b_width = self.window / _TIME_BUCKETS if window_type == "time" else 1.0
        self._clear_window()

    # -- public state ------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (an open whose time is up reports
        ``"half_open"``: the next call is a trial)."""
        code = self.state_code
        if code == OPEN and self.forced is None and self.clock.monotonic() >= self._open_until:
            return "half_open"
        return STATES[code]

    def remaining(self) -> float:
        """Seconds the machine stays open (0.0 unless open)."""
        if self.state_code != OPEN:
            return 0.0
        if self.forced == "open":
            return float("inf")
        return max(0.0, self._open_until - self.clock.monotonic())

    def snapshot(self) -> tuple[int, int, int]:
        """(calls, failures, slow calls) in the current window."""
        with self._lock:
            if self.window_type == "time":
                self._rotate(self.clock.monotonic())
            return self._counts()

    def force_open(self) -> None:
        """Reject every call until :meth:`force_closed` or :meth:`reset`."""
        with self._lock:
            self.forced = "open"
            change = self._to_open(float("inf"))
        self._changed(change)

    def force_closed(self) -> None:
        """Admit every call and record nothing until :meth:`force_open` or :meth:`reset`."""
        with self._lock:
            self.forced = "closed"
            change = self._to_closed()
            self.state_code = FORCED_CLOSED
        self._changed(change)

    def reset(self) -> None:
        """Back to closed with an empty window, forced state cleared."""
        with self._lock:
            self.forced = None
            change = self._to_closed()
        self._changed(change)

    # -- window ------------------------------------------------------------------------------
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
            self._b_idx = int(self.clock.monotonic() // self._b_width)

    def _counts(self) -> tuple[int, int, int]:
        if self.window_type == "count":
            ring = self._ring
            both = ring.count(3) if self.timed else 0
            return (len(ring), ring.count(1) + both,
                    ring.count(2) + both if self.timed else 0)
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

    # -- transitions (the caller holds the lock; each returns (old, new) for _changed) ---------
    def _to_open(self, until: float) -> tuple[int, int]:
        old = self.state_code
        self.state_code = OPEN
        self.epoch += 1
        self.opened += 1
        self._open_until = until
        self._clear_window()
        return old, OPEN

    def _to_closed(self) -> tuple[int, int]:
        old = self.state_code
        self.state_code = CLOSED
        self.epoch += 1
        self._clear_window()
        return old, CLOSED

    def _to_half_open(self, now: float) -> tuple[int, int]:
        old = self.state_code
        self.state_code = HALF_OPEN
        self.epoch += 1
        self._permits = self.half_open_calls
        self._forfeited = 0
        self._trial_ok = 0
        self._lease_until = now
        return old, HALF_OPEN

    def _changed(self, change: tuple[int, int] | None) -> None:
        if change is None or self.on_change is None:
            return
        old, new = STATES[change[0]], STATES[change[1]]
        if old != new:
            self.on_change(old, new, self.clock.monotonic())

    # -- the permission protocol -----------------------------------------------------------------
    def acquire(self) -> int:
        """Admit a call (returns the epoch to report back with) or raise ``reject(...)``."""
        if self.state_code == CLOSED:
            return self.epoch
        return self._acquire_slow()

    def _acquire_slow(self) -> int:
        change = None
        remaining, epoch, reason = 0.0, -1, ""
        with self._lock:
            state = self.state_code
            if state in (CLOSED, FORCED_CLOSED):
                return self.epoch
            now = self.clock.monotonic()
            if state == OPEN:
                if self.forced == "open":
                    reason, remaining = "forced_open", float("inf")
                elif now < self._open_until:
                    reason, remaining = "open", self._open_until - now
                else:
                    change = self._to_half_open(now)
            if not reason:
                if self._permits <= 0 and self.probe_lease is not None \
                        and now >= self._lease_until:
                    self._permits = 1  # the last trial's outcome never came: lease ended
                    self._forfeited += 1
                if self._permits > 0:
                    self._permits -= 1
                    if self.probe_lease is not None:
                        self._lease_until = now + self.probe_lease
                    epoch = self.epoch
                else:
                    reason, remaining = "half_open_full", 0.0
        self._changed(change)
        if reason:
            next(self._rejected)
            if self.on_reject is not None:
                self.on_reject(reason, remaining, now)
            raise self.reject(reason, remaining)
        return epoch

    def _record(self, epoch: int, failed: bool, start: float | None) -> None:
        """Record an outcome; ``start`` None: no duration known (never a slow call)."""
        if self.timed:
            now = self.clock.monotonic()
            slow = (start is not None and self.slow_call_duration is not None
                    and now - start >= self.slow_call_duration)
        else:
            now, slow = 0.0, False
        change = None
        with self._lock:
            if epoch != self.epoch:
                return
            if self.state_code == CLOSED:
                self._add(failed | (slow << 1), now)
                n, fails, slows = self._counts()
                if n >= self.min_calls and (fails / n >= self.failure_rate
                                            or slows / n >= self.slow_call_rate):
                    change = self._to_open((now if self.timed else self.clock.monotonic())
                                           + self.open_for)
            elif self.state_code == HALF_OPEN:
                if failed or slow:
                    change = self._to_open((now if self.timed else self.clock.monotonic())
                                           + self.open_for)
                else:
                    self._trial_ok += 1
                    if self._trial_ok >= self.half_open_calls:
                        change = self._to_closed()
        self._changed(change)

    def on_success(self, epoch: int, start: float = 0.0) -> None:
        """The call admitted at ``epoch`` (started at monotonic ``start``) succeeded."""
        next(self._ok)
        if self.fast and (self.slow_call_duration is None
                          or self.clock.monotonic() - start < self.slow_call_duration):
            # Lock-free for the common case: a quick success, closed, count window, min_calls
            # already reached (a quick success can then only lower the rates: no decision to
            # take). Read the deque before the epoch: a transition bumps the epoch, then swaps
            # the deque, so an append that loses that race lands in a deque nobody reads.
            ring = self._ring
            if epoch == self.epoch and self.state_code == CLOSED \
                    and len(ring) >= self.min_calls:
                ring.append(0)
                return
        self._record(epoch, False, start)

    def on_failure(self, epoch: int, start: float = 0.0) -> None:
        """The call admitted at ``epoch`` failed."""
        next(self._failed)
        self._record(epoch, True, start)

    def release(self, epoch: int) -> None:
        """The call ended without a verdict: a half-open trial slot goes back (unless the
        probe lease already handed a slot on: then that one counts as given back)."""
        with self._lock:
            if epoch == self.epoch and self.state_code == HALF_OPEN:
                if self._forfeited:
                    self._forfeited -= 1
                else:
                    self._permits += 1

    # -- outcome-only reporting (for callers that cannot carry an epoch, e.g. a pipelined
    #    connection whose replies serve many callers): attributed to the current state ----------
    def success(self) -> None:
        """A call succeeded (attributed to the current state; no duration: never slow)."""
        next(self._ok)
        if self.fast and self.state_code == CLOSED and len(self._ring) >= self.min_calls:
            self._ring.append(0)
            return
        self._record(self.epoch, False, None)

    def failure(self) -> None:
        """A call failed (attributed to the current state)."""
        next(self._failed)
        self._record(self.epoch, True, None)

    def outcomes(self) -> tuple[int, int, int]:
        """Calls reported since creation: (successes, failures, rejections)."""
        return (_value(self._ok), _value(self._failed), _value(self._rejected))

    def __repr__(self) -> str:
        return f"BreakerMachine(name={self.name!r}, state={self.state!r})"


def _value(counter: itertools.count[int]) -> int:
    # an itertools.count's next value, read without advancing it: its repr is "count(N)"
    return int(repr(counter)[6:-1])
