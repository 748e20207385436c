"""A fleet of 500 servers in 3 regions running the real HybridStore in virtual time.

    PYTHONPATH=src python bench/fleet.py                      # the full run (a few minutes)
    PYTHONPATH=src python bench/fleet.py --rate 20000 --seconds 1   # a small one

1,000,000 requests per second in total (``--rate``), for ``--seconds`` of virtual time
on the project's discrete-event engine (:class:`stormguard.sim.Engine`): every request
is one ``hit`` on the real :class:`~stormguard.HybridStore` of the server the load
balancer picks, each server syncing every 100 ms at its own phase. One backend per
region (a MemoryStore on the engine's clock standing for the region's Redis; a
region's keys are homed in it). Three kinds of keys, each limited per second (fixed
window of 1 s, so a window's admissions are exact to count):

* users: 10,000,000, Zipf popularity (exponent ``--zipf``, 1.0: the rank-k user sends
  1/k of the top one's traffic; the top ones are hot, most are cold), 75 % of the
  traffic, limit 10 per second each;
* API keys: 4 at 50,000 requests per second each, limit 40,000 per second;
* bots: 100 at 500 requests per second each, limit 100 per second.

The load balancer spreads requests at random over the servers of the key's region
(``--balance sticky`` sends each key to one server, as a consistent-hash balancer
would). In the same run, on the same requests, a Gubernator-GLOBAL-like strategy: each
server answers from the key's status as last broadcast (a new key: a fresh counter),
counts locally, and every 100 ms sends its hits to the key's owner, which adds them and
broadcasts the new status to every server of the region; no shares.

Reported: backend operations per second (a lease, a direct check, one key of a sync
round or of a GLOBAL batch: one Lua script run on Redis), the Redis nodes they imply
at ``--node-ops`` script runs per second per node (the figure for the rate-limit script
on this machine: about 8.5 µs of Redis time each, ``INFO commandstats``, see
docs/performance.md), round trips per server per second, the checks that waited for
a round trip (modelled 0.5-2 ms in-region), overshoot per key class (admitted above the
limit, over every key-second at or above its limit) and false denials (denied requests
of key-seconds whose demand was within the limit: a perfect limiter admits them all).
Not modelled: the round trip's duration in the store's decisions (a reply is applied at
the moment its request is sent).
"""

from __future__ import annotations

import argparse
import math
import random
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

from stormguard import HybridStore, MemoryStore, Rule
from stormguard.sim import Engine

REGIONS = 3
SERVERS = 500
TICK = 0.001  # requests are generated per millisecond
SYNC = 0.1


@dataclass
class KeyClass:
    name: str
    rule: Rule
    share: float  # of the total request rate


@dataclass
class Tally:
    """Per key class: what happened, and the exact counts per key-second."""

    offered: int = 0
    admitted: int = 0
    waited: int = 0
    latency: float = 0.0  # modelled round-trip time of the checks that waited, ms
    excess: int = 0
    over_admitted: int = 0
    false_denials: int = 0
    in_limit_requests: int = 0
    window: dict[str, list[int]] = field(default_factory=dict)  # key -> [offered, admitted]

    def close_window(self, limit: int) -> None:
        for offered, admitted in self.window.values():
            if offered <= limit:
                self.false_denials += offered - admitted
                self.in_limit_requests += offered
            else:
                self.over_admitted += admitted
                self.excess += max(0, admitted - limit)
        self.window = {}


