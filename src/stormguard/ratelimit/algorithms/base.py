"""The contract every algorithm implements (see the package docstring)."""

from __future__ import annotations

from typing import Any, ClassVar

from stormguard._core.errors import ConfigError

__all__ = ["NOT_RESERVABLE", "Algorithm", "Booking", "Transition", "Verdict", "ceil_div"]

NOT_RESERVABLE = ("has no reservation (defined for token_bucket, gcra and leaky_bucket: a "
                  "window algorithm cannot book a future slot without letting requests of "
                  "the current window count in a later one)")

#: What the hot path (:meth:`Algorithm.apply`) answers:
#: ``(allowed, remaining, reset_after_us, retry_after_us)``.
Verdict = tuple[bool, int, int, int]
#: What the reference form (:meth:`Algorithm.decide`) answers:
#: ``(allowed, new_state, remaining, reset_after_us, retry_after_us, expires_at_us)``.
Transition = tuple[bool, Any, int, int, int, int]
#: What a reservation (:meth:`Algorithm.reserve`) answers: ``(ok, at_us, new_state)``.
Booking = tuple[bool, int, Any]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0``."""
    return -((-a) // b)


class Algorithm:
    """Base: one instance per rule, holding the rule's integer constants.

    ``N`` is the limit, ``W`` the window in microseconds, ``B`` the capacity (the burst of
    the bucket algorithms, else the limit) and ``C = B * W`` the capacity in scaled units,
    computed once (with large limits it is a big integer, costly to rebuild per check).
    """

    __slots__ = ("B", "C", "N", "W")
    name: ClassVar[str] = ""
    #: True when ``burst`` means something for this algorithm.
    uses_burst: ClassVar[bool] = False
    #: True when :meth:`reserve` is defined for this algorithm.
    reservable: ClassVar[bool] = False
    #: the entry state of a key never seen (the hot path's stand-in for ``None``)
    FRESH: ClassVar[tuple[int, ...]] = ()

    def __init__(self, limit: int, window_us: int, burst: int) -> None:
        self.N = limit
        self.W = window_us
        self.B = burst if self.uses_burst else limit
        self.C = self.B * window_us

    def __reduce__(self) -> tuple[Any, ...]:
        # explicit, so that pickle and copy work on the compiled (mypyc) classes too
        return (type(self), (self.N, self.W, self.B))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self.N}, window_us={self.W}, capacity={self.B})"

    @property
    def magnitude(self) -> int:
        """The largest integer this algorithm's arithmetic holds relative to ``now``: what an
        implementation on IEEE doubles (the Redis scripts) must keep below 2**53."""
        return self.C + self.N

    # -- the reference form: pure, on immutable state ------------------------------------
    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        """Decide one request at ``now`` on ``state`` (``None`` for a key never seen), which
        is never modified. ``new_state`` is ``state`` itself unless the request was
        admitted and ``consume`` is true."""
        raise NotImplementedError

    def expires_of(self, state: Any) -> int:
        """When ``state`` stops mattering: from then on it decides like a key never seen."""
        raise NotImplementedError

    def reserve(self, state: Any, now: int, cost: int, max_wait_us: int,
                book: bool) -> Booking:
        """The earliest time ``at_us >= now`` at which ``cost`` is admitted; ``ok`` is false
        (and nothing booked) when ``at_us - now > max_wait_us``. With ``book``,
        ``new_state`` is the state after admitting ``cost`` at ``at_us``."""
        raise ConfigError("algorithm", self.name, NOT_RESERVABLE)

    # -- the hot path: the same arithmetic on a mutable entry -----------------------------
    def fresh(self) -> list[Any]:
        """A new entry ``[expires_at_us, *state]`` for a key never seen."""
        return [0, *self.FRESH]

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        """Decide on the entry ``[expires_at_us, *state]``: updated in place when ``consume``
        and the request is admitted, untouched otherwise."""
        raise NotImplementedError

    def state_of(self, entry: list[Any]) -> Any:
        """The reference form's state held by a (non-fresh) entry."""
        return tuple(entry[1:])

    def entry_of(self, state: Any) -> list[Any]:
        """The entry holding a reference-form state."""
        return [self.expires_of(state), *state]
