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

:meth:`Algorithm.decide` is the pure reference form above. The embedded store
uses :meth:`Algorithm.apply`, the same arithmetic (``decide`` is built on it)
on a mutable entry ``[expires_at_us, *state]``, returning the
:class:`~stormguard.Decision` directly: no copies on the hot path.

State layouts (the Lua scripts store the same numbers):

=========================  ===========================================
fixed_window               ``(window_index, used)``
sliding_window_counter     ``(window_index, current, previous)``
sliding_window_log         ``tuple`` of admission times (one per unit of cost)
token_bucket               ``(level, last_us)``; level in scaled tokens
gcra                       ``(tat,)``: the TAT scaled by ``N`` (``tat_us * N``), one integer
leaky_bucket               ``(level, last_us)``; level in scaled units
=========================  ===========================================
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, ClassVar, Final

from stormguard.ratelimit.decision import Decision

if TYPE_CHECKING:
    from stormguard.ratelimit.rule import Rule

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

_new = tuple.__new__


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class Algorithm:
    """Base: one instance per rule, holding the rule's integer constants.

    Subclasses implement :meth:`apply`, the single copy of each algorithm's
    arithmetic, on a mutable *entry* ``[expires_at_us, *state]``: with
    ``consume`` and an admitted request it updates the entry in place,
    otherwise it leaves it untouched. :meth:`decide` is the pure form on
    immutable state tuples, built on :meth:`apply` over a copy.
    """

    __slots__ = ("B", "C", "N", "W", "rule")
    name: ClassVar[str] = ""
    #: True when ``burst`` means something for this algorithm.
    uses_burst: ClassVar[bool] = False
    #: the entry of a key never seen
    FRESH: ClassVar[tuple[int, ...]] = ()

    def __init__(self, limit: int, window_us: int, burst: int, rule: Rule | None = None) -> None:
        self.N = limit
        self.W = window_us
        self.B = burst if self.uses_burst else limit
        #: the capacity in scaled units (``B * W``), computed once: with large limits it
        #: is a big integer, costly to rebuild on every check
        self.C = self.B * window_us
        self.rule = rule

    def fresh(self) -> list[Any]:
        """A new entry for a key never seen."""
        return [0, *self.FRESH]

    def __reduce__(self) -> tuple[Any, ...]:
        # explicit, so that pickle and copy work on the compiled (mypyc) classes too
        return (type(self), (self.N, self.W, self.B, self.rule))

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
        raise NotImplementedError

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        """Pure: ``state`` (None for a new key) is never modified."""
        entry = self.fresh() if state is None else [0, *state]
        d = self.apply(entry, now, cost, consume)
        new_state = tuple(entry[1:]) if d[0] and consume else state
        return (d[0], new_state, d[2], round(d[3] * 1e6), round(d[4] * 1e6),
                entry[0] if d[0] and consume else self.expires(entry, now))

    def expires(self, entry: list[Any], now: int) -> int:
        """When an untouched entry stops mattering (used by the pure form only)."""
        return int(entry[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self.N}, window_us={self.W}, capacity={self.B})"


