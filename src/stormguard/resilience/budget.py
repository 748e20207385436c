"""RetryBudget: retries may be at most a fraction of first attempts (Google SRE's 10 %).

Over a sliding ``window`` (seconds, kept as 10 buckets), the number of retries
may reach ``ratio x first attempts + min_per_second x window``. One budget is
shared by every :class:`stormguard.Retry` that calls the same dependency.
Normal days never notice it (a few failures, all retried); when the dependency
is down it turns "every request retries 3 times" (4x load) into "about 10 %
more load". Spending is exact under a lock; counting first attempts is lock-free.
"""

from __future__ import annotations

import threading

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock

__all__ = ["RetryBudget"]

_BUCKETS = 10


class RetryBudget:
    """A sliding-window allowance of retries, shared between Retry policies."""

    __slots__ = ("_clock", "_firsts", "_idx", "_inv_width", "_lock", "_retries",
                 "min_per_second", "ratio", "window")

    def __init__(self, ratio: float = 0.1, min_per_second: float = 1.0, window: float = 10.0,
                 *, clock: Clock | None = None) -> None:
        self.ratio = validate.number("ratio", ratio, allow_zero=True)
        self.min_per_second = validate.number("min_per_second", min_per_second, allow_zero=True)
        self.window = validate.number("window", window)
        self._clock: Clock = system_clock if clock is None else clock
        self._inv_width = _BUCKETS / self.window
        self._lock = threading.Lock()
        self._firsts = [0] * _BUCKETS
        self._retries = [0] * _BUCKETS
        self._idx = int(self._clock.monotonic() * self._inv_width)

    def __repr__(self) -> str:
        return (f"RetryBudget(ratio={self.ratio}, min_per_second={self.min_per_second}, "
                f"window={self.window})")

    def _rotate(self, idx: int) -> None:
        """Drop the buckets that slid out of the window (caller holds the lock)."""
        if idx <= self._idx:
            return
        firsts, retries = self._firsts, self._retries
        for i in range(self._idx + 1, min(idx, self._idx + _BUCKETS) + 1):
            j = i % _BUCKETS
            firsts[j] = retries[j] = 0
        self._idx = idx

    def record_attempt(self) -> None:
        """Count one first attempt (every call through a Retry that uses this budget).

        Lock-free unless a bucket boundary is crossed: with many threads racing,
        a count may be lost or land in the next bucket, which moves the
        allowance by ``ratio`` x (number of racing threads) at most.
        """
        idx = int(self._clock.monotonic() * self._inv_width)
        if idx != self._idx:
            with self._lock:
                self._rotate(idx)
        self._firsts[idx % _BUCKETS] += 1

    def _allowance(self) -> float:
        return self.ratio * sum(self._firsts) + self.min_per_second * self.window

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when it is spent."""
        idx = int(self._clock.monotonic() * self._inv_width)
        with self._lock:
            self._rotate(idx)
            if sum(self._retries) + 1 > self._allowance():
                return False
            self._retries[idx % _BUCKETS] += 1
            return True

    def available(self) -> float:
        """Retries the budget would allow right now."""
        idx = int(self._clock.monotonic() * self._inv_width)
        with self._lock:
            self._rotate(idx)
            return max(0.0, self._allowance() - sum(self._retries))
