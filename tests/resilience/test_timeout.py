"""Timeout and the deadline context variable: what is enforced, sync and async."""

from __future__ import annotations

import asyncio

import pytest

from stormguard import ConfigError, DeadlineExceeded, Pipeline, Timeout, deadline
from stormguard.observability.events import Event, TimedOut
from stormguard.testing import FakeClock
from tests.resilience.conftest import Boom, Mode, failing


async def test_exposes_the_deadline_to_the_called_code(mode: Mode, clock: FakeClock) -> None:
    seen: list[float | None] = []

    def fn() -> str:
        seen.append(deadline.remaining())
        return "ok"

    assert deadline.remaining() is None
    assert await mode.call(Timeout(2.5, clock=clock), fn) == "ok"
    assert seen == [2.5]
    assert deadline.remaining() is None  # restored afterwards


async def test_inner_timeout_is_clipped_to_the_outer_deadline(mode: Mode,
                                                              clock: FakeClock) -> None:
    seen: list[float | None] = []

    def fn() -> None:
        seen.append(deadline.remaining())

    outer = Pipeline(Timeout(total=3.0, clock=clock), Timeout(1.0, clock=clock))
    await mode.call(outer, fn)
    assert seen == [1.0]
    inner_first = Pipeline(Timeout(total=3.0, clock=clock))

    def nested() -> None:
        clock.advance(2.2)
        Timeout(1.0, clock=clock).call(fn)

    await mode.call(inner_first, nested)
    assert seen[-1] == pytest.approx(0.8)


async def test_late_result_raises_deadline_exceeded(mode: Mode, clock: FakeClock) -> None:
    events: list[Event] = []

    def slow() -> str:
        clock.advance(1.5)
        return "too late"

    err = await mode.outcome(Timeout(1.0, clock=clock, listeners=(events.append,)), slow)
    assert isinstance(err, DeadlineExceeded)
    assert isinstance(err, TimeoutError)
    assert [(type(e), e.seconds, e.total) for e in events if isinstance(e, TimedOut)] == [
        (TimedOut, 1.0, False)]


async def test_late_exception_becomes_the_cause(mode: Mode, clock: FakeClock) -> None:
    def slow_fail() -> None:
        clock.advance(1.0)
        raise Boom

    err = await mode.outcome(Timeout(total=1.0, clock=clock), slow_fail)
    assert isinstance(err, DeadlineExceeded)
    assert isinstance(err.__cause__, Boom)


async def test_errors_before_the_deadline_pass_through(mode: Mode, clock: FakeClock) -> None:
    assert isinstance(await mode.outcome(Timeout(1.0, clock=clock), failing()), Boom)


async def test_expired_outer_deadline_means_no_call(mode: Mode, clock: FakeClock) -> None:
    calls: list[int] = []

    def outer_body() -> None:
        clock.advance(5.0)
        Timeout(1.0, clock=clock).call(calls.append, 1)

    err = await mode.outcome(Timeout(total=2.0, clock=clock), outer_body)
    assert isinstance(err, DeadlineExceeded)
    assert calls == []


def test_async_code_is_cancelled_for_real(clock: FakeClock) -> None:
    cancelled: list[float] = []

    async def hang() -> None:
        try:
            await asyncio.sleep(30)  # virtual: on clock.run, or cancelled by the timeout
        except asyncio.CancelledError:
            cancelled.append(clock.monotonic())
            raise

    with pytest.raises(DeadlineExceeded):
        clock.run(Timeout(0.02, clock=clock).acall(hang))
    assert cancelled == [100.02]  # cancelled at the deadline, in virtual time
    assert clock.monotonic() == 100.02


def test_async_outer_total_cancels_inner_work(clock: FakeClock) -> None:
    async def hang() -> None:
        await asyncio.sleep(30)  # virtual: on clock.run, or cancelled by the timeout

    with pytest.raises(DeadlineExceeded) as info:
        clock.run(Pipeline(Timeout(total=0.03, clock=clock),
                           Timeout(10.0, clock=clock)).acall(hang))
    assert "total timeout" in str(info.value)
    assert clock.monotonic() == 100.03


def test_the_contract_example(clock: FakeClock) -> None:
    with pytest.raises(DeadlineExceeded):
        clock.run(Timeout(30.0, clock=clock).acall(asyncio.sleep, 60))
    assert clock.monotonic() == 130.0


def test_async_timer_on_the_system_clock_still_fires_on_a_virtual_loop() -> None:
    """The timer is armed at loop.time() + what is left on the policy's clock."""
    loop_clock = FakeClock()
    with pytest.raises(DeadlineExceeded):
        loop_clock.run(Timeout(0.01).acall(asyncio.sleep, 60))
    assert 100.0 < loop_clock.monotonic() < 100.5


