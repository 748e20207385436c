"""Pure rate-limiting arithmetic: ``state + now -> new state + verdict``.

No I/O, no locks, no clock reads, and nothing of rules, decisions or HTTP: an algorithm
takes integers and answers integers (and a bool). Every quantity is an integer so that
the Python code here and the Lua scripts of the Redis store (which run on IEEE doubles,
exact for integers below 2**53) reach *identical* decisions:

* time is in integer microseconds (``now`` is epoch microseconds, never negative);
* ``W`` is the window in microseconds, ``N`` the limit, ``B`` the capacity (burst; the
  limit for window algorithms), ``c`` the cost;
* the bucket algorithms measure their level in *scaled tokens*: one token is ``W`` units
  and the refill (or drain) rate is exactly ``N`` units per microsecond, so no division
  is ever needed except the final ``ceil(x / N)`` that turns a level difference into
  microseconds.

Every algorithm has two forms of the same arithmetic, held to agree by property tests:

``decide(state, now, cost, consume) -> (allowed, new_state, remaining, reset_after_us,
retry_after_us, expires_at_us)``
    the **reference form**: a plain pure function on immutable state (``None`` for a key
    never seen or forgotten). ``new_state`` is what a store keeps when ``allowed and
    consume``; otherwise it is ``state`` itself (a denied request never consumes).
    ``remaining`` is what could still be admitted at ``now`` after this request;
    ``reset_after_us`` the time until the quota is fully restored; ``retry_after_us``
    (0 when allowed) the exact wait after which the same request is admitted if nothing
    else arrives; ``expires_at_us`` when the kept state stops mattering (from then on it
    decides like a key never seen: what a store uses as TTL).

``apply(entry, now, cost, consume) -> (allowed, remaining, reset_after_us, retry_after_us)``
    the **hot path** of the embedded store (compiled with mypyc): the same decision on a
    mutable entry ``[expires_at_us, *state]``, updated in place, no copies. The store
    turns the verdict into a :class:`~stormguard.Decision`.

``reserve(state, now, cost, max_wait_us, book) -> (ok, at_us, new_state)``
    a **reservation** (bucket algorithms only; see :mod:`.buckets`): the earliest
    ``at_us >= now`` at which ``cost`` is admitted, booked when ``book`` and
    ``at_us - now <= max_wait_us``.

State layouts (the Lua scripts store the same numbers):

=========================  ===========================================
fixed_window               ``(window_index, used)``
sliding_window_counter     ``(window_index, current, previous)``
sliding_window_log         ``tuple`` of admission times (one per unit of cost)
token_bucket               ``(level, last_us)``; level in scaled tokens
gcra                       ``(tat,)``: the TAT scaled by ``N`` (``tat_us * N``), one integer
leaky_bucket               ``(level, last_us)``; level in scaled units
=========================  ===========================================

Modules: :mod:`.base` (the contract), :mod:`.windows` (fixed window, sliding window
counter), :mod:`.log` (sliding window log), :mod:`.buckets` (token bucket, GCRA, leaky
bucket, reservations).
"""

from __future__ import annotations

from typing import Final

from stormguard.ratelimit.algorithms.base import Algorithm, Booking, Transition, Verdict
from stormguard.ratelimit.algorithms.buckets import Gcra, LeakyBucket, TokenBucket
from stormguard.ratelimit.algorithms.log import SlidingWindowLog
from stormguard.ratelimit.algorithms.windows import FixedWindow, SlidingWindowCounter

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Booking",
    "FixedWindow",
    "Gcra",
    "LeakyBucket",
    "SlidingWindowCounter",
    "SlidingWindowLog",
    "TokenBucket",
    "Transition",
    "Verdict",
]

#: The algorithms by name.
ALGORITHMS: Final[dict[str, type[Algorithm]]] = {
    cls.name: cls
    for cls in (FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, Gcra, LeakyBucket)
}
