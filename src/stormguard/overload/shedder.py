"""The admission core of load shedding: tiers as caps, a bounded wait, CoDel, LIFO.

One :class:`Shedder` guards one process's work (the middleware's) or one dependency
(:class:`stormguard.resilience.ConcurrencyLimit`). A request of tier ``t`` gets a slot
while fewer than ``cap(t) = max(1, floor(limit x share[t]))`` slots are taken (shares:
critical 1.0, degraded 0.8, sheddable 0.5), so lower tiers can never take the last
slots critical traffic needs. Without a slot it waits at most ``queue_timeout`` (one
duration for every tier, or one per tier: ``{"critical": 0.5}``, the others 50 ms); a
freed slot is handed straight to a waiter (the most important tier first, among those
whose cap allows it), so an arrival never overtakes an eligible waiter.

**CoDel** (Facebook's variant for servers): when the waiting requests have stood in the
queue longer than ``codel_target`` (5 ms) for a whole ``codel_interval`` (100 ms), the
queue is standing, not absorbing a burst: from then on, until the queue has stayed short
(empty, or waits below the target) for a whole interval, new degraded and sheddable
arrivals that find no slot under their tier's cap are shed at once instead of waiting
(one that finds a free slot still takes it: CoDel manages the queue, the caps keep the
slots critical requests need), and degraded and sheddable waiters are served newest
first (adaptive LIFO: the oldest ones are the likeliest to be abandoned by their clients
already); critical waiters stay first in, first out.

The shedder is thread-safe (one lock, never held across a wait) and serves threads and
asyncio tasks alike; waits are measured on its clock (virtual on
:class:`stormguard.testing.FakeClock`'s loop).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock, SystemClock, system_clock
from stormguard._core.errors import ConfigError, Shed
from stormguard.observability.events import LimitChanged, Listener, RequestShed, emit, observed
from stormguard.observability.metrics import track
from stormguard.overload.limit import AdaptiveLimit, Limit, coerce_limit

__all__ = ["CRITICAL", "DEFAULT_SHARES", "DEGRADED", "SHEDDABLE", "TIERS", "Shedder", "Ticket",
           "Waiting", "tier_index"]

TIERS = ("critical", "degraded", "sheddable")
"""The priority tiers, most important first; shed in the reverse order."""
CRITICAL, DEGRADED, SHEDDABLE = 0, 1, 2
DEFAULT_SHARES: dict[str, float] = {"critical": 1.0, "degraded": 0.8, "sheddable": 0.5}
#: the longest a request waits for a slot when ``queue_timeout`` does not name its tier
DEFAULT_QUEUE_TIMEOUT = 0.05

#: the wait-in-vain estimate's margin: halved at each wait in vain, at least this share
#: of the queue timeout, doubling back every VAIN_RECOVERY seconds (see Shedder._margin)
VAIN_FLOOR = 0.125
VAIN_RECOVERY = 3.0
_VAIN_DOUBLINGS = math.log2(1 / VAIN_FLOOR)  # from the floor back to 1

#: a thread waiting on a clock other than the system's looks at it this often (real seconds)
_POLL = 0.002


def tier_index(field: str, tier: object) -> int:
    """The index of a tier name in :data:`TIERS`; a ConfigError naming ``field`` else."""
    if isinstance(tier, str):
        try:
            return TIERS.index(tier)
        except ValueError:
            pass
    raise ConfigError(field, tier, "must be one of 'critical', 'degraded', 'sheddable'")


class Ticket:
    """One admitted request: release it with :meth:`Shedder.release` when it finishes."""

    __slots__ = ("area", "in_flight", "key", "start", "tier")

    def __init__(self, tier: int, start: float, in_flight: int, key: str,
                 area: float = 0.0) -> None:
        self.tier = tier
        self.start = start
        self.in_flight = in_flight
        self.key = key
        self.area = area  # the shedder's in-flight x seconds so far, when it started


class _Waiter:
    __slots__ = ("event", "future", "granted", "key", "loop", "since", "tier")

    def __init__(self, tier: int, since: float, key: str) -> None:
        self.tier = tier
        self.since = since
        self.key = key
        self.granted: Ticket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.future: asyncio.Future[None] | None = None
        self.event: threading.Event | None = None


Waiting = _Waiter
"""A request's place in a shedder's queue (:meth:`Shedder.enqueue`); its ``event`` is set
when a slot is handed to it (then ``granted`` holds the :class:`Ticket`)."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Shedder:
    """Admit, queue or shed work by priority tier under one concurrency limit."""

    def __init__(self, limit: AdaptiveLimit | int | None = None, *,
                 queue_timeout: float | Mapping[str, float] = 0.05,
                 shares: Mapping[str, float] | None = None, codel_target: float = 0.005,
                 codel_interval: float = 0.1, max_queue: int = 1000,
                 retry_after: float = 1.0, name: str = "shedder", clock: Clock | None = None,
                 listeners: Iterable[Listener] = ()) -> None:
        self.limit: Limit = coerce_limit("limit", limit)
        if isinstance(self.limit, AdaptiveLimit):
            if self.limit.owner is not None:
                raise ConfigError("limit", limit, "this AdaptiveLimit already belongs to "
                                  "another shedder or ConcurrencyLimit: give each its own")
            self.limit.owner = self
        self.queue_timeouts = self._check_timeouts(queue_timeout)
        """The longest a request of each tier may wait for a slot (seconds)."""
        self._timeout = tuple(self.queue_timeouts[t] for t in TIERS)
        self.queue_timeout = max(self._timeout)
        """The longest any request may wait for a slot (seconds)."""
        self.codel_target = validate.duration("codel_target", codel_target)
        self.codel_interval = validate.duration("codel_interval", codel_interval)
        self.max_queue = validate.integer("max_queue", max_queue, minimum=0)
        self.retry_after = validate.number("retry_after", retry_after, allow_zero=True)
        self.shares = self._check_shares(shares)
        self._share = tuple(self.shares[t] for t in TIERS)
        self.name = name
        self._clock: Clock = system_clock if clock is None else clock
        self._listeners: list[Listener] = list(listeners)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._area = 0.0  # the integral of the in-flight count over time, up to _area_at:
        self._area_at = 0.0  # what a request's concurrency during its life is read from
        self._tier_in_flight = [0, 0, 0]
        self._queues: tuple[deque[_Waiter], ...] = (deque(), deque(), deque())
        self._waiting = 0
        self._above_since: float | None = None  # CoDel: waiters above target since then
        self._below_since: float | None = None  # ...and, when overloaded, short since then
        self._overloaded = False
        self._rtt = 0.0  # moving average of the latency of admitted requests
        # per tier, the moving average of the time between requests that were not shed on
        # arrival (they take slots before any less important waiter), and the latest one
        self._gap = [0.0, 0.0, 0.0]
        self._last = [-math.inf, -math.inf, -math.inf]
        # per tier, the share of its queue_timeout the wait-in-vain estimate allows just
        # after its latest wait in vain, and when that was: see _margin
        self._vain = [1.0, 1.0, 1.0]
        self._vain_at = [-math.inf, -math.inf, -math.inf]
        self._admitted = [0, 0, 0]
        self._shed = [0, 0, 0]
        self._shed_codel = 0
        self._shed_timeout = 0
        track(self, "shedder")  # metrics: limit, in flight, waiting, shed by tier

    @staticmethod
    def _check_timeouts(queue_timeout: float | Mapping[str, float]) -> dict[str, float]:
        if isinstance(queue_timeout, Mapping):
            out = dict.fromkeys(TIERS, DEFAULT_QUEUE_TIMEOUT)
            for tier, wait in queue_timeout.items():
                tier_index("queue_timeout", tier)
                out[tier] = validate.duration(f"queue_timeout[{tier!r}]", wait,
                                              allow_zero=True)
            return out
        return dict.fromkeys(TIERS, validate.duration("queue_timeout", queue_timeout,
                                                      allow_zero=True))

    @staticmethod
    def _check_shares(shares: Mapping[str, float] | None) -> dict[str, float]:
        out = dict(DEFAULT_SHARES)
        if shares is not None:
            if not isinstance(shares, Mapping):
                raise ConfigError("shares", shares, "must map tiers to fractions of the limit")
            for tier, share in shares.items():
                tier_index("shares", tier)
                out[tier] = validate.number(f"shares[{tier!r}]", share, maximum=1.0)
        if not out["critical"] >= out["degraded"] >= out["sheddable"]:
            raise ConfigError("shares", shares, "must not give a less important tier more "
                              "of the limit (critical >= degraded >= sheddable)")
        return out

    def __repr__(self) -> str:
        return (f"Shedder(limit={self.limit!r}, queue_timeout={self.queue_timeouts}, "
                f"in_flight={self._in_flight})")

    # -- reading ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return self._waiting

    def cap(self, tier: int) -> int:
        """How many slots may be taken for a request of ``tier`` to be admitted."""
        return max(1, math.floor(self.limit.limit * self._share[tier]))

    def overloaded(self) -> bool:
        """True while the queue is standing (CoDel): degraded and sheddable arrivals that
        find no slot are shed at once, their waiters served newest first."""
        with self._lock:
            return self._standing(self._clock.monotonic())

    def stats(self) -> dict[str, Any]:
        """Gauges and counters for metrics: the limit, in flight, waiting, admitted and shed
        per tier, whether the queue is standing."""
        with self._lock:
            return {
                "limit": self.limit.limit,
                "adaptive": self.limit.adaptive,
                "in_flight": self._in_flight,
                "in_flight_by_tier": dict(zip(TIERS, self._tier_in_flight, strict=True)),
                "waiting": self._waiting,
                "waiting_by_tier": {t: len(q) for t, q in zip(TIERS, self._queues, strict=True)},
                "admitted": dict(zip(TIERS, self._admitted, strict=True)),
                "shed": dict(zip(TIERS, self._shed, strict=True)),
                "shed_codel": self._shed_codel,
                "shed_queue_timeout": self._shed_timeout,
                "caps": {t: self.cap(i) for i, t in enumerate(TIERS)},
                "overloaded": self._standing(self._clock.monotonic()),
            }

    # -- the decisions (under the lock) -------------------------------------------------------
    def _standing(self, now: float) -> bool:
        """CoDel's state: entered when waiters stood above the target for a whole
        interval, left when the queue stayed short (empty, or sojourns below the target)
        for a whole interval."""
        if self._overloaded:
            below = self._below_since
            if below is not None and now - below >= self.codel_interval:
                self._overloaded = False
                self._below_since = None
            return self._overloaded
        above = self._above_since
        if above is not None and now - above >= self.codel_interval:
            self._overloaded = True
            self._below_since = None
        return self._overloaded

    def _sojourn(self, waited: float, now: float) -> None:
        """A waiter left the queue after ``waited`` seconds."""
        if waited < self.codel_target:
            self._short(now)
        else:
            self._below_since = None
            if self._above_since is None:
                self._above_since = now - waited + self.codel_target

    def _short(self, now: float) -> None:
        """The queue is short now (empty, or a sojourn below the target)."""
        self._above_since = None
        if self._overloaded and self._below_since is None:
            self._below_since = now

    def _tick(self, now: float) -> float:
        """The in-flight integral up to ``now`` (before the count changes)."""
        if now > self._area_at:
            self._area += self._in_flight * (now - self._area_at)
            self._area_at = now
        return self._area

    def _take(self, tier: int, now: float, key: str) -> Ticket:
        area = self._tick(now)
        self._in_flight += 1
        self._tier_in_flight[tier] += 1
        self._admitted[tier] += 1
        return Ticket(tier, now, self._in_flight, key, area)

    def _dispatch(self, now: float) -> None:
        """Hand free slots to waiters, most important tier first (newest first when the
        queue is standing)."""
        lifo = self._standing(now)
        queues = self._queues
        limit = self.limit.limit
        share = self._share
        here = asyncio.events._get_running_loop()  # None outside a running loop
        for tier in (CRITICAL, DEGRADED, SHEDDABLE):
            q = queues[tier]
            cap = max(1, math.floor(limit * share[tier]))
            while q and self._in_flight < cap:
                w = q.pop() if lifo and tier else q.popleft()
                self._waiting -= 1
                self._sojourn(now - w.since, now)
                w.granted = self._take(tier, now, w.key)
                if w.event is not None:
                    w.event.set()
                elif w.loop is not None and w.future is not None:
                    if w.loop is here:  # freed on the waiter's own loop: it resumes in
                        _resolve(w.future)  # this round, no wake-up, no extra round
                        continue
                    try:
                        w.loop.call_soon_threadsafe(_resolve, w.future)
                    except RuntimeError:  # its loop is closed: nobody will take the slot
                        w.granted = None
                        self._in_flight -= 1
                        self._tier_in_flight[tier] -= 1
                        self._admitted[tier] -= 1
        if not self._waiting:
            self._short(now)

    def _admit(self, tier: int, key: str, now: float, may_wait: bool) -> Ticket | _Waiter | str:
        """A ticket, a waiter to wait on, or the reason to shed."""
        if self._waiting:
            oldest = min(q[0].since for q in self._queues if q)
            if now - oldest >= self.codel_target:
                self._below_since = None
                if self._above_since is None:
                    self._above_since = oldest + self.codel_target
        elif self._overloaded or self._above_since is not None:
            self._short(now)
        limit = self.limit.limit
        if self._in_flight < max(1, math.floor(limit * self._share[tier])):
            self._arrived(tier, now)
            return self._take(tier, now, key)
        timeout = self._timeout[tier]
        if not may_wait or timeout <= 0 or self._waiting >= self.max_queue:
            return "capacity"
        if tier != CRITICAL and self._rtt and self._in_vain(tier, now, limit, timeout):
            return "capacity"
        if tier != CRITICAL and (self._overloaded or self._above_since is not None) \
                and self._standing(now):
            return "codel"
        self._arrived(tier, now)
        w = _Waiter(tier, now, key)
        self._queues[tier].append(w)
        self._waiting += 1
        return w

    def _arrived(self, tier: int, now: float) -> None:
        """A request of ``tier`` was admitted or queued: it goes before any less important
        waiter. Its tier's arrival rate follows (a moving average of the gaps, 1/20)."""
        last = self._last[tier]
        self._last[tier] = now
        if last > -math.inf:
            gap = now - last
            g = self._gap[tier]
            self._gap[tier] = gap if not g else g + 0.05 * (gap - g)

    def _rate(self, tier: int, now: float) -> float:
        """Requests of ``tier`` per second that take slots (0 before two of them; a
        silence longer than their usual gap lowers it, as 1 / the silence)."""
        g = self._gap[tier]
        if not g:
            return 0.0
        return 1.0 / max(g, now - self._last[tier])

    def _in_vain(self, tier: int, now: float, limit: int, timeout: float) -> bool:
        """Would a degraded or sheddable request that finds no slot wait in vain? Slots
        free about every ``s = rtt / in_flight`` seconds; it needs the ones for the
        waiters before it, and the more important requests that arrive while it waits
        (``r`` per second) go first too, so it starts after about ``need x s / (1 - r x
        s)``: never when ``r x s >= 1``. Shed at once when that is longer than its wait."""
        queues = self._queues
        ahead = len(queues[CRITICAL]) + len(queues[DEGRADED])
        r = self._rate(CRITICAL, now)
        if tier == SHEDDABLE:
            ahead += len(queues[SHEDDABLE])
            r += self._rate(DEGRADED, now)
        need = ahead + 1 + self._in_flight - max(1, math.floor(limit * self._share[tier]))
        s = self._rtt / max(1, self._in_flight)
        busy = r * s
        return busy >= 1.0 or need * s > timeout * self._margin(tier, now) * (1.0 - busy)

    def _margin(self, tier: int, now: float) -> float:
        """The share of its wait a request of ``tier`` may be expected to need: 1 until
        one of them waits in vain, then halved at each wait in vain (down to
        ``VAIN_FLOOR``) and doubling back every ``VAIN_RECOVERY`` seconds without one. An
        estimate that keeps letting requests wait in vain is too hopeful for this
        traffic; one that is right again soon goes back to the whole wait."""
        m = self._vain[tier]
        if m >= 1.0:
            return 1.0
        doublings = min(_VAIN_DOUBLINGS, (now - self._vain_at[tier]) / VAIN_RECOVERY)
        return min(1.0, m * math.pow(2.0, doublings))

    def _waited_in_vain(self, tier: int, now: float) -> None:
        self._vain[tier] = max(VAIN_FLOOR, self._margin(tier, now) * 0.5)
        self._vain_at[tier] = now

    def _shed_one(self, tier: int, reason: str, now: float) -> Shed:
        self._shed[tier] += 1
        if reason == "codel":
            self._shed_codel += 1
        elif reason == "queue_timeout":
            self._shed_timeout += 1
        if observed(self._listeners):
            emit(self._listeners, RequestShed(self.name, now, TIERS[tier], reason,
                                              self._in_flight, self.limit.limit))
        return Shed(f"{self.name}: overloaded, {TIERS[tier]} request shed ({reason})",
                    tier=TIERS[tier], reason=reason, retry_after=self.retry_after,
                    name=self.name)

    def _give_up(self, w: _Waiter, now: float) -> Ticket | Shed:
        """A waiter's time is up: its ticket if a slot was handed to it meanwhile, else
        it leaves the queue and is shed."""
        with self._lock:
            if w.granted is not None:
                return w.granted
            try:
                self._queues[w.tier].remove(w)
            except ValueError:  # pragma: no cover - granted is set under the same lock
                pass
            else:
                self._waiting -= 1
            self._sojourn(now - w.since, now)
            if not self._waiting:
                self._short(now)
            self._waited_in_vain(w.tier, now)
            return self._shed_one(w.tier, "queue_timeout", now)

    # -- the API ----------------------------------------------------------------------------
    def try_acquire(self, tier: int = CRITICAL, key: str = "") -> Ticket | Shed:
        """A slot now, or the :class:`Shed` error to answer with (never waits)."""
        now = self._clock.monotonic()
        with self._lock:
            got = self._admit(tier, key, now, False)
            if isinstance(got, Ticket):
                return got
            return self._shed_one(tier, "capacity", now)

    def enqueue(self, tier: int, key: str, event: Callable[[], threading.Event]
                ) -> Ticket | Shed | Waiting:
        """:meth:`acquire_blocking`'s decision without its wait, for a caller that waits
        by its own means (the simulator, in virtual time): a slot now (a :class:`Ticket`),
        the :class:`Shed` error to answer with, or the request's place in the queue.

        ``event`` is called (under the shedder's lock) only when the request must wait:
        the object it returns is the place's ``event``, whose ``set()`` the shedder calls,
        under its lock, when a slot is handed to the request. The caller waits for that
        at most the tier's queue timeout (``queue_timeouts[TIERS[tier]]``, as
        :meth:`acquire_blocking` does), then hands the place to :meth:`settle`."""
        now = self._clock.monotonic()
        with self._lock:
            got = self._admit(tier, key, now, True)
            if isinstance(got, Ticket):
                return got
            if isinstance(got, str):
                return self._shed_one(tier, got, now)
            got.event = event()
            return got

    def settle(self, place: Waiting) -> Ticket | Shed:
        """The end of a wait begun by :meth:`enqueue`: the ticket of the slot handed to
        the request meanwhile, else it leaves the queue and is shed (``queue_timeout``)."""
        return self._give_up(place, self._clock.monotonic())

    async def acquire_async(self, tier: int = CRITICAL, key: str = "",
                            wait: float | None = None) -> Ticket | Shed:
        """A slot, waiting at most the tier's ``queue_timeout`` (or ``wait``) on the
        running loop."""
        clock = self._clock
        now = clock.monotonic()
        with self._lock:
            got = self._admit(tier, key, now, wait is None or wait > 0)
            if isinstance(got, Ticket):
                return got
            if isinstance(got, str):
                return self._shed_one(tier, got, now)
            loop = asyncio.get_running_loop()
            got.loop = loop
            got.future = fut = loop.create_future()
        timeout = self._timeout[tier]
        budget = timeout if wait is None else min(wait, timeout)
        try:
            async with asyncio.timeout(budget):
                await fut
        except TimeoutError:
            return self._give_up(got, clock.monotonic())
        except BaseException:
            ticket = self._give_up(got, clock.monotonic())
            if isinstance(ticket, Ticket):
                self.release(ticket, ok=False)
            raise
        assert got.granted is not None
        return got.granted

    def acquire_blocking(self, tier: int = CRITICAL, key: str = "",
                         wait: float | None = None) -> Ticket | Shed:
        """A slot, blocking this thread at most the tier's ``queue_timeout`` (or
        ``wait``)."""
        clock = self._clock
        now = clock.monotonic()
        with self._lock:
            got = self._admit(tier, key, now, wait is None or wait > 0)
            if isinstance(got, Ticket):
                return got
            if isinstance(got, str):
                return self._shed_one(tier, got, now)
            got.event = event = threading.Event()
        timeout = self._timeout[tier]
        budget = timeout if wait is None else min(wait, timeout)
        if type(clock) is SystemClock:
            event.wait(budget)
        else:  # another clock's time: wait in short real slices, watching it
            end = now + budget
            while not event.wait(_POLL) and clock.monotonic() < end:
                pass
        return self._give_up(got, clock.monotonic())

    def release(self, ticket: Ticket, ok: bool = True) -> None:
        """The request of ``ticket`` finished (``ok``: normally, so its latency is a
        sample for an adaptive limit); its slot goes to a waiter, if one may have it."""
        clock = self._clock
        now = clock.monotonic()
        with self._lock:
            area = self._tick(now)
            self._in_flight -= 1
            self._tier_in_flight[ticket.tier] -= 1
            rtt = now - ticket.start
            if ok:
                self._rtt = rtt if not self._rtt else self._rtt + 0.1 * (rtt - self._rtt)
            limit = self.limit
            if ok and limit.adaptive:
                old = limit.limit
                # the concurrency it ran under: the mean in-flight count over its life,
                # itself included (a request that started alone and was joined did not run
                # alone; one that started among others may have finished alone)
                seen: float = ticket.in_flight
                if rtt > 0:
                    seen = max(1.0, (area - ticket.area) / rtt)
                ratio = limit.sample(rtt, now, seen, ticket.key)
                if ratio is not None and limit.limit != old and observed(self._listeners):
                    emit(self._listeners, LimitChanged(self.name, now, old, limit.limit, ratio))
            if self._waiting:
                self._dispatch(now)

    # -- listeners ----------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)
