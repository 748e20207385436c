"""Three regions, one global limit: centralised, per-region copies, static split and
demand split side by side, on the project's discrete-event engine (virtual time).

    PYTHONPATH=src python bench/regions.py              # 60 s of virtual traffic
    PYTHONPATH=src python bench/regions.py --quick      # 24 s, for a smoke run

Regions us, eu, ap; one-way delays us-eu 50 ms, us-ap 75 ms, eu-ap 60 ms (round trips
100-150 ms). One key, a global limit of ``--limit`` per 1 s window (fixed window, so
"admitted per window" is exact); the offered load is twice the limit, evenly spaced:

* phase 1 (0-35 %): 80/10/10 of it in us/eu/ap (its first 3 windows, while the regions
  first meet, are left out of the figures); phase 2 (35-60 %): 10/10/80;
* phase 3 (60-85 %): ap partitioned (no link to or from it); phase 4: healed, 10/10/80.

Strategies (each on its own copy of the same arrivals):

* ``centralised``: one counter in us; every check from eu or ap crosses the link
  (round trip added to the check); partitioned, ap's checks fail and are admitted
  (fail-open: what the global total then does) -- a fail-closed limiter would deny
  all of them instead.
* ``per-region``: each region enforces the full limit on its own (the N x limit that
  per-data-center counting gives).
* ``static``: RegionalStore(split="static"), equal thirds.
* ``demand``: RegionalStore(split="demand"), sync every 1 s, lease 3 s, min_share 0.05;
  its reports travel the links with their delay (writes to a cut link fail).

Printed per strategy: the added latency of a check (mean, p99), the global admitted per
window as a fraction of the limit in each phase (mean, min, max), the windows after the
demand shift until the total is back within 5 % of the limit, and the share of the
limit left unused while some region's users were denied.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from stormguard import MemoryStore, RegionalStore, Rule, StorageError
from stormguard.sim import Engine
from stormguard.stores.regional import Board, MemoryBoard

REGIONS = ("us", "eu", "ap")
ONE_WAY = {frozenset(("us", "eu")): 0.050, frozenset(("us", "ap")): 0.075,
           frozenset(("eu", "ap")): 0.060}


def delay(a: str, b: str) -> float:
    return 0.0 if a == b else ONE_WAY[frozenset((a, b))]


class Link(Board):
    """A's view of B's board: writes land after the link's delay; a cut link fails."""

    def __init__(self, eng: Engine, inbox: MemoryBoard, seconds: float,
                 cut: Callable[[], bool]) -> None:
        self.eng, self.inbox, self.seconds, self.cut = eng, inbox, seconds, cut

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        if self.cut():
            raise StorageError("link cut")
        self.eng.call_later(self.seconds, self.inbox.write, sender, payload, ttl)

    def read(self) -> dict[str, bytes]:
        return self.inbox.read()


class Scenario:
    def __init__(self, duration: float, limit: int) -> None:
        self.duration = duration
        self.limit = limit
        # whole seconds: a phase starts with a window
        self.t_shift = float(round(0.35 * duration))
        self.t_cut = float(round(0.60 * duration))
        self.t_heal = float(round(0.85 * duration))

    def mix(self, t: float) -> dict[str, float]:
        return ({"us": 0.8, "eu": 0.1, "ap": 0.1} if t < self.t_shift
                else {"us": 0.1, "eu": 0.1, "ap": 0.8})

    def cut(self, t: float) -> bool:
        return self.t_cut <= t < self.t_heal

    def phase(self, t: float) -> str:
        if t < self.t_shift:
            return "80/10/10"
        if t < self.t_cut:
            return "10/10/80"
        return "partition" if t < self.t_heal else "healed"


