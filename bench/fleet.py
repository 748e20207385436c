"""A fleet of 500 servers in 3 regions running the real HybridStore in virtual time.

    PYTHONPATH=src python bench/fleet.py                      # the full run (about a minute)
    PYTHONPATH=src python bench/fleet.py --rate 20000 --seconds 1   # a small one

The model is :mod:`stormguard.sim.fleet` (its docstring describes it), the same one
``stormguard simulate fleet`` runs; this script keeps the full scale as its default
(1,000,000 requests per second for 2 s of virtual time) and prints the markdown tables
that docs/performance.md quotes, then the regions table of :mod:`stormguard.sim.regions`
(``--no-regions`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# a script here named after a module shadows it (bench/redis.py would redis-py, a
# bench/queue.py once hid the standard library's queue): keep this directory off the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

from stormguard.sim.fleet import FULL_RATE, simulate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regions", action=argparse.BooleanOptionalAction, default=True,
                        help="then the 3 regions under one global limit (bench/regions.py)")
    parser.add_argument("--rate", type=float, default=FULL_RATE, help="requests per second")
    parser.add_argument("--seconds", type=float, default=2.0, help="virtual seconds")
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--balance", choices=("random", "sticky"), default="random")
    parser.add_argument("--hot-rate", type=float, default=0.0)
    parser.add_argument("--node-ops", type=float, default=117_000,
                        help="script runs per second one Redis node sustains")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cold-allowance", type=int, default=0,
                        help="HybridStore's cold_allowance (0: exact, every unit leased)")
    parser.add_argument("--script-adds", action="store_true",
                        help="every forced add a key of the lease script (no native SET NX)")
    parser.add_argument("--redis-costs", default=None, metavar="JSON",
                        help='figures replacing REDIS_COSTS, e.g. \'{"script": 16.9}\'')
    args = parser.parse_args()
    fleet = simulate(rate=args.rate, seconds=args.seconds, users=args.users, zipf=args.zipf,
                     balance=args.balance, hot_rate=args.hot_rate, node_ops=args.node_ops,
                     seed=args.seed, cold_allowance=args.cold_allowance,
                     native_adds=not args.script_adds,
                     redis_costs=json.loads(args.redis_costs) if args.redis_costs else None)
    print(fleet.text())
    if args.regions:  # the fleet's regions: stormguard.sim.regions, the full run
        from stormguard.sim.regions import simulate as regions

        print()
        print(regions(measure_convergence=True).text())


if __name__ == "__main__":
    main()
