"""FakeClock.run: asyncio on virtual time, jumping to the next timer when every task waits.

Every ``asyncio.sleep`` in this file runs on the virtual loop: no real time passes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import (
    Bulkhead,
    BulkheadFull,
    ConfigError,
    DeadlineExceeded,
    Pipeline,
    Retry,
    Timeout,
)
from stormguard._core.clock import Clock, system_clock, wall_us
from stormguard.testing import FakeClock, VirtualEventLoop

# Every test here checks the *real* time a virtual run took: it is the point of the loop
# (minutes of virtual time in milliseconds). The bound is loose on purpose: it only
# proves nothing slept for real (each run below would take >= 30 s if it did).
REAL_BOUND = 5.0


def real_time(fn: object) -> float:
    began = time.perf_counter()
    assert callable(fn)
    fn()
    return time.perf_counter() - began


def test_the_contract_timeout_of_30s_on_a_sleep_of_60s(clock: FakeClock) -> None:
    began = clock.monotonic()

    def go() -> None:
        with pytest.raises(DeadlineExceeded):
            clock.run(Timeout(30.0, clock=clock).acall(asyncio.sleep, 60))

    assert real_time(go) < REAL_BOUND
    assert clock.monotonic() - began == 30.0


def test_loop_time_is_the_clock(clock: FakeClock) -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = [loop.time() - clock.monotonic()]
        clock.advance(7.0)
        seen.append(loop.time() - clock.monotonic())
        await asyncio.sleep(3.0)
        seen.append(loop.time() - clock.monotonic())
        return seen

    assert clock.run(main()) == [0.0, 0.0, 0.0]


def test_sleep_takes_exactly_its_virtual_time(clock: FakeClock) -> None:
    async def main() -> float:
        began = clock.monotonic()
        await asyncio.sleep(3600)
        return clock.monotonic() - began

    assert clock.run(main()) == 3600.0


def test_asyncio_timeout_and_wait_for_in_virtual_time(clock: FakeClock) -> None:
    async def main() -> list[float]:
        t0 = clock.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(45):
                await asyncio.sleep(100)
        t1 = clock.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), timeout=12.5)
        t2 = clock.monotonic()
        assert await asyncio.wait_for(asyncio.sleep(1, result="done"), timeout=5) == "done"
        return [t1 - t0, t2 - t1, clock.monotonic() - t2]

    assert clock.run(main()) == [45.0, 12.5, 1.0]


def test_call_later_runs_in_time_order_at_its_virtual_time(clock: FakeClock) -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        t0 = clock.monotonic()
        done = loop.create_future()
        for name, delay in [("c", 30.0), ("a", 0.5), ("b", 10.0), ("a2", 0.5)]:
            loop.call_later(delay, lambda n=name: fired.append((n, clock.monotonic() - t0)))
        loop.call_at(t0 + 31.0, done.set_result, None)
        await done

    clock.run(main())
    assert fired == [("a", 0.5), ("a2", 0.5), ("b", 10.0), ("c", 30.0)]


def test_cancelled_timers_are_not_jumped_to(clock: FakeClock) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = clock.monotonic()
        for _ in range(200):  # enough to exercise CPython's cancelled-timer bookkeeping too
            loop.call_later(5.0, lambda: None).cancel()
        await asyncio.sleep(20.0)
        return clock.monotonic() - t0

    assert clock.run(main()) == 20.0


def test_gather_of_many_sleepers_wakes_each_on_its_time(clock: FakeClock) -> None:
    async def sleeper(i: int, t0: float) -> float:
        await asyncio.sleep(i * 0.25)
        return clock.monotonic() - t0

    async def main() -> tuple[list[float], float]:
        t0 = clock.monotonic()
        woke = await asyncio.gather(*(sleeper(i, t0) for i in range(1000)))
        return woke, clock.monotonic() - t0

    def go() -> None:
        woke, total = clock.run(main())
        assert woke == [i * 0.25 for i in range(1000)]
        assert total == 999 * 0.25

    assert real_time(go) < REAL_BOUND


def test_autojump_never_skips_a_ready_callback(clock: FakeClock) -> None:
    """A busy task (yielding, never sleeping) keeps time still: no timer fires early."""
    async def main() -> tuple[list[float], float]:
        t0 = clock.monotonic()
        fired: list[float] = []
        asyncio.get_running_loop().call_later(1.0, lambda: fired.append(clock.monotonic() - t0))
        for _ in range(500):
            await asyncio.sleep(0)  # a callback is always ready: time must not move
            assert clock.monotonic() == t0
        assert fired == []
        await asyncio.sleep(0.5)  # now everything waits: time moves, to 0.5 only
        assert (fired, clock.monotonic() - t0) == ([], 0.5)
        await asyncio.sleep(1.0)
        return fired, clock.monotonic() - t0

    assert clock.run(main()) == ([1.0], 1.5)


def test_cancellation_in_virtual_time(clock: FakeClock) -> None:
    async def main() -> float:
        t0 = clock.monotonic()
        task = asyncio.ensure_future(asyncio.sleep(1000))
        await asyncio.sleep(2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return clock.monotonic() - t0

    assert clock.run(main()) == 2.0


def test_leftover_tasks_are_cancelled_and_the_loop_closed(clock: FakeClock) -> None:
    cleaned: list[bool] = []
    loops: list[asyncio.AbstractEventLoop] = []
    kept: list[asyncio.Future[None]] = []

    async def background() -> None:
        try:
            await asyncio.sleep(10_000)
        finally:
            cleaned.append(True)

    async def main() -> str:
        loops.append(asyncio.get_running_loop())
        kept.append(asyncio.ensure_future(background()))
        await asyncio.sleep(0)
        return "done"

    assert clock.run(main()) == "done"
    assert cleaned == [True]
    assert loops[0].is_closed()
    assert clock.monotonic() == 100.0  # cancelled, not waited for


def test_asleep_sleeps_on_the_virtual_loop(clock: FakeClock) -> None:
    async def main() -> list[float]:
        t0 = clock.monotonic()
        other = asyncio.ensure_future(asyncio.sleep(2, result=clock))
        await clock.asleep(5)  # a real timer on the loop: the other task wakes at 2 first
        woke = (await other).monotonic() - t0
        return [woke, clock.monotonic() - t0]

    assert clock.run(main()) == [5.0, 5.0]
    assert clock.sleeps == [5]


def test_asleep_on_a_normal_loop_advances_and_yields(clock: FakeClock) -> None:
    asyncio.run(clock.asleep(5))
    assert clock.monotonic() == 105.0
    assert clock.sleeps == [5]


def test_threads_wake_the_loop_without_a_jump(clock: FakeClock) -> None:
    """A thread's result arrives through the self-pipe; with no timer the loop waits for it."""
    async def main() -> tuple[str, float]:
        t0 = clock.monotonic()
        result = await asyncio.to_thread(lambda: "from a thread")
        return result, clock.monotonic() - t0

    assert clock.run(main()) == ("from a thread", 0.0)


