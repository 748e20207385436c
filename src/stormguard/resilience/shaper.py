"""Shaper: the leaky bucket as a queue. Calls leave at a steady pace instead of being refused.

``Shaper(rate=500, per=1.0, max_wait=2.0)`` spaces departures exactly ``per / rate``
apart (``burst=N`` lets N leave back to back first, like NGINX's ``burst=N nodelay``). A
call books its slot when it arrives, so slots are given in arrival order, and waits for
it; a call whose slot is further away than ``max_wait``, or than the deadline in force
(``Timeout``, ``deadline.scope``), or that finds ``max_queue`` calls already waiting, is
refused at once with :class:`~stormguard.ShaperFull` and books nothing.

The schedule is the generic cell rate algorithm of the rate-limit layer
(``Algorithm.reserve`` of ``gcra``, integer microseconds), run

* in process, on the policy clock's monotonic time (``store=None``): one lock held
  for the booking only, shared by threads and asyncio tasks;
* or on a store (``store="redis://..."``, any :class:`~stormguard.Store` with
  ``reserve``): one reservation per call, atomic in the store, so N processes sharing
  ``key`` leave at ``rate`` per ``per`` together. Redis stores book through the
  ``stormguard.shaper`` script (``stores/redis/shaping.py``), which also holds the pause
  every process sees. When the store fails, ``on_error`` decides: ``"local"`` (default)
  paces this process alone at ``rate / expected_instances``, ``"allow"`` lets the call
  go at once, ``"deny"`` refuses it with ``ShaperFull(reason="store")``.

``pause(seconds)``: nobody sharing the shaper is given a slot before then; calls already
waiting whose slot falls inside the pause book again after it (they keep their
``max_wait``). An exception raised by the call with a numeric ``retry_after`` (a 429 or
503 with ``Retry-After``, a :class:`~stormguard.TransientError`) pauses the shaper for
that long (at most ``max_pause``) before it propagates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.deadline import _current
from stormguard._core.errors import ConfigError, ShaperFull, StorageError, StormguardError
from stormguard.observability.events import (
    Listener,
    ShaperDegraded,
    ShaperPaused,
    ShaperRejected,
    ShaperWaited,
)
from stormguard.observability.metrics import track
from stormguard.ratelimit.rule import Rule
from stormguard.resilience._base import Args, AsyncNext, Kwargs, Next, Policy
from stormguard.stores import Store, from_url

__all__ = ["Shaper"]

_ON_ERROR = ("local", "allow", "deny")
_REASONS = ("max_wait", "deadline", "max_queue", "paused", "store")


def _rule(rate: Fraction, burst: int, field: str) -> Rule:
    """The GCRA rule of ``rate`` departures per second: ``limit`` per ``window`` with both
    integers. Slots are whole microseconds: an interval that is not (1/3 s) is rounded up,
    so the pace is never faster than asked and slower by under 1 us per departure."""
    rate = rate.limit_denominator(1_000_000)
    try:
        return Rule(rate.numerator, float(rate.denominator), "gcra", burst)
    except ConfigError as exc:
        raise ConfigError(field, float(rate), f"cannot be paced exactly ({exc.problem})") from exc


class _Schedule:
    """Departures in this process: GCRA reservations on monotonic microseconds.

    :meth:`book` is ``Algorithm.reserve`` of the ``gcra`` rule (the reference, which
    ``tests/resilience/test_shaper.py`` holds it to on random traces) written out on its
    one integer (the theoretical arrival time scaled by ``N``): half the cost per call.
    Not thread-safe by itself: the shaper calls it with its lock held.
    """

    __slots__ = ("C", "N", "W", "clock", "tat")

    def __init__(self, rule: Rule, clock: Clock) -> None:
        algo = rule._algo
        self.N: int = algo.N
        self.W: int = algo.W
        self.C: int = algo.C
        self.clock = clock
        self.tat: int | None = None

    def book(self, budget: float | None, paused_until: float,
             commit: bool = True) -> tuple[bool, float]:
        """``(ok, wait)``: the next slot, booked when it is within ``budget`` seconds (and,
        unless ``commit``, only when it is now: a full queue takes no one who must wait)."""
        mono = self.clock.monotonic()
        now = round(mono * 1_000_000)
        judged = round(paused_until * 1_000_000) if paused_until > mono else now
        tat = self.tat
        n = self.N
        at = judged
        if tat is not None:
            earliest = -((self.C - self.W - tat) // n)  # ceil((tat + W - C) / N)
            at = max(at, earliest)
        wait_us = at - now
        if budget is not None and wait_us > int(budget * 1_000_000):
            return False, wait_us / 1_000_000
        if commit or wait_us <= 0:
            scaled = at * n
            self.tat = (scaled if tat is None or tat < scaled else tat) + self.W
        return True, wait_us / 1_000_000


class Shaper(Policy):
    """Pace calls to one dependency: a leaky bucket that queues instead of rejecting."""

    __slots__ = ("_counts", "_fallback", "_lock", "_paused_until", "_redis", "_rule",
                 "_schedule", "_shaping", "_store", "_waiting", "burst", "expected_instances",
                 "key", "max_pause", "max_queue", "max_wait", "on_error",
                 "pause_on_retry_after", "per", "rate")

    def __init__(self, rate: float, per: float = 1.0, *, max_wait: float | None = 1.0,
                 burst: int = 1, max_queue: int | None = None,
                 store: Store | str | None = None, key: str | None = None,
                 on_error: str = "local", expected_instances: int = 1,
                 pause_on_retry_after: bool = True, max_pause: float = 60.0,
                 name: str = "shaper", clock: Clock | None = None,
                 listeners: tuple[Listener, ...] = ()) -> None:
        self.rate = validate.number("rate", rate)
        self.per = validate.number("per", per)
        self.burst = validate.integer("burst", burst)
        self.max_wait = (None if max_wait is None
                         else validate.number("max_wait", max_wait, allow_zero=True))
        self.max_queue = (None if max_queue is None
                          else validate.integer("max_queue", max_queue, minimum=0))
        self.on_error = validate.one_of("on_error", on_error, _ON_ERROR)
        self.expected_instances = validate.integer("expected_instances", expected_instances)
        self.pause_on_retry_after = validate.boolean("pause_on_retry_after",
                                                     pause_on_retry_after)
        self.max_pause = validate.number("max_pause", max_pause, allow_zero=True)
        validate.text("name", name)
        super().__init__(name=name, clock=clock, listeners=listeners)
        per_second = (Fraction(self.rate).limit_denominator(1_000_000)
                      / Fraction(self.per).limit_denominator(1_000_000))
        self._rule = _rule(per_second, self.burst, "rate")
        self._lock = threading.Lock()
        self._waiting = 0
        self._paused_until = float("-inf")  # monotonic seconds
        self._counts: dict[str, int] = dict.fromkeys(
            ("departed", "waited", "degraded", "pauses", *_REASONS), 0)
        self._store: Store | None = None
        self._schedule: _Schedule | None = None
        self._fallback: _Schedule | None = None
        self._redis = False
        self._shaping: Any = None  # stores/redis/shaping.py, for a Redis store
        track(self, "shaper")  # metrics: queue depth, waits, rejections (its stats())
        if store is None:
            if key is not None:
                raise ConfigError("key", key, "only means something with store=")
            self.key = validate.text("name", name)
            self._schedule = _Schedule(self._rule, self._clock)
            return
        self.key = validate.text("key", name if key is None else key)
        if isinstance(store, str):
            store = from_url(store)
        elif not isinstance(store, Store):
            raise ConfigError("store", store, "must be a stormguard Store or a store URL")
        self._store = store
        if on_error == "local":
            self._fallback = _Schedule(
                _rule(per_second / self.expected_instances, self.burst, "expected_instances"),
                self._clock)
        if type(store).__module__.startswith("stormguard.stores.redis"):
            from stormguard.stores.redis import shaping  # only then: redis-py is optional

            if shaping.supports(store):
                self._redis = True
                self._shaping = shaping

    def __repr__(self) -> str:
        # the store's type only: a store's own repr may show its URL, password included
        where = ("" if self._store is None
                 else f", store={type(self._store).__name__}, key={self.key!r}")
        return (f"Shaper(rate={self.rate:g}, per={self.per:g}, max_wait={self.max_wait}, "
                f"burst={self.burst}{where})")

    @property
    def interval(self) -> float:
        """Seconds between two departures at the steady pace (``per / rate``)."""
        return self.per / self.rate

    @property
    def waiting(self) -> int:
        """Calls of this process waiting for their slot now."""
        return self._waiting

    def stats(self) -> dict[str, float]:
        """Counters for metrics: ``waiting`` (calls queued now, this process), ``departed``
        (calls let through), ``waited`` (of them, those that had to wait), ``rejected``
        and one ``rejected_<reason>`` per reason, ``degraded`` (bookings handled by
        ``on_error``), ``pauses``, and ``paused_for`` (seconds of pause left)."""
        with self._lock:
            counts = dict(self._counts)
            waiting = self._waiting
        out: dict[str, float] = {"waiting": waiting, "departed": counts["departed"],
                                 "waited": counts["waited"],
                                 "rejected": sum(counts[r] for r in _REASONS)}
        for r in _REASONS:
            out[f"rejected_{r}"] = counts[r]
        out["degraded"] = counts["degraded"]
        out["pauses"] = counts["pauses"]
        out["paused_for"] = max(0.0, self._paused_until - self._clock.monotonic())
        return out

    # -- decisions (never block) ------------------------------------------------------------
    def _budget(self, waited: float) -> tuple[float | None, str]:
        """How long this call may still wait (None: any), and what sets that bound."""
        budget = None if self.max_wait is None else self.max_wait - waited
        by = "max_wait"
        d = _current.get()
        if d is not None:
            left = d.remaining()
            if budget is None or left < budget:
                budget, by = left, "deadline"
        return budget, by

    def _reject(self, reason: str, wait: float, retry_after: float,
                cause: BaseException | None = None) -> ShaperFull:
        with self._lock:
            self._counts[reason] += 1
        if self._observed():
            self._emit(ShaperRejected(self.name, self._clock.monotonic(), reason, wait,
                                      retry_after))
        if reason == "max_queue":
            text = f"{self.max_queue} calls already waiting"
        elif reason == "store":
            text = f"its store failed ({cause})"
        else:
            bound = {"max_wait": "max_wait", "deadline": "the deadline",
                     "paused": "max_wait (paused)"}[reason]
            text = f"next slot in {wait:.3f}s, beyond {bound}"
        return ShaperFull(f"shaper {self.name!r}: {text}", retry_after=retry_after,
                          reason=reason, name=self.name)

    def _too_far(self, wait: float, budget: float | None, by: str) -> ShaperFull:
        if by == "max_wait" and self._paused_until - self._clock.monotonic() > (budget or 0.0):
            by = "paused"
        return self._reject(by, wait, max(0.0, wait - (budget or 0.0)))

    def _book_local(self, schedule: _Schedule, budget: float | None, by: str) -> float:
        """Book on an in-process schedule: the wait, or ShaperFull (nothing booked)."""
        with self._lock:
            room = self.max_queue is None or self._waiting < self.max_queue
            ok, wait = schedule.book(budget, self._paused_until, room)
            if ok:
                if wait <= 0:
                    self._counts["departed"] += 1
                    return 0.0
                if room:
                    self._waiting += 1
                    return wait
        if ok:  # it would have to wait, and max_queue calls already do
            raise self._reject("max_queue", wait, self.interval)
        raise self._too_far(wait, budget, by)

    def _enter(self) -> bool:
        """Before a store booking: take a place in the queue, so max_queue is exact with
        concurrent bookings. False when the queue is full (book only a slot that is now)."""
        with self._lock:
            if self.max_queue is not None and self._waiting >= self.max_queue:
                return False
            self._waiting += 1
            return True

    def _booked(self, ok: bool, wait: float, paused_for: float, budget: float | None,
                by: str, placed: bool) -> float:
        """After a store booking (``placed``: with a place taken by :meth:`_enter`; else it
        asked for a slot that is now): the wait, or ShaperFull."""
        with self._lock:
            if paused_for > 0:
                self._paused_until = max(self._paused_until,
                                         self._clock.monotonic() + paused_for)
            if ok and wait > 0:
                return wait
            if placed:
                self._waiting -= 1
            if ok:
                self._counts["departed"] += 1
                return 0.0
        if not placed and (budget is None or wait <= budget):
            raise self._reject("max_queue", wait, self.interval)
        raise self._too_far(wait, budget, by)

    def _degraded(self, exc: StorageError, budget: float | None, by: str,
                  placed: bool) -> float:
        """The store failed (the place taken by :meth:`_enter` is given back first)."""
        with self._lock:
            if placed:
                self._waiting -= 1
            self._counts["degraded"] += 1
        if self._observed():
            self._emit(ShaperDegraded(self.name, self._clock.monotonic(), self.on_error, exc))
        if self._fallback is not None:
            return self._book_local(self._fallback, budget, by)
        if self.on_error == "allow":
            with self._lock:
                self._counts["departed"] += 1
            return 0.0
        retry = max(self.interval, float(getattr(exc, "remaining", 0.0) or 0.0))
        raise self._reject("store", 0.0, retry, exc) from exc

    def _woke(self, waited: float) -> bool:
        """A waiter's slot came: True if it departs, False if a pause began meanwhile
        and it must book again (its place in the queue is given back either way)."""
        now = self._clock.monotonic()
        with self._lock:
            self._waiting -= 1
            if now < self._paused_until:
                return False
            self._counts["departed"] += 1
            self._counts["waited"] += 1
        if self._observed():
            self._emit(ShaperWaited(self.name, now, waited))
        return True

    def _gone(self) -> None:
        """A waiter left without departing (cancelled, interrupted): its slot stays unused."""
        with self._lock:
            self._waiting -= 1

    def _pause_left(self) -> float:
        return self._paused_until - self._clock.monotonic()

    def _retry_after_of(self, exc: BaseException) -> float:
        """The pause an error asks for (0.0: none)."""
        if not self.pause_on_retry_after or isinstance(exc, StormguardError):
            return 0.0
        value = getattr(exc, "retry_after", None)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            return 0.0
        return min(float(value), self.max_pause)

    def _pause_here(self, seconds: float, cause: BaseException | None) -> None:
        until = self._clock.monotonic() + seconds
        with self._lock:
            self._paused_until = max(self._paused_until, until)
            self._counts["pauses"] += 1
        if self._observed():
            self._emit(ShaperPaused(self.name, self._clock.monotonic(), seconds, cause))

    def _pause_failed(self, exc: StorageError) -> None:
        with self._lock:
            self._counts["degraded"] += 1
        if self._observed():
            self._emit(ShaperDegraded(self.name, self._clock.monotonic(), "local", exc))

    # -- booking and waiting: a hand-written pair (I/O and sleeping differ by nature) -------
    def _book_here(self, schedule: _Schedule, waited: float) -> float:
        """Book on the in-process schedule (no I/O: the same for both styles)."""
        budget, by = self._budget(waited)
        if budget is not None and budget < 0:
            raise self._reject(by, 0.0, 0.0)
        return self._book_local(schedule, budget, by)

    def _book_blocking(self, waited: float) -> float:
        budget, by = self._budget(waited)
        if budget is not None and budget < 0:
            raise self._reject(by, 0.0, 0.0)
        store: Any = self._store
        placed = self._enter()
        asked = budget if placed else 0.0
        try:
            if self._redis:
                ok, wait, paused_for = self._shaping.book(store, self.key, self._rule, asked)
            else:
                r = store.reserve(self.key, self._rule, max_wait=asked)
                ok, wait, paused_for = r.ok, r.wait, 0.0
        except StorageError as exc:
            return self._degraded(exc, budget, by, placed)
        except BaseException:
            if placed:
                self._gone()
            raise
        return self._booked(ok, wait, paused_for, budget, by, placed)

    async def _book_async(self, waited: float) -> float:
        budget, by = self._budget(waited)
        if budget is not None and budget < 0:
            raise self._reject(by, 0.0, 0.0)
        store: Any = self._store
        placed = self._enter()
        asked = budget if placed else 0.0
        try:
            if self._redis:
                ok, wait, paused_for = await self._shaping.abook(store, self.key, self._rule,
                                                                 asked)
            else:
                r = await store.areserve(self.key, self._rule, max_wait=asked)
                ok, wait, paused_for = r.ok, r.wait, 0.0
        except StorageError as exc:
            return self._degraded(exc, budget, by, placed)
        except BaseException:
            if placed:
                self._gone()
            raise
        return self._booked(ok, wait, paused_for, budget, by, placed)

    def _depart_blocking(self) -> None:
        """Book a slot and wait for it (again after a pause that began meanwhile)."""
        waited = 0.0
        schedule = self._schedule
        while True:
            if schedule is not None:
                wait = self._book_here(schedule, waited)
            else:
                if not self._redis:
                    left = self._pause_left()  # a store that knows no pause: wait it out
                    if left > 0:
                        budget, _ = self._budget(waited)
                        if budget is not None and left > budget:
                            raise self._reject("paused", left, left - budget)
                        self._clock.sleep(left)
                        waited += left
                        continue
                wait = self._book_blocking(waited)
            if wait <= 0:
                return
            try:
                self._clock.sleep(wait)
            except BaseException:
                self._gone()
                raise
            waited += wait
            if self._woke(waited):
                return

    async def _depart_async(self) -> None:
        """Book a slot and wait for it (again after a pause that began meanwhile)."""
        waited = 0.0
        schedule = self._schedule
        while True:
            if schedule is not None:
                wait = self._book_here(schedule, waited)
            else:
                if not self._redis:
                    left = self._pause_left()  # a store that knows no pause: wait it out
                    if left > 0:
                        budget, _ = self._budget(waited)
                        if budget is not None and left > budget:
                            raise self._reject("paused", left, left - budget)
                        await self._clock.asleep(left)
                        waited += left
                        continue
                wait = await self._book_async(waited)
            if wait <= 0:
                return
            try:
                await self._clock.asleep(wait)
            except BaseException:
                self._gone()
                raise
            waited += wait
            if self._woke(waited):
                return

    # -- pausing -------------------------------------------------------------------------
    def pause(self, seconds: float) -> None:
        """Nobody sharing this shaper departs before ``seconds`` from now (with a Redis
        store: in every process, through the store; a failing store pauses this process)."""
        seconds = validate.number("seconds", seconds, allow_zero=True)
        self._pause(seconds, None)

    async def apause(self, seconds: float) -> None:
        """:meth:`pause` without blocking the event loop on the store's round trip."""
        seconds = validate.number("seconds", seconds, allow_zero=True)
        await self._apause(seconds, None)

    def _pause(self, seconds: float, cause: BaseException | None) -> None:
        self._pause_here(seconds, cause)
        if self._redis and seconds > 0:
            try:
                self._shaping.pause(self._store, self.key, self._rule, seconds)
            except StorageError as exc:
                self._pause_failed(exc)

    async def _apause(self, seconds: float, cause: BaseException | None) -> None:
        self._pause_here(seconds, cause)
        if self._redis and seconds > 0:
            try:
                await self._shaping.apause(self._store, self.key, self._rule, seconds)
            except StorageError as exc:
                self._pause_failed(exc)

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source shaper
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        await self._depart_async()
        try:
            return await nxt(fn, args, kwargs)
        except Exception as exc:
            seconds = self._retry_after_of(exc)
            if seconds:
                await self._apause(seconds, exc)
            raise
    # unasync: end

    # unasync: generated shaper (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        self._depart_blocking()
        try:
            return nxt(fn, args, kwargs)
        except Exception as exc:
            seconds = self._retry_after_of(exc)
            if seconds:
                self._pause(seconds, exc)
            raise
    # unasync: end
