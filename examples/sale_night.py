"""The sale night, outbound: a checkout that never stops while its SMS provider does.

    PYTHONPATH=src python examples/sale_night.py              # full scale, about 2 hours
                                                              # of virtual time
    PYTHONPATH=src python examples/sale_night.py --scale 0.1  # rates x 0.1, same ratios
    PYTHONPATH=src python examples/sale_night.py --queue sqlite:///tmp/sms.db

1,000 orders/s. Each order sends an SMS through

    q.fallback("send_sms") -> Timeout(total=3) -> Retry(budget) -> CircuitBreaker(window 20,
    50 %, open 30 s, 3 trials) -> Bulkhead(20) -> Timeout(1.0) -> Shaper(500/s)

The provider answers in 200 ms; then, for 40 minutes, in 30 s; then in 200 ms again. The
provider's contract allows 500 SMS/s, so even on a good night half the SMS must wait:
what the checkout cannot send at once is deferred to a queue, and a worker drains the
queue through the same pace (``Pipeline(shaper, breaker, Timeout(1.0))``: two shapers
with their own ``max_wait`` sharing one store, hence one pace). Everything runs on a
FakeClock: the whole night takes minutes of CPU, not hours.

:func:`simulate` is the night as a function (the test runs it scaled down on a SQLite
queue); ``main`` prints the figures docs/resilience.md tells.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from stormguard import (
    Bulkhead,
    CircuitBreaker,
    Deferred,
    DeferredQueue,
    MemoryStore,
    Pipeline,
    Retry,
    RetryBudget,
    Shaper,
    Timeout,
)
from stormguard.observability.events import Event, StateChanged
from stormguard.testing import FakeClock


@dataclass
class Night:
    """The night's parameters (full scale by default); :meth:`scaled` keeps the ratios."""

    orders_per_s: float = 1000.0
    normal: float = 60.0          # seconds of 200 ms answers before the slowdown
    slow_for: float = 2400.0      # 40 minutes of 30 s answers
    after: float = 60.0           # orders keep coming this long after the recovery
    sms_ok: float = 0.2
    sms_slow: float = 30.0
    shaper_rate: float = 500.0    # the provider's contract
    bulkhead: int = 20            # the checkout's SMS workers
    worker_concurrency: int = 100  # 100 x 200 ms = 500/s: the worker can fill the pace
    queue: str = "memory://"
    seed: int = 11
    tick: float = 0.01            # orders arrive in batches of one tick (10 ms)

    def scaled(self, scale: float, **changes: Any) -> Night:
        """Rates x ``scale`` (orders, the pace, the checkout's and the worker's workers),
        so every ratio of the night is kept; durations unchanged unless given."""
        fields = dict(self.__dict__)
        fields.update(orders_per_s=self.orders_per_s * scale,
                      shaper_rate=self.shaper_rate * scale,
                      bulkhead=max(1, round(self.bulkhead * scale)),
                      worker_concurrency=max(1, round(self.worker_concurrency * scale)),
                      tick=max(self.tick, 1 / (self.orders_per_s * scale)))
        fields.update(changes)
        return Night(**fields)

    @property
    def slow_at(self) -> float:
        return self.normal

    @property
    def recovered_at(self) -> float:
        return self.normal + self.slow_for

    @property
    def sale_ends(self) -> float:
        return self.normal + self.slow_for + self.after


@dataclass
class Report:
    """What the night measured (times in seconds from the sale's start)."""

    orders: int = 0
    failed: int = 0               # orders whose SMS step raised (must be 0)
    sent_directly: int = 0
    deferred: int = 0
    resubmitted: int = 0          # deferred orders the app sent again (same key)
    resubmitted_same_job: int = 0  # ... that got the same job back (nothing enqueued)
    first_open_after_slowdown: float | None = None
    breaker_opened: int = 0
    checkout_max_in_flight: int = 0   # SMS calls holding checkout workers at once
    provider_max_per_second: int = 0  # most calls the provider received in any 1 s
    after_recovery_max_per_second: int = 0
    checkout_p50: float = 0.0     # the SMS step of an order, as the customer waits it
    checkout_p99: float = 0.0
    checkout_max: float = 0.0
    queue_peak: int = 0
    drained_at: float = 0.0       # when the last SMS was delivered
    delivered: int = 0            # distinct orders whose SMS the provider sent
    duplicates: int = 0           # SMS sent more than once for one order
    lost: int = 0                 # orders with no SMS at the end
    queue_end: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0


