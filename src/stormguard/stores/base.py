"""The storage contract every backend implements."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.algorithms.base import NOT_RESERVABLE

if TYPE_CHECKING:
    from stormguard._core.clock import Clock
    from stormguard.ratelimit.decision import Decision
    from stormguard.ratelimit.reservation import Reservation
    from stormguard.ratelimit.rule import Rule

__all__ = ["NO_LIMIT_US", "Store", "binding", "check_cost", "check_reservation", "check_rules",
           "key_error"]

#: ``max_wait=None`` (no limit) in microseconds: more than any wait a rule can produce.
NO_LIMIT_US = 2**62


def key_error(key: object) -> TypeError:
    return TypeError(f"key: must be a str, got {type(key).__name__} {key!r:.80}")


def check_cost(rule: Rule, cost: object) -> int:
    """Validate ``cost`` against ``rule`` (called only when ``cost != 1``)."""
    cost = validate.integer("cost", cost)
    if cost > rule.capacity:
        raise ConfigError("cost", cost,
                          f"exceeds the capacity {rule.capacity} of rule {rule}; "
                          "it could never be admitted")
    return cost


def check_reservation(rule: Rule, cost: object, max_wait: object,
                      book: object) -> tuple[int, int]:
    """Validate the arguments of ``reserve``: ``(cost, max_wait in microseconds)``."""
    if not rule._algo.reservable:
        raise ConfigError("algorithm", rule.algorithm, NOT_RESERVABLE)
    if type(cost) is not int or cost != 1:
        cost = check_cost(rule, cost)
    validate.boolean("book", book)
    if max_wait is None:
        return cost, NO_LIMIT_US
    seconds = validate.number("max_wait", max_wait, allow_zero=True)
    return cost, min(round(seconds * 1_000_000), NO_LIMIT_US)


def check_rules(rules: Sequence[Rule], cost: int) -> tuple[Rule, ...]:
    """Validate a ``hit_all`` rule list: non-empty, duplicates removed, cost fits all."""
    from stormguard.ratelimit.rule import Rule  # local: avoid an import cycle at module load

    if isinstance(rules, Rule):
        rules = (rules,)
    if not rules:
        raise ConfigError("rules", rules, "must name at least one rule")
    out: dict[str, Rule] = {}
    for r in rules:
        if not isinstance(r, Rule):
            raise ConfigError("rules", r, "every item must be a stormguard.Rule")
        out.setdefault(r.id, r)
    for r in out.values():
        if cost != 1 or type(cost) is not int:
            check_cost(r, cost)
    return tuple(out.values())


def binding(decisions: Sequence[Decision]) -> Decision:
    """The decision that speaks for a ``hit_all``: the denial with the longest wait, or,
    when all admit, the rule with the least left."""
    denied = [d for d in decisions if not d.allowed]
    if denied:
        return max(denied, key=lambda d: d.retry_after)
    return min(decisions, key=lambda d: d.remaining)


class Store(abc.ABC):
    """Where counters live. Implementations: ``memory://`` (:class:`MemoryStore`),
    ``redis://`` and ``redis+cluster://``.

    A backend failure is raised as :class:`stormguard.StorageError` and nothing else;
    the limiter's ``on_error`` decides what the request gets. The ``a*`` coroutines
    default to the blocking methods, which is right for stores that never block.
    """

    clock: Clock

    @abc.abstractmethod
    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision: ...

    @abc.abstractmethod
    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision: ...

    @abc.abstractmethod
    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision: ...

    @abc.abstractmethod
    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None: ...

    def reserve(self, key: str, rule: Rule, cost: int = 1, *, max_wait: float | None = None,
                book: bool = True) -> Reservation:
        """The earliest time ``cost`` can be admitted on ``rule`` for ``key``, booked (when
        ``book`` and within ``max_wait`` seconds; ``None``: any wait) so that later hits and
        reservations come after it. Bucket algorithms only (``token_bucket``, ``gcra``,
        ``leaky_bucket``): any other raises :class:`~stormguard.ConfigError`."""
        raise NotImplementedError(f"{type(self).__name__} has no reservations yet")

    def ping(self) -> bool:
        """True when the backend answers."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self.hit(key, rule, cost)

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self.peek(key, rule, cost)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return self.hit_all(key, rules, cost)

    async def areserve(self, key: str, rule: Rule, cost: int = 1, *,
                       max_wait: float | None = None, book: bool = True) -> Reservation:
        return self.reserve(key, rule, cost, max_wait=max_wait, book=book)

    async def areset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self.reset(key, rule)

    async def aping(self) -> bool:
        return self.ping()

    async def aclose(self) -> None:
        self.close()

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} cannot count its keys cheaply")

    def __bool__(self) -> bool:
        # a store is always truthy: without this, an empty MemoryStore is falsy (len 0)
        # and ``store or MemoryStore()`` silently replaces it; a Redis store raises
        return True