def test_sync_code_is_not_interrupted_but_gets_the_error(clock: FakeClock) -> None:
    """Documented limit: a blocking call that ignores the deadline runs to its end."""
    finished: list[bool] = []

    def blocking() -> None:
        clock.sleep(0.03)
        finished.append(True)

    with pytest.raises(DeadlineExceeded):
        Timeout(0.01, clock=clock).call(blocking)
    assert finished == [True]


def test_decorator_on_sync_and_async(clock: FakeClock) -> None:
    t = Timeout(1.0, clock=clock)

    @t
    def f(x: int) -> int:
        return x + 1

    @t
    async def g(x: int) -> int:
        return x + 2

    assert f(1) == 2
    assert asyncio.run(g(1)) == 3
    assert f.__name__ == "f"


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    ((), {}, "seconds"), ((1.0,), {"total": 2.0}, "seconds"), ((0,), {}, "seconds"),
    ((), {"total": -1}, "total"), (("1",), {}, "seconds")])
def test_config_errors(args: tuple[float, ...], kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Timeout(*args, **kwargs)
    assert info.value.field == field


async def test_outside_cancellation_stays_a_cancellation() -> None:
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.sleep(30)  # virtual: on clock.run, or cancelled by the timeout

    task = asyncio.ensure_future(Timeout(10.0).acall(hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_callee_swallowing_the_cancellation_still_times_out(clock: FakeClock) -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)  # virtual: on clock.run, or cancelled by the timeout
        except asyncio.CancelledError:
            return "ignored the cancel"
        return "slept"

    async def main() -> None:
        with pytest.raises(DeadlineExceeded):
            await Timeout(0.02, clock=clock).acall(stubborn)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0  # no cancellation request left behind
        await asyncio.sleep(0)  # and the task is not cancelled at its next await

    clock.run(main())
    assert clock.monotonic() == 100.02


def test_callee_turning_the_cancellation_into_an_error_times_out(clock: FakeClock) -> None:
    async def converts() -> None:
        try:
            await asyncio.sleep(30)  # virtual: on clock.run, or cancelled by the timeout
        except asyncio.CancelledError:
            raise Boom("cleanup failed") from None

    async def main() -> None:
        with pytest.raises(DeadlineExceeded) as info:
            await Timeout(0.02, clock=clock).acall(converts)
        assert isinstance(info.value.__cause__, Boom)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0

    clock.run(main())
    assert clock.monotonic() == 100.02


async def test_outer_deadline_on_another_clock_still_clips(mode: Mode) -> None:
    outer_clock, inner_clock = FakeClock(), FakeClock(monotonic_start=5_000.0)
    seen: list[float | None] = []

    def body() -> None:
        outer_clock.advance(2.5)
        Timeout(1.0, clock=inner_clock).call(lambda: seen.append(deadline.remaining()))

    await mode.call(Timeout(total=3.0, clock=outer_clock), body)
    assert seen == [pytest.approx(0.5)]


def test_scope_and_timeout_share_one_clipping(clock: FakeClock) -> None:
    other = FakeClock(monotonic_start=9_000.0)
    with deadline.scope(2.0, clock) as outer:
        with deadline.scope(5.0, clock) as inner:
            assert inner.at == outer.at  # never outlives the outer deadline
        with deadline.scope(5.0, other) as elsewhere:  # another clock: clipped by what is left
            assert elsewhere.remaining() == pytest.approx(2.0)
        clock.advance(0.5)
        seen: list[float | None] = []
        Timeout(5.0, clock=other).call(lambda: seen.append(deadline.remaining()))
        assert seen == [pytest.approx(1.5)]
    assert deadline.current() is None


def test_deadline_exceeded_names_the_deadline_that_decided(clock: FakeClock) -> None:
    """A per-attempt timeout cut short by a total deadline names the total one (a 2.5 s
    total deadline used to be reported as "timeout of 0.230s")."""
    def slow() -> None:
        clock.advance(1.0)

    def late_attempt() -> None:
        clock.advance(2.27)
        Timeout(1.0, clock=clock).call(slow)

    with pytest.raises(DeadlineExceeded) as info:
        Timeout(total=2.5, clock=clock).call(late_attempt)
    assert str(info.value) == ("total deadline of 2.500s exceeded (it left this timeout of "
                               "1.000s only 0.230s)")
    with pytest.raises(DeadlineExceeded, match=r"^timeout of 1\.000s exceeded$"):
        Timeout(1.0, clock=clock).call(lambda: clock.advance(1.5))
    with pytest.raises(DeadlineExceeded, match=r"^total timeout of 2\.000s exceeded$"):
        Timeout(total=2.0, clock=clock).call(lambda: clock.advance(2.5))