class Provider:
    """The SMS provider: 200 ms, then 30 s for ``slow_for``, then 200 ms. An SMS is sent
    when its call completes (a call cancelled by a timeout sent nothing)."""

    def __init__(self, night: Night, clock: FakeClock, total: int) -> None:
        self.night = night
        self.clock = clock
        self.t0 = clock.monotonic()
        self.sent = bytearray(total)  # per order: how many times its SMS was sent
        self.in_flight = {"checkout": 0, "worker": 0}
        self.max_in_flight = {"checkout": 0, "worker": 0}
        self.window: deque[int] = deque()  # arrival times (us) of the last second
        self.max_per_second = 0
        self.max_after_recovery = 0
        self.last_sent = 0.0
        self.by_worker = 0  # SMS the worker sent (deferred ones delivered)

    def _arrive(self, origin: str) -> float:
        now = self.clock.monotonic() - self.t0
        us = round(now * 1_000_000)
        w = self.window
        w.append(us)
        while w[0] <= us - 1_000_000:  # the second (now - 1 s, now]
            w.popleft()
        n = len(w)
        self.max_per_second = max(self.max_per_second, n)
        if now >= self.night.recovered_at:
            self.max_after_recovery = max(self.max_after_recovery, n)
        self.in_flight[origin] += 1
        self.max_in_flight[origin] = max(self.max_in_flight[origin], self.in_flight[origin])
        slow = self.night.slow_at <= now < self.night.recovered_at
        return self.night.sms_slow if slow else self.night.sms_ok

    async def _send(self, order: int, origin: str) -> str:
        latency = self._arrive(origin)
        try:
            await asyncio.sleep(latency)  # virtual: the loop is the FakeClock's
        finally:
            self.in_flight[origin] -= 1
        self.sent[order] += 1
        if origin == "worker":
            self.by_worker += 1
        self.last_sent = self.clock.monotonic() - self.t0
        return "sent"

    async def send_sms(self, order: int, to: str) -> str:
        """The checkout's call."""
        return await self._send(order, "checkout")

    async def send_queued(self, order: int, to: str) -> str:
        """The worker's call (same arguments: the deferred payload)."""
        return await self._send(order, "worker")


def policies(night: Night, clock: FakeClock, q: DeferredQueue, provider: Provider,
             on_breaker: Any) -> tuple[Pipeline, Any]:
    """The checkout's SMS pipeline and the queue's worker, sharing one breaker and one pace."""
    pace = MemoryStore(clock=clock)  # in production: the Redis URL the fleet shares
    breaker = CircuitBreaker(window=20, failure_rate=0.5, open_for=30.0, half_open_calls=3,
                             name="sms", clock=clock, listeners=(on_breaker,))
    jitter = random.Random(night.seed)  # noqa: S311 - retry jitter, not a secret
    checkout = Pipeline(
        q.fallback("send_sms", key=lambda p: f"sms:{p['order']}"),
        Timeout(total=3.0, clock=clock),
        Retry(attempts=3, base=0.1, max_delay=1.0, rng=jitter, clock=clock,
              budget=RetryBudget(ratio=0.1, min_per_second=1.0, window=10.0, clock=clock)),
        breaker,
        Bulkhead(night.bulkhead, clock=clock),
        Timeout(1.0, clock=clock),
        Shaper(rate=night.shaper_rate, max_wait=0.1, store=pace, key="sms-provider",
               name="sms-checkout", clock=clock),
    )
    worker = q.worker(
        {"send_sms": provider.send_queued},
        pipeline=Pipeline(Shaper(rate=night.shaper_rate, max_wait=2.0, store=pace,
                                 key="sms-provider", name="sms-worker", clock=clock),
                          breaker, Timeout(1.0, clock=clock)),
        concurrency=night.worker_concurrency, max_attempts=10, visibility_timeout=30.0)
    return checkout, worker


