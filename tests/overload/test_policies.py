"""ConcurrencyLimit and AdaptiveThrottle, sync and asyncio, on real threads and the
virtual clock."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from stormguard import (
    AdaptiveLimit,
    AdaptiveThrottle,
    ConcurrencyLimit,
    ConfigError,
    Pipeline,
    Retry,
    Shed,
    StormguardError,
    Throttled,
)
from stormguard.deadline import scope
from stormguard.observability.events import CallThrottled, Event
from stormguard.testing import FakeClock
from tests.resilience.conftest import Mode


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Mode:
    return Mode(request.param)


class Scripted(random.Random):
    """A random.Random whose draws are given: the rejections become predictable."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


class Rejected(Exception):
    """The dependency said no (a 503, a 429)."""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- AdaptiveThrottle -------------------------------------------------------------------------
def test_throttle_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="k"):
        AdaptiveThrottle(k=0.5)
    with pytest.raises(ConfigError, match="window"):
        AdaptiveThrottle(window=0)
    with pytest.raises(ConfigError, match="on"):
        AdaptiveThrottle(on=42)  # type: ignore[arg-type]


def test_a_healthy_dependency_is_never_throttled(mode: Mode, clock: FakeClock) -> None:
    throttle = AdaptiveThrottle(clock=clock, rng=random.Random(1))
    for _ in range(500):
        assert run(mode.call(throttle, lambda: "ok")) == "ok"
    assert throttle.counts() == (500, 500)
    assert throttle.probability() == 0.0


def test_a_dependency_that_rejects_everything_stops_receiving_calls(mode: Mode,
                                                                    clock: FakeClock) -> None:
    throttle = AdaptiveThrottle(clock=clock, rng=random.Random(7))
    sent = 0
    throttled = 0

    def backend() -> None:
        nonlocal sent
        sent += 1
        raise Rejected

    for _ in range(1000):
        try:
            run(mode.call(throttle, backend))
        except Throttled:
            throttled += 1
        except Rejected:
            pass
    # with no accepts, p = requests / (requests + 1): about ln(1000) calls get through
    assert sent <= 25
    assert throttled == 1000 - sent
    assert throttle.counts() == (1000, 0)  # locally throttled calls count as requests


def test_the_rejection_probability_is_the_formula(clock: FakeClock) -> None:
    """(requests - k * accepts) / (requests + 1): 10 accepted, then rejections until the
    probability is positive; each call is rejected exactly when the draw is below it."""
    draws = [0.5] * 200
    throttle = AdaptiveThrottle(k=2.0, clock=clock, rng=Scripted(draws))
    for _ in range(10):
        throttle.call(lambda: None)
    expected: list[bool] = []
    got: list[bool] = []
    probabilities: list[tuple[float, float]] = []
    requests, accepts = 10, 10
    for _ in range(60):
        p = max(0.0, (requests - 2.0 * accepts) / (requests + 1))
        assert throttle.probability() == pytest.approx(p)
        expected.append(p > 0.5)
        try:
            throttle.call(lambda: (_ for _ in ()).throw(Rejected()))
        except Throttled as exc:
            got.append(True)
            probabilities.append((exc.probability, p))
        except Rejected:
            got.append(False)
        requests += 1
    assert got == expected
    assert any(got)
    assert not all(got)
    for told, p in probabilities:
        assert told == pytest.approx(p)


def test_errors_outside_on_are_accepts(mode: Mode, clock: FakeClock) -> None:
    """A 404 is an answer: only the exceptions of on= mean "rejected"."""
    throttle = AdaptiveThrottle(on=Rejected, clock=clock, rng=random.Random(3))

    def not_found() -> None:
        raise KeyError("404")

    for _ in range(200):
        with pytest.raises(KeyError):
            run(mode.call(throttle, not_found))
    assert throttle.counts() == (200, 200)
    assert throttle.probability() == 0.0


def test_the_window_forgets(clock: FakeClock) -> None:
    throttle = AdaptiveThrottle(window=60.0, clock=clock, rng=random.Random(3))
    for _ in range(50):
        with pytest.raises((Rejected, Throttled)):
            throttle.call(lambda: (_ for _ in ()).throw(Rejected()))
    assert throttle.probability() > 0.9
    clock.advance(30.0)
    assert throttle.counts() == (50, 0)
    clock.advance(31.0)  # every bucket of the window has turned over
    assert throttle.counts() == (0, 0)
    assert throttle.call(lambda: "back") == "back"


def test_throttled_events_and_error_type(clock: FakeClock) -> None:
    events: list[Event] = []
    throttle = AdaptiveThrottle(clock=clock, rng=Scripted([0.0] * 10), listeners=(events.append,))
    with pytest.raises(Rejected):
        throttle.call(lambda: (_ for _ in ()).throw(Rejected()))
    with pytest.raises(Throttled) as info:
        throttle.call(lambda: "never sent")
    assert isinstance(info.value, StormguardError)
    assert [type(e) for e in events] == [CallThrottled]
    assert events[0].requests == 2  # type: ignore[attr-defined]
    assert events[0].accepts == 0  # type: ignore[attr-defined]


def test_throttle_counts_nothing_lost_across_threads() -> None:
    throttle = AdaptiveThrottle(rng=random.Random(5))
    n, m = 8, 2000

    def work() -> None:
        for _ in range(m):
            throttle.call(lambda: None)

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttle.counts() == (n * m, n * m)


