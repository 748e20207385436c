"""The overload scenario in virtual time: examples/shop_app.py on one simulated CPU,
driven open-loop through httpx's ASGITransport on FakeClock's event loop."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stormguard.testing import FakeClock

ROOT = Path(__file__).resolve().parents[2]

#: (method, path, tier, share of the requests): 20 % critical, 30 % degraded, 50 % sheddable
MIX = [("POST", "/checkout", "critical", 0.04), ("GET", "/cart", "critical", 0.16),
       ("GET", "/reviews", "degraded", 0.30),
       ("GET", "/recommendations", "sheddable", 0.30), ("GET", "/analytics", "sheddable", 0.20)]
CLIENT_TIMEOUT = 1.0  # a client gives up after this long: a later answer is not goodput
SLICE = 0.005  # CPython's sys.getswitchinterval(): threads take the GIL in turns this long


def shop_module() -> Any:
    name = "shop_app_example"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "shop_app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mean_cost() -> float:
    cost = shop_module().COST
    return sum(share * cost[path] for _, path, _, share in MIX)


@dataclass
class Result:
    duration: float
    latencies: dict[str, list[float]] = field(default_factory=dict)   # 200s, per tier
    shed: dict[str, list[float]] = field(default_factory=dict)        # 503s, per tier
    sent: dict[str, int] = field(default_factory=dict)
    arrivals: list[tuple[float, str, str]] = field(default_factory=list)  # counted: t, tier, path

    def success(self, tier: str) -> float:
        ok = sum(1 for t in self.latencies.get(tier, []) if t <= CLIENT_TIMEOUT)
        return ok / max(1, self.sent.get(tier, 0))

    def p99(self, tier: str, shed: bool = False) -> float:
        xs = sorted((self.shed if shed else self.latencies).get(tier, []))
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0

    def goodput(self) -> float:
        good = sum(1 for xs in self.latencies.values() for t in xs if t <= CLIENT_TIMEOUT)
        return good / self.duration


def simulate(protection: str, load: float, *, duration: float = 4.0, seed: int = 1,
             warmup: float = 1.0, warm_load: float = 1.0, **options: Any) -> Result:
    """Offer ``load`` x the CPU's capacity for ``duration`` virtual seconds, open loop
    (one request every 1 / rate seconds whether or not earlier ones finished), after
    ``warmup`` seconds at ``warm_load`` x (not counted: the evening before the sale, in
    which the limit learns the latency of the shop at work)."""
    clock = FakeClock()
    rng = random.Random(seed)
    rate = load / mean_cost()
    result = Result(duration)

    async def main() -> None:
        cpu = asyncio.Lock()  # one core, handed round in 5 ms slices as the GIL does

        async def work(seconds: float) -> None:
            while seconds > 0:
                async with cpu:
                    step = min(SLICE, seconds)
                    await asyncio.sleep(step)
                seconds -= step

        app = shop_module().build_app(protection, work=work, clock=clock, **options) \
            if protection != "none" else shop_module().build_app("none", work=work)
        transport = httpx.ASGITransport(app=app, client=("192.0.2.9", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:

            async def one(method: str, path: str, tier: str) -> None:
                t0 = clock.monotonic()
                r = await client.request(method, path)
                took = clock.monotonic() - t0
                if r.status_code == 200:
                    result.latencies.setdefault(tier, []).append(took)
                else:
                    assert r.status_code == 503, r.text
                    assert r.json()["tier"] == tier
                    result.shed.setdefault(tier, []).append(took)

            weights = [m[3] for m in MIX]
            warm = []
            slow = warm_load / mean_cost()
            for i in range(int(slow * warmup)):
                method, path, tier, _ = rng.choices(MIX, weights)[0]
                await asyncio.sleep(max(0.0, start + i / slow - clock.monotonic()))
                warm.append(asyncio.create_task(client.request(method, path)))
            await asyncio.gather(*warm)
            t0 = clock.monotonic()
            tasks = []
            for i in range(int(rate * duration)):
                method, path, tier, _ = rng.choices(MIX, weights)[0]
                result.sent[tier] = result.sent.get(tier, 0) + 1
                result.arrivals.append((i / rate, tier, path))
                await asyncio.sleep(max(0.0, t0 + i / rate - clock.monotonic()))
                tasks.append(asyncio.create_task(one(method, path, tier)))
            await asyncio.gather(*tasks)

    start = clock.monotonic()
    clock.run(main())
    return result


def main() -> None:
    """``python -m tests.overload.shop_sim``: the table in docs/performance.md (floor: the
    critical p99 of an ideal scheduler on the same arrivals, bench/overload.py's
    ``ideal``)."""
    tiers = ("critical", "degraded", "sheddable")
    base = simulate("adaptive", 0.25, warm_load=0.25).p99("critical")
    print(f"virtual time, one core in 5 ms slices; capacity {1 / mean_cost():.1f} req/s; "
          f"unloaded critical p99 {base * 1000:.1f} ms")
    ideal = runpy.run_path(str(ROOT / "bench" / "overload.py"))["ideal"]
    print("config    load seed | success: critical degraded sheddable | crit p99 | "
          "floor | late 503 | goodput")
    for protection in ("adaptive", "none"):
        for load in (1.0, 2.0, 4.0):
            for seed in (1, 2, 3, 4):
                r = simulate(protection, load, seed=seed, warm_load=load)
                late = sum(1 for xs in r.shed.values() for t in xs if t > 0.005)
                late_share = late / sum(r.sent.values())
                print(f"{protection:<9} {load:>3g}x {seed:>4} | "
                      + " ".join(f"{r.success(t):>8.2%}" for t in tiers)
                      + f" | {r.p99('critical') / base:>6.1f}x"
                      + f" | {ideal(r.arrivals, shop_module().COST, 0.0, False)[0] / base:>4.1f}x"
                      + f" | {late_share:>7.1%}"
                      + f" | {r.goodput() * mean_cost():>6.0%}")


if __name__ == "__main__":
    main()