class GlobalLike:
    """Gubernator GLOBAL, as far as the decision goes: local answers from the status last
    broadcast by the key's owner, hits forwarded in batches, no shares.

    The broadcast is modelled as a version per key and region: a server whose copy is
    older than the broadcast takes the broadcast remaining, then counts its own hits down
    from it (what every peer's cache does between two broadcasts)."""

    def __init__(self) -> None:
        self.cache: list[dict[str, list[int]]] = [{} for _ in range(SERVERS)]
        self.pending: list[dict[str, int]] = [defaultdict(int) for _ in range(SERVERS)]
        # per region: key -> [hits counted by the owner, window, broadcast version]
        self.owner: list[dict[str, list[int]]] = [{} for _ in range(REGIONS)]
        self.ops = 0
        self.trips = 0

    def hit(self, server: int, region: int, key: str, limit: int, window: int) -> bool:
        g = self.owner[region].get(key)
        st = self.cache[server].get(key)
        if g is not None and g[1] == window:
            if st is None or st[1] != window or st[2] != g[2]:
                st = self.cache[server][key] = [max(0, limit - g[0]), window, g[2]]
        elif st is None or st[1] != window:
            st = self.cache[server][key] = [limit, window, -1]  # a new key: a fresh counter
        self.pending[server][key] += 1
        if st[0] > 0:
            st[0] -= 1
            return True
        return False

    def sync(self, server: int, region: int, window: int) -> None:
        batch = self.pending[server]
        if not batch:
            return
        self.pending[server] = defaultdict(int)
        self.trips += 1
        owner = self.owner[region]
        for key, hits in batch.items():
            self.ops += 1
            st = owner.get(key)
            if st is None or st[1] != window:
                st = owner[key] = [0, window, 0]
            st[0] += hits
            st[2] += 1  # broadcast: every server's copy is now older


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1_000_000, help="requests per second")
    parser.add_argument("--seconds", type=float, default=2.0, help="virtual seconds")
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--balance", choices=("random", "sticky"), default="random")
    parser.add_argument("--hot-rate", type=float, default=0.0)
    parser.add_argument("--node-ops", type=float, default=117_000,
                        help="script runs per second one Redis node sustains")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    scale = args.rate / 1_000_000
    classes = {
        "user": KeyClass("user", Rule(10, 1, "fixed_window"), 0.75),
        "api": KeyClass("api", Rule(40_000, 1, "fixed_window"), 0.20),
        "bot": KeyClass("bot", Rule(100, 1, "fixed_window"), 0.05),
    }
    n_api, n_bot = 4, 100
    limits = {name: c.rule.limit for name, c in classes.items()}
    rng = random.Random(args.seed)
    eng = Engine()
    clock = eng.clock
    clock.set_wall(math.floor(clock.wall()) + 1.0 - TICK / 2)  # windows start on the tick
    region_servers = [list(range(r, SERVERS, REGIONS)) for r in range(REGIONS)]
    backends = [MemoryStore(clock=clock, max_keys=50_000_000) for _ in range(REGIONS)]
    stores = [HybridStore(backends[s % REGIONS], sync_interval=None, clock=clock,
                          hot_rate=args.hot_rate, deny_hold=SYNC, max_keys=200_000,
                          name=f"server-{s}") for s in range(SERVERS)]
    glob = GlobalLike()
    tallies = {"hybrid": {n: Tally() for n in classes}, "global": {n: Tally() for n in classes}}
    log_users = math.log(args.users)
    s_exp = args.zipf

    def user_rank(u: float) -> int:
        if s_exp == 1.0:  # CDF(k) ~ ln k / ln N
            return int(math.exp(u * log_users))
        # continuous Zipf inverse CDF on [1, N]
        a = 1.0 - s_exp
        return int((1 + u * (args.users ** a - 1)) ** (1 / a))

    weights = [classes["user"].share, classes["api"].share, classes["bot"].share]
    per_tick = args.rate * TICK
    carry = [0.0]
    window_of = [int(clock.wall())]

    def pick_server(key: str, region: int) -> int:
        servers = region_servers[region]
        if args.balance == "sticky":
            return servers[zlib.crc32(key.encode(), 1) % len(servers)]
        return servers[int(rng.random() * len(servers))]

    def tick() -> None:
        window = int(clock.wall())
        if window != window_of[0]:
            for t in tallies.values():
                for n, tally in t.items():
                    tally.close_window(limits[n])
            window_of[0] = window
        carry[0] += per_tick
        n = int(carry[0])
        carry[0] -= n
        rnd = rng.random
        for _ in range(n):
            u = rnd()
            if u < weights[0]:
                name = "user"
                key = f"user:{user_rank(rnd())}"
            elif u < weights[0] + weights[1]:
                name = "api"
                key = f"api:{int(rnd() * n_api)}"
            else:
                name = "bot"
                key = f"bot:{int(rnd() * n_bot)}"
            region = zlib.crc32(key.encode()) % REGIONS  # stable across runs
            server = pick_server(key, region)
            rule = classes[name].rule
            store = stores[server]
            trips = store._b._trips
            ok = store.hit(key, rule).allowed
            th = tallies["hybrid"][name]
            th.offered += 1
            th.admitted += ok
            if store._b._trips != trips:
                th.waited += 1
                th.latency += 0.5 + 1.5 * rnd()  # 0.5-2 ms in-region
            w = th.window.get(key)
            if w is None:
                w = th.window[key] = [0, 0]
            w[0] += 1
            w[1] += ok
            ok2 = glob.hit(server, region, key, rule.limit, window)
            tg = tallies["global"][name]
            tg.offered += 1
            tg.admitted += ok2
            w = tg.window.get(key)
            if w is None:
                w = tg.window[key] = [0, 0]
            w[0] += 1
            w[1] += ok2

    def sync(s: int) -> None:
        stores[s].sync()
        glob.sync(s, s % REGIONS, int(clock.wall()))

    wall = time.perf_counter()
    eng.every(TICK, tick)
    for s in range(SERVERS):
        eng.every(SYNC, sync, s, start=eng.now + rng.random() * SYNC)
    eng.run(until=eng.now + args.seconds)
    for t in tallies.values():
        for n, tally in t.items():
            tally.close_window(limits[n])
    elapsed = time.perf_counter() - wall

    seconds = args.seconds
    offered = sum(t.offered for t in tallies["hybrid"].values())
    h_ops = sum(s._b.ops for s in stores) / seconds
    h_trips = sum(s._b.round_trips for s in stores) / seconds / SERVERS
    g_ops = glob.ops / seconds
    g_trips = glob.trips / seconds / SERVERS
    direct_ops = offered / seconds
    print(f"fleet: {SERVERS} servers, {REGIONS} regions, {args.rate:,.0f} requests/s for "
          f"{seconds:g} s virtual ({offered:,} checks), {args.users:,} users (Zipf "
          f"{s_exp:g}), balance {args.balance}, hot_rate {args.hot_rate:g}; "
          f"ran in {elapsed:.0f} s")
    print()
    print("| strategy | backend ops/s | Redis nodes | round trips /server/s |")
    print("|---|---:|---:|---:|")
    print(f"| every check on Redis (RedisStore) | {direct_ops:,.0f} | "
          f"{direct_ops / args.node_ops:.1f} | {direct_ops / SERVERS:,.0f} |")
    print(f"| HybridStore | {h_ops:,.0f} | {h_ops / args.node_ops:.1f} | {h_trips:,.1f} |")
    print(f"| GLOBAL-like (last broadcast, no shares) | {g_ops:,.0f} | "
          f"{g_ops / args.node_ops:.1f} | {g_trips:,.1f} |")
    print()
    print("| key class | strategy | checks | waited for a round trip | mean wait (ms) | "
          "overshoot | false denials |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in classes:
        for strategy, label in (("hybrid", "HybridStore"), ("global", "GLOBAL-like")):
            t = tallies[strategy][name]
            over = (f"{100 * t.excess / max(1, t.over_admitted - t.excess):.2f} %"
                    if t.over_admitted else "-")
            fd = f"{t.false_denials:,} of {t.in_limit_requests:,}"
            waited = f"{100 * t.waited / max(1, t.offered):.1f} %" if strategy == "hybrid" \
                else "0 %"
            wait_ms = f"{t.latency / max(1, t.offered):.2f}"
            print(f"| {name} | {label} | {t.offered:,} | {waited} | {wait_ms} | {over} | {fd} |")
    print()
    print("(every check on Redis waits 1.25 ms on average in this model; the GLOBAL-like "
          "strategy never waits)")
    print(f"ops cut vs every check on Redis: HybridStore {direct_ops / max(1.0, h_ops):.1f}x, "
          f"GLOBAL-like {direct_ops / max(1.0, g_ops):.1f}x; scale {scale:g}")


if __name__ == "__main__":
    main()
