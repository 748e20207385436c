"""The built-in ``fleet`` simulation: 500 servers in 3 regions running the real HybridStore.

Every request is one ``hit`` on the real :class:`~stormguard.HybridStore` of the server
the load balancer picks, on the discrete-event engine (:class:`stormguard.sim.Engine`),
each server syncing every 100 ms at its own phase. One backend per region (a
:class:`~stormguard.MemoryStore` on the engine's clock standing for the region's Redis;
a region's keys are homed in it). Three kinds of keys, each limited per second (fixed
window of 1 s, so a window's admissions are exact to count):

* users: 10,000,000, Zipf popularity (exponent ``zipf``, 1.0: the rank-k user sends
  1/k of the top one's traffic; the top ones are hot, most are cold), 75 % of the
  traffic, limit 10 per second each;
* API keys: 4, 20 % of the traffic (50,000 requests per second each at the full
  1,000,000 per second), limit 40,000 per second;
* bots: 100, 5 % of the traffic (500 requests per second each at full scale), limit
  100 per second.

The load balancer spreads requests at random over the servers of the key's region
(``balance="sticky"`` sends each key to one server, as a consistent-hash balancer
would). In the same run, on the same requests, a Gubernator-GLOBAL-like strategy: each
server answers from the key's status as last broadcast (a new key: a fresh counter),
counts locally, and every 100 ms sends its hits to the key's owner, which adds them and
broadcasts the new status to every server of the region; no shares.

Reported: backend operations per second (a lease, a direct check, one key of a sync
round or of a GLOBAL batch), the Redis nodes they imply at ``node_ops`` operations per
second per node (the old model: every operation one script run at about 8.5 µs), and the
Redis *time* they cost under the measured cost model :data:`REDIS_COSTS` (a fixed cost per
script run plus a cost per key by kind: lease, forced add, board post, board entry read;
a direct check at its measured cost, a cold key's or a hot key's), whose nodes are Redis
seconds per second; round trips per server per second,
the checks that waited for a round trip (modelled 0.5-2 ms in-region), overshoot per
key class (admitted above the limit, over every key-second at or above its limit; also
over the key-seconds after the first second, when the first is a warm-up) and
false denials (denied requests of key-seconds whose demand was within the limit: a
perfect limiter admits them all). Not modelled: the round trip's duration in the
store's decisions (a reply is applied at the moment its request is sent).

``cold_allowance`` (default 0, the store's: every unit leased before it is spent) sets
the hybrid stores' cold allowance: with 1, a key a server holds no lease for is
admitted on it once per window and charged at the next round, the board telling every
server of the region which keys are exhausted (docs/hybrid.md).

``stormguard simulate fleet`` runs it at a tenth of the full rate for 2 s of virtual
time (a few seconds of real time); ``--rate 1000000`` is the full scale (about a minute:
40-55 s of CPU time for the 2 virtual seconds on a shared 2-core machine). ``bench/fleet.py`` is
the same model with the full scale as its default.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stormguard.ratelimit.rule import Rule
from stormguard.sim.engine import Engine
from stormguard.stores.hybrid import HybridStore
from stormguard.stores.memory import MemoryStore

if TYPE_CHECKING:  # sim.report imports the scenario model (greenlet): the fleet needs neither
    from stormguard.sim.report import Panel, Report

__all__ = ["FULL_RATE", "QUICK_RATE", "REGIONS", "SERVERS", "Fleet", "GlobalLike", "KeyClass",
           "Tally", "report", "simulate"]

REGIONS = 3
SERVERS = 500
TICK = 0.001  # requests are generated per millisecond
SYNC = 0.1  # each server's sync interval, and the GLOBAL-like batch interval
SAMPLE = 0.1  # the resolution of the plotted series
FULL_RATE = 1_000_000.0
QUICK_RATE = 100_000.0  # the default of ``stormguard simulate fleet``
REDIS_WAIT_MS = 1.25  # mean of the modelled 0.5-2 ms round trip

#: µs of Redis time per operation: INFO commandstats (EVALSHA usec) on a private
#: redis-server 7.0, cold keys, fixed window, measured with
#: ``PYTHONPATH=src:. STORMGUARD_PURE=1 python bench/redis_costs.py --n 2000 --repeat 10``
#: (the minimum of 10 runs of 2,000 keys per row, 2026-12-01 14:36 UTC on the shared
#: 2-core machine under load; docs/performance.md#hybrid-store). "script": the fixed cost
#: of one lease script run; "lease_key", "owe_key": one key in it (a lease, a forced add);
#: "post": a key appended to the board; "board_read": one board entry returned;
#: "direct_*": one rate-limit script run (RedisStore.hit) on a key absent (cold) or
#: present (hot).
#: "native_new", "native_present": a native forced add (``SET NX GET PX`` in the round's
#: pipeline, ``usec`` of SET) on a new key, on a key present (then charged in the next
#: round: a "native_append", or an "owe_key" near its limit), measured by the same
#: script on 2026-12-01 15:10 UTC (``--n 2000 --repeat 5``, the minimum of 5 runs).
#: "native_append": the next round's charge of a key present (``APPEND``, ``PEXPIRE``,
#: ``GET``, the three commands' ``usec``), measured by the same script on 2026-12-02
#: 14:10 UTC (``--n 2000 --repeat 5``: 0.67 µs, with native_new 0.55 in the same run)
#: and scaled to this set by native_new (0.90 / 0.55).
#: "board_read" since the board became one string (lease.lua): 0.331 x 0.338 / 0.673, the
#: ratio of the two formats measured side by side by the same script on 2026-12-01
#: 22:55 UTC (``--n 2000 --repeat 3``, the list 0.673 µs per entry, the string 0.338).
REDIS_COSTS: dict[str, float] = {
    "direct_cold": 14.60, "direct_hot": 15.14, "script": 9.88, "lease_key": 4.85,
    "owe_key": 3.48, "post": 0.96, "board_read": 0.166,
    "native_new": 0.90, "native_present": 0.44, "native_append": 1.10,
}

Balance = Literal["random", "sticky"]
STRATEGIES = {"hybrid": "HybridStore", "global": "GLOBAL-like"}


@dataclass
class KeyClass:
    name: str
    rule: Rule
    share: float  # of the total request rate
    keys: int


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
    # the same, over the windows after the first one (the warm-up)
    late_excess: int = 0
    late_over_admitted: int = 0
    windows: int = 0

    def close_window(self, limit: int) -> None:
        if not self.window:
            return
        late = self.windows > 0
        self.windows += 1
        for offered, admitted in self.window.values():
            if offered <= limit:
                self.false_denials += offered - admitted
                self.in_limit_requests += offered
            else:
                self.over_admitted += admitted
                excess = max(0, admitted - limit)
                self.excess += excess
                if late:
                    self.late_over_admitted += admitted
                    self.late_excess += excess
        self.window = {}

    @property
    def late_overshoot(self) -> float | None:
        """:attr:`overshoot` over the windows after the first."""
        if not self.late_over_admitted:
            return None
        return self.late_excess / max(1, self.late_over_admitted - self.late_excess)

    @property
    def overshoot(self) -> float | None:
        """Admitted above the limit, as a share of the limit's worth, over the key-seconds
        at or above the limit (None: there were none)."""
        if not self.over_admitted:
            return None
        return self.excess / max(1, self.over_admitted - self.excess)


class GlobalLike:
    """Gubernator GLOBAL, as far as the decision goes: local answers from the status last
    broadcast by the key's owner, hits forwarded in batches, no shares.

    The broadcast is modelled as a version per key and region: a server whose copy is
    older than the broadcast takes the broadcast remaining, then counts its own hits down
    from it (what every peer's cache does between two broadcasts)."""

    def __init__(self, servers: int = SERVERS, regions: int = REGIONS) -> None:
        self.cache: list[dict[str, list[int]]] = [{} for _ in range(servers)]
        self.pending: list[defaultdict[str, int]] = [defaultdict(int) for _ in range(servers)]
        # per region: key -> [hits counted by the owner, window, broadcast version]
        self.owner: list[dict[str, list[int]]] = [{} for _ in range(regions)]
        self.ops = 0
        self.trips = 0
        self.batches = 0  # one script run each, under the cost model

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
        self.batches += -(-len(batch) // 256)
        owner = self.owner[region]
        for key, hits in batch.items():
            self.ops += 1
            st = owner.get(key)
            if st is None or st[1] != window:
                st = owner[key] = [0, window, 0]
            st[0] += hits
            st[2] += 1  # broadcast: every server's copy is now older


def key_classes(users: int) -> dict[str, KeyClass]:
    return {
        "user": KeyClass("user", Rule(10, 1, "fixed_window"), 0.75, users),
        "api": KeyClass("api", Rule(40_000, 1, "fixed_window"), 0.20, 4),
        "bot": KeyClass("bot", Rule(100, 1, "fixed_window"), 0.05, 100),
    }


@dataclass
class Fleet:
    """One run: the parameters, the tallies per strategy and key class, the counters."""

    rate: float
    seconds: float
    users: int
    zipf: float
    balance: str
    hot_rate: float
    node_ops: float
    seed: int
    classes: dict[str, KeyClass]
    tallies: dict[str, dict[str, Tally]]
    hybrid_ops: int
    hybrid_trips: int
    global_ops: int
    global_trips: int
    # Redis µs over the run under the cost model: strategy -> µs
    redis_us: dict[str, float]
    # the hybrid stores' operations by kind (scripts, lease_keys, owe_keys, ...)
    kinds: dict[str, int]
    cold_allowance: int
    costs: dict[str, float]
    # Redis µs per second after the first second (strategy -> µs/s; empty: a short run)
    late_redis_us_per_s: dict[str, float]
    elapsed: float  # real seconds the run took
    # per SAMPLE of virtual time: (end time, checks, hybrid ops, global ops,
    # admitted per strategy and key class)
    samples: list[tuple[float, int, int, int, dict[str, dict[str, int]]]]

    @property
    def checks(self) -> int:
        return sum(t.offered for t in self.tallies["hybrid"].values())

    def nodes(self, strategy: str) -> float:
        """Redis seconds per second (nodes) under the cost model."""
        return self.redis_us[strategy] / 1e6 / self.seconds

    def _ops(self) -> dict[str, tuple[float, float]]:
        """strategy -> (backend ops per second, round trips per server per second)."""
        s = self.seconds
        direct = self.checks / s
        return {"redis": (direct, direct / SERVERS),
                "hybrid": (self.hybrid_ops / s, self.hybrid_trips / s / SERVERS),
                "global": (self.global_ops / s, self.global_trips / s / SERVERS)}

    @property
    def figures(self) -> dict[str, Any]:
        ops = self._ops()
        direct = ops["redis"][0]
        strategies: dict[str, Any] = {}
        for name, (per_s, trips) in ops.items():
            strategies[name] = {
                "backend_ops_per_s": per_s, "redis_nodes_by_ops": per_s / self.node_ops,
                "redis_us_per_s": self.redis_us[name] / self.seconds,
                "redis_nodes": self.nodes(name),
                "redis_nodes_after_first_second": (self.late_redis_us_per_s[name] / 1e6
                                                   if self.late_redis_us_per_s else None),
                "round_trips_per_server_per_s": trips,
                "ops_cut": direct / max(1.0, per_s),
                "redis_time_cut": self.redis_us["redis"] / max(1.0, self.redis_us[name])}
        classes: dict[str, Any] = {}
        for name, kc in self.classes.items():
            entry: dict[str, Any] = {"limit_per_s": kc.rule.limit, "keys": kc.keys,
                                     "share": kc.share}
            for strategy in STRATEGIES:
                t = self.tallies[strategy][name]
                waited = t.waited if strategy == "hybrid" else 0
                entry[strategy] = {
                    "checks": t.offered, "admitted": t.admitted,
                    "waited_rate": waited / max(1, t.offered),
                    "mean_wait_ms": t.latency / max(1, t.offered),
                    "overshoot_rate": t.overshoot, "admitted_over_limit": t.excess,
                    "overshoot_rate_after_first_second": t.late_overshoot,
                    "false_denials": t.false_denials,
                    "in_limit_requests": t.in_limit_requests}
            classes[name] = entry
        return {
            "simulation": "fleet", "servers": SERVERS, "regions": REGIONS,
            "rate_per_s": self.rate, "seconds": self.seconds, "checks": self.checks,
            "users": self.users, "zipf": self.zipf, "balance": self.balance,
            "hot_rate": self.hot_rate, "node_ops_per_s": self.node_ops, "seed": self.seed,
            "cold_allowance": self.cold_allowance, "redis_costs_us": self.costs,
            "hybrid_operations": self.kinds,
            "scale": self.rate / FULL_RATE, "real_time_s": self.elapsed,
            "redis_mean_wait_ms": REDIS_WAIT_MS,
            "strategies": strategies, "key_classes": classes}

    def text(self) -> str:
        """The tables bench/fleet.py prints (markdown)."""
        ops = self._ops()
        direct_ops, h_ops, g_ops = ops["redis"][0], ops["hybrid"][0], ops["global"][0]
        n = self.node_ops
        lines = [
            f"fleet: {SERVERS} servers, {REGIONS} regions, {self.rate:,.0f} requests/s for "
            f"{self.seconds:g} s virtual ({self.checks:,} checks), {self.users:,} users (Zipf "
            f"{self.zipf:g}), balance {self.balance}, hot_rate {self.hot_rate:g}, "
            f"cold_allowance {self.cold_allowance}; ran in {self.elapsed:.0f} s",
            "",
            "| strategy | backend ops/s | Redis nodes (ops / node_ops) | Redis ms per s | "
            "Redis nodes (Redis time) | round trips /server/s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| every check on Redis (RedisStore) | {direct_ops:,.0f} | "
            f"{direct_ops / n:.1f} | {self.nodes('redis') * 1e3:,.0f} | "
            f"{self.nodes('redis'):.2f} | {ops['redis'][1]:,.0f} |",
            f"| HybridStore | {h_ops:,.0f} | {h_ops / n:.1f} | {self.nodes('hybrid') * 1e3:,.0f} | "
            f"{self.nodes('hybrid'):.2f} | {ops['hybrid'][1]:,.1f} |",
            f"| GLOBAL-like (last broadcast, no shares) | {g_ops:,.0f} | "
            f"{g_ops / n:.1f} | {self.nodes('global') * 1e3:,.0f} | "
            f"{self.nodes('global'):.2f} | {ops['global'][1]:,.1f} |",
            "",
            *([f"Redis nodes (Redis time) after the first second: every check on Redis "
               f"{self.late_redis_us_per_s['redis'] / 1e6:.2f}, HybridStore "
               f"{self.late_redis_us_per_s['hybrid'] / 1e6:.2f}, GLOBAL-like "
               f"{self.late_redis_us_per_s['global'] / 1e6:.2f}", ""]
              if self.late_redis_us_per_s else []),
            "HybridStore's Redis time by kind (ms per s): " + ", ".join(
                f"{k} {v / self.seconds / 1e3:,.0f}" for k, v in self._hybrid_parts().items()),
            "",
            "| key class | strategy | checks | waited for a round trip | mean wait (ms) | "
            "overshoot | overshoot after 1st s | false denials |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
        for name in self.classes:
            for strategy, label in STRATEGIES.items():
                t = self.tallies[strategy][name]
                over = "-" if t.overshoot is None else f"{100 * t.overshoot:.2f} %"
                late = "-" if t.late_overshoot is None else f"{100 * t.late_overshoot:.2f} %"
                fd = f"{t.false_denials:,} of {t.in_limit_requests:,}"
                waited = (f"{100 * t.waited / max(1, t.offered):.1f} %"
                          if strategy == "hybrid" else "0 %")
                wait_ms = f"{t.latency / max(1, t.offered):.2f}"
                lines.append(f"| {name} | {label} | {t.offered:,} | {waited} | {wait_ms} | "
                             f"{over} | {late} | {fd} |")
        lines += [
            "",
            "(every check on Redis waits 1.25 ms on average in this model; the GLOBAL-like "
            "strategy never waits)",
            f"ops cut vs every check on Redis: HybridStore {direct_ops / max(1.0, h_ops):.1f}x, "
            f"GLOBAL-like {direct_ops / max(1.0, g_ops):.1f}x; Redis time cut: HybridStore "
            f"{self.nodes('redis') / max(1e-9, self.nodes('hybrid')):.1f}x, GLOBAL-like "
            f"{self.nodes('redis') / max(1e-9, self.nodes('global')):.1f}x; "
            f"scale {self.rate / FULL_RATE:g}",
            "Redis time: the cost model REDIS_COSTS (µs): " + ", ".join(
                f"{k} {v:g}" for k, v in self.costs.items())]
        return "\n".join(lines)

    def _hybrid_parts(self) -> dict[str, float]:
        """The hybrid stores' Redis µs by operation kind."""
        return hybrid_parts(self.kinds, self.costs)

    def panels(self) -> list[Panel]:
        """Backend operations per second, and admissions per second by key class."""
        xs: list[float] = []
        redis: list[float] = []
        hybrid: list[float] = []
        glob: list[float] = []
        admitted: dict[tuple[str, str], list[float]] = {
            (s, c): [] for s in STRATEGIES for c in self.classes}
        prev_t, prev_c, prev_h, prev_g = 0.0, 0, 0, 0
        prev_a = {s: dict.fromkeys(self.classes, 0) for s in STRATEGIES}
        for t, c, h, g, a in self.samples:
            dt = t - prev_t
            if dt <= 0:
                continue
            xs.append((prev_t + t) / 2)
            redis.append((c - prev_c) / dt)
            hybrid.append((h - prev_h) / dt)
            glob.append((g - prev_g) / dt)
            for (s, k), ys in admitted.items():
                ys.append((a[s][k] - prev_a[s][k]) / dt)
            prev_t, prev_c, prev_h, prev_g, prev_a = t, c, h, g, a
        ops = [("every check on Redis", xs, redis), ("HybridStore", xs, hybrid),
               ("GLOBAL-like", xs, glob)]
        adm = [(f"{k} {STRATEGIES[s]}", xs, ys) for (s, k), ys in admitted.items()]
        return [("backend operations (all regions)", "ops/s", False, ops),
                ("admitted requests by key class", "requests/s", True, adm)]


def hybrid_parts(kinds: dict[str, int], costs: dict[str, float]) -> dict[str, float]:
    """Redis µs by operation kind of the hybrid stores' counts (:class:`Backend` counters)."""
    return {"script runs": kinds["scripts"] * costs["script"],
            "lease keys": kinds["lease_keys"] * costs["lease_key"],
            "forced adds": kinds["owe_keys"] * costs["owe_key"],
            "native adds": (kinds.get("native_new", 0) * costs["native_new"]
                            + kinds.get("native_present", 0) * costs["native_present"]
                            + kinds.get("native_appends", 0) * costs["native_append"]),
            "board posts": kinds["posts"] * costs["post"],
            "board reads": kinds["board_reads"] * costs["board_read"],
            "direct checks": kinds["direct"] * costs["direct_cold"]}


# one function: the model's state lives in the closures' locals, the per-request loop's
# fastest lookups
def simulate(  # noqa: PLR0915
    *, rate: float = FULL_RATE, seconds: float = 2.0, users: int = 10_000_000,
    zipf: float = 1.0, balance: Balance = "random", hot_rate: float = 0.0,
    node_ops: float = 117_000, seed: int = 7, cold_allowance: int = 0,
    redis_costs: dict[str, float] | None = None, native_adds: bool = True,
) -> Fleet:
    """Run the fleet for ``seconds`` of virtual time at ``rate`` requests per second.

    ``node_ops``: the script runs per second one Redis node sustains (the figure for the
    rate-limit script on the project's benchmark machine, about 8.5 µs of Redis time
    each: the old model, still reported). ``redis_costs``: figures that replace those of
    :data:`REDIS_COSTS` (the Redis time model). ``cold_allowance``: the hybrid stores'.
    ``native_adds``: forced adds on fixed windows as the Redis backend sends them, native
    ``SET NX`` commands in the round's pipeline (False: every one a key of the script)."""
    costs = {**REDIS_COSTS, **(redis_costs or {})}
    unknown = set(costs) - set(REDIS_COSTS)
    if unknown:
        raise ValueError(f"redis_costs: unknown operation kinds {sorted(unknown)}")
    if rate <= 0 or seconds <= 0 or users < 1 or node_ops <= 0:
        raise ValueError("rate, seconds, users and node_ops must be positive")
    if balance not in ("random", "sticky"):
        raise ValueError(f"balance: 'random' or 'sticky' (got {balance!r})")
    classes = key_classes(users)
    n_api, n_bot = classes["api"].keys, classes["bot"].keys
    limits = {name: c.rule.limit for name, c in classes.items()}
    rng = random.Random(seed)
    eng = Engine()
    clock = eng.clock
    clock.set_wall(math.floor(clock.wall()) + 1.0 - TICK / 2)  # windows start on the tick
    region_servers = [list(range(r, SERVERS, REGIONS)) for r in range(REGIONS)]
    backends = [MemoryStore(clock=clock, max_keys=50_000_000) for _ in range(REGIONS)]
    stores = [HybridStore(backends[s % REGIONS], sync_interval=None, clock=clock,
                          hot_rate=hot_rate, deny_hold=SYNC, max_keys=200_000,
                          cold_allowance=cold_allowance, native_adds=native_adds,
                          name=f"server-{s}") for s in range(SERVERS)]
    for st in stores:
        st._b.native = native_adds  # as RedisBackend answers forced adds
    glob = GlobalLike()
    tallies = {s: {n: Tally() for n in classes} for s in STRATEGIES}
    direct_us = [0.0]  # every check on Redis: a cold key's first check in a window, or hot
    cold_us, hot_us = costs["direct_cold"], costs["direct_hot"]
    log_users = math.log(users)

    def user_rank(u: float) -> int:
        if zipf == 1.0:  # CDF(k) ~ ln k / ln N
            return int(math.exp(u * log_users))
        # continuous Zipf inverse CDF on [1, N]
        a = 1.0 - zipf
        return int((1 + u * (users ** a - 1)) ** (1 / a))

    w_user = classes["user"].share
    w_api = w_user + classes["api"].share
    per_tick = rate * TICK
    carry = [0.0]
    window_of = [int(clock.wall())]
    sticky = balance == "sticky"

    def pick_server(key: str, region: int) -> int:
        servers = region_servers[region]
        if sticky:
            return servers[zlib.crc32(key.encode(), 1) % len(servers)]
        return servers[int(rng.random() * len(servers))]

    kind_names = ("scripts", "lease_keys", "owe_keys", "posts", "board_reads", "direct",
                  "native_new", "native_present", "native_appends")
    # at the end of the first whole window: the counters so far (the warm-up)
    warm: dict[str, Any] = {}

    def snapshot() -> dict[str, Any]:
        return {"at": eng.now, "kinds": {k: sum(getattr(s._b, k) for s in stores)
                                         for k in kind_names},
                "direct_us": direct_us[0], "glob": (glob.batches, glob.ops)}

    def tick() -> None:
        window = int(clock.wall())
        if window != window_of[0]:
            if not warm and tallies["hybrid"]["user"].window:
                warm.update(snapshot())
            for t in tallies.values():
                for kc, tally in t.items():
                    tally.close_window(limits[kc])
            window_of[0] = window
        carry[0] += per_tick
        n = int(carry[0])
        carry[0] -= n
        rnd = rng.random
        for _ in range(n):
            u = rnd()
            if u < w_user:
                name = "user"
                key = f"user:{user_rank(rnd())}"
            elif u < w_api:
                name = "api"
                key = f"api:{int(rnd() * n_api)}"
            else:
                name = "bot"
                key = f"bot:{int(rnd() * n_bot)}"
            region = zlib.crc32(key.encode()) % REGIONS  # stable across runs
            server = pick_server(key, region)
            rule = classes[name].rule
            store = stores[server]
            trips = store._b.round_trips
            ok = store.hit(key, rule).allowed
            th = tallies["hybrid"][name]
            th.offered += 1
            th.admitted += ok
            if store._b.round_trips != trips:
                th.waited += 1
                th.latency += 0.5 + 1.5 * rnd()  # 0.5-2 ms in-region
            w = th.window.get(key)
            if w is None:
                w = th.window[key] = [0, 0]
                direct_us[0] += cold_us
            else:
                direct_us[0] += hot_us
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

    start = eng.now
    samples: list[tuple[float, int, int, int, dict[str, dict[str, int]]]] = []

    def sample() -> None:
        samples.append((
            eng.now - start, sum(t.offered for t in tallies["hybrid"].values()),
            sum(s._b.ops for s in stores), glob.ops,
            {s: {n: t.admitted for n, t in c.items()} for s, c in tallies.items()}))

    wall = time.perf_counter()
    eng.every(TICK, tick)
    for s in range(SERVERS):
        eng.every(SYNC, sync, s, start=eng.now + rng.random() * SYNC)
    # the sampler draws no random number: the run is the same with or without it
    eng.every(SAMPLE, sample, start=start + SAMPLE)
    eng.run(until=start + seconds)
    for t in tallies.values():
        for n, tally in t.items():
            tally.close_window(limits[n])
    elapsed = time.perf_counter() - wall
    end = snapshot()
    kinds = end["kinds"]

    def redis_time(snap: dict[str, Any]) -> dict[str, float]:
        batches, gops = snap["glob"]
        return {"redis": snap["direct_us"],
                "hybrid": sum(hybrid_parts(snap["kinds"], costs).values()),
                # the same model: a batch is a script run, each key in it a forced add
                "global": batches * costs["script"] + gops * costs["owe_key"]}

    redis_us = redis_time(end)
    late: dict[str, float] = {}
    if warm and end["at"] > warm["at"]:
        first = redis_time(warm)
        late = {k: (v - first[k]) / (end["at"] - warm["at"]) for k, v in redis_us.items()}
    return Fleet(
        rate=rate, seconds=seconds, users=users, zipf=zipf, balance=balance,
        hot_rate=hot_rate, node_ops=node_ops, seed=seed, classes=classes, tallies=tallies,
        hybrid_ops=sum(s._b.ops for s in stores),
        hybrid_trips=sum(s._b.round_trips for s in stores),
        global_ops=glob.ops, global_trips=glob.trips, elapsed=elapsed, samples=samples,
        redis_us=redis_us, kinds=kinds, cold_allowance=cold_allowance, costs=costs,
        late_redis_us_per_s=late)


def report(*, rate: float = QUICK_RATE, seconds: float = 2.0, users: int = 10_000_000,
           zipf: float = 1.0, balance: Balance = "random", hot_rate: float = 0.0,
           node_ops: float = 117_000, seed: int = 7, cold_allowance: int = 0,
           redis_costs: dict[str, float] | None = None) -> Report:
    """The fleet as ``stormguard simulate fleet`` shows it: a tenth of the full rate by
    default (a few seconds); ``rate=FULL_RATE`` is the 1,000,000 requests per second run."""
    from stormguard.sim.report import Report

    fleet = simulate(rate=rate, seconds=seconds, users=users, zipf=zipf, balance=balance,
                     hot_rate=hot_rate, node_ops=node_ops, seed=seed,
                     cold_allowance=cold_allowance, redis_costs=redis_costs)
    desc = (f"{SERVERS} servers in {REGIONS} regions, {rate:,.0f} requests/s for "
            f"{seconds:g} s of virtual time, each a hit on the real HybridStore of the "
            f"server the balancer ({balance}) picks; a GLOBAL-like strategy on the same "
            "requests")
    return Report(title="stormguard simulate fleet", text=fleet.text(), figures=fleet.figures,
                  panels=fleet.panels(), scenarios={"fleet": desc})
