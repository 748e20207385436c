"""Concurrency limits: a fixed one, and :class:`AdaptiveLimit`, which follows latency.

:class:`AdaptiveLimit` is pure: it never reads a clock, sleeps or locks. Its owner (a
:class:`~stormguard.overload.Shedder`) feeds it one sample per finished request,
``sample(rtt, now, in_flight, key)``, under the owner's lock, and reads ``limit``.

The rule, per window of samples (at least ``min_samples``, and ``window`` seconds unless
the latency is far past the tolerance: then the window closes at once):

* every sample is compared with the **no-load minimum** of its ``key`` (a route: a
  20 ms checkout is not a slow 5 ms cart): ``ratio = rtt / baseline[key]``, and the
  window's ``ratio`` is their median (one GC pause is not a queue);
* ``ratio > tolerance`` (2.0: queueing shows): the limit shrinks multiplicatively,
  ``limit x max(0.5, tolerance / ratio)``;
* ``ratio`` near 1 (at most ``1 + (tolerance - 1) / 2``) and the limit was in use (the
  most in flight reached half of it): the limit grows, by 1 below 10 and by
  ``sqrt(limit)`` above;
* otherwise it holds.

The baseline is the smallest latency seen for the key; a window in which every request
ran alone (``in_flight <= 1``) is a no-load measurement by definition and moves it 10 %
toward that window's fastest request, upward too, so a service that really became
slower is re-learnt (within a few dozen windows at the floor) without a probe (Envoy's
periodic minRTT probe, which drops concurrency to measure, is what causes its bursts of
503s). Because the baseline is a *minimum*, never an average of loaded samples,
sustained queueing keeps the ratio high: the limit cannot creep upward under moderate
overload, which is the known flaw of Gradient2, whose long-term average follows the
loaded latency until the gradient reads 1 and its queue allowance adds ``sqrt(limit)``
every window (``tests/overload/test_limit.py`` runs both through that scenario). The
price: a limit that starts under overload learns a loaded baseline and settles higher
than it needs to (it still never creeps).
"""

from __future__ import annotations

import math
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError

__all__ = ["AdaptiveLimit", "FixedLimit", "Limit", "coerce_limit"]

#: distinct baseline keys kept; later keys share the "" baseline
MAX_KEYS = 256
_RATIO_CAP = 10.0
#: the most one window may take off the limit (x 0.5)
SHRINK_FLOOR = 0.5


class FixedLimit:
    """A concurrency limit that never moves (``limit=20`` in the middleware)."""

    __slots__ = ("limit",)

    adaptive = False

    def __init__(self, limit: int) -> None:
        self.limit = validate.integer("limit", limit)

    def sample(self, rtt: float, now: float, in_flight: int, key: str = "") -> float | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"limit": self.limit, "adaptive": False}

    def __repr__(self) -> str:
        return f"FixedLimit({self.limit})"


