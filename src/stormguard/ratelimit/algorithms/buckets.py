"""The bucket family: token bucket, GCRA and leaky bucket (as a meter).

All three admit the same requests: a burst of ``B`` at once, then ``N`` per ``W``. Levels
are in scaled units (one unit of cost = ``W``), so the rate is exactly ``N`` scaled units
per microsecond.

**Reservation** (:meth:`~stormguard.ratelimit.algorithms.Algorithm.reserve`): the
earliest ``at_us >= now`` at which a hit of ``cost`` is admitted, and with ``book`` the
state after that hit *at* ``at_us``. Booked slots therefore follow the bucket's own rule:
``B`` back to back, then one unit per emission interval ``W / N`` µs, and a hit or a
reservation made after a booking comes after it:

* gcra: the booking moves the theoretical arrival time on by ``cost * W``; every later
  request is judged at its own time against it.
* token_bucket: the booking takes the tokens at ``at_us``; the state then stands at
  ``at_us`` and, as for a clock that stepped back, requests before it are judged as if
  made at ``at_us`` (so a hit's ``retry_after`` is counted from the booked slot).
* leaky_bucket: the booking pours ``cost`` into the bucket at ``at_us``: the bucket is
  the queue of a shaper and ``at_us`` the moment the call leaves it. Requests before
  ``at_us`` are judged at ``at_us``, as for the token bucket.
"""

from __future__ import annotations

from typing import Any

from stormguard.ratelimit.algorithms.base import Algorithm, Booking, Transition, Verdict, ceil_div

__all__ = ["Gcra", "LeakyBucket", "TokenBucket"]