class Sale:
    """The night's traffic: orders arriving, the worker draining, until the queue is empty."""

    def __init__(self, night: Night, clock: FakeClock, report: Report) -> None:
        self.night, self.clock, self.report = night, clock, report
        self.total = int(night.orders_per_s * night.sale_ends + 0.5)
        self.provider = Provider(night, clock, self.total)
        self.q = DeferredQueue(night.queue, clock=clock)
        self.opened: list[float] = []
        self.waits: list[float] = []
        self.checkout, self.worker = policies(night, clock, self.q, self.provider,
                                              self.on_breaker)

    def on_breaker(self, event: Event) -> None:
        if isinstance(event, StateChanged) and event.new == "open":
            self.opened.append(event.at - self.provider.t0)

    async def order(self, n: int) -> None:
        report, clock = self.report, self.clock
        start = clock.monotonic()
        try:
            result = await self.checkout.acall(self.provider.send_sms, n, "+8801700000000")
        except Exception:
            report.failed += 1
        else:
            if isinstance(result, Deferred):
                report.deferred += 1
                if n % 100 == 0:  # the app resubmits 1 % of orders: the same idempotency key
                    again = await self.q.adefer("send_sms",
                                                {"order": n, "to": "+8801700000000"},
                                                key=f"sms:{n}")
                    report.resubmitted += 1
                    report.resubmitted_same_job += again == result.job_id
            else:
                report.sent_directly += 1
        self.waits.append(clock.monotonic() - start)

    async def arrivals(self) -> None:
        night, report = self.night, self.report
        per_tick = night.orders_per_s * night.tick
        due = 0.0
        n = 0
        tasks: set[asyncio.Task[None]] = set()
        while n < self.total:
            due += per_tick
            while n < min(self.total, int(due + 1e-9)):
                task = asyncio.ensure_future(self.order(n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            report.queue_peak = max(report.queue_peak,
                                    report.deferred - self.provider.by_worker)
            await asyncio.sleep(night.tick)
        report.orders = n
        while tasks:
            await asyncio.gather(*tasks)

    async def until_drained(self) -> None:
        await self.arrivals()
        while True:  # the queue's own count is asked only once ours says it is empty
            if self.provider.by_worker >= self.report.deferred:
                stats = self.q.stats()
                if stats["pending"] == 0 and stats["in_flight"] == 0:
                    break
            await asyncio.sleep(1.0)
        self.worker.stop()

    async def run(self) -> None:
        await asyncio.gather(self.worker.arun(), self.until_drained())
        await self.q.aclose()
        self.report.queue_end = self.q.stats()
        self.q.close()
        measure(self.night, self.report, self.provider, self.opened, self.waits)


def measure(night: Night, report: Report, provider: Provider, opened: list[float],
            waits: list[float]) -> None:
    report.breaker_opened = len(opened)
    after = [t - night.slow_at for t in opened if t >= night.slow_at]
    report.first_open_after_slowdown = after[0] if after else None
    report.checkout_max_in_flight = provider.max_in_flight["checkout"]
    report.provider_max_per_second = provider.max_per_second
    report.after_recovery_max_per_second = provider.max_after_recovery
    waits.sort()
    report.checkout_p50 = statistics.median(waits)
    report.checkout_p99 = waits[int(0.99 * (len(waits) - 1))]
    report.checkout_max = waits[-1]
    report.drained_at = provider.last_sent
    counts = provider.sent
    report.delivered = sum(1 for c in counts if c >= 1)
    report.duplicates = sum(c - 1 for c in counts if c > 1)
    report.lost = sum(1 for c in counts if c == 0)


def simulate(night: Night) -> Report:
    """Run the night on a FakeClock and measure it."""
    clock = FakeClock()
    report = Report()
    cpu = time.process_time()
    clock.run(Sale(night, clock, report).run())
    report.cpu_seconds = time.process_time() - cpu
    return report


def describe(night: Night, r: Report) -> str:
    opened = ("never" if r.first_open_after_slowdown is None
              else f"{r.first_open_after_slowdown:.2f} s after the slowdown")
    return "\n".join([
        f"orders: {r.orders:,} at {night.orders_per_s:g}/s for {night.sale_ends:g} s; "
        f"the provider slow (30 s) from {night.slow_at:g} s to {night.recovered_at:g} s",
        f"failed orders: {r.failed}",
        f"SMS sent by the checkout itself: {r.sent_directly:,}; deferred to the queue: "
        f"{r.deferred:,}; resubmitted with the same key: {r.resubmitted:,} "
        f"({r.resubmitted_same_job:,} got the same job back)",
        f"breaker: first opened {opened}; opened {r.breaker_opened} times in all",
        f"checkout's SMS workers busy at once: at most {r.checkout_max_in_flight} "
        f"(bulkhead {night.bulkhead})",
        f"the SMS step of an order: p50 {r.checkout_p50 * 1000:.0f} ms, p99 "
        f"{r.checkout_p99 * 1000:.0f} ms, max {r.checkout_max:.2f} s",
        f"provider: at most {r.provider_max_per_second} calls in any second (after the "
        f"recovery: {r.after_recovery_max_per_second}; contract {night.shaper_rate:g}/s)",
        f"queue: peak {r.queue_peak:,} jobs; last SMS delivered at {r.drained_at:,.0f} s "
        f"({(r.drained_at - night.recovered_at) / 60:.1f} min after the recovery)",
        f"delivered: {r.delivered:,} of {r.orders:,} orders; duplicates {r.duplicates}; "
        f"lost {r.lost}; queue at the end {r.queue_end}",
        f"({r.cpu_seconds:.0f} s of CPU for {r.drained_at / 60:.0f} virtual minutes)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every rate (orders, pace, workers); 1 = full scale")
    parser.add_argument("--slow-for", type=float, default=2400.0,
                        help="seconds the provider takes 30 s (default 40 minutes)")
    parser.add_argument("--queue", default="memory://",
                        help="the DeferredQueue URL (default memory://)")
    args = parser.parse_args(argv)
    night = Night().scaled(args.scale, slow_for=args.slow_for, queue=args.queue)
    print(describe(night, simulate(night)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
