"""Who is being limited right now: a bounded heavy-hitter sketch (space-saving).

:class:`SpaceSaving` keeps at most ``capacity`` keys, whatever the number of distinct keys
it sees (Metwally, Agrawal, El Abbadi, "Efficient computation of frequent and top-k
elements in data streams", 2005). A key it holds has an estimated count ``count`` and an
error bound ``error``: its true count is in ``[count - error, count]``. A key whose true
count exceeds (total / capacity) is always held, so the keys denied most are there.

When full, a new key replaces the key of least count, inheriting that count as its error.
The minimum is found with a heap holding one ``(count, tick, key)`` entry per held key,
updated lazily: an increment only bumps the key's count (O(1)); an eviction pops the
smallest entry and, when its count is stale (lower than the key's count now), pushes it
back with the current count and pops again. Stored counts never exceed the true ones, so
the first entry popped that is not stale is a true minimum. Memory: the dict and a heap
of exactly ``capacity`` entries.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass

from stormguard._core import validate

__all__ = ["SpaceSaving", "TopKey"]


@dataclass(frozen=True, slots=True)
class TopKey:
    """One held key: its estimated ``count`` (an upper bound), ``error`` (count - error is
    a lower bound) and the ``rules`` that denied it (most recent last, at most 8)."""

    key: str
    count: int
    error: int
    rules: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"key": self.key, "count": self.count, "error": self.error,
                "rules": list(self.rules)}


_MAX_RULES = 8


class SpaceSaving:
    """A thread-safe space-saving sketch of at most ``capacity`` keys.

    >>> s = SpaceSaving(2)
    >>> for k in ["a", "a", "a", "b", "c"]:
    ...     s.add(k, "login")
    >>> [(t.key, t.count) for t in s.top(1)]
    [('a', 3)]
    """

    __slots__ = ("_counts", "_heap", "_lock", "_rules", "_tick", "capacity", "total")

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = validate.integer("capacity", capacity, maximum=1_000_000)
        self._counts: dict[str, list[int]] = {}  # key -> [count, error]
        self._rules: dict[str, tuple[str, ...]] = {}
        self._heap: list[tuple[int, int, str]] = []
        self._tick = 0
        self._lock = threading.Lock()
        self.total = 0
        """Weight added since creation (every key, held or not)."""

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, key: str, rule: str | None = None, weight: int = 1) -> None:
        """Count ``weight`` more for ``key`` (denied by ``rule``)."""
        with self._lock:
            self.total += weight
            counts = self._counts
            entry = counts.get(key)
            if entry is None:
                self._tick += 1
                if len(counts) < self.capacity:
                    entry = counts[key] = [weight, 0]
                else:
                    victim = self._pop_min()
                    floor = counts.pop(victim)[0]
                    del self._rules[victim]
                    entry = counts[key] = [floor + weight, floor]
                self._rules[key] = (rule,) if rule is not None else ()
                heapq.heappush(self._heap, (entry[0], self._tick, key))
            else:
                entry[0] += weight
                if rule is not None:
                    rules = self._rules[key]
                    if not rules or rules[-1] != rule:
                        rules = (*(r for r in rules if r != rule), rule)[-_MAX_RULES:]
                        self._rules[key] = rules

    def _pop_min(self) -> str:
        heap, counts = self._heap, self._counts
        while True:
            c, _, k = heap[0]
            now = counts[k][0]
            if now == c:
                heapq.heappop(heap)
                return k
            self._tick += 1
            heapq.heapreplace(heap, (now, self._tick, k))  # stale: back with its count

    def top(self, n: int = 20) -> list[TopKey]:
        """The ``n`` keys of highest count, highest first (ties: by key)."""
        validate.integer("n", n, maximum=1_000_000)
        with self._lock:
            items = [(e[0], e[1], k, self._rules[k]) for k, e in self._counts.items()]
        best = heapq.nsmallest(n, items, key=lambda t: (-t[0], t[2]))
        return [TopKey(k, c, err, rules) for c, err, k, rules in best]

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._rules.clear()
            self._heap.clear()
            self.total = 0

    def __repr__(self) -> str:
        return f"SpaceSaving(capacity={self.capacity}, held={len(self._counts)})"
