"""The embedded store: in-process, thread-safe, bounded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

from stormguard._core import validate
from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.algorithms import Algorithm, Verdict
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.reservation import Reservation
from stormguard.ratelimit.rule import Rule
from stormguard.stores.base import (
    Store,
    binding,
    check_cost,
    check_reservation,
    check_rules,
    key_error,
)

__all__ = ["MemoryStore"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # not a runtime dependency: only the compiler reads the decorator

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls


DEFAULT_MAX_KEYS = 100_000
_SWEEP_INTERVAL_US = 1_000_000
_new: Final = tuple.__new__  # Final: compiled, a C static instead of a dict lookup per call


def _decision(v: Verdict, algo: Algorithm, rule: Rule) -> Decision:
    """The Decision of an algorithm's verdict (times from microseconds to seconds; a zero
    is the constant 0.0, not a new float)."""
    reset = v[2]
    retry = v[3]
    return _new(Decision, (v[0], algo.B, v[1], reset / 1e6 if reset else 0.0,
                           retry / 1e6 if retry else 0.0, rule, False))


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, it stays open to subclasses
class MemoryStore(Store):
    """Counters in a bounded LRU dict guarded by one lock.

    * Thread-safe: every check is one critical section (decide + write) under a
      lock that is never held across I/O or ``await``, so it is asyncio-safe too.
    * Bounded: never more than ``max_keys`` keys (one per key and rule). When full,
      expired keys are swept first (at most once per second of store time), then the
      least recently used key is evicted. An evicted key restarts with a full quota;
      size ``max_keys`` above your number of concurrently active keys.
    """

    def __init__(self, *, clock: Clock | None = None,
                 max_keys: object = DEFAULT_MAX_KEYS) -> None:
        self.clock = clock if clock is not None else system_clock
        self.max_keys: int = validate.integer("max_keys", max_keys)
        self._wall = self.clock.wall
        wall_ns = getattr(self.clock, "wall_ns", None)
        if wall_ns is None:
            raise ConfigError("clock", self.clock, "must have the methods of stormguard.Clock "
                              "(wall_ns() is missing)")
        # `self._wall_ns() // 1000` below is stormguard._core.clock.wall_us, inlined: the
        # hot path saves a call
        self._wall_ns: Callable[[], int] = wall_ns
        self._data: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        # entry = [expires_at_us, *algorithm state] (see stormguard.ratelimit.algorithms)
        self._get = self._data.get
        self._touch = self._data.move_to_end
        self._lock = threading.Lock()
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        self._last_sweep = -_SWEEP_INTERVAL_US
        # the entry last moved to the MRU end: hitting it again needs no move (a hot key)
        self._mru: list[Any] | None = None
        self.evictions = 0
        """Keys evicted (not expired) because the store was full."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStore:
        """``memory://`` with an optional ``?max_keys=N`` (any other parameter is refused)."""
        query = parse_qs(urlsplit(url).query, keep_blank_values=True)
        unknown = sorted(set(query) - {"max_keys"})
        if unknown:
            what = "query parameter" if len(unknown) == 1 else "query parameters"
            raise ConfigError("url", unknown, f"unknown {what} "
                              f"{', '.join(map(repr, unknown))}: a memory:// URL takes "
                              "max_keys only")
        if "max_keys" in query and "max_keys" not in options:
            try:
                options["max_keys"] = int(query["max_keys"][0])
            except ValueError:
                raise ConfigError("max_keys", query["max_keys"][0], "must be an integer") from None
        return cls(**options)

    def _now(self) -> int:
        return self._wall_ns() // 1000

    # key and cost are typed `object` (wider than Store's, which is allowed): when this
    # module is compiled, mypyc would otherwise reject bad values with a TypeError that
    # names neither the field nor the problem before our checks could run.
    def hit(self, key: object, rule: Rule, cost: object = 1) -> Decision:
        # The hot path: one lock, one dict lookup, one apply() that updates the entry in place
        # and answers a verdict of plain integers (compiled, a C struct: no allocation).
        if type(key) is not str:
            raise key_error(key)
        if type(cost) is not int or cost != 1:
            cost = check_cost(rule, cost)
        now = self._wall_ns() // 1000
        k = (rule._id, key)
        algo = rule._algo
        self._acquire()
        try:
            entry = self._get(k)
            if entry is None:
                entry = algo.fresh()
                v = algo.apply(entry, now, cost, True)
                if v[0]:
                    if len(self._data) >= self.max_keys:
                        self._make_room(now, self.max_keys - 1)
                    self._data[k] = entry
                    self._mru = entry
            else:
                v = algo.apply(entry, now, cost, True)
                if entry is not self._mru:
                    self._touch(k)
                    self._mru = entry
        finally:
            self._release()
        # _decision(v, algo, rule), inlined
        reset = v[2]
        retry = v[3]
        return _new(Decision, (v[0], algo.B, v[1], reset / 1e6 if reset else 0.0,
                               retry / 1e6 if retry else 0.0, rule, False))

    def peek(self, key: object, rule: Rule, cost: object = 1) -> Decision:
        if type(key) is not str:
            raise key_error(key)
        if type(cost) is not int or cost != 1:
            cost = check_cost(rule, cost)
        now = self._now()
        algo = rule._algo
        with self._lock:
            entry = self._get((rule._id, key))
            v = algo.apply(algo.fresh() if entry is None else entry, now, cost, False)
        return _decision(v, algo, rule)

    def hit_all(self, key: object, rules: Sequence[Rule], cost: object = 1) -> Decision:
        if type(key) is not str:
            raise key_error(key)
        if type(cost) is not int:  # bool too; check_rules checks the value of an int
            cost = validate.integer("cost", cost)
        rules = check_rules(rules, cost)
        if len(rules) == 1:
            return self.hit(key, rules[0], cost)
        now = self._now()
        data = self._data
        with self._lock:
            # first pass decides without consuming; only if every rule admits, consume all
            entries = []
            for rule in rules:
                k = (rule._id, key)
                entry = data.get(k)
                if entry is not None:
                    data.move_to_end(k)
                    self._mru = entry
                entries.append((k, entry, rule._algo))
            verdicts = [algo.apply(e if e is not None else algo.fresh(), now, cost, False)
                        for _, e, algo in entries]
            admitted = all(v[0] for v in verdicts)
            if admitted:
                verdicts = []
                for k, found, algo in entries:
                    entry = found if found is not None else algo.fresh()
                    verdicts.append(algo.apply(entry, now, cost, True))
                    if found is None:
                        data[k] = entry
                        self._mru = entry
                if len(data) > self.max_keys:
                    # evicts least recently used keys first: this call's keys are the most recent
                    self._make_room(now, self.max_keys)
        decisions = [_decision(v, e[2], r) for v, e, r in zip(verdicts, entries, rules,
                                                                strict=True)]
        if not admitted:  # the rules that would admit report it unconsumed, and denied
            decisions = [d if not d[0] else d.replace(allowed=False) for d in decisions]
        return binding(decisions)

    def reserve(self, key: object, rule: Rule, cost: object = 1, *,
                max_wait: object = None, book: object = True) -> Reservation:
        if type(key) is not str:
            raise key_error(key)
        cost, wait_us = check_reservation(rule, cost, max_wait, book)
        now = self._now()
        k = (rule._id, key)
        algo = rule._algo
        with self._lock:
            entry = self._get(k)
            state = None if entry is None else algo.state_of(entry)
            ok, at, new_state = algo.reserve(state, now, cost, wait_us, book is True)
            if ok and book:
                if entry is None:
                    if len(self._data) >= self.max_keys:
                        self._make_room(now, self.max_keys - 1)
                    entry = algo.entry_of(new_state)
                    self._data[k] = entry
                else:
                    entry[:] = algo.entry_of(new_state)
                    self._touch(k)
                self._mru = entry
        return Reservation(ok, (at - now) / 1e6, at / 1e6)

    def reset(self, key: object, rule: Rule | Sequence[Rule]) -> None:
        if type(key) is not str:
            raise key_error(key)
        rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
        with self._lock:
            for r in rules:
                self._data.pop((r._id, key), None)

    def _make_room(self, now: int, target: int) -> None:
        """Shrink to ``target`` keys: expired keys first, then least recently used.
        Called with the lock held."""
        data = self._data
        if now - self._last_sweep >= _SWEEP_INTERVAL_US:
            self._last_sweep = now
            expired = [k for k, e in data.items() if e[0] <= now]
            for k in expired:
                del data[k]
        while len(data) > target:
            data.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        """Forget every key."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        """Keys held now (expired keys are dropped first)."""
        now = self._now()
        with self._lock:
            expired = [k for k, e in self._data.items() if e[0] <= now]
            for k in expired:
                del self._data[k]
            return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryStore(max_keys={self.max_keys}, clock={self.clock!r})"