# -- ConcurrencyLimit ---------------------------------------------------------------------------
def test_concurrency_limit_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="max_wait"):
        ConcurrencyLimit(5, max_wait=-1)
    with pytest.raises(ConfigError, match="limit"):
        ConcurrencyLimit("5")  # type: ignore[arg-type]


def test_a_fixed_limit_is_never_exceeded_by_real_threads() -> None:
    limit = ConcurrencyLimit(4)
    lock = threading.Lock()
    now = peak = 0
    shed = 0
    reasons: set[str] = set()
    barrier = threading.Barrier(12)

    def dependency() -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        for _ in range(2000):
            pass
        with lock:
            now -= 1

    def work() -> None:
        nonlocal shed
        barrier.wait()
        for _ in range(300):
            try:
                limit.call(dependency)
            except Shed as exc:
                with lock:
                    shed += 1
                    reasons.add(exc.reason)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak <= 4
    assert reasons <= {"capacity"}
    assert limit.in_flight == 0
    stats = limit.stats()
    assert stats["admitted"]["critical"] + shed == 12 * 300


def test_a_call_waits_up_to_max_wait_clipped_to_the_deadline() -> None:
    clock = FakeClock()
    limit = ConcurrencyLimit(1, max_wait=0.5, clock=clock)

    async def hold(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    async def main() -> tuple[str, float, float]:
        first = asyncio.create_task(limit.acall(hold, 0.2))
        await asyncio.sleep(0)
        t0 = clock.monotonic()
        second = await limit.acall(hold, 0.0)  # waits 0.2 s for the slot
        waited = clock.monotonic() - t0
        await first
        blocker = asyncio.create_task(limit.acall(hold, 5.0))
        await asyncio.sleep(0)
        t1 = clock.monotonic()
        with scope(0.1, clock=clock), pytest.raises(Shed) as info:
            await limit.acall(hold, 0.0)
        assert info.value.reason == "queue_timeout"
        clipped = clock.monotonic() - t1
        blocker.cancel()
        return second, waited, clipped

    second, waited, clipped = clock.run(main())
    assert second == "done"
    assert waited == pytest.approx(0.2)
    assert clipped == pytest.approx(0.1)


def test_the_adaptive_limit_follows_a_dependency_that_queues() -> None:
    """A dependency that serves 4 calls at once (beyond, they queue): 40 concurrent
    callers on the virtual clock; the limit falls from 20 toward 4 and the dependency's
    own queue stays short."""
    clock = FakeClock()
    limit = ConcurrencyLimit(AdaptiveLimit(initial=20), clock=clock)
    gate = asyncio.Semaphore(4)
    worst = {"queued": 0}
    waiting = 0

    async def dependency() -> None:
        nonlocal waiting
        waiting += 1
        worst["queued"] = max(worst["queued"], waiting - 4)
        async with gate:
            waiting -= 1
            await asyncio.sleep(0.01)

    async def caller() -> None:
        for _ in range(200):
            try:
                await limit.acall(dependency)
            except Shed:
                await asyncio.sleep(0.005)

    async def main() -> None:
        await asyncio.gather(*(caller() for _ in range(40)))

    clock.run(main())
    assert limit.limit <= 4 * limit.shedder.limit.tolerance + 1  # type: ignore[union-attr]
    assert limit.stats()["shed"]["critical"] > 0


def test_failures_do_not_teach_the_limit(mode: Mode, clock: FakeClock) -> None:
    adaptive = AdaptiveLimit(initial=10, min_samples=1, window=0.0)
    limit = ConcurrencyLimit(adaptive, clock=clock)

    def refused() -> None:
        raise ConnectionRefusedError

    for _ in range(50):
        with pytest.raises(ConnectionRefusedError):
            run(mode.call(limit, refused))
    assert adaptive.baseline("") is None
    assert limit.in_flight == 0


def test_shed_is_not_retried_by_default(clock: FakeClock) -> None:
    limit = ConcurrencyLimit(1, clock=clock)
    pipeline = Pipeline(Retry(attempts=3, clock=clock), limit)
    ticket = limit.shedder.try_acquire()
    with pytest.raises(Shed):
        pipeline.call(lambda: "never")
    assert clock.sleeps == []
    assert not isinstance(ticket, Shed)
    limit.shedder.release(ticket)
    assert pipeline.call(lambda: "now") == "now"


def test_a_blocking_call_waits_for_a_slot_a_thread_frees() -> None:
    """Real threads on the system clock: one call holds the only slot until told; a
    second, with max_wait, gets the slot as soon as it is freed (no polling: the freed
    slot is handed over); a third without wait is refused at once."""
    limit = ConcurrencyLimit(1, max_wait=30.0)
    holding = threading.Event()
    release = threading.Event()
    results: list[str] = []

    def hold() -> str:
        holding.set()
        release.wait(30)
        return "first"

    first = threading.Thread(target=lambda: results.append(limit.call(hold)))
    first.start()
    assert holding.wait(30)
    waiter = threading.Thread(target=lambda: results.append(limit.call(lambda: "second")))
    waiter.start()
    eventually = __import__("tests.resilience.conftest", fromlist=["eventually"]).eventually
    eventually(lambda: limit.stats()["waiting"] == 1)
    no_wait = ConcurrencyLimit(1)
    ticket = no_wait.shedder.try_acquire()
    with pytest.raises(Shed):
        no_wait.call(lambda: "never")
    assert not isinstance(ticket, Shed)
    release.set()
    first.join()
    waiter.join()
    assert results == ["first", "second"]
    assert limit.in_flight == 0
