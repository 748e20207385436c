"""Three regions driven in virtual time: offered load per region and interval, syncs,
and per-window accounting of what each region admitted and the limits it enforced."""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Callable

from stormguard import RegionalStore, Rule
from stormguard.testing import FakeClock

REGIONS = ("us", "eu", "ap")


class Regions:
    def __init__(self, stores: dict[str, RegionalStore], clock: FakeClock, rule: Rule,
                 *, steps: int = 10, interval: float = 1.0, parallel: bool = False,
                 hurry: bool = True, order: tuple[str, ...] | None = None,
                 after_round: Callable[[], None] | None = None) -> None:
        """``hurry``: every store takes its ``half_sync()`` step half-way through each
        interval and polls (``poll()``) about a quarter before and after it, as the
        background sync does; ``order``: the order of
        the syncs at the same instant (the stores' order by default); ``after_round``:
        called after each round of syncs (a test's boards deliver the reports then:
        every region syncing at the same instant reads the reports of the round
        before)."""
        self.parallel = parallel
        self.hurry = hurry
        self.order = order
        self.after_round = after_round
        self.stores = stores
        self.clock = clock
        self.rule = rule
        self.steps = steps
        self.interval = interval
        # window index -> region -> admitted / offered / the largest local limit in force
        self.admitted: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.offered: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.limits: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.key = "api_key:acme"
        self.start = clock.wall()

    def window(self) -> int:
        return math.floor(self.clock.wall() / self.rule.window)

    def run_interval(self, offered: dict[str, int]) -> None:
        """Spread ``offered[r]`` checks per region over one interval, then sync."""
        step = self.interval / self.steps
        for i in range(self.steps):
            if self.hurry and i in (self.steps // 4, self.steps // 2, 3 * self.steps // 4):
                for s in self._ordered():
                    if i == self.steps // 2:
                        s.half_sync()
                    else:
                        s.poll()
                if self.after_round is not None:
                    self.after_round()
            self.clock.advance(step)
            w = self.window()
            for r, n in offered.items():
                store = self.stores[r]
                lim = store.local_rule(self.key, self.rule).limit
                self.limits[w][r] = max(self.limits[w][r], lim)
                share = n * (i + 1) // self.steps - n * i // self.steps
                for _ in range(share):
                    self.offered[w][r] += 1
                    if store.hit(self.key, self.rule).allowed:
                        self.admitted[w][r] += 1
        self.sync_all(self.parallel)

    def _ordered(self) -> list[RegionalStore]:
        names = self.order or tuple(self.stores)
        return [self.stores[r] for r in names]

    def sync_all(self, parallel: bool = False) -> None:
        if not parallel:
            for s in self._ordered():
                s.sync()
            if self.after_round is not None:
                self.after_round()
            return
        threads = [threading.Thread(target=s.sync) for s in self.stores.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def total(self, w: int) -> int:
        return sum(self.admitted[w].values())

    def windows(self) -> list[int]:
        """The windows the run covered from start to end (partial ones left out)."""
        w = self.rule.window
        now = self.clock.wall()
        return sorted(k for k in self.admitted if k * w >= self.start - 1e-9
                      and (k + 1) * w <= now + 1e-9)


def demand_shift(regions: Regions, limit: int, *, before: int = 6, after: int = 6,
                 run: Callable[[dict[str, int]], None] | None = None) -> int:
    """80/10/10 of twice the limit, then 10/10/80; returns the first window after the
    shift."""
    run = run or regions.run_interval
    high, low = limit * 16 // 10, limit * 2 // 10
    for _ in range(before):
        run({"us": high, "eu": low, "ap": low})
    shift = regions.window() + 1
    for _ in range(after):
        run({"us": low, "eu": low, "ap": high})
    return shift