def test_autojump_threshold_lets_real_io_win_over_a_pending_timer(clock: FakeClock) -> None:
    """With a threshold, a reply that comes within it (here, from a real thread) is seen
    before the clock jumps to the 60 s timeout."""
    async def main() -> str:
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        threading.Timer(0.01, loop.call_soon_threadsafe, (reply.set_result, "reply")).start()
        async with asyncio.timeout(60):
            return await reply

    assert clock.run(main(), autojump_threshold=1.0) == "reply"
    assert clock.monotonic() == 100.0


def test_a_loop_factory_for_runners(clock: FakeClock) -> None:
    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        assert isinstance(runner.get_loop(), VirtualEventLoop)
        runner.run(asyncio.sleep(90))
    assert clock.monotonic() == 190.0


def test_set_wall_goes_back_without_moving_monotonic(clock: FakeClock) -> None:
    clock.set_wall(1_700_000_100.25)
    assert clock.wall() == 1_700_000_100.25
    assert clock.monotonic() == pytest.approx(160.25)
    clock.set_wall(1_600_000_000.5)  # an NTP step back
    assert clock.wall() == 1_600_000_000.5
    assert clock.wall_ns() == 1_600_000_000_500_000_000
    assert clock.monotonic() == pytest.approx(160.25)
    clock.advance(1.5)
    assert clock.wall() == 1_600_000_002.0
    assert clock.monotonic() == pytest.approx(161.75)
    with pytest.raises(ValueError, match="back in time"):
        clock.advance(-1)


