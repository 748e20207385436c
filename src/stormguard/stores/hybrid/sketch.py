"""Which keys are hot: a bounded heavy-hitter count (Misra-Gries) with hysteresis."""

from __future__ import annotations

__all__ = ["HotKeys"]


class HotKeys:
    """Counts checks per key over periods of ``period`` seconds in at most ``size``
    counters (Misra-Gries: when full, every counter drops by the smallest one and the
    zeros leave, so a key seen more than ``n / size`` times in a period of ``n`` checks is
    never lost, and the count of a key is low by at most ``n / size``).

    A key turns hot as soon as its count in the current period passes ``rate x period``;
    it turns cold again only after a whole period under half that rate (hysteresis: a key
    near the threshold does not flap). At most ``size`` keys are hot at once.
    """

    __slots__ = ("_counts", "_end", "_high", "_low", "hot", "period_us", "size")

    def __init__(self, rate: float, period: float, size: int) -> None:
        self.period_us = round(period * 1_000_000)
        self.size = size
        self._high = rate * period
        self._low = rate * period / 2
        self._counts: dict[str, float] = {}
        self._end = 0
        self.hot: dict[str, None] = {}

    def check(self, key: str, now_us: int) -> bool:
        """Count one check of ``key`` at ``now_us``; True when the key is hot."""
        if now_us >= self._end:
            self._roll(now_us)
        counts = self._counts
        c = counts.get(key)
        if c is not None:
            c += 1
            counts[key] = c
            if c > self._high and key not in self.hot and len(self.hot) < self.size:
                self.hot[key] = None
        elif len(counts) < self.size:
            counts[key] = 1
        else:
            least = min(counts.values())
            self._counts = {k: v - least for k, v in counts.items() if v > least}
        return key in self.hot

    def _roll(self, now_us: int) -> None:
        counts = self._counts
        low = self._low
        for key in [k for k in self.hot if counts.get(k, 0) < low]:
            del self.hot[key]
        self._counts = {}
        self._end = now_us + self.period_us
