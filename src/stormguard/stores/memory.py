"""The embedded store: in-process, thread-safe, bounded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stormguard._clock import Clock, system_clock
from stormguard.decision import Decision
from stormguard.errors import ConfigError
from stormguard.rules import Rule
from stormguard.stores.base import Store, binding, check_cost, check_rules, key_error

__all__ = ["MemoryStore"]

DEFAULT_MAX_KEYS = 100_000
_SWEEP_INTERVAL_US = 1_000_000


class MemoryStore(Store):
    """Counters in a bounded LRU dict guarded by one lock.

    * Thread-safe: every check is one critical section (decide + write) under a
      lock that is never held across I/O or ``await``, so it is asyncio-safe too.
    * Bounded: never more than ``max_keys`` keys (one per key and rule). When full,
      expired keys are swept first (at most once per second of store time), then the
      least recently used key is evicted. An evicted key restarts with a full quota;
      size ``max_keys`` above your number of concurrently active keys.
    """

    def __init__(self, *, clock: Clock | None = None, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ConfigError("max_keys", max_keys, "must be a positive integer")
        self.clock = clock if clock is not None else system_clock
        self.max_keys = max_keys
        self._wall = self.clock.wall
        self._data: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._last_sweep = -_SWEEP_INTERVAL_US
        self.evictions = 0
        """Keys evicted (not expired) because the store was full."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStore:
        """``memory://`` with an optional ``?max_keys=N``."""
        query = parse_qs(urlsplit(url).query)
        if "max_keys" in query and "max_keys" not in options:
            try:
                options["max_keys"] = int(query["max_keys"][0])
            except ValueError:
                raise ConfigError("max_keys", query["max_keys"][0], "must be an integer") from None
        return cls(**options)

    def _now(self) -> int:
        return int(self._wall() * 1_000_000 + 0.5)

    def _decide(self, key: str, rule: Rule, cost: int, consume: bool) -> Decision:
        if type(key) is not str:
            raise key_error(key)
        if cost != 1 or type(cost) is not int:
            check_cost(rule, cost)
        now = int(self._wall() * 1_000_000 + 0.5)
        k = (rule._id, key)
        data = self._data
        with self._lock:
            entry = data.get(k)
            if entry is None:
                allowed, state, remaining, reset, retry, exp = rule._algo.decide(
                    None, now, cost, consume)
                if allowed and consume:
                    if len(data) >= self.max_keys:
                        self._make_room(now)
                    data[k] = [state, exp]
            else:
                allowed, state, remaining, reset, retry, exp = rule._algo.decide(
                    entry[0], now, cost, consume)
                data.move_to_end(k)
                if allowed and consume:
                    entry[0] = state
                    entry[1] = exp
        return Decision(allowed, rule._algo.B, remaining, reset / 1e6, retry / 1e6, rule)

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decide(key, rule, cost, True)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self._decide(key, rule, cost, False)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        if type(key) is not str:
            raise key_error(key)
        rules = check_rules(rules, cost)
        if len(rules) == 1:
            return self._decide(key, rules[0], cost, True)
        now = self._now()
        data = self._data
        results = []
        with self._lock:
            for rule in rules:
                k = (rule._id, key)
                entry = data.get(k)
                verdict = rule._algo.decide(entry[0] if entry else None, now, cost, True)
                results.append((k, entry, verdict))
            all_ok = all(v[0] for _, _, v in results)
            for k, _, v in results:
                # look the key up again: making room for an earlier rule's new key may
                # have evicted or swept this one
                entry = data.get(k)
                if entry is not None:
                    data.move_to_end(k)
                    if all_ok:
                        entry[0] = v[1]
                        entry[1] = v[5]
                elif all_ok:
                    if len(data) >= self.max_keys:
                        self._make_room(now)
                    data[k] = [v[1], v[5]]
        decisions = []
        for rule, (_, entry, verdict) in zip(rules, results, strict=True):
            v = verdict
            if v[0] and not all_ok:
                # admitted by this rule but nothing was consumed: report the unconsumed view
                v = rule._algo.decide(entry[0] if entry else None, now, cost, False)
            decisions.append(Decision(v[0] and all_ok, rule._algo.B, v[2], v[3] / 1e6,
                                      v[4] / 1e6, rule))
        return binding(decisions)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        if type(key) is not str:
            raise key_error(key)
        rules = (rule,) if isinstance(rule, Rule) else tuple(rule)
        with self._lock:
            for r in rules:
                self._data.pop((r._id, key), None)

    def _make_room(self, now: int) -> None:
        """Called with the lock held when the store is full."""
        data = self._data
        if now - self._last_sweep >= _SWEEP_INTERVAL_US:
            self._last_sweep = now
            expired = [k for k, e in data.items() if e[1] <= now]
            for k in expired:
                del data[k]
        while len(data) >= self.max_keys:
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
            expired = [k for k, e in self._data.items() if e[1] <= now]
            for k in expired:
                del self._data[k]
            return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryStore(max_keys={self.max_keys}, clock={self.clock!r})"
