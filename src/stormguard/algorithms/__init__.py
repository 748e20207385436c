"""Pure rate-limiting arithmetic: ``state + now -> new state + verdict``.

No I/O, no locks, no clock reads. Every quantity is an integer so that the
Python code here and the Lua scripts of the Redis store (which run on IEEE
doubles, exact for integers below 2**53) reach *identical* decisions:

* time is in integer microseconds (``now`` is epoch microseconds);
* ``W`` is the window in microseconds, ``N`` the limit, ``B`` the capacity
  (burst; the limit for window algorithms), ``c`` the cost;
* the bucket algorithms measure their level in *scaled tokens*: one token is
  ``W`` units and the refill (or drain) rate is exactly ``N`` units per
  microsecond, so no division is ever needed except the final
  ``ceil(x / N)`` that turns a level difference into microseconds.

Every algorithm object has one method::

    decide(state, now, cost, consume) ->
        (allowed, new_state, remaining, reset_after_us, retry_after_us, expires_at_us)

``state`` is ``None`` for a key never seen (or forgotten). ``new_state`` is
what the store must keep when ``allowed and consume``; otherwise the store
writes nothing (a denied request never consumes). ``remaining`` is what could
still be admitted at ``now`` after this request; ``reset_after_us`` the time
until the quota is fully restored; ``retry_after_us`` (0 when allowed) the
exact wait after which the same request is admitted if nothing else arrives;
``expires_at_us`` the time after which the state is indistinguishable from a
fresh key (what a store uses as TTL).

State layouts (the Lua scripts store the same numbers):

=========================  ===========================================
fixed_window               ``(window_index, used)``
sliding_window_counter     ``(window_index, current, previous)``
sliding_window_log         ``tuple`` of admission times (one per unit of cost)
token_bucket               ``(level, last_us)``; level in scaled tokens
gcra                       ``tat`` scaled by ``N`` (``tat_us * N``): one integer
leaky_bucket               ``(level, last_us)``; level in scaled units
=========================  ===========================================
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Final

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "FixedWindow",
    "Gcra",
    "LeakyBucket",
    "SlidingWindowCounter",
    "SlidingWindowLog",
    "TokenBucket",
    "Verdict",
]

# (allowed, new_state, remaining, reset_after_us, retry_after_us, expires_at_us)
Verdict = tuple[bool, Any, int, int, int, int]


class Algorithm:
    """Base: one instance per rule, holding the rule's integer constants."""

    __slots__ = ("B", "N", "W")
    name: str = ""
    #: True when ``burst`` means something for this algorithm.
    uses_burst: bool = False

    def __init__(self, limit: int, window_us: int, burst: int) -> None:
        self.N = limit
        self.W = window_us
        self.B = burst if self.uses_burst else limit

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self.N}, window_us={self.W}, capacity={self.B})"


class FixedWindow(Algorithm):
    """Epoch-aligned windows ``[k*W, (k+1)*W)``; at most ``N`` per window."""

    __slots__ = ()
    name = "fixed_window"

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        w = now // W
        used = 0
        if state is not None and state[0] >= w:
            if state[0] > w:  # the clock stepped back: stay in the newer window
                w = state[0]
                now = w * W
            used = state[1]
        end = (w + 1) * W
        if used + cost <= N:
            if consume:
                used += cost
                state = (w, used)
            return (True, state, N - used, end - now if used else 0, 0, end)
        return (False, state, N - used, end - now, end - now, end)