class AdaptiveLimit:
    """A concurrency limit that follows measured latency, within ``[min, max]``."""

    __slots__ = ("_alone", "_baseline", "_limit", "_max_in_flight", "_n", "_ratios", "_since",
                 "_sum", "initial", "max", "min", "min_samples", "owner", "tolerance", "window")

    adaptive = True

    def __init__(self, initial: int = 20, min: int = 1, max: int = 1000, *,
                 tolerance: float = 2.0, window: float = 0.1, min_samples: int = 10) -> None:
        self.min = validate.integer("min", min)
        self.max = validate.integer("max", max)
        if self.max < self.min:
            raise ConfigError("max", max, f"must be >= min ({min})")
        self.initial = validate.integer("initial", initial)
        if not self.min <= initial <= self.max:
            raise ConfigError("initial", initial, f"must be within [min, max] = [{min}, {max}]")
        self.tolerance = validate.number("tolerance", tolerance, minimum=1.0)
        self.window = validate.number("window", window, allow_zero=True)
        self.min_samples = validate.integer("min_samples", min_samples)
        self.owner: object = None
        """The shedder this limit belongs to (one limit, one owner: it is not locked)."""
        self._limit = float(initial)
        self._baseline: dict[str, float] = {}
        self._alone: dict[str, float] = {}  # per key, this window's fastest request alone
        self._since: float | None = None
        self._n = 0
        self._sum = 0.0
        self._ratios: list[float] = []
        self._max_in_flight = 0

    @property
    def limit(self) -> int:
        """The current limit, an integer within ``[min, max]``."""
        return int(self._limit)

    def baseline(self, key: str = "") -> float | None:
        """The no-load latency learnt for ``key`` (None before its first sample)."""
        return self._baseline.get(key)

    def sample(self, rtt: float, now: float, in_flight: int, key: str = "") -> float | None:
        """One finished request took ``rtt`` seconds, ``in_flight`` requests (itself
        included) were in flight when it started. Answers the window's mean ratio when
        this sample closed a window (the limit may have moved), else None."""
        if not rtt > 0 or not math.isfinite(rtt):
            return None  # a zero or broken measurement says nothing about queueing
        base = self._baseline
        b = base.get(key)
        if b is None:
            if len(base) >= MAX_KEYS:
                key = ""
                b = base.get(key)
            if b is None:
                base[key] = b = rtt
        if rtt < b:
            base[key] = b = rtt
        if in_flight <= 1:  # ran alone: a no-load measurement
            alone = self._alone
            seen = alone.get(key)
            if seen is None or rtt < seen:
                alone[key] = rtt
        ratio = rtt / b
        self._ratios.append(ratio)
        self._sum += ratio if ratio < _RATIO_CAP else _RATIO_CAP
        self._n += 1
        self._max_in_flight = max(self._max_in_flight, in_flight)
        since = self._since
        if since is None:
            self._since = now
            return None
        if self._n < self.min_samples:
            return None
        if now - since < self.window and self._sum < 2 * self.tolerance * self._n:
            return None  # (a window far past the tolerance closes early: react at once)
        return self._update(now)

    def _update(self, now: float) -> float:
        ratios = sorted(self._ratios)
        mean = ratios[len(ratios) // 2]  # the median: one GC pause is not a queue
        self._ratios.clear()
        if self._max_in_flight <= 1:  # a whole window of requests alone: follow them, 10 %
            base = self._baseline
            for key, rtt in self._alone.items():
                b = base[key]
                if rtt > b:
                    base[key] = b + 0.1 * (rtt - b)
        self._alone.clear()
        limit = self._limit
        tol = self.tolerance
        if mean > tol:
            limit *= max(SHRINK_FLOOR, tol / mean)
        elif mean <= 1.0 + (tol - 1.0) / 2 and 2 * self._max_in_flight >= limit:
            limit += 1.0 if limit < 10 else math.sqrt(limit)
        self._limit = min(float(self.max), max(float(self.min), limit))
        self._since = now
        self._n = 0
        self._sum = 0.0
        self._max_in_flight = 0
        return mean

    def stats(self) -> dict[str, Any]:
        return {"limit": self.limit, "adaptive": True, "min": self.min, "max": self.max,
                "baselines": len(self._baseline)}

    def __repr__(self) -> str:
        return (f"AdaptiveLimit(limit={self.limit}, min={self.min}, max={self.max}, "
                f"tolerance={self.tolerance})")


Limit = AdaptiveLimit | FixedLimit


def coerce_limit(field: str, limit: object) -> Limit:
    """``limit=``: an :class:`AdaptiveLimit`, a :class:`FixedLimit` or an int (fixed);
    None is a new :class:`AdaptiveLimit` with the defaults."""
    if limit is None:
        return AdaptiveLimit()
    if isinstance(limit, AdaptiveLimit | FixedLimit):
        return limit
    if isinstance(limit, int) and not isinstance(limit, bool):
        return FixedLimit(validate.integer(field, limit))
    raise ConfigError(field, limit, "must be an AdaptiveLimit or an int (a fixed "
                      "concurrency limit)")
