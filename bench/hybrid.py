"""HybridStore against RedisStore and limits on one private Redis: 8 client processes.

    PYTHONPATH=src:. python bench/hybrid.py            # ~1 minute
    PYTHONPATH=src:. python bench/hybrid.py --seconds 1 --procs 2   # a quick look

Two workloads, each run by every contender in turn on a fresh private redis-server:

* mixed (closed loop, as fast as each process can): 90 % of the checks on 4 hot keys
  (limit far above the demand: every check admitted), 10 % on 100,000 cold keys
  (a random one each time, limit 100 per minute), fixed window;
* paced hot keys: the 4 hot keys only, at a fixed offered rate per process
  (``--paced``, two rates), to show the round trips do not follow the request rate.

Reported per contender: checks per second per process, Redis CPU time per admitted
check (the sum of ``usec`` over ``INFO commandstats``, i.e. the time Redis spent
executing commands, divided by the admitted checks; reset before each run; when scripts
ran, only theirs: Redis 7 also lists the commands a script calls, whose time is in the
script's already; plus the native forced adds of ``cold_allowance`` runs, ``SET`` s
outside the scripts, as their share by count of ``cmdstat_set``), and
round trips per process per second (the stores count theirs; for limits, the
commands Redis executed, each of its checks being one or more round trips).
The contenders: ``RedisStore`` (one script per check), ``HybridStore`` (sync every
100 ms; hot_rate 0 and 50, and cold_allowance 1: the cold keys admitted once per window
per process and charged in the sync round) and limits' ``FixedWindowRateLimiter`` over
its ``RedisStorage``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# bench/redis.py would shadow redis-py: keep this directory off the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from tests.redis_servers import start_redis  # noqa: E402

HOT = 4
COLD = 100_000


def make(kind: str, url: str) -> tuple[Any, Any, Any]:
    """(check(key, hot) -> admitted, round trips so far, close)."""
    from stormguard import HybridStore, RedisStore, Rule

    hot_rule = Rule(10**9, 60, algorithm="fixed_window")
    cold_rule = Rule(100, 60, algorithm="fixed_window")
    if kind == "limits":
        import limits
        import limits.storage
        import limits.strategies

        storage = limits.storage.RedisStorage(url)
        lim = limits.strategies.FixedWindowRateLimiter(storage)
        hot_item = limits.RateLimitItemPerMinute(10**9)
        cold_item = limits.RateLimitItemPerMinute(100)

        def check_l(key: str, hot: bool) -> bool:
            return bool(lim.hit(hot_item if hot else cold_item, key))

        return check_l, lambda: None, lambda: None, lambda: 0
    if kind == "RedisStore":
        store: Any = RedisStore(url, timeout=1.0)
    else:  # "HybridStore", "HybridStore hot_rate=50", "HybridStore cold_allowance=1"
        opts: dict[str, Any] = {}
        for part in kind.split()[1:]:
            name, _, value = part.partition("=")
            opts[name] = int(value) if name == "cold_allowance" else float(value)
        store = HybridStore(url, sync_interval=0.1, timeout=1.0, **opts)
    hit = store.hit

    def check(key: str, hot: bool) -> bool:
        return bool(hit(key, hot_rule if hot else cold_rule).allowed)

    def trips() -> int:
        if isinstance(store, RedisStore):
            return store.round_trips
        return int(store.stats()["backend_round_trips"])

    def natives() -> tuple[int, int]:
        """Native forced adds sent outside the scripts: SET NX GETs, and APPENDs (each
        with a PEXPIRE and a GET)."""
        b = getattr(store, "_b", None)
        return (int(getattr(b, "native_new", 0) + getattr(b, "native_present", 0)),
                int(getattr(b, "native_appends", 0)))

    return check, trips, store.close, natives


def worker(kind: str, url: str, seconds: float, rate: float, seed: int, barrier: Any,
           out: Any) -> None:
    check, trips, close, natives = make(kind, url)
    rng = random.Random(seed)
    hot_keys = [f"api:{i}" for i in range(HOT)]
    check(hot_keys[0], True)  # connect, load the scripts
    barrier.wait()
    t0 = time.perf_counter()
    trips0 = trips()
    n = admitted = 0
    end = t0 + seconds
    if rate <= 0:  # closed loop, mixed
        while True:
            for _ in range(100):
                if rng.random() < 0.9:
                    ok = check(hot_keys[n % HOT], True)
                else:
                    ok = check(f"user:{rng.randrange(COLD)}", False)
                admitted += ok
                n += 1
            if time.perf_counter() >= end:
                break
    else:  # paced, hot keys only
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due = int(rate * (now - t0)) - n
            for _ in range(due):
                admitted += check(hot_keys[n % HOT], True)
                n += 1
            time.sleep(0.001)  # real time: requests arrive over the run
    elapsed = time.perf_counter() - t0
    t1 = trips()
    out.put((n, admitted, None if t1 is None else t1 - trips0, elapsed, natives()))
    close()


def run(kind: str, url: str, client: Any, procs: int, seconds: float,
        rate: float) -> dict[str, float]:
    client.flushall()
    client.config_resetstat()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(kind, url, seconds, rate, i, barrier, out))
          for i in range(procs)]
    for p in ps:
        p.start()
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    stats = {k: v for k, v in client.info("commandstats").items()
             if k.split("|")[0] not in ("cmdstat_info", "cmdstat_config", "cmdstat_flushall")}
    # Redis 7 also counts the commands a script calls under their own names, inside the
    # script's usec already: when scripts ran, their usec is the work (the rest: a ping)
    scripts = [v for k, v in stats.items() if k.startswith(("cmdstat_eval", "cmdstat_fcall"))]
    counted = scripts if scripts else list(stats.values())
    usec = sum(v["usec"] for v in counted)
    # native forced adds are SETs (and APPEND, PEXPIRE, GET) outside the scripts, counted
    # with the scripts' own calls of those commands: their share of each command's usec
    # by count (an approximation)
    sent = {"set": sum(r[4][0] for r in results)}
    sent["append"] = sent["pexpire"] = sent["get"] = sum(r[4][1] for r in results)
    for name, native in sent.items():
        st = stats.get(f"cmdstat_{name}")
        if scripts and native and st:
            usec += st["usec"] * min(1.0, native / max(1, st["calls"]))
    calls = sum(v["calls"] for v in stats.values())
    n = sum(r[0] for r in results)
    admitted = sum(r[1] for r in results)
    elapsed = max(r[3] for r in results)
    # limits counts no round trips: take the commands Redis executed (at least one each)
    trips = calls if results[0][2] is None else sum(r[2] for r in results)
    return {"per_proc": n / elapsed / procs, "usec": usec / max(1, admitted),
            "trips": trips / elapsed / procs, "admitted": admitted / max(1, n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--paced", default="1000,5000",
                        help="offered rates per process for the paced runs ('' : none)")
    parser.add_argument("--kinds", default="RedisStore,limits,HybridStore,"
                        "HybridStore hot_rate=50,HybridStore cold_allowance=1",
                        help="the contenders of the mixed runs")
    args = parser.parse_args()
    server = start_redis()
    try:
        client = server.client()
        kinds = [k for k in args.kinds.split(",") if k]
        print(f"{args.procs} client processes, {args.seconds:g} s per run, one private "
              "redis-server; 2 cores shared with everything else on the machine")
        print()
        print("mixed: 90 % of checks on 4 hot keys, 10 % on 100,000 cold keys, closed loop")
        print()
        print("| contender | checks/s per process | Redis µs per admitted check | "
              "round trips /process/s | vs RedisStore (checks/s) | vs RedisStore (Redis µs) |")
        print("|---|---:|---:|---:|---:|---:|")
        base: dict[str, float] = {}
        for kind in kinds:
            r = run(kind, server.url, client, args.procs, args.seconds, 0.0)
            if not base:
                base = r
            print(f"| {kind} | {r['per_proc']:,.0f} | {r['usec']:.2f} | {r['trips']:,.0f} | "
                  f"{r['per_proc'] / base['per_proc']:.1f}x | "
                  f"1/{base['usec'] / max(1e-9, r['usec']):.1f} |")
            sys.stdout.flush()
        print()
        print("paced: the 4 hot keys only, at a fixed rate per process")
        print()
        print("| contender | offered /process/s | round trips /process/s | "
              "Redis µs per admitted check |")
        print("|---|---:|---:|---:|")
        for rate in (float(x) for x in args.paced.split(",") if x):
            for kind in ("RedisStore", "HybridStore"):
                r = run(kind, server.url, client, args.procs, args.seconds, rate)
                print(f"| {kind} | {rate:,.0f} | {r['trips']:,.1f} | {r['usec']:.3f} |")
                sys.stdout.flush()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