class FixedWindow(Algorithm):
    """Epoch-aligned windows ``[k*W, (k+1)*W)``; at most ``N`` per window.

    Entry: ``[expires, window_index, used]``."""

    __slots__ = ()
    name = "fixed_window"
    FRESH = (-1, 0)

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
        W: int = self.W
        N: int = self.N
        w = now // W
        used: int = 0
        sw: int = entry[1]
        if sw >= w:
            if sw > w:  # the clock stepped back: stay in the newer window
                w = sw
                now = w * W
            used = entry[2]
        # no multiplication: compiled, a product above 2**31 (any window over 35 min in µs)
        # leaves the machine-integer fast path
        end = now - now % W + W
        if used + cost <= N:
            if consume:
                used += cost
                entry[0] = end
                entry[1] = w
                entry[2] = used
            return _new(Decision, (True, N, N - used, (end - now) / 1e6 if used else 0.0, 0.0,
                                   self.rule, False))
        wait = (end - now) / 1e6
        return _new(Decision, (False, N, N - used, wait, wait, self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        return (now // self.W + 1) * self.W


class SlidingWindowCounter(Algorithm):
    """Cloudflare's estimate ``prev * (W - elapsed) / W + cur`` over epoch-aligned windows.

    Admitted iff ``prev * (W - elapsed) + (cur + cost) * W <= N * W`` (exact integers).
    Entry: ``[expires, window_index, current, previous]``."""

    __slots__ = ()
    name = "sliding_window_counter"
    FRESH = (-2, 0, 0)

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
        W: int = self.W
        N: int = self.N
        w = now // W
        start = now - now % W
        sw: int = entry[1]
        if sw >= w:
            if sw > w:  # the clock stepped back: stay in the newer window
                w = sw
                start = now = w * W
            cur: int = entry[2]
            prev: int = entry[3]
        elif sw == w - 1:
            cur = 0
            prev = entry[2]
        else:
            cur = prev = 0
        elapsed = now - start
        prev_part = prev * (W - elapsed)
        if prev_part + (cur + cost) * W <= self.C:
            allowed = True
            retry = 0
            if consume:
                cur += cost
                entry[0] = start + W + W
                entry[1] = w
                entry[2] = cur
                entry[3] = prev
        else:
            allowed = False
            free = N - cur - cost
            if free >= 0:
                # still inside this window: wait until prev's weight has decayed enough
                retry = (W - (free * W) // prev) - elapsed
            else:
                # next window: cur becomes prev
                w2 = ((N - cost) * W) // cur
                w2 = min(w2, W)
                retry = start + W + (W - w2) - now
        remaining = N + (-prev_part) // W - cur  # (N * W - prev_part) // W - cur
        remaining = max(remaining, 0)
        if cur:
            reset = start + W + W - now
        elif prev:
            reset = start + W - now
        else:
            reset = 0
        return _new(Decision, (allowed, N, remaining, reset / 1e6, retry / 1e6, self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        return (now // self.W + 2) * self.W


class SlidingWindowLog(Algorithm):
    """Exact: a request at ``t`` counts during ``[t, t + W)``; never more than ``N`` in any
    half-open interval of length ``W``. Memory is O(limit) per key.

    Entry: ``[expires, log, head]`` where ``log`` is a sorted list with one admission
    time per unit of cost and ``log[:head]`` have expired. Expired entries are cut off
    in bulk once they are at least half of the list, so an admission costs O(1)
    amortised however many entries are live (the pure form's state is a tuple of the
    live entries)."""

    __slots__ = ()
    name = "sliding_window_log"

    def fresh(self) -> list[Any]:
        return [0, [], 0]

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Verdict:
        allowed, new_state, remaining, reset, retry, exp = super().decide(
            None if state is None else (list(state), 0), now, cost, consume)
        new_state = tuple(new_state[0][new_state[1]:]) if allowed and consume else state
        return (allowed, new_state, remaining, reset, retry, exp)

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
        W: int = self.W
        N: int = self.N
        log: list[int] = entry[1]
        i: int = entry[2]
        size = len(log)
        if size and now < log[-1]:
            now = log[-1]  # a clock that stepped back: never reorder the log
        cut = now - W
        if size > i and log[i] <= cut:
            i = bisect_right(log, cut, i)
        live = size - i
        if live + cost <= N:
            if consume:
                if i and i * 2 >= size:
                    del log[:i]  # amortised: at least as many entries cut as remain
                    i = 0
                entry[2] = i
                if cost == 1:
                    log.append(now)
                else:
                    log.extend([now] * cost)
                live += cost
                entry[0] = now + W
            reset = (log[-1] + W - now) / 1e6 if live else 0.0
            return _new(Decision, (True, N, N - live, reset, 0.0, self.rule, False))
        k = live + cost - N  # how many of the oldest live entries must expire
        retry = log[i + k - 1] + W - now
        return _new(Decision, (False, N, N - live, (log[-1] + W - now) / 1e6, retry / 1e6,
                               self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        log = entry[1]
        return log[-1] + self.W if log else now


class TokenBucket(Algorithm):
    """Capacity ``B`` tokens, refilled continuously at ``N / W`` tokens per second.

    Entry: ``[expires, level, last_us]``; the level is in scaled tokens (1 token = ``W``)."""

    __slots__ = ()
    name = "token_bucket"
    uses_burst = True

    def fresh(self) -> list[Any]:
        return [0, self.C, 0]

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
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
        return _new(Decision, (allowed, self.B, self.B + (-spent) // W, reset / 1e6,
                               retry / 1e6, self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        level = min(self.C, entry[1] + max(0, now - entry[2]) * self.N)
        return now + _ceil_div(self.C - level, self.N)


class Gcra(Algorithm):
    """Generic cell rate algorithm: the token bucket's decisions from one timestamp.

    Entry: ``[expires, tat]`` with the theoretical arrival time scaled by ``N``
    (``tat_us * N``), so the emission interval ``W / N`` is the integer ``W``.
    Decisions equal :class:`TokenBucket`'s with the same parameters, to the microsecond.
    """

    __slots__ = ()
    name = "gcra"
    uses_burst = True
    FRESH = (0,)

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
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
        return _new(Decision, (allowed, self.B, remaining, reset / 1e6, retry / 1e6,
                               self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        return now + _ceil_div(max(0, entry[1] - now * self.N), self.N)


class LeakyBucket(Algorithm):
    """Leaky bucket as a meter: capacity ``B``, drains at ``N / W`` per second;
    admitted iff ``level + cost <= B``. (The queueing *shaper* form, which delays
    instead of rejecting, is for outbound calls.)

    Entry: ``[expires, level, last_us]``; the level is in scaled units (1 unit of cost = ``W``)."""

    __slots__ = ()
    name = "leaky_bucket"
    uses_burst = True
    FRESH = (0, 0)

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Decision:
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
        return _new(Decision, (allowed, self.B, self.B + (-level) // W, reset / 1e6,
                               retry / 1e6, self.rule, False))

    def expires(self, entry: list[Any], now: int) -> int:
        level = max(0, entry[1] - max(0, now - entry[2]) * self.N)
        return now + _ceil_div(level, self.N)


ALGORITHMS: Final[dict[str, type[Algorithm]]] = {
    cls.name: cls
    for cls in (FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, Gcra, LeakyBucket)
}
