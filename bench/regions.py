"""Three regions, one global limit: centralised, per-region copies, static split and
demand split side by side, on the project's discrete-event engine (virtual time).

    PYTHONPATH=src python bench/regions.py              # 60 s of virtual traffic
    PYTHONPATH=src python bench/regions.py --quick      # 24 s, limit 300, for a smoke run

The model is :mod:`stormguard.sim.regions` (its docstring describes it), the same one
``stormguard simulate fleet`` and bench/fleet.py print after the fleet's tables. This
script prints its tables (the four strategies; the demand split's convergence after the
shift, in sync intervals, per sync alignment) and, in real time, what RegionalStore adds
to a check over the MemoryStore it wraps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
# a script here named after a module shadows it: keep this directory off the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

from stormguard import MemoryStore, RegionalStore, Rule  # noqa: E402
from stormguard.sim.regions import REGIONS, simulate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--limit", type=int, default=1000, help="global limit per second")
    parser.add_argument("--offsets", type=int, default=10,
                        help="offsets of the shift within the sync interval (convergence)")
    parser.add_argument("--quick", action="store_true", help="24 s, limit 300, 4 offsets")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.limit, args.offsets = 24.0, 300, 4
    began = time.perf_counter()
    result = simulate(duration=args.duration, limit=args.limit, measure_convergence=True,
                      offsets=args.offsets)
    print(result.text())
    checks = sum(len(o.added) for o in result.outcomes.values())
    print(f"\nsimulated {checks:,} checks (and the convergence runs) in "
          f"{time.perf_counter() - began:.1f} s of wall time")
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
            t0 = time.perf_counter()
            for i in range(n):
                hit(keys[i % 1000], rule)
            best = min(best, time.perf_counter() - t0)
        return best / n

    regional.sync()
    a, b = bench(bare.hit), bench(regional.hit)
    print(f"real time, one thread: MemoryStore.hit {a * 1e6:.2f} us, RegionalStore.hit over "
          f"it {b * 1e6:.2f} us ({b / a:.2f}x, +{(b - a) * 1e6:.2f} us per check)")


if __name__ == "__main__":
    main()