class SlidingWindowCounter(Algorithm):
    """Cloudflare's estimate: ``prev * (W - elapsed) / W + cur``, epoch-aligned windows.

    Admitted iff ``prev * (W - elapsed) + (cur + cost) * W <= N * W`` (exact integers).
    """

    __slots__ = ()
    name = "sliding_window_counter"

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        w = now // W
        start = w * W
        if state is None:
            cur = prev = 0
        else:
            sw = state[0]
            if sw >= w:
                if sw > w:  # the clock stepped back: stay in the newer window
                    w = sw
                    start = now = w * W
                cur = state[1]
                prev = state[2]
            elif sw == w - 1:
                cur = 0
                prev = state[1]
            else:
                cur = prev = 0
        elapsed = now - start
        weight = W - elapsed
        prev_part = prev * weight
        if prev_part + (cur + cost) * W <= N * W:
            allowed = True
            retry = 0
            if consume:
                cur += cost
                state = (w, cur, prev)
        else:
            allowed = False
            free = N - cur - cost
            if free >= 0:
                # still inside this window: wait until prev's weight has decayed enough
                retry = (W - (free * W) // prev) - elapsed
            else:
                # next window: cur becomes prev
                w2 = min(W, ((N - cost) * W) // cur)
                retry = start + W + (W - w2) - now
        remaining = (N * W - prev_part) // W - cur
        remaining = max(remaining, 0)
        if cur:
            reset = start + 2 * W - now
        elif prev:
            reset = start + W - now
        else:
            reset = 0
        return (allowed, state, remaining, reset, retry, start + 2 * W)


class SlidingWindowLog(Algorithm):
    """Exact: a request at ``t`` counts during ``[t, t + W)``; never more than ``N`` in any
    half-open interval of length ``W``. Memory is O(limit) per key."""

    __slots__ = ()
    name = "sliding_window_log"

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        log: tuple[int, ...] = state if state is not None else ()
        if log and now < log[-1]:
            now = log[-1]  # a clock that stepped back: never reorder the log
        i = bisect_right(log, now - W)
        live = len(log) - i
        if live + cost <= N:
            if consume:
                log = log[i:] + (now,) * cost
                state = log
                i = 0
                live = len(log)
            reset = log[-1] + W - now if live else 0
            return (True, state, N - live, reset, 0, (log[-1] + W) if live else now)
        k = live + cost - N  # how many of the oldest live entries must expire
        retry = log[i + k - 1] + W - now
        return (False, state, N - live, log[-1] + W - now, retry, log[-1] + W)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class TokenBucket(Algorithm):
    """Capacity ``B`` tokens, refilled continuously at ``N / W`` tokens per second."""

    __slots__ = ()
    name = "token_bucket"
    uses_burst = True

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        cap = self.B * W
        if state is None:
            level = cap
        else:
            level = state[0]
            elapsed = now - state[1]
            if elapsed > 0:
                level += elapsed * N
                level = min(level, cap)
            else:
                now = state[1]  # the clock stepped back: as if no time passed
        need = cost * W
        if level >= need:
            allowed = True
            retry = 0
            if consume:
                level -= need
                state = (level, now)
        else:
            allowed = False
            retry = _ceil_div(need - level, N)
        reset = _ceil_div(cap - level, N)
        return (allowed, state, level // W, reset, retry, now + reset)


class Gcra(Algorithm):
    """Generic cell rate algorithm: the token bucket's decisions from one timestamp.

    State is the theoretical arrival time scaled by ``N`` (``tat_us * N``), so the
    emission interval ``W / N`` becomes the integer ``W``. Decisions equal
    :class:`TokenBucket`'s with the same parameters, to the microsecond.
    """

    __slots__ = ()
    name = "gcra"
    uses_burst = True

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        tol = self.B * W
        nows = now * N
        base = state if state is not None and state > nows else nows
        new_tat = base + cost * W
        if new_tat - nows <= tol:
            allowed = True
            retry = 0
            if consume:
                base = new_tat
                state = new_tat
        else:
            allowed = False
            retry = _ceil_div(new_tat - nows - tol, N)
        debt = base - nows
        reset = _ceil_div(debt, N)
        return (allowed, state, (tol - debt) // W, reset, retry, now + reset)


class LeakyBucket(Algorithm):
    """Leaky bucket as a meter: capacity ``B``, drains at ``N / W`` per second;
    admitted iff ``level + cost <= B``. (The queueing *shaper* form, which delays
    instead of rejecting, is for outbound calls.)"""

    __slots__ = ()
    name = "leaky_bucket"
    uses_burst = True

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        W = self.W
        N = self.N
        cap = self.B * W
        if state is None:
            level = 0
        else:
            level = state[0]
            elapsed = now - state[1]
            if elapsed > 0:
                level -= elapsed * N
                level = max(level, 0)
            else:
                now = state[1]  # the clock stepped back: as if no time passed
        add = cost * W
        if level + add <= cap:
            allowed = True
            retry = 0
            if consume:
                level += add
                state = (level, now)
        else:
            allowed = False
            retry = _ceil_div(level + add - cap, N)
        reset = _ceil_div(level, N)
        return (allowed, state, (cap - level) // W, reset, retry, now + reset)


ALGORITHMS: Final[dict[str, type[Algorithm]]] = {
    cls.name: cls
    for cls in (FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, Gcra, LeakyBucket)
}
