"""How fast does `stormguard simulate` run virtual time? stormguard vs SimPy, one run.

    PYTHONPATH=src python bench/sim.py [--seconds 3600] [--rate 1000]

Four runs of the same traffic (Poisson, ``--rate`` requests/s for ``--seconds`` of
virtual time; 800 threads, each request holding one for 0.3 s):

* ``simpy``: SimPy's processes (generators) with a ``Resource`` of 800: the peer, a
  discrete-event model that runs no production code;
* ``engine``: the same on ``stormguard.sim.Engine`` as bare callbacks (a counter for
  the threads): the floor of the event queue itself;
* ``tasks``: the same with stormguard's simulated threads (greenlets, a ``Pool``): what
  running blocking code costs over callbacks;
* ``model``: the sale-night checkout (4 x 200 threads; 0.1 s of work, payment and
  inventory calls through real ``Bulkhead``s, the SMS call through real ``Fallback``,
  ``CircuitBreaker`` and ``Timeout``), the full ``stormguard.sim`` model;
* ``inbound``: ``model`` behind the front door (each order from one of 10,000 users,
  checked against a per-user rule on a real ``RateLimiter``, then a slot of a real
  tiered ``Shedder``): what the inbound side costs when a scenario uses it.

Prints real and CPU seconds per run (CPU time moves less with the load of a shared
machine), microseconds of CPU per request, ratios to SimPy, and the model's
projection for one virtual hour against the 60 s target.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections.abc import Callable

import simpy

from stormguard.sim import Engine, salenight
from stormguard.sim.model import run
from stormguard.sim.runtime import Gauge, Pool, new_engine, spawn
from stormguard.sim.scenario import from_dict

HOLD = 0.3
THREADS = 800


def bench_simpy(seconds: float, rate: float) -> int:
    env = simpy.Environment()
    threads = simpy.Resource(env, capacity=THREADS)
    rng = random.Random(1)
    done = [0]

    def request() -> simpy.events.ProcessGenerator:
        with threads.request() as req:
            yield req
            yield env.timeout(HOLD)
        done[0] += 1

    def arrivals() -> simpy.events.ProcessGenerator:
        while True:
            yield env.timeout(rng.expovariate(rate))
            env.process(request())

    env.process(arrivals())
    env.run(until=seconds)
    return done[0]


def bench_engine(seconds: float, rate: float) -> int:
    eng = Engine()
    rng = random.Random(1)
    state = {"busy": 0, "done": 0, "queued": 0}
    start = eng.now

    def finish() -> None:
        state["done"] += 1
        if state["queued"]:
            state["queued"] -= 1
            eng.call_later(HOLD, finish)
        else:
            state["busy"] -= 1

    def arrive() -> None:
        if state["busy"] < THREADS:
            state["busy"] += 1
            eng.call_later(HOLD, finish)
        else:
            state["queued"] += 1
        eng.call_later(rng.expovariate(rate), arrive)

    eng.call_later(rng.expovariate(rate), arrive)
    eng.run(until=start + seconds)
    return state["done"]


def bench_tasks(seconds: float, rate: float) -> int:
    eng, clock = new_engine()
    rng = random.Random(1)
    buckets = int(seconds) + 2
    pool = Pool(eng, clock, THREADS, None, Gauge(clock, buckets, 1.0), Gauge(clock, buckets, 1.0))
    done = [0]

    def request() -> None:
        pool.acquire()
        clock.sleep(HOLD)
        pool.release()
        done[0] += 1

    def arrive() -> None:
        spawn(eng, clock, request)
        eng.call_later(rng.expovariate(rate), arrive)

    eng.call_later(rng.expovariate(rate), arrive)
    eng.run(until=seconds)
    return done[0]


def bench_model(seconds: float, rate: float) -> int:
    data = salenight.scenarios()["bulkhead"]
    data["duration"] = seconds
    data["measure"] = {"start": 0, "end": seconds}
    data["dependencies"]["sms"] = {"latency": "5ms"}  # a normal night, all the way
    data["traffic"][0]["arrival"]["rate"] = rate
    steps = data["services"]["checkout"]["endpoints"]["order"]["steps"]
    steps[3]["policies"] = [{"fallback": {}}, {"circuit_breaker": {"window": 20}},
                            {"timeout": "1s"}]
    result = run(from_dict(data))
    return result.series.total("orders:success") + result.series.total("orders:fallback")


def bench_inbound(seconds: float, rate: float) -> int:
    """The ``model`` run behind the front door: every order from one of 10,000 users
    (uniform) checked against a per-user rule on one shared store, then given a slot of
    a tiered shedder (a fixed 1,000 slots per instance: it never sheds here). What the
    inbound side costs per request when a scenario uses it."""
    data = salenight.scenarios()["bulkhead"]
    data["duration"] = seconds
    data["measure"] = {"start": 0, "end": seconds}
    data["dependencies"]["sms"] = {"latency": "5ms"}
    data["traffic"][0]["arrival"]["rate"] = rate
    data["traffic"][0]["keys"] = {"count": 10_000, "user": "user-{i}"}
    svc = data["services"]["checkout"]
    svc["endpoints"]["order"]["route"] = "POST /checkout"
    svc["rate_limit"] = {"rules": [{"name": "per-user", "scope": "user", "limit": 100,
                                    "window": "1s"}]}
    svc["load_shedding"] = {"limit": 1000, "priorities": {"POST /checkout*": "critical"}}
    steps = svc["endpoints"]["order"]["steps"]
    steps[3]["policies"] = [{"fallback": {}}, {"circuit_breaker": {"window": 20}},
                            {"timeout": "1s"}]
    result = run(from_dict(data))
    return result.series.total("orders:success") + result.series.total("orders:fallback")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3600.0, help="virtual seconds per run")
    ap.add_argument("--rate", type=float, default=1000.0, help="requests per virtual second")
    args = ap.parse_args()
    print(f"# stormguard.sim vs SimPy: {args.seconds:g} virtual s at {args.rate:g} requests/s")
    print(f"# Python {platform.python_version()} on {platform.machine()}, "
          f"{platform.platform()}")
    runs: list[tuple[str, Callable[[float, float], int]]] = [
        ("simpy", bench_simpy), ("engine", bench_engine), ("tasks", bench_tasks),
        ("model", bench_model), ("inbound", bench_inbound)]
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    print("| run | requests | real s | CPU s | µs/request (CPU) | vs simpy (CPU) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fn in runs:
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn(args.seconds, args.rate)
        times[name] = el = time.perf_counter() - t0
        cpu[name] = c = time.process_time() - c0
        print(f"| {name} | {n:,} | {el:.2f} | {c:.2f} | {c / max(n, 1) * 1e6:.2f} | "
              f"{c / cpu['simpy']:.2f}x |", flush=True)
    scale = 3600.0 / args.seconds * args.rate / 1000.0
    hour, hour_cpu = times["model"] * scale, cpu["model"] * scale
    print(f"\nmodel: one virtual hour at 1,000 requests/s takes {hour:.0f} s of real time "
          f"({hour_cpu:.0f} s of CPU) here; the target is 60 s")
    extra = (cpu["inbound"] - cpu["model"]) / max(1.0, args.seconds * args.rate) * 1e6
    print(f"inbound (rate limit + shedder on every order): "
          f"{cpu['inbound'] / cpu['model']:.2f}x the model's CPU time, {extra:.1f} µs more "
          "per request")


if __name__ == "__main__":
    main()
