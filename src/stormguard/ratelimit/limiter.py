"""`RateLimiter` and `AsyncRateLimiter`: the front door of inbound rate limiting."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, ParamSpec, TypeVar

from stormguard._core import validate
from stormguard._core.errors import ConfigError, StorageError
from stormguard.observability import metrics as _metrics
from stormguard.observability.topk import SpaceSaving
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.decorate import KeyFunc, LimitArg, async_decorator, sync_decorator
from stormguard.ratelimit.rule import Rule
from stormguard.stores import from_url
from stormguard.stores.base import Store, check_rules
from stormguard.stores.memory import MemoryStore

__all__ = ["AsyncRateLimiter", "OnError", "RateLimiter"]

P = ParamSpec("P")
T = TypeVar("T")
OnError = Literal["allow", "deny", "local"]
_ON_ERROR = ("allow", "deny", "local")


def _capacity(rule: Rule) -> int:
    return rule.capacity


_RuleCounters = tuple["itertools.count[int]", "itertools.count[int]", "itertools.count[int]",
                      "itertools.count[int]"]


def _count_value(counter: itertools.count[int]) -> int:
    # an itertools.count's next value, read without advancing it: its repr is "count(N)"
    return int(repr(counter)[6:-1])


class _Base:
    def __init__(self, store: Store | str = "memory://", *, on_error: OnError = "allow",
                 local_share: float = 1.0, deny_retry_after: float = 1.0,
                 on_degraded: Callable[[Rule, StorageError], None] | None = None,
                 name: str = "limiter", top_keys: int | None = None,
                 **store_options: Any) -> None:
        if isinstance(store, str):
            store = from_url(store, **store_options)
        elif store_options:
            raise ConfigError("store_options", sorted(store_options),
                              "only apply when the store is given as a URL")
        if not isinstance(store, Store):
            raise ConfigError("store", store, "must be a stormguard Store or a store URL")
        validate.one_of("on_error", on_error, _ON_ERROR)
        self.store = store
        self.on_error: OnError = on_error
        self.local_share = validate.number("local_share", local_share, maximum=1.0)
        self.deny_retry_after = validate.number("deny_retry_after", deny_retry_after,
                                                allow_zero=True)
        self.on_degraded = on_degraded
        self.degraded_count = 0
        """How many decisions were answered by ``on_error`` instead of the store."""
        self._count_lock = threading.Lock()
        # created up front: two threads failing over at once must share one local store
        self._local: MemoryStore | None = (
            MemoryStore(clock=store.clock) if on_error == "local" else None)
        self._local_rules: dict[str, Rule] = {}
        self.name = validate.text("name", name)
        """The limiter's name in metrics (``stormguard_limiter_decisions{name=...}``)."""
        self.top: SpaceSaving | None = (
            None if top_keys is None
            else SpaceSaving(validate.integer("top_keys", top_keys, maximum=1_000_000)))
        """With ``top_keys=K``: the K most-denied keys (a bounded space-saving sketch)."""
        # rule name -> counters of (allowed, denied, degraded, of the denied: shadow)
        self._decisions: dict[str, _RuleCounters] = {}
        self._counting = False
        self._instrumented = False
        _metrics.track(self, "limiter")
        if self.top is not None:
            self._instrument()

    # -- metrics and top keys (only when enabled: the plain path has no extra frame) --------
    @property
    def store_name(self) -> str:
        """The store's name in metrics."""
        return str(getattr(self.store, "name", type(self.store).__name__))

    @property
    def store_errors(self) -> int:
        """Store failures answered by ``on_error`` (the same as ``degraded_count``)."""
        return self.degraded_count

    def decision_counts(self) -> dict[tuple[str, str], int]:
        """``{(rule name, result): decisions}`` counted since metrics were enabled; result
        is "allowed", "denied", "shadow_denied" (a shadow rule of a rule set denied) or
        "degraded" (answered by ``on_error``)."""
        with self._count_lock:
            rows = list(self._decisions.items())
        out: dict[tuple[str, str], int] = {}
        for name, (allowed, denied, degraded, shadow) in rows:
            n_shadow = _count_value(shadow)
            for result, n in (("allowed", _count_value(allowed)),
                              ("denied", _count_value(denied) - n_shadow),
                              ("shadow_denied", n_shadow),
                              ("degraded", _count_value(degraded))):
                if n:
                    out[(name, result)] = n
        return out

    def _enable_metrics(self) -> None:
        self._counting = True
        self._instrument()

    def _counters(self, name: str) -> _RuleCounters:
        with self._count_lock:
            c = self._decisions.get(name)
            if c is None:
                if len(self._decisions) >= _metrics.MAX_SERIES:
                    name = "(other)"  # a runaway number of rule names: one series for the rest
                    c = self._decisions.get(name)
                if c is None:
                    c = self._decisions[name] = (itertools.count(), itertools.count(),
                                                 itertools.count(), itertools.count())
            return c

    def _record(self, key: str, d: Decision) -> None:
        # per check once enabled: one dict lookup and one next() on an itertools.count
        # (a single atomic C call under the GIL: no lock, nothing lost between threads)
        rule = d.rule
        name = (rule.name if rule is not None else None) or "(unnamed)"
        if self._counting:
            c = self._decisions.get(name)
            if c is None:
                c = self._counters(name)
            next(c[2] if d.degraded else c[0] if d.allowed else c[1])
        if self.top is not None and not d.allowed:
            self.top.add(key, name)

    def _note_shadow(self, names: Sequence[str]) -> None:
        """A rule-set check (none of whose decisions was degraded) found these shadow rules
        denying: their "denied" decisions are reported as "shadow_denied"."""
        if not self._counting:
            return
        for name in names:
            c = self._decisions.get(name)
            if c is not None:
                next(c[3])

    def _instrument(self) -> None:
        raise NotImplementedError

    # -- degraded answers -------------------------------------------------------------
    def _local_rule(self, rule: Rule) -> Rule:
        r = self._local_rules.get(rule.id)
        if r is None:
            limit = max(1, int(rule.limit * self.local_share))
            r = rule if limit == rule.limit else rule.with_limit(limit)
            self._local_rules[rule.id] = r
        return r

    def _degraded(self, key: str, rules: Sequence[Rule], cost: int, exc: StorageError,
                  consume: bool = True) -> Decision:
        with self._count_lock:
            self.degraded_count += 1
        # the rule a healthy store names for a fresh key: the least capacity (the first of
        # equals), so that a degraded answer names the same rule and limit as a healthy one
        rule = rules[0] if len(rules) == 1 else min(rules, key=_capacity)
        if self.on_degraded is not None:
            self.on_degraded(rule, exc)
        if self.on_error == "local":
            if self._local is None:
                self._local = MemoryStore(clock=self.store.clock)
            local = [self._local_rule(r) for r in rules]
            cost = min(cost, *(r.capacity for r in local))
            if consume:
                d = self._local.hit_all(key, local, cost)
            else:
                d = self._local.peek(key, local[0], cost)
            original = next((r for r in rules if self._local_rule(r) is d.rule), rule)
            return d.replace(rule=original, degraded=True)
        cap = rule.capacity
        if self.on_error == "deny":
            return Decision(False, cap, 0, self.deny_retry_after, self.deny_retry_after,
                            rule, True)
        return Decision(True, cap, cap, 0.0, 0.0, rule, True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r}, on_error={self.on_error!r})"


