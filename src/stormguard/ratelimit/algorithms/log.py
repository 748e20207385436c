"""The sliding window log: exact, one admission time per unit of cost."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from stormguard.ratelimit.algorithms.base import Algorithm, Transition, Verdict

__all__ = ["SlidingWindowLog"]


class SlidingWindowLog(Algorithm):
    """A request admitted at ``t`` counts during ``[t, t + W)``; never more than ``N`` in
    any half-open interval of length ``W``. Memory is O(limit) per key.

    Reference state: the tuple of admission times, oldest first. Hot-path entry:
    ``[expires, log, head]`` where ``log`` is a sorted list and ``log[:head]`` have
    expired; expired entries are cut off in bulk once they are at least half of the list,
    so an admission costs O(1) amortised however many entries are live."""

    __slots__ = ()
    name = "sliding_window_log"

    @property
    def magnitude(self) -> int:
        return self.N  # times and counts only: no product of the window with anything

    def expires_of(self, state: Any) -> int:
        return int(state[-1]) + self.W

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        W, N = self.W, self.N
        log: tuple[int, ...] = () if state is None else state
        if log and now < log[-1]:
            now = log[-1]  # a clock that stepped back: never reorder the log
        live = tuple(t for t in log if t > now - W)
        allowed = len(live) + cost <= N
        # denied: wait until enough of the oldest live entries have expired
        retry = 0 if allowed else live[len(live) + cost - N - 1] + W - now
        if allowed and consume:
            live += (now,) * cost
            state = live
        return (allowed, state, N - len(live), live[-1] + W - now if live else 0, retry,
                now if state is None else self.expires_of(state))

    def fresh(self) -> list[Any]:
        return [0, [], 0]

    def state_of(self, entry: list[Any]) -> Any:
        return tuple(entry[1][entry[2]:])

    def entry_of(self, state: Any) -> list[Any]:
        return [self.expires_of(state), list(state), 0]

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
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
            return (True, N - live, log[-1] + W - now if live else 0, 0)
        k = live + cost - N  # how many of the oldest live entries must expire
        return (False, N - live, log[-1] + W - now, log[i + k - 1] + W - now)