class TokenBucket(Algorithm):
    """Capacity ``B`` tokens, refilled continuously at ``N / W`` tokens per µs.

    State ``(level, last_us)``, the level in scaled tokens (one token = ``W``)."""

    __slots__ = ()
    name = "token_bucket"
    uses_burst = True
    reservable = True

    def expires_of(self, state: Any) -> int:
        level, last = state
        return int(last) + ceil_div(self.C - level, self.N)

    def _level(self, state: Any, now: int) -> tuple[int, int]:
        """(level, the time it is judged at): a clock behind ``last_us`` counts as it."""
        if state is None:
            return self.C, now
        level, last = state
        if now <= last:  # the clock stepped back (or stood still): no time passed
            return level, last
        return min(self.C, level + (now - last) * self.N), now

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        level, now = self._level(state, now)
        need = cost * self.W
        allowed = level >= need
        retry = 0 if allowed else ceil_div(need - level, self.N)
        if allowed and consume:
            level -= need
            state = (level, now)
        return (allowed, state, level // self.W, ceil_div(self.C - level, self.N), retry,
                now if state is None else self.expires_of(state))

    def reserve(self, state: Any, now: int, cost: int, max_wait_us: int,
                book: bool) -> Booking:
        level, judged = self._level(state, now)
        need = cost * self.W
        at = now if level >= need else judged + ceil_div(need - level, self.N)
        ok = at - now <= max_wait_us
        if ok and book:
            state = self.decide(state, at, cost, True)[1]
        return ok, at, state

    def fresh(self) -> list[Any]:
        return [0, self.C, 0]

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        # Computed on what is *missing* from the bucket (``cap - level``): it stays small
        # when the capacity is huge, so the big-integer work is one subtraction.
        W: int = self.W
        N: int = self.N
        cap = self.C
        level: int = entry[1]
        spent = cap - level
        last: int = entry[2]
        elapsed = now - last
        if elapsed > 0:
            spent -= elapsed * N
            spent = max(spent, 0)
        else:
            now = last  # the clock stepped back (or stood still): no time passed
        need = W if cost == 1 else cost * W
        if spent + need <= cap:  # level >= need
            allowed = True
            retry = 0
            if consume:
                spent += need
                entry[1] = cap - spent
                entry[2] = now
        else:
            allowed = False
            retry = -((cap - spent - need) // N)  # ceil((need - level) / N)
        reset = -((-spent) // N)  # ceil((cap - level) / N)
        if allowed and consume:
            entry[0] = now + reset
        # level // W == (B * W - spent) // W
        return (allowed, self.B + (-spent) // W, reset, retry)


class Gcra(Algorithm):
    """Generic cell rate algorithm: the token bucket's decisions from one timestamp.

    State ``(tat,)``: the theoretical arrival time scaled by ``N`` (``tat_us * N``), so
    the emission interval ``W / N`` µs is the integer ``W`` and the tolerance is ``C``.
    Decisions equal :class:`TokenBucket`'s with the same parameters, to the microsecond.
    """

    __slots__ = ()
    name = "gcra"
    uses_burst = True
    reservable = True
    FRESH = (0,)

    def expires_of(self, state: Any) -> int:
        return ceil_div(state[0], self.N)

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        nows = now * self.N
        tat = nows if state is None else max(state[0], nows)
        new_tat = tat + cost * self.W
        allowed = new_tat - nows <= self.C  # the debt after this request fits the tolerance
        retry = 0 if allowed else ceil_div(new_tat - nows - self.C, self.N)
        if allowed and consume:
            tat = new_tat
            state = (tat,)
        # a clock behind the state sees its skew as debt, possibly beyond the tolerance
        remaining = max(0, (self.C - (tat - nows)) // self.W)
        return (allowed, state, remaining, ceil_div(tat - nows, self.N), retry,
                now if state is None else self.expires_of(state))

    def reserve(self, state: Any, now: int, cost: int, max_wait_us: int,
                book: bool) -> Booking:
        tat = 0 if state is None else state[0]
        # admitted at t iff max(tat, t * N) + cost * W - t * N <= C
        at = max(now, ceil_div(tat + cost * self.W - self.C, self.N))
        ok = at - now <= max_wait_us
        if ok and book:
            state = self.decide(state, at, cost, True)[1]
        return ok, at, state

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        # Computed on the debt (``tat - now``, scaled): it stays small when ``now * N``
        # and the tolerance are huge.
        W: int = self.W
        N: int = self.N
        tol = self.C
        nows = now * N
        tat: int = entry[1]
        debt = tat - nows
        debt = max(debt, 0)
        new_debt = debt + (W if cost == 1 else cost * W)
        if new_debt <= tol:
            allowed = True
            retry = 0
            if consume:
                debt = new_debt
                entry[1] = nows + new_debt
        else:
            allowed = False
            retry = -((tol - new_debt) // N)
        reset = -((-debt) // N)
        if allowed and consume:
            entry[0] = now + reset
        remaining = self.B + (-debt) // W  # (tol - debt) // W
        if remaining < 0:  # a clock that stepped back sees the skew as debt beyond tol
            remaining = 0
        return (allowed, remaining, reset, retry)


class LeakyBucket(Algorithm):
    """Leaky bucket as a meter: capacity ``B``, drains at ``N / W`` per µs; admitted iff
    ``level + cost <= B``. As a queue (a shaper that delays instead of rejecting), it is
    the same bucket with :meth:`reserve`.

    State ``(level, last_us)``, the level in scaled units (one unit of cost = ``W``)."""

    __slots__ = ()
    name = "leaky_bucket"
    uses_burst = True
    reservable = True
    FRESH = (0, 0)

    def expires_of(self, state: Any) -> int:
        level, last = state
        return int(last) + ceil_div(level, self.N)

    def _level(self, state: Any, now: int) -> tuple[int, int]:
        """(level, the time it is judged at): a clock behind ``last_us`` counts as it."""
        if state is None:
            return 0, now
        level, last = state
        if now <= last:  # the clock stepped back (or stood still): no time passed
            return level, last
        return max(0, level - (now - last) * self.N), now

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        level, now = self._level(state, now)
        add = cost * self.W
        allowed = level + add <= self.C
        retry = 0 if allowed else ceil_div(level + add - self.C, self.N)
        if allowed and consume:
            level += add
            state = (level, now)
        return (allowed, state, (self.C - level) // self.W, ceil_div(level, self.N), retry,
                now if state is None else self.expires_of(state))

    def reserve(self, state: Any, now: int, cost: int, max_wait_us: int,
                book: bool) -> Booking:
        level, judged = self._level(state, now)
        add = cost * self.W
        at = now if level + add <= self.C else judged + ceil_div(level + add - self.C, self.N)
        ok = at - now <= max_wait_us
        if ok and book:
            state = self.decide(state, at, cost, True)[1]
        return ok, at, state

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        W: int = self.W
        N: int = self.N
        cap = self.C
        level: int = entry[1]
        last: int = entry[2]
        elapsed = now - last
        if elapsed > 0:
            level -= elapsed * N
            level = max(level, 0)
        else:
            now = last  # the clock stepped back (or stood still): no time passed
        add = W if cost == 1 else cost * W
        if level + add <= cap:
            allowed = True
            retry = 0
            if consume:
                level += add
                entry[1] = level
                entry[2] = now
        else:
            allowed = False
            retry = -((cap - add - level) // N)
        reset = -((-level) // N)
        if allowed and consume:
            entry[0] = now + reset
        # (cap - level) // W == (B * W - level) // W
        return (allowed, self.B + (-level) // W, reset, retry)