class RateLimiter(_Base):
    """Blocking rate limiter over any store.

    >>> from stormguard import RateLimiter, Rule
    >>> limiter = RateLimiter("memory://")
    >>> limiter.hit("user:42", Rule.parse("100/minute")).allowed
    True

    ``on_error`` decides what a check gets when the store fails: ``"allow"`` (default,
    fail-open), ``"deny"`` (fail-closed) or ``"local"`` (an in-process limiter enforcing
    ``local_share`` of each rule's limit). Such decisions have ``degraded=True`` and name
    the rule a healthy store would name for a fresh key (for ``hit_all``, the rule of least
    capacity), with its limit (``"local"``: the local share of it).
    """

    def __init__(self, store: Store | str = "memory://", **options: Any) -> None:
        super().__init__(store, **options)
        if type(self.store) is MemoryStore:
            # The embedded store never raises StorageError: skip one frame per check.
            self.hit = self.store.hit  # type: ignore[method-assign]
            self.peek = self.store.peek  # type: ignore[method-assign]
        if self.top is not None or self._counting:  # asked for before hit was bound
            self._instrument()

    def _instrument(self) -> None:
        with self._count_lock:
            if self._instrumented or ("hit" not in vars(self)
                                      and type(self.store) is MemoryStore):
                # RateLimiter.__init__ has not bound the store's methods yet
                return
            self._instrumented = True
            raw_hit, raw_all, record = self.hit, self.hit_all, self._record

            def hit(key: str, rule: Rule, cost: int = 1) -> Decision:
                d = raw_hit(key, rule, cost)
                record(key, d)
                return d

            def hit_all(key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
                d = raw_all(key, rules, cost)
                record(key, d)
                return d

            self.hit = hit  # type: ignore[method-assign]
            self.hit_all = hit_all  # type: ignore[method-assign]

    def limit(self, limit: LimitArg, *, key: KeyFunc | str | None = None, cost: int = 1
              ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorate a blocking function: each call spends ``cost`` on ``limit``
        (``"10/minute"``, ``"10/minute;100/hour"``, a Rule or rules) for the key
        ``key(*args, **kwargs)`` (a string: one counter; default: the function's name),
        and raises :class:`~stormguard.RateLimited` without calling it when denied.

        >>> limiter = RateLimiter("memory://")
        >>> @limiter.limit("2/minute", key=lambda user: f"user:{user}")
        ... def search(user: str) -> str:
        ...     return "results"
        >>> search("42"), search("42")
        ('results', 'results')
        """
        return sync_decorator(self, limit, key, cost)

    # The on_error control flow, once: asyncio source (AsyncRateLimiter below), blocking twin
    # generated by tools/unasync.py.
    # unasync: generated limiter (python tools/unasync.py; do not edit)
    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        """Check and consume ``cost`` if admitted."""
        try:
            return self.store.hit(key, rule, cost)
        except StorageError as exc:
            return self._degraded(key, (rule,), cost, exc)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        """The decision ``hit`` would give, consuming nothing."""
        try:
            return self.store.peek(key, rule, cost)
        except StorageError as exc:
            return self._degraded(key, (rule,), cost, exc, consume=False)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        """All-or-nothing over several rules; returns the binding rule's decision."""
        try:
            return self.store.hit_all(key, rules, cost)
        except StorageError as exc:
            return self._degraded(key, check_rules(rules, cost), cost, exc)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        """Forget the counters of ``key`` under ``rule`` (raises StorageError on failure)."""
        self.store.reset(key, rule)
        if self._local is not None:
            rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
            self._local.reset(key, [self._local_rule(r) for r in rules])

    def ping(self) -> bool:
        return self.store.ping()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> RateLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
    # unasync: end


class AsyncRateLimiter(_Base):
    """The same API as :class:`RateLimiter`, as coroutines."""

    def limit(self, limit: LimitArg, *, key: KeyFunc | str | None = None, cost: int = 1
              ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """:meth:`RateLimiter.limit` for coroutine functions."""
        return async_decorator(self, limit, key, cost)

    def _instrument(self) -> None:
        with self._count_lock:
            if self._instrumented:
                return
            self._instrumented = True
            raw_hit, raw_all, record = self.hit, self.hit_all, self._record

            async def hit(key: str, rule: Rule, cost: int = 1) -> Decision:
                d = await raw_hit(key, rule, cost)
                record(key, d)
                return d

            async def hit_all(key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
                d = await raw_all(key, rules, cost)
                record(key, d)
                return d

            self.hit = hit  # type: ignore[method-assign]
            self.hit_all = hit_all  # type: ignore[method-assign]

    # unasync: source limiter
    async def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        """Check and consume ``cost`` if admitted."""
        try:
            return await self.store.ahit(key, rule, cost)
        except StorageError as exc:
            return self._degraded(key, (rule,), cost, exc)

    async def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        """The decision ``hit`` would give, consuming nothing."""
        try:
            return await self.store.apeek(key, rule, cost)
        except StorageError as exc:
            return self._degraded(key, (rule,), cost, exc, consume=False)

    async def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        """All-or-nothing over several rules; returns the binding rule's decision."""
        try:
            return await self.store.ahit_all(key, rules, cost)
        except StorageError as exc:
            return self._degraded(key, check_rules(rules, cost), cost, exc)

    async def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        """Forget the counters of ``key`` under ``rule`` (raises StorageError on failure)."""
        await self.store.areset(key, rule)
        if self._local is not None:
            rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
            self._local.reset(key, [self._local_rule(r) for r in rules])

    async def ping(self) -> bool:
        return await self.store.aping()

    async def aclose(self) -> None:
        await self.store.aclose()

    async def __aenter__(self) -> AsyncRateLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
    # unasync: end
