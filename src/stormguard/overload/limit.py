"""Concurrency limits: a fixed one, and :class:`AdaptiveLimit`, which follows latency.

:class:`AdaptiveLimit` is pure: it never reads a clock, sleeps or locks. Its owner (a
:class:`~stormguard.overload.Shedder`) feeds it one sample per finished request,
``sample(rtt, now, in_flight, key)``, under the owner's lock, and reads ``limit``.

The rule, per window of samples (at least ``min_samples``, and ``window`` seconds unless
the latency is far past the tolerance: then the window closes at once):

* every sample is compared with the **no-load minimum** of its ``key`` (a route: a
  20 ms checkout is not a slow 5 ms cart): ``ratio = rtt / baseline[key]``, and the
  window's ``ratio`` is their median (one GC pause is not a queue);
* ``in_flight`` is the concurrency the request ran under: the shedder's in-flight count
  averaged over the request's life, itself included (a float; a count works too);
* ``ratio > tolerance`` (2.0: queueing shows) but the requests that ran alone in that
  window (at least 2) were as slow (their median ratio above the tolerance too): the
  slowness is not a queue of ours (a busy machine, a slow disk) and a lower limit would
  only shed requests, so it holds;
* the latency grew with the concurrency: the requests share one resource (one core
  under one GIL, a saturated dependency), more at once is only latency and no throughput
  (Little's law), so the limit steps down, to ``min(limit, c) - 1``, and does not grow
  for the next 10 windows. Either the whole window shows it (``c``, its concurrency, at
  least 1.5: the smaller of its requests' mean and Little's law's, their summed latency
  over the window's duration; and the summed latency at least ``1 + 0.75 x (c - 1)``
  times their summed baselines) or its joined requests do (at least 3 that ran at 1.5 or
  more, as slowed in proportion to their own concurrency; ``c`` their mean). At 1 there
  is no telling whether 2 would be better: it tries after those 10 windows; the try ends
  at its third joined request that shared, and each try that steps down again within
  ``JOINED_WINDOWS`` (20) windows doubles the wait before the next (10, 20, 40, then 80
  windows); growth beyond a try starts the waits again at 10;
* ``ratio > tolerance`` otherwise: the limit shrinks multiplicatively,
  ``limit x max(0.5, tolerance / ratio)``;
* ``ratio`` near 1 (at most ``1 + (tolerance - 1) / 2``) and the limit was in use (some
  request ran under more than half of it): the limit grows, by 1 below 10 and by
  ``sqrt(limit)`` above;
* otherwise it holds.

The baseline is the smallest latency seen for the key; a window in which every request
ran alone (``in_flight < 1.1``) is a no-load measurement by definition and moves it 10 %
toward that window's fastest request, upward too, so a service that really became
slower is re-learnt (within a few dozen windows at the floor) without a probe (Envoy's
periodic minRTT probe, which drops concurrency to measure, is what causes its bursts of
503s). Because the baseline is a *minimum*, never an average of loaded samples,
sustained queueing keeps the ratio high: the limit cannot creep upward under moderate
overload, which is the known flaw of Gradient2, whose long-term average follows the
loaded latency until the gradient reads 1 and its queue allowance adds ``sqrt(limit)``
every window (``tests/overload/test_limit.py`` runs both through that scenario).

A limit that starts under overload learns a loaded baseline: no request it sees ran at
no load. So unless the baselines were measured with one request in flight, it does not
grow on them, and the second window is a **probe**: the limit is lowered to half the
concurrency at which the baseline was measured (and half the last probe), never below a
quarter of itself, for one window in which it does not grow and which counts only the
requests admitted within it (a request admitted before ran at the old concurrency, and
at 20 in flight a 20 ms request outlasts a 100 ms window). If latency falls with it
(some route's baseline drops by 5 % or more), the baseline was a loaded one: if as many
requests finished per second in the probe as before it (90 %: one shared core, where
the concurrency above the probe's only queued), the limit stays at the probe's, else it
goes back; probes go on, one every other window, until one finds nothing, and then stop
for good. A probe costs at most 3/4 of the slots for one window, and goes to the floor
(``min``) only when the baseline was measured one above it (on one CPU-bound core, a
baseline learnt at 2 in flight is twice the real one, and only a window at 1 tells).
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
#: probe windows: the limit x 0.5, at window 2, then every other window while a probe finds
#: a lower baseline (the one learnt was measured under load); stopped by the first that
#: does not
PROBE = 0.5
#: a probe that found a lower baseline with at least this share of the throughput before
#: it keeps its limit (the concurrency above it only queued)
PROBE_KEEP = 0.9
FIRST_PROBE = 2
PROBE_EVERY = 1
#: latency at least 1 + SHARED x (concurrency - 1) times the minimum: the requests in flight
#: share one resource (no parallel speed-up), so the limit steps down by one
SHARED = 0.75
#: windows without growth after such a step down (one try a second at 100 ms windows),
#: doubled after each try that stepped down again at once, up to SHARED_HOLD_MAX
SHARED_HOLD = 10
SHARED_HOLD_MAX = 80
#: a request that ran under a concurrency at least this high (time-averaged, itself
#: included) was joined: the share of its latency it owes to the others shows
JOINED = 1.5
#: at most this concurrency (time-averaged) is a request alone: a no-load measurement
ALONE = 1.1
#: the most windows joined requests are gathered over at one limit (their evidence); a
#: step down within as many windows of a growth is that try failing
JOINED_WINDOWS = 20


class FixedLimit:
    """A concurrency limit that never moves (``limit=20`` in the middleware)."""

    __slots__ = ("limit",)

    adaptive = False

    def __init__(self, limit: int) -> None:
        self.limit = validate.integer("limit", limit)

    def sample(self, rtt: float, now: float, in_flight: float, key: str = "") -> float | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"limit": self.limit, "adaptive": False}

    def __repr__(self) -> str:
        return f"FixedLimit({self.limit})"


class AdaptiveLimit:
    """A concurrency limit that follows measured latency, within ``[min, max]``."""

    __slots__ = (
        "_alone",
        "_alone_ratios",
        "_base_in_flight",
        "_baseline",
        "_done",
        "_grew_at",
        "_grow_after",
        "_hold",
        "_j_base",
        "_j_conc",
        "_j_n",
        "_j_rtt",
        "_j_since",
        "_limit",
        "_lowered",
        "_max_in_flight",
        "_n",
        "_probe_at",
        "_probe_limit",
        "_probe_start",
        "_probing",
        "_rate_before",
        "_ratios",
        "_since",
        "_sum",
        "_sum_base",
        "_sum_in_flight",
        "_sum_rtt",
        "_windows",
        "initial",
        "max",
        "min",
        "min_samples",
        "owner",
        "tolerance",
        "window",
    )

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
        self._alone_ratios: list[float] = []  # this window's ratios of requests alone
        self._since: float | None = None
        self._n = 0
        self._sum = 0.0
        self._ratios: list[float] = []
        self._max_in_flight = 0.0
        self._sum_in_flight = 0.0
        self._sum_rtt = 0.0  # this window's latencies, and its requests' baselines
        self._sum_base = 0.0
        self._grow_after = 0  # no growth before this window (after a shared-core step down)
        self._hold = SHARED_HOLD  # windows of that hold, doubled by each failed try
        self._grew_at = -SHARED_HOLD_MAX  # the window of the latest growth
        self._j_n = 0  # this window's joined requests: count, latency, what proportional
        self._j_rtt = 0.0  # sharing would give them (see JOINED), summed concurrency
        self._j_base = 0.0
        self._j_conc = 0.0
        self._j_since = 0  # the window they were first gathered in
        self._windows = 0
        self._probe_at: int | None = FIRST_PROBE
        self._probing = False
        self._probe_start = 0.0  # requests admitted before it do not count in a probe
        self._done = 0  # requests finished in this window, counted or not
        self._rate_before = 0.0  # finished per second in the last window before a probe
        self._lowered = False
        self._probe_limit = math.inf  # each probe goes to half the last one
        self._base_in_flight = 0.0  # the concurrency the latest baseline was measured at

    @property
    def limit(self) -> int:
        """The current limit, an integer within ``[min, max]``."""
        if self._probing:  # never to the floor (what makes Envoy's probes hurt), unless
            # the baseline was measured one above it: then the floor is the question
            floor = self.min + 1 if self._base_in_flight >= self.min + 1.5 else self.min
            return min(int(self._limit),
                       max(floor, int(min(self._limit, self._probe_limit))))
        return int(self._limit)

    @property
    def probing(self) -> bool:
        """True during a probe window (the limit is lowered, to half at most)."""
        return self._probing

    def baseline(self, key: str = "") -> float | None:
        """The no-load latency learnt for ``key`` (None before its first sample)."""
        return self._baseline.get(key)

    def sample(self, rtt: float, now: float, in_flight: float, key: str = "") -> float | None:
        """One finished request took ``rtt`` seconds under a concurrency of ``in_flight``
        (itself included): the time-averaged number of requests in flight during its
        life, as a :class:`~stormguard.overload.Shedder` measures it, or the count when
        it started. Answers the window's median ratio when this sample closed a window
        (the limit may have moved), else None."""
        if not rtt > 0 or not math.isfinite(rtt):
            return None  # a zero or broken measurement says nothing about queueing
        self._done += 1
        if self._probing and now - rtt < self._probe_start:
            return None  # admitted before the probe lowered the limit: it ran at the old
            # concurrency and says nothing of the new one (a request can outlast a window)
        base = self._baseline
        b = base.get(key)
        if b is None:
            if len(base) >= MAX_KEYS:
                key = ""
                b = base.get(key)
            if b is None:
                base[key] = b = rtt
                self._base_in_flight = max(self._base_in_flight, in_flight)
        if rtt < b:
            if rtt < 0.95 * b:
                self._lowered = True
            base[key] = b = rtt
            self._base_in_flight = in_flight
        if in_flight < ALONE:  # ran alone: a no-load measurement
            self._alone_ratios.append(rtt / b)
            alone = self._alone
            seen = alone.get(key)
            if seen is None or rtt < seen:
                alone[key] = rtt
        ratio = rtt / b
        self._ratios.append(ratio)
        self._sum += ratio if ratio < _RATIO_CAP else _RATIO_CAP
        self._n += 1
        self._max_in_flight = max(self._max_in_flight, in_flight)
        self._sum_in_flight += in_flight
        self._sum_rtt += rtt
        self._sum_base += b
        if in_flight >= JOINED:  # what proportional sharing would have made of it
            self._j_n += 1
            self._j_rtt += rtt
            self._j_base += b * (1.0 + SHARED * (in_flight - 1.0))
            self._j_conc += in_flight
        since = self._since
        if since is None:
            self._since = now
            return None
        if self._n < self.min_samples:
            if self._j_n >= 3 and self._j_rtt >= self._j_base:
                return self._update(now)  # 3 joined requests shared one resource: step
                # down now (after a growth, that ends the try: each is latency for all)
            return None
        if now - since < self.window and self._sum < 2 * self.tolerance * self._n:
            return None  # (a window far past the tolerance closes early: react at once)
        return self._update(now)

    def _update(self, now: float) -> float:
        since = self._since
        span = now - since if since is not None else 0.0
        rate = self._done / span if span > 0 else 0.0  # finished per second
        self._done = 0
        ratios = sorted(self._ratios)
        mean = ratios[len(ratios) // 2]  # the median: one GC pause is not a queue
        self._ratios.clear()
        if self._max_in_flight < ALONE:  # a whole window of requests alone: follow them, 10 %
            base = self._baseline
            for key, rtt in self._alone.items():
                b = base[key]
                if rtt > b:
                    base[key] = b + 0.1 * (rtt - b)
        self._alone.clear()
        limit = self._limit
        tol = self.tolerance
        lone = sorted(self._alone_ratios)
        self._alone_ratios.clear()
        shared = self._shared(now)
        if mean > tol and len(lone) >= 2 and lone[len(lone) // 2] > tol:
            pass  # requests that ran alone were slow too: not a queue a lower limit shortens
        elif shared is not None:
            # latency grew with the concurrency: the requests share one resource (a core,
            # the GIL, a saturated dependency), so more of them at once only adds latency
            # (Little: no more throughput); step down toward where each runs alone, and
            # wait before trying more again, longer after each try that failed at once
            step = min(limit, shared) - 1.0
            limit = min(step, limit * max(SHRINK_FLOOR, tol / mean)) if mean > tol else step
            failed = self._windows - self._grew_at <= JOINED_WINDOWS
            self._hold = min(2 * self._hold, SHARED_HOLD_MAX) if failed else SHARED_HOLD
            self._grow_after = self._windows + self._hold
        elif mean > tol:
            limit *= max(SHRINK_FLOOR, tol / mean)
        elif mean <= 1.0 + (tol - 1.0) / 2 and 2 * self._max_in_flight >= limit + 1 \
                and not self._probing and self._windows >= self._grow_after \
                and (self._probe_at is None or self._base_in_flight < ALONE) \
                and (limit < 2.0 or (self._j_n >= 3 and self._j_rtt < self._j_base)):
            # (in use: some request ran under more than half the limit; above 1, requests
            # that ran joined were not slowed in proportion: more at once does run in
            # parallel; not on baselines measured under load that a probe has yet to
            # check: near such a baseline is no evidence of no queue, and growth only adds
            # to it)
            if limit >= 2.0:  # beyond a try from 1: more at once runs in parallel, so
                self._hold = SHARED_HOLD  # the waits between tries start again at 1 s
            if limit < self.max:
                limit += 1.0 if limit < 10 else math.sqrt(limit)
                self._grew_at = self._windows
        changed = int(limit) != int(self._limit)
        self._limit = min(float(self.max), max(float(self.min), limit))
        self._since = now
        self._n = 0
        self._sum = 0.0
        self._max_in_flight = 0.0
        self._sum_in_flight = 0.0
        self._sum_rtt = self._sum_base = 0.0
        if changed or self._j_n >= 3 or self._windows - self._j_since >= JOINED_WINDOWS:
            # (joined requests are few at a moderate load: their evidence is gathered
            # over up to JOINED_WINDOWS windows at one limit)
            self._j_n = 0
            self._j_rtt = self._j_base = self._j_conc = 0.0
            self._j_since = self._windows + 1
        self._windows += 1
        self._probes(now, rate)
        self._lowered = False
        return mean


    def _probes(self, now: float, rate: float) -> None:
        """After a window (``rate``: requests finished per second in it): end a probe,
        or start the next one when it is due."""
        if self._probing:  # found a lower baseline: it was a loaded one, look again later
            if self._lowered and rate >= PROBE_KEEP * self._rate_before:
                # and as many finished per second at the probe's limit (one shared core):
                # the concurrency above it was only queueing, so stay there
                self._limit = min(self._limit, float(self.limit))
            self._probing = False
            self._probe_at = self._windows + PROBE_EVERY if self._lowered else None
        else:
            self._rate_before = rate
        if not self._probing and self._probe_at is not None \
                and self._windows >= self._probe_at:
            if self._base_in_flight < ALONE:  # the baselines were measured alone: no need
                self._probe_at = None
            else:  # below the last probe and where the baseline was measured, not below 1/4
                self._probing = True
                self._probe_start = now
                self._probe_limit = max(0.25 * self._limit, PROBE * min(
                    self._limit, self._probe_limit, float(self._base_in_flight)))

    def _shared(self, now: float) -> float | None:
        """The concurrency at which this window's requests shared one resource, or None.

        Either the whole window (its concurrency, the smaller of the mean and Little's
        law's, at least ``JOINED``, and its summed latency at least ``1 + SHARED x (c -
        1)`` times the summed baselines), or its joined requests alone (at least 3 that
        ran under ``JOINED`` or more, slowed as much in proportion to their own
        concurrency): at a moderate load most requests run alone and the window's mean
        hides the ones that did not."""
        c = min(self._sum_in_flight / self._n, self._little(now))
        if c >= JOINED and self._sum_rtt >= self._sum_base * (1.0 + SHARED * (c - 1.0)):
            return c
        if self._j_n >= 3 and self._j_rtt >= self._j_base:
            return self._j_conc / self._j_n
        return None

    def _little(self, now: float) -> float:
        """The window's mean concurrency by Little's law: its requests' summed latency
        over its duration (the in-flight counts seen at the ends of a request overstate
        it when the others left early)."""
        since = self._since
        span = now - since if since is not None else 0.0
        return self._sum_rtt / span if span > 0 else math.inf

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