def test_every_stormguard_timer_runs_in_virtual_time(clock: FakeClock) -> None:
    """Retry sleeps, bulkhead waits and timeouts of one pipeline, on one virtual timeline."""
    log: list[tuple[str, float]] = []
    bh = Bulkhead(1, max_wait=2.0, clock=clock)
    policy = Pipeline(Timeout(total=20.0, clock=clock),
                      Retry(attempts=4, base=1.0, jitter="none", retry_on=(BulkheadFull,
                                                                           DeadlineExceeded),
                            clock=clock),
                      bh, Timeout(3.0, clock=clock))

    async def call(name: str, work: float) -> None:
        log.append((name, clock.monotonic() - 100.0))
        await asyncio.sleep(work)

    async def main() -> list[BaseException | None]:
        hog = asyncio.ensure_future(bh.acall(asyncio.sleep, 4.5))  # holds the slot 4.5 s
        await asyncio.sleep(0)
        out = await asyncio.gather(policy.acall(call, "a", 10.0), return_exceptions=True)
        await hog
        return out

    def go() -> None:
        (result,) = clock.run(main())
        assert isinstance(result, DeadlineExceeded)

    assert real_time(go) < REAL_BOUND
    # t=0: waits 2 s for the slot (BulkheadFull), backs off 1 s; t=3: waits, gets the slot at
    # 4.5 (the hog ends), times out at 7.5; backs off 2 s; t=9.5: times out at 12.5; backs
    # off 4 s; t=16.5: the 4th and last attempt times out at 19.5 (inside the total 20 s)
    assert log == [("a", 4.5), ("a", 9.5), ("a", 16.5)]
    assert clock.monotonic() - 100.0 == 19.5


def test_the_clock_protocol_and_epoch_microseconds(clock: FakeClock) -> None:
    assert isinstance(clock, Clock)
    assert isinstance(system_clock, Clock)
    clock.set_wall(1_700_000_000.123456)
    assert wall_us(clock) == 1_700_000_000_123_456
    clock.set_wall(1_700_000_000.0000005)  # rounds to the microsecond, as the stores do
    assert wall_us(clock) == 1_700_000_000_000_001
    before = time.time_ns() // 1000
    assert before <= wall_us(system_clock) <= time.time_ns() // 1000


@settings(max_examples=40, deadline=None)
@given(plans=st.lists(st.lists(st.integers(0, 10_000).map(lambda ms: ms / 1000), min_size=1,
                               max_size=5), min_size=1, max_size=30))
def test_every_task_wakes_exactly_on_its_virtual_time(plans: list[list[float]]) -> None:
    """Random tasks, each a chain of sleeps: each wakes at exactly the sum of its own
    sleeps (as the loop adds them), whatever the others do, and the run ends with the
    longest chain."""
    clock = FakeClock()

    async def chain(delays: list[float]) -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        expected = loop.time()
        for delay in delays:
            expected += delay
            await asyncio.sleep(delay)
            assert loop.time() >= expected - 1e-9  # never woken early
        return clock.monotonic(), expected

    async def main() -> list[tuple[float, float]]:
        return await asyncio.gather(*(chain(p) for p in plans))

    for woke, expected in clock.run(main()):
        assert woke == pytest.approx(expected, abs=1e-9)
    assert clock.monotonic() == pytest.approx(100.0 + max(map(sum, plans)), abs=1e-9)


def test_run_propagates_the_error_and_still_closes_the_loop(clock: FakeClock) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(3)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        clock.run(main())
    assert loops[0].is_closed()
    assert clock.monotonic() == 103.0
    with pytest.raises(ConfigError):
        clock.new_event_loop(autojump_threshold=-1)