def run(strategy: str, sc: Scenario) -> dict[str, Any]:
    eng = Engine()
    clock = eng.clock
    t0 = eng.now
    rule = Rule(sc.limit, 1, algorithm="fixed_window")
    admitted: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    denied: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    added: list[float] = []
    w0 = math.floor(clock.wall())

    def window() -> int:
        return math.floor(clock.wall()) - w0

    def count(region: str, ok: bool) -> None:
        (admitted if ok else denied)[window()][region] += 1

    stores: dict[str, Any] = {}
    if strategy == "centralised":
        central = MemoryStore(clock=clock)

        def check(region: str) -> None:
            if region != "us" and sc.cut(eng.now - t0):
                added.append(0.5)  # a timeout, then fail-open
                count(region, True)
                return
            added.append(2 * delay(region, "us"))
            eng.call_later(delay(region, "us"),
                           lambda: count(region, central.hit("k", rule).allowed))
    elif strategy == "per-region":
        own = {r: MemoryStore(clock=clock) for r in REGIONS}

        def check(region: str) -> None:
            added.append(0.0)
            count(region, own[region].hit("k", rule).allowed)
    else:
        locals_ = {r: MemoryStore(clock=clock) for r in REGIONS}
        inbox = {r: MemoryBoard(clock) for r in REGIONS}

        def link_cut(a: str, b: str) -> Callable[[], bool]:
            return lambda: a != b and "ap" in (a, b) and sc.cut(eng.now - t0)

        for a in REGIONS:
            boards = {b: Link(eng, inbox[b], delay(a, b), link_cut(a, b)) for b in REGIONS}
            stores[a] = RegionalStore(region=a, stores=locals_, split=strategy, clock=clock,
                                      sync_interval=None, lease=3.0, min_share=0.05,
                                      boards=boards)
            if strategy == "demand":
                # the regions' syncs are not in step: 0.1 s apart
                eng.every(1.0, stores[a].sync, start=eng.now + 0.5 + 0.1 * REGIONS.index(a))

        def check(region: str) -> None:
            added.append(0.0)
            count(region, stores[region].hit("k", rule).allowed)

    offered = 2 * sc.limit  # per second, all regions together

    def arrive(region: str) -> None:
        t = eng.now - t0
        if t >= sc.duration:
            return
        check(region)
        rate = offered * sc.mix(t)[region]
        eng.call_later(1.0 / rate, arrive, region)

    for i, r in enumerate(REGIONS):
        eng.call_later(0.0001 * i, arrive, r)
    eng.run(until=t0 + sc.duration + 1.0)

    windows = [w for w in range(int(sc.duration)) if w in admitted or w in denied]
    per_phase: dict[str, list[float]] = defaultdict(list)
    unused = []
    for w in windows:
        if w < 3:
            continue  # warm-up: the regions have not heard from each other yet
        total = sum(admitted[w].values())
        per_phase[sc.phase(w + 0.5)].append(total / sc.limit)
        if any(denied[w].values()):
            unused.append(max(0.0, 1 - total / sc.limit))
    shift = int(sc.t_shift)
    back = next((w - shift for w in windows if shift < w < int(sc.t_cut) and all(
        abs(sum(admitted[v].values()) / sc.limit - 1) <= 0.05
        for v in windows if w <= v < int(sc.t_cut))), None)
    added.sort()
    ap_cut = [admitted[w]["ap"] / sc.limit for w in windows
              if sc.phase(w + 0.5) == "partition"]
    return {"strategy": strategy, "lat_mean": sum(added) / len(added),
            "lat_p99": added[int(len(added) * 0.99)], "phases": per_phase,
            "back": back, "unused": sum(unused) / max(1, len(unused)),
            "ap_cut": sum(ap_cut) / max(1, len(ap_cut)), "checks": len(added)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--limit", type=int, default=1000, help="global limit per second")
    parser.add_argument("--quick", action="store_true", help="24 s, limit 300")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.limit = 24.0, 300
    sc = Scenario(args.duration, args.limit)
    print(f"3 regions, one-way delays 50/75/60 ms; limit {sc.limit}/s, offered 2x; "
          f"{sc.duration:g} s virtual: shift at {sc.t_shift:g} s, ap cut "
          f"{sc.t_cut:g}-{sc.t_heal:g} s")
    phases = ("80/10/10", "10/10/80", "partition", "healed")
    head = f"{'strategy':<12} {'added ms mean':>13} {'p99':>6} " + " ".join(
        f"{p + ' mean/min/max':>22}" for p in phases) + f" {'back':>5} {'unused':>7}"
    print(head)
    results = []
    for strategy in ("centralised", "per-region", "static", "demand"):
        began = time.perf_counter()
        res = run(strategy, sc)
        res["wall"] = time.perf_counter() - began
        results.append(res)
        cells = []
        for p in phases:
            v = res["phases"].get(p, [])
            cells.append(f"{sum(v) / len(v):.2f}/{min(v):.2f}/{max(v):.2f}" if v else "-")
        back = "-" if res["back"] is None else str(res["back"])
        print(f"{res['strategy']:<12} {res['lat_mean'] * 1e3:>13.1f} "
              f"{res['lat_p99'] * 1e3:>6.0f} " + " ".join(f"{c:>22}" for c in cells)
              + f" {back:>5} {res['unused']:>7.1%}")
    by = {r["strategy"]: r for r in results}
    d, s, c = by["demand"], by["static"], by["centralised"]

    def mean(r: dict[str, Any], p: str) -> float:
        v = r["phases"].get(p, [])
        return sum(v) / len(v) if v else float("nan")

    print()
    print("global admitted / limit (1.00 is exact), demand vs static: "
          f"{mean(d, '80/10/10'):.2f} vs {mean(s, '80/10/10'):.2f} before the shift "
          f"({mean(d, '80/10/10') / mean(s, '80/10/10'):.2f}x), "
          f"{mean(d, '10/10/80'):.2f} vs {mean(s, '10/10/80'):.2f} after")
    print(f"partition (ap cut): demand max {max(d['phases']['partition']):.2f}, "
          f"ap keeps {d['ap_cut']:.2f} of the limit; centralised fail-open max "
          f"{max(c['phases']['partition']):.2f}")
    print(f"added latency per check: centralised {c['lat_mean'] * 1e3:.1f} ms mean, "
          f"p99 {c['lat_p99'] * 1e3:.0f} ms; regional 0 (the local store's own figure)")
    print(f"simulated {sum(r['checks'] for r in results):,} checks in "
          f"{sum(r['wall'] for r in results):.1f} s of wall time")
    overhead(20_000 if args.quick else 200_000)


def overhead(n: int) -> None:
    """Real time: what RegionalStore adds to a check (scaled rule lookup, demand count)
    over the bare MemoryStore it wraps; both in this run, best of 3."""
    from stormguard.testing import FakeClock

    clock = FakeClock()  # frozen time: every check does the same work
    rule = Rule(10**9, 1)
    locals_ = {r: MemoryStore(clock=clock) for r in REGIONS}
    bare = MemoryStore(clock=clock)
    regional = RegionalStore(region="us", stores=locals_, clock=clock, sync_interval=None)
    keys = [f"user:{i}" for i in range(1000)]

    def bench(hit: Callable[[str, Rule], object]) -> float:
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            for i in range(n):
                hit(keys[i % 1000], rule)
            best = min(best, time.perf_counter() - began)
        return best / n

    regional.sync()
    a, b = bench(bare.hit), bench(regional.hit)
    print(f"real time, one thread: MemoryStore.hit {a * 1e6:.2f} us, RegionalStore.hit over "
          f"it {b * 1e6:.2f} us ({b / a:.2f}x, +{(b - a) * 1e6:.2f} us per check)")


if __name__ == "__main__":
    main()
